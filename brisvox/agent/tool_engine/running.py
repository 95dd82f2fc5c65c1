"""One run of a response's admitted calls, and the ReadOnly path (step 3 of a run).

Owns :meth:`_Running._run`: every admitted call starts in issue order
(SideEffect calls synchronously, before the first await), all run in
parallel, and a dropped run is abandoned; and :meth:`_Running._run_read_only`,
one ReadOnly call under its timeout and the turn's token.

Invariants:

* Calls start in issue order and their answers stay in their slots, so
  ``results`` is in issue order whatever order the calls end in.
* A ReadOnly call is cancelled by a barge-in (the turn's token), dropped at its
  timeout, and one that raises (anything but ToolError) is answered "the tool
  panicked"; its result over ``max_result_bytes`` is refused
  ``result_too_large``.
* No exception escapes a run except the caller's own cancellation
  (``asyncio.CancelledError``); then nothing of the run reaches the context:
  its record is abandoned (:meth:`_Delivery._abandon
  <brisvox.agent.tool_engine.delivery._Delivery._abandon>`), SideEffect results
  it carried become late notes.
"""

from __future__ import annotations

import asyncio

import orjson

from brisvox.agent.conversation.context import ToolMessage
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.config import (
    D_INTERRUPTED,
    D_NOT_STARTED,
    D_PANIC,
    D_TIMEOUT_RO,
    _nbytes,
    _serialize,
)
from brisvox.agent.tool_engine.delivery import _RunRecord
from brisvox.agent.tool_engine.registry import CancelToken, ToolContext, ToolError
from brisvox.agent.tool_engine.scope import _Expired, _Interrupted, _Scope
from brisvox.agent.tool_engine.side_effects import _SideEffects
from brisvox.agent.tool_engine.state import _Item


class _Running(_SideEffects):
    """Step 3 of a run (a part of :class:`ToolEngine`)."""

    _runs: int

    # ------------------------------------------------------------------ step 3: run
    async def _run(self, items: list[_Item], epoch: int, token: CancelToken) -> _RunRecord:
        self._runs += 1
        record = _RunRecord(self._runs)
        now = self.clock.now()
        waits = []
        seen_se: set[str] = set()
        for it in items:
            if it.msg is not None or it.held:
                continue
            it.t0 = now
            assert it.entry is not None and it.call is not None
            if it.entry.spec.side_effect:
                self._start_side_effect(it, epoch, token, record, seen_se)
                if it.msg is not None:
                    self._settled(epoch, it)
                    continue
                waits.append(self._await_side_effect(it, epoch, token, record))
            else:
                waits.append(self._run_read_only(it, epoch, token))
        try:
            if len(waits) == 1:
                await waits[0]
            elif waits:
                await asyncio.gather(*waits)
        except asyncio.CancelledError:
            # The execute future was dropped: nothing of this run reaches the context.
            self._abandon(record)
            raise
        return record

    # -- ReadOnly
    async def _run_read_only(self, it: _Item, epoch: int, token: CancelToken) -> None:
        assert it.entry is not None and it.call is not None
        spec = it.entry.spec
        if token.cancelled:
            self._stats.not_started_cancelled += 1
            it.error(te.INTERRUPTED, D_NOT_STARTED, ev.NOT_STARTED)
            self._settled(epoch, it)
            return
        ctx = ToolContext(self.session, epoch, it.call_id, token, it.tool, self.call_info)
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
            limit = self.config.max_result_bytes
            n = _nbytes(text) if len(text) * 4 > limit else len(text)
            if n > limit:
                it.error(te.RESULT_TOO_LARGE, f"the result is {n} bytes, over the limit of {limit} bytes",
                         ev.RESULT_TOO_LARGE)
                return
            it.answer(ToolMessage(it.call_id, text, False), ev.OK)
        finally:
            if it.msg is not None:
                self._settled(epoch, it)
