"""One run of a response's admitted calls, and the ReadOnly path (step 3 of a run).

Owns :class:`Runner`, which the engine holds: :meth:`Runner.run`, where every
admitted call starts in issue order (SideEffect calls synchronously, before
the first await, through :class:`~brisvox.agent.tool_engine.side_effects.SideEffects`),
all run in parallel, each traced when it settles, and a dropped run is
abandoned; and the ReadOnly path, one ReadOnly call under its timeout and the
turn's token.

Invariants:

* Calls start in issue order and their answers stay in their slots, so
  ``results`` is in issue order whatever order the calls end in.
* A ReadOnly call is cancelled by a barge-in (the turn's token), dropped at its
  timeout, and one that raises (anything but ToolError) is answered "the tool
  panicked"; its result over ``max_result_bytes`` is refused
  ``result_too_large``.
* No exception escapes a run except the caller's own cancellation
  (``asyncio.CancelledError``); then nothing of the run reaches the context:
  its record is abandoned (:meth:`Delivery.abandon
  <brisvox.agent.tool_engine.delivery.Delivery.abandon>`), SideEffect results
  it carried become late notes.
* Runs are numbered in order (a record's ``run``), one engine's runs by one runner.
"""

from __future__ import annotations

import asyncio

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import ToolMessage
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.config import (
    D_INTERRUPTED,
    D_NOT_STARTED,
    D_PANIC,
    D_TIMEOUT_RO,
    _nbytes,
    _serialize,
)
from brisvox.agent.tool_engine.delivery import Delivery, _RunRecord
from brisvox.agent.tool_engine.registry import CancelToken, ToolContext, ToolError
from brisvox.agent.tool_engine.scope import _Expired, _Interrupted, _Scope
from brisvox.agent.tool_engine.side_effects import SideEffects
from brisvox.agent.tool_engine.state import _Item
from brisvox.agent.tool_engine.trace import CallTrace
from brisvox.clock import Clock


class Runner:
    """Step 3 of a run (the invariants are the module's): runs the items it is
    given that are neither answered nor held."""

    __slots__ = ("_session", "_call_info", "_clock", "_max_result_bytes", "_side_effects", "_delivery",
                 "_trace", "_stats", "_runs")

    def __init__(self, *, session: str, call_info: CallInfo, clock: Clock, max_result_bytes: int,
                 side_effects: SideEffects, delivery: Delivery, trace: CallTrace,
                 stats: ev.ToolStats) -> None:
        self._session = session
        self._call_info = call_info
        self._clock = clock
        self._max_result_bytes = max_result_bytes
        self._side_effects = side_effects
        self._delivery = delivery
        self._trace = trace
        self._stats = stats
        self._runs = 0

    # ------------------------------------------------------------------ step 3: run
    async def run(self, items: list[_Item], epoch: int, token: CancelToken, *, scripted: bool = False) -> _RunRecord:
        """Run ``items`` (answers in their slots); the record of what the run did.
        ``scripted``: the operator's calls (no confirmation gate)."""
        self._runs += 1
        record = _RunRecord(self._runs, scripted=scripted)
        now = self._clock.now()
        waits = []
        seen_se: set[str] = set()
        for it in items:
            if it.msg is not None or it.held:
                continue
            it.t0 = now
            assert it.entry is not None and it.call is not None
            if it.entry.spec.side_effect:
                self._side_effects.start(it, epoch, token, record, seen_se, scripted=scripted)
                if it.msg is not None:
                    self._trace.settled(epoch, it)
                    continue
                waits.append(self._side_effect_slot(it, epoch, token, record))
            else:
                waits.append(self._run_read_only(it, epoch, token))
        try:
            if len(waits) == 1:
                await waits[0]
            elif waits:
                await asyncio.gather(*waits)
        except asyncio.CancelledError:
            # The execute future was dropped: nothing of this run reaches the context.
            self._delivery.abandon(record)
            raise
        return record

    async def _side_effect_slot(self, it: _Item, epoch: int, token: CancelToken, record: _RunRecord) -> None:
        try:
            await self._side_effects.wait(it, epoch, token, record)
        finally:
            if it.msg is not None:
                self._trace.settled(epoch, it)

    # -- ReadOnly
    async def _run_read_only(self, it: _Item, epoch: int, token: CancelToken) -> None:
        assert it.entry is not None and it.call is not None
        spec = it.entry.spec
        if token.cancelled:
            self._stats.not_started_cancelled += 1
            it.error(te.INTERRUPTED, D_NOT_STARTED, ev.NOT_STARTED)
            self._trace.settled(epoch, it)
            return
        ctx = ToolContext(self._session, epoch, it.call_id, token, it.tool, self._call_info)
        try:
            try:
                async with _Scope(token, spec.timeout):
                    out = await it.entry.tool(it.call.arguments, ctx)
            except _Expired:
                it.error(te.TIMEOUT, D_TIMEOUT_RO.format(t=spec.timeout), ev.TIMED_OUT)
                return
            except _Interrupted:
                self._stats.read_only_cancelled += 1
                it.error(te.INTERRUPTED, D_INTERRUPTED, ev.INTERRUPTED)
                return
            except ToolError as e:
                it.error(te.TOOL_FAILED, e.message, ev.FAILED)
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling() == 0:  # raised by the tool, not a cancellation
                    it.error(te.TOOL_FAILED, D_PANIC, ev.FAILED)
                    return
                self._stats.read_only_cancelled += 1
                raise
            except Exception:  # a panicking tool never unwinds into the caller
                it.error(te.TOOL_FAILED, D_PANIC, ev.FAILED)
                return
            try:
                text = _serialize(out)
            except (TypeError, orjson.JSONEncodeError):
                it.error(te.TOOL_FAILED, "the tool returned a value that is not JSON", ev.FAILED)
                return
            limit = self._max_result_bytes
            n = _nbytes(text) if len(text) * 4 > limit else len(text)
            if n > limit:
                it.error(te.RESULT_TOO_LARGE, f"the result is {n} bytes, over the limit of {limit} bytes",
                         ev.RESULT_TOO_LARGE)
                return
            it.answer(ToolMessage(it.call_id, text, False), ev.OK)
        finally:
            if it.msg is not None:
                self._trace.settled(epoch, it)
