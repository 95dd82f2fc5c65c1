"""The SIP user agent's counters and its bounded log.

Owns :class:`SipCounters`: the counters every part of one user agent adds to
(the transaction layer, the dialog layer, the dialer, each call's RTP) and
the :class:`~brisvox.runtime.log_limit.LogLimiter` they all log bad input
through (one line per site per minute, never a traceback per datagram).

Invariants:

* A counter is created by its first count and only grows; a snapshot
  (:meth:`SipCounters.snapshot`, :meth:`SipCounters.suppressed`: one
  ``log_suppressed_<site>`` per site that had lines not written) is a copy.
* A refusal (:meth:`SipCounters.refuse`) is counted ``sip_refused_<reason>``
  and logged at INFO, bounded, under the site of the same name.
"""

from __future__ import annotations

import logging
from typing import Any

from brisvox.runtime.log_limit import LogLimiter


class SipCounters:
    """Counters and bounded logging of one SIP user agent (see the module docstring)."""

    def __init__(self, log: logging.Logger) -> None:
        self.values: dict[str, int] = {}
        self.log_limit = LogLimiter(log)

    def count(self, name: str, n: int = 1) -> None:
        self.values[name] = self.values.get(name, 0) + n

    def refuse(self, reason: str, detail: str, *args: object) -> None:
        """Count ``sip_refused_<reason>`` and log it, bounded (one line per reason per minute)."""
        self.count(f"sip_refused_{reason}")
        self.log_limit(f"sip_refused_{reason}", f"SIP refused ({reason}): {detail}", *args, level=logging.INFO)

    def snapshot(self) -> dict[str, Any]:
        return dict(self.values)

    def suppressed(self) -> dict[str, int]:
        """``log_suppressed_<site>``: the log lines not written, by site."""
        return {f"log_suppressed_{site}": n for site, n in self.log_limit.suppressed.items()}
