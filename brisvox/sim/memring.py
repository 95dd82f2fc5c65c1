"""MemRing: an in-memory ring with the subset of ``ipc.ring.Ring`` the actor uses.

Owns the sim's audio rings: absolute positions, one writer, ``write``,
``write_pos``, ``read_range`` (returns ``ipc.ring.ReadResult``), ``cut`` and
``floor``. A reader more than a ring behind loses the overwritten samples
(counted in ``lost``), exactly like the shared-memory ring.
"""

from __future__ import annotations

import numpy as np

from ipc.ring import ReadResult


class MemRing:
    __slots__ = ("rate", "capacity", "_buf", "_w", "_floor")

    def __init__(self, rate: int, capacity: int = 1 << 20) -> None:
        if capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two")
        self.rate = rate
        self.capacity = capacity
        self._buf = np.zeros(capacity, dtype=np.int16)
        self._w = 0
        self._floor = 0

    @property
    def write_pos(self) -> int:
        return self._w

    @property
    def floor(self) -> int:
        return self._floor

    def write(self, samples: np.ndarray) -> int:
        n = len(samples)
        if n == 0:
            return self._w
        if n > self.capacity:
            samples = samples[n - self.capacity :]
            self._w += n - self.capacity
            n = self.capacity
        i = self._w & (self.capacity - 1)
        first = min(n, self.capacity - i)
        self._buf[i : i + first] = samples[:first]
        if first < n:
            self._buf[: n - first] = samples[first:]
        self._w += n
        return self._w

    def cut(self, position: int) -> int:
        if position > self._floor:
            self._floor = position
        return self._floor

    def read_range(self, start: int, end: int) -> ReadResult:
        end = min(end, self._w)
        start = min(start, end)
        lo = max(start, self._w - self.capacity)
        n = end - lo
        out = np.empty(n, dtype=np.int16)
        if n > 0:
            i = lo & (self.capacity - 1)
            first = min(n, self.capacity - i)
            out[:first] = self._buf[i : i + first]
            if first < n:
                out[first:] = self._buf[: n - first]
        return ReadResult(out, lo, lo - start, 0)
