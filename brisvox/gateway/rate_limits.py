"""The gateway's per-source rate limits: one in-memory storage per process for every listener.

Owns :func:`process_storage` (the ``limits`` package's ``MemoryStorage``,
created on first use) and :func:`parse_rates`. The SIP user agent
(:mod:`brisvox.gateway.sip.guard`: INVITE, OPTIONS) and the WebSocket server
(:mod:`brisvox.gateway.ws.server`: handshakes) each count in their own
namespace of the same storage, keyed by the source IP address only (the
port is the sender's choice).

Invariants: one storage per process (its expiry timer thread is started
once); a window's entries live at most the window's length, so memory is
bounded by the sources seen in the longest window.
"""

from __future__ import annotations

import threading

from limits import RateLimitItem, parse, storage

_lock = threading.Lock()
_storage: storage.MemoryStorage | None = None


def process_storage() -> storage.MemoryStorage:
    """The one in-memory rate-limit storage of this process (created on first use)."""
    global _storage
    with _lock:
        if _storage is None:
            _storage = storage.MemoryStorage()
        return _storage


def parse_rates(rates: tuple[str, ...]) -> tuple[RateLimitItem, ...]:
    """``("10/second", "100/minute")`` -> limit items; ValueError for a bad one."""
    return tuple(parse(r) for r in rates)
