"""Log lines about bad input, bounded: the first occurrence of each kind with its detail, then a count.

Owns :class:`LogLimiter`. Hostile or broken peers can send thousands of bad
datagrams or messages a second; logging each (worse: with a traceback)
would flood the journal and cost the event loop more than the input itself.
A site (a short stable name: ``sip_parse``, ``ws_bad_frame``) logs its first
occurrence with the detail; later ones within ``interval_s`` are only
counted; the first occurrence after the interval logs one line with the
number suppressed in between and its own detail.

Invariants: at most one line per site per ``interval_s`` (plus the first);
memory is bounded (``max_sites`` sites; beyond that new sites share one
overflow site); never raises; ``suppressed`` (site -> count) is what the
role exports to its metrics. Times come from ``clock`` (monotonic seconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

OVERFLOW = "other"


class LogLimiter:
    __slots__ = ("log", "interval_s", "max_sites", "clock", "_last", "_pending", "suppressed", "lines")

    def __init__(self, log: logging.Logger, interval_s: float = 60.0, max_sites: int = 128,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.interval_s = interval_s
        self.max_sites = max_sites
        self.clock = clock
        self._last: dict[str, float] = {}  # site -> when it last logged a line
        self._pending: dict[str, int] = {}  # site -> occurrences since that line
        self.suppressed: dict[str, int] = {}  # site -> occurrences never logged (all time)
        self.lines = 0

    def __call__(self, site: str, msg: str, *args: object, level: int = logging.WARNING) -> bool:
        """Log ``msg % args`` for ``site`` if its interval allows; returns whether a line went out."""
        if site not in self._last and len(self._last) >= self.max_sites:
            site = OVERFLOW
        now = self.clock()
        last = self._last.get(site)
        if last is not None and now - last < self.interval_s:
            self._pending[site] = self._pending.get(site, 0) + 1
            self.suppressed[site] = self.suppressed.get(site, 0) + 1
            return False
        self._last[site] = now
        n = self._pending.pop(site, 0)
        self.lines += 1
        try:
            if n:
                self.log.log(level, f"{msg} ({n} more like it in the last %.0f s, not logged)",
                             *args, now - (last or now))
            else:
                self.log.log(level, msg, *args)
        except Exception:  # noqa: BLE001 - a bad format string must not break the caller
            pass
        return True
