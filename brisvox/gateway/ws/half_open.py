"""The WebSocket listener's half-open connections: a global cap and a per-source cap at accept time.

Owns :class:`HalfOpenTable` (which connections hold a file descriptor without
having completed the HTTP upgrade, and whether one more may) and
:func:`auto_cap` (the global cap's default, from the process's file limit).
Pure: the table says what to do (keep, drop the new one, drop the oldest),
the listener (:mod:`brisvox.gateway.ws.listener`, :mod:`brisvox.gateway.ws.server`)
does it.

Rule of :func:`auto_cap` (``[websocket] max_half_open = "auto"``): an eighth
of the soft ``RLIMIT_NOFILE`` when the listener starts, within 16..4096. At
the usual 1,024 that is 128, and the other seven eighths stay for what a
live call holds (its socket or RTP socket and four ring mappings: about six
descriptors, 120 calls on two cores), the worker and agent links, the logs;
with the limit raised (systemd ``LimitNOFILE=``, or the daemon raising its soft
limit to the hard one) it grows, up to 4096 (5 s handshake timers x 4096 is
already 800 slow handshakes a second).

Invariants:

* The table holds each connection at most once, in accept order, with the
  source (TCP peer address) it was admitted under; ``per_source`` is exactly
  the count of its entries per source.
* :meth:`admit` never lets the table grow beyond ``cap``: at the cap the
  OLDEST entry is removed and returned to be closed, and the new one is
  kept (a slow handshake, most likely a flood's, gives way to a new one, so
  a health check or a real caller's handshake, which completes in
  milliseconds, still gets through while the table is full).
* A source already holding ``per_source_cap`` entries gets nothing (the new
  connection is refused), whatever the global count: one address cannot
  evict everyone else's handshakes. A source ``exempt`` says so (a trusted
  proxy: many clients behind one address) has no per-source cap.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

AUTO_MIN = 16
AUTO_MAX = 4096
AUTO_SHARE = 8  # one eighth of the soft file limit

K = TypeVar("K", bound=Hashable)


def soft_nofile() -> int:
    """The process's soft ``RLIMIT_NOFILE`` now (``RLIM_INFINITY`` as a large number)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 30 if soft == resource.RLIM_INFINITY else int(soft)


def auto_cap(soft: int | None = None) -> int:
    """The global half-open cap for a soft file limit of ``soft`` (default: this process's; module doc)."""
    n = soft_nofile() if soft is None else soft
    return max(AUTO_MIN, min(AUTO_MAX, n // AUTO_SHARE))


class HalfOpenTable(Generic[K]):
    """Half-open connections by accept order (see the module invariants)."""

    __slots__ = ("cap", "per_source_cap", "exempt", "_entries", "per_source")

    def __init__(self, cap: int, per_source_cap: int, exempt: Callable[[str], bool] = lambda s: False) -> None:
        self.cap = max(1, cap)
        self.per_source_cap = per_source_cap  # 0: none
        self.exempt = exempt
        self._entries: dict[K, str] = {}  # insertion order is accept order
        self.per_source: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def source_full(self, source: str) -> bool:
        """``source`` holds its whole per-source share: a new connection of it is refused."""
        cap = self.per_source_cap
        return cap > 0 and self.per_source.get(source, 0) >= cap and not self.exempt(source)

    def admit(self, key: K, source: str) -> tuple[bool, K | None]:
        """``(kept, evicted)``: whether ``key`` is now in the table, and the oldest entry removed to
        make room for it (the caller closes that one), if any."""
        if self.source_full(source):
            return False, None
        evicted: K | None = None
        if len(self._entries) >= self.cap:
            evicted = next(iter(self._entries))
            self.remove(evicted)
        self._entries[key] = source
        self.per_source[source] = self.per_source.get(source, 0) + 1
        return True, evicted

    def track(self, key: K, source: str) -> None:
        """Hold ``key`` without a check (a connection that did not come through :meth:`admit`)."""
        if key not in self._entries:
            self._entries[key] = source
            self.per_source[source] = self.per_source.get(source, 0) + 1

    def remove(self, key: K) -> bool:
        """``key`` is no longer half-open (upgraded or closed); False if it was not held."""
        source = self._entries.pop(key, None)
        if source is None:
            return False
        n = self.per_source.get(source, 0) - 1
        if n > 0:
            self.per_source[source] = n
        else:
            self.per_source.pop(source, None)
        return True
