"""The per-session idempotency store of SideEffect calls.

Owns the state of every SideEffect key: in flight, done (the recorded result)
or lost (the call ended without a result), and the store's bounds.

Invariants:

* At most ``capacity`` entries and ``max_bytes`` of recorded result text.
* When a bound is reached, the oldest SETTLED entry (done or lost, in settle
  order) is evicted; an in-flight entry is never evicted. When every entry is
  in flight, a new key is refused (``FULL``).
* A recording is never evicted by itself (the engine raises ``max_bytes`` to
  at least one result).
* A key is begun at most once while it is known: ``begin`` on a known key
  reports its state and changes nothing.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

from brisvox.agent.tool_engine.registry import IdempotencyKey


class KeyState(enum.Enum):
    IN_FLIGHT = "in_flight"
    DONE = "done"
    LOST = "lost"


@dataclass(slots=True)
class Entry:
    state: KeyState
    content: str = ""
    is_error: bool = False
    nbytes: int = 0


class Begin(enum.Enum):
    STARTED = "started"  # a new in-flight entry: run the call
    DONE = "done"  # answer the recorded result
    IN_FLIGHT = "in_flight"  # duplicate_call
    LOST = "lost"  # unknown_outcome
    FULL = "full"  # store_full


@dataclass(frozen=True, slots=True)
class IdempotencyUsage:
    entries: int
    bytes: int


class IdempotencyStore:
    __slots__ = ("capacity", "max_bytes", "_entries", "_bytes", "evictions")

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self.capacity = max(1, capacity)
        self.max_bytes = max_bytes
        self._entries: OrderedDict[IdempotencyKey, Entry] = OrderedDict()
        self._bytes = 0
        self.evictions = 0

    def get(self, key: IdempotencyKey) -> Entry | None:
        return self._entries.get(key)

    def begin(self, key: IdempotencyKey) -> tuple[Begin, Entry | None]:
        e = self._entries.get(key)
        if e is not None:
            return {KeyState.DONE: Begin.DONE, KeyState.IN_FLIGHT: Begin.IN_FLIGHT,
                    KeyState.LOST: Begin.LOST}[e.state], e
        while len(self._entries) >= self.capacity:
            if not self._evict_one(None):
                return Begin.FULL, None
        e = Entry(KeyState.IN_FLIGHT)
        self._entries[key] = e
        return Begin.STARTED, e

    def record(self, key: IdempotencyKey, content: str, is_error: bool) -> None:
        """Settle ``key`` as done with its result text."""
        self._settle(key, KeyState.DONE, content, is_error)

    def lose(self, key: IdempotencyKey, content: str) -> None:
        """Settle ``key`` as lost (never run again); ``content`` is its unknown_outcome text."""
        self._settle(key, KeyState.LOST, content, True)

    def _settle(self, key: IdempotencyKey, state: KeyState, content: str, is_error: bool) -> None:
        e = self._entries.get(key)
        if e is None:  # evicted while in flight cannot happen; re-create defensively
            e = self._entries[key] = Entry(KeyState.IN_FLIGHT)
        if e.state is not KeyState.IN_FLIGHT:
            return
        n = len(content.encode("utf-8", "replace"))
        e.state, e.content, e.is_error, e.nbytes = state, content, is_error, n
        self._bytes += n
        self._entries.move_to_end(key)
        while self._bytes > self.max_bytes:
            if not self._evict_one(key):
                break

    def _evict_one(self, keep: IdempotencyKey | None) -> bool:
        for k, e in self._entries.items():
            if e.state is not KeyState.IN_FLIGHT and k != keep:
                del self._entries[k]
                self._bytes -= e.nbytes
                self.evictions += 1
                return True
        return False

    def usage(self) -> IdempotencyUsage:
        return IdempotencyUsage(len(self._entries), self._bytes)
