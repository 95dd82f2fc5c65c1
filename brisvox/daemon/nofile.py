"""The file-descriptor limit (``RLIMIT_NOFILE``) of the daemon and of each of its children.

Owns how the daemon gets its file limit and how it is reported:

* :func:`raise_nofile`: the supervisor calls it once at start, before it forks
  its first child, so every child (and every restarted child) inherits the
  raised limit across ``fork``. The soft limit goes up to the hard limit (on
  Linux a hard limit of ``RLIM_INFINITY`` means ``/proc/sys/fs/nr_open``);
  it is never lowered.
* :func:`nofile_of`: another process's limits (``prlimit(2)``, the same
  figures as ``/proc/<pid>/limits``), read by the supervisor when a child
  completes its handshake.
* :func:`plan` (pure) and :func:`describe` (the one line to log or print):
  what the raise does and whether the hard limit is too low for a public
  listener (below :data:`LOW_NOFILE`: a flood of half-open connections can
  exhaust it; the fix is the hard limit: systemd ``LimitNOFILE=``,
  ``ulimit -Hn``, ``docker run --ulimit nofile=65536:65536``).

Invariants: nothing here raises (a failed ``setrlimit`` is reported in
:attr:`NofileLimit.error` and the limits found are kept); the soft limit
never goes down; :func:`plan` reads no state.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

LOW_NOFILE = 8192  # a hard limit below this gets a warning (docs/OPERATIONS.md, "File descriptors")
NR_OPEN = Path("/proc/sys/fs/nr_open")
HOW_TO_RAISE = "systemd LimitNOFILE=65536, ulimit -Hn 65536 as root, docker run --ulimit nofile=65536:65536"


@dataclass(frozen=True, slots=True)
class NofileLimit:
    """The limits a process runs with: ``soft``/``hard`` now, ``before`` the soft limit found at start."""

    soft: int
    hard: int
    before: int
    error: str = ""

    @property
    def low(self) -> bool:
        return 0 <= self.hard < LOW_NOFILE

    def as_dict(self) -> dict[str, int | str]:
        return {"soft": self.soft, "hard": self.hard, "before": self.before, "error": self.error}


def _nr_open() -> int:
    try:
        return int(NR_OPEN.read_text().strip())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default


def plan(soft: int, hard: int, nr_open: int) -> int:
    """The soft limit to set: the hard limit (``nr_open`` when the hard one is infinite), never lower than ``soft``."""
    inf = resource.RLIM_INFINITY
    target = nr_open if hard == inf else hard
    if soft == inf:
        return soft
    return max(soft, target)


def raise_nofile() -> NofileLimit:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns what it got."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = plan(soft, hard, _nr_open())
    if want == soft:
        return NofileLimit(soft, hard, soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as e:
        return NofileLimit(soft, hard, soft, f"setrlimit({want}): {e}")
    got_soft, got_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NofileLimit(got_soft, got_hard, soft)


def nofile_of(pid: int) -> tuple[int, int] | None:
    """(soft, hard) ``RLIMIT_NOFILE`` of process ``pid``, None when it cannot be read (gone, not ours)."""
    try:
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    return int(soft), int(hard)


def low_hint(lim: NofileLimit) -> str:
    """The warning's tail when the hard limit is low (else "")."""
    if not lim.low:
        return ""
    return (f"; the hard limit {lim.hard} is low (below {LOW_NOFILE}): a flood of connections can use up every "
            f"descriptor; raise it ({HOW_TO_RAISE})")


def describe(lim: NofileLimit) -> tuple[bool, str]:
    """(is a warning, the line to log) saying what the supervisor got at start."""
    if lim.error:
        line = f"file descriptors: soft limit {lim.soft}, hard {lim.hard}: could not raise the soft limit ({lim.error})"
    elif lim.before != lim.soft:
        line = f"file descriptors: soft limit raised from {lim.before} to {lim.soft} (the hard limit)"
    else:
        line = f"file descriptors: soft limit {lim.soft} (hard {lim.hard})"
    return bool(lim.error) or lim.low, line + low_hint(lim)


def check_line(lim: NofileLimit) -> tuple[bool, str]:
    """(is a warning, the line ``brisvoxd check`` prints) for :func:`would_get`'s answer."""
    return lim.low, (f"file descriptors in this shell: soft {lim.before}, hard {lim.hard}; brisvoxd start raises "
                     f"the soft limit to {lim.soft} and every child inherits it (under systemd: the unit's "
                     f"LimitNOFILE=){low_hint(lim)}")


def would_get() -> NofileLimit:
    """What :func:`raise_nofile` would give this process, without changing anything (``brisvoxd check``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NofileLimit(plan(soft, hard, _nr_open()), hard, soft)
