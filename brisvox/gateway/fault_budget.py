"""The fault budget of a live WebSocket call: how many malformed messages it survives.

Owns :class:`FaultBudget` (the policy, from ``[websocket] fault_max``,
``fault_window_s`` and ``hangup_on_error``) and :class:`FaultCounter` (one
per call: the recent faults and the verdict on the next one). Both the
Twilio and the native legs use it for every malformed message that arrives
during a live call; a message that is malformed before the call exists is
the leg's own business (there is no call to keep).

The rule, for each malformed message of a live call (the leg has counted it
and dropped it already):

* ``hangup_on_error`` on: the call ends on this first one (the strict
  behaviour, for a peer that must never send anything malformed);
* otherwise the call ends only when this message makes more than
  ``max_faults`` malformed messages within ``window_s`` seconds (a sliding
  window: the ``max_faults + 1`` latest arrived less than ``window_s``
  apart); below that the call goes on as if the message never came.

The defaults, 20 within 10 s, are what a carrier integration wants: a live
caller should not be hung up because a proxy or a media server garbled a
few messages (one bad Twilio media message is 20 ms of audio; a short burst
of them is a click), while a peer that is broken for good is cut quickly
rather than left to stream garbage for the whole call. Twilio sends 50
media messages a second, so a stream that went bad entirely exceeds the
budget after 21 messages, about 0.4 s; a sporadic fault, less than two a
second on average, never ends the call. The native protocol answers every
malformed message with an ``error``, which a client that loops on its own
mistake would meet at the same rate.

Invariants:

* Pure: no I/O and no clock; the caller passes ``now`` (seconds on any
  monotonic clock) with each fault and acts on the returned
  :class:`Decision`.
* Bounded memory: a counter keeps at most ``max_faults + 1`` timestamps
  (a deque with that ``maxlen``) whatever the number of faults.
* Every fault is counted (:attr:`FaultCounter.total`), whatever the verdict.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

DEFAULT_MAX_FAULTS = 20
DEFAULT_WINDOW_S = 10.0
MAX_FAULTS_LIMIT = 10000  # the config's bound: a counter's memory is max_faults + 1 floats
MAX_WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class FaultBudget:
    """The policy (see the module docstring); ``max_faults`` 0 ends a call on its first fault."""

    max_faults: int = DEFAULT_MAX_FAULTS
    window_s: float = DEFAULT_WINDOW_S
    hangup_on_error: bool = False

    def __post_init__(self) -> None:
        if type(self.max_faults) is not int or not 0 <= self.max_faults <= MAX_FAULTS_LIMIT:
            raise ValueError(f"max_faults must be an integer within 0..{MAX_FAULTS_LIMIT}, got {self.max_faults!r}")
        if not 0 < self.window_s <= MAX_WINDOW_S:  # also refuses NaN
            raise ValueError(f"window_s must be > 0 and at most {MAX_WINDOW_S:g}, got {self.window_s!r}")

    def counter(self) -> FaultCounter:
        """A fresh counter for one call."""
        return FaultCounter(self)

    def describe(self) -> str:
        """The policy in a few words (logs, docs)."""
        if self.hangup_on_error:
            return "hangup_on_error: the first malformed message ends the call"
        return f"at most {self.max_faults} malformed messages within {self.window_s:g} s"


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one fault: ``end`` the call, or drop the message and go on.

    ``reason`` names the budget when it was exceeded; it is empty for a
    ``hangup_on_error`` end (the leg closes with the message's own reason,
    as without a budget) and for a drop.
    """

    end: bool
    reason: str = ""


DROP = Decision(False)
HANGUP_ON_ERROR = Decision(True)


class FaultCounter:
    """The malformed messages of one call (see the module docstring)."""

    __slots__ = ("budget", "total", "_recent")

    def __init__(self, budget: FaultBudget) -> None:
        self.budget = budget
        self.total = 0
        self._recent: deque[float] = deque(maxlen=budget.max_faults + 1)

    def fault(self, now: float) -> Decision:
        """One malformed message at ``now``: end the call, or drop the message and go on."""
        self.total += 1
        b = self.budget
        if b.hangup_on_error:
            return HANGUP_ON_ERROR
        recent = self._recent
        recent.append(now)
        if len(recent) > b.max_faults and now - recent[0] < b.window_s:
            return Decision(True, f"fault budget exceeded: {len(recent)} malformed messages in {b.window_s:g} s")
        return DROP

    def recent(self, now: float) -> int:
        """How many of the kept faults are less than ``window_s`` old at ``now`` (at most max_faults + 1)."""
        horizon = now - self.budget.window_s
        return sum(1 for t in self._recent if t > horizon)

    @property
    def kept(self) -> int:
        """How many timestamps the counter holds (bounded by ``max_faults + 1``)."""
        return len(self._recent)
