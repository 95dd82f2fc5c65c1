"""The trace of one engine's calls: one event per settled or held call.

Owns :class:`CallTrace`, which the engine and its runner hold: a call is
traced when it is answered (planning, admission, a run), or held by a
speculation. The events themselves are :func:`brisvox.agent.tool_engine.events.emit`.

Invariants:

* Each settled call emits one DEBUG ``tool call settled`` event on the
  ``brisvox.tools`` logger (session, epoch, call id, tool, outcome, duration,
  retries); the duration runs from the call's start in its run (0 when it
  never started).
* Arguments are never logged (nor results).
"""

from __future__ import annotations

from collections.abc import Iterable

from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.state import _Item
from brisvox.clock import Clock


class CallTrace:
    """The settle and hold events of one session's calls."""

    __slots__ = ("_session", "_clock")

    def __init__(self, session: str, clock: Clock) -> None:
        self._session = session
        self._clock = clock

    def settled(self, epoch: int, it: _Item) -> None:
        dur = 0
        if it.t0 is not None:
            dur = int(round((self._clock.now() - it.t0) * 1e6))
        ev.emit("tool call settled", self._session, epoch, it.call_id, it.tool, it.outcome, dur, it.retries)

    def answered(self, epoch: int, items: Iterable[_Item]) -> None:
        """A settle event for each item that has its answer, in order."""
        for it in items:
            if it.msg is not None:
                self.settled(epoch, it)

    def held(self, epoch: int, items: Iterable[_Item]) -> None:
        """A hold event for each item a speculation holds, in order."""
        for it in items:
            if it.held:
                ev.emit("tool call held", self._session, epoch, it.call_id, it.tool, ev.HELD, 0, it.retries)
