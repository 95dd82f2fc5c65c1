"""Exit codes of brisvoxd and of its children: one table, used on both sides of a fork.

Invariants:

* A child that exits with :data:`CONFIG` stops the whole daemon, which then
  exits :data:`CONFIG` itself with the child's message (naming the key).
* A child that exits with :data:`BOOT` (or dies before its handshake) counts as
  a boot failure: restarted with backoff, marked failed after too many in a row.
* The CLI's ``status`` uses :data:`NOT_RUNNING` (LSB: "program is not running").
"""

from __future__ import annotations

OK = 0
FAILURE = 1  # generic error (daemon: fatal internal error; CLI: command failed)
CONFIG = 2  # configuration error: a message names the key; do not restart
BOOT = 3  # a child could not boot (Hello ok=False or an exception before ready)
NOT_RUNNING = 3  # CLI only: `brisvoxd status` found no daemon
SIGNAL_BASE = 128  # shells report death by signal N as 128 + N

NAMES = {OK: "ok", FAILURE: "failure", CONFIG: "config error", BOOT: "boot failure"}


def describe(status: int) -> str:
    """Human form of a ``waitpid`` status already decoded to ``code`` (>= 0) or ``-signal``."""
    if status < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit {status} ({NAMES.get(status, 'error')})"
