"""The schedule of the load generator's one 20 ms timer (pure).

Owns which telephony frames are due at a given time: frame n of the run is due
at ``t0 + n * period``, for every call at once (one timer for all calls, never a
task per call). A late wake-up sends the missed frames in a burst, as a phone
whose packets were delayed would; if the timer falls more than ``max_behind_s``
behind, the missed frames are skipped and counted (the run is then invalid as a
measurement of the server, and says so).

Invariants: frame indices are handed out exactly once and in order; the number
due is never negative; lateness is measured from each frame's own deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Pacer:
    t0: float
    period: float = 0.020
    max_behind_s: float = 1.0
    next_index: int = 0
    skipped: int = 0
    late_s: list[float] = field(default_factory=list)  # wake-up lateness per tick

    def deadline(self, index: int) -> float:
        return self.t0 + index * self.period

    def next_deadline(self) -> float:
        return self.deadline(self.next_index)

    def due(self, now: float) -> int:
        """How many frames every call sends now (0 if woken early)."""
        if now < self.next_deadline():
            return 0
        behind = now - self.next_deadline()
        self.late_s.append(behind)
        if behind > self.max_behind_s:
            jump = int(behind / self.period)
            self.skipped += jump
            self.next_index += jump
        n = int((now - self.next_deadline()) / self.period) + 1
        self.next_index += n
        return n
