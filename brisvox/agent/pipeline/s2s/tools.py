"""Tool calls of a speech-to-speech session, through the call's ToolEngine; the history a new session replays.

Owns the tool phase of the S2S stage (:class:`S2sTools`) and
:func:`history_items` (the context as :class:`S2sItem` rows):

* One tool phase at a time, on a helper task of the stage: the completed
  response's calls are assembled like an LLM response's
  (:class:`~brisvox.agent.conversation.assemble.ResponseAssembler`: internal
  ids ``t<epoch>.<n>``, the provider's call id kept as ``provider_id``, bad
  JSON answered as an invalid call, never run), the assistant message (the
  round's transcript and its calls) goes into the context, the engine runs
  them (``execute``: validation, retry budget, idempotency, ``already_done``,
  the confirmation gate), the results go into the context and to the provider
  in call order, then one ``create_response``.
* The confirmation gate hears of every speech start
  (``note_user_speech_started``: speech that was going on when a request was
  made is not its reply) and every user turn (``note_user_turn``).
* A barge-in (:meth:`cut`) cancels the tool phase of every cut epoch: the
  execution is discarded (its SideEffect results become late notes, exactly
  once), the open calls are closed ``interrupted`` in the context and on the
  provider's side (so both conversations stay valid), and nothing is asked of
  the model. Late notes enter the context (and reach the provider as a note)
  when no call is open.
* Provider withdrawals (``S2sToolCancelled``) cancel the phase of those calls
  the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from brisvox.agent.conversation.assemble import ResponseAssembler
from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.pipeline.s2s import machine as M
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import CancelToken
from brisvox.providers.base import ProviderError
from brisvox.providers.s2s.base import S2sItem, S2sTool, S2sToolResult

if TYPE_CHECKING:
    from brisvox.agent.pipeline.s2s.stage import S2sStage

log = logging.getLogger("brisvox.agent.s2s")


@dataclass(slots=True)
class _Phase:
    epoch: int
    response_id: str
    provider_ids: tuple[str, ...]
    token: CancelToken
    task: asyncio.Task[Any] | None = None


class S2sTools:
    def __init__(self, stage: S2sStage, engine: ToolEngine | None) -> None:
        self.stage = stage
        self.engine = engine
        self.phase: _Phase | None = None
        self.queue: list[M.RunTools] = []
        self.phases = 0
        self.calls = 0
        self.cut_phases = 0
        self.withdrawn = 0
        self.late_notes = 0
        self.no_engine = 0
        self.records: list[dict[str, Any]] = []
        # (epoch, call id, tool, outcome) of each call run, as recorded: the call's tool.called webhook
        self.on_outcome: Callable[[int, str, str, str], None] | None = None

    # -- what the model is told -----------------------------------------------------------
    def specs(self) -> tuple[S2sTool, ...]:
        if self.engine is None:
            return ()
        return tuple(S2sTool(s.name, s.description, s.parameters) for s in self.engine.registry.specs())

    # -- the confirmation gate -------------------------------------------------------------
    def note_speech_started(self) -> None:
        if self.engine is not None:
            self.engine.note_user_speech_started()

    def note_user_turn(self) -> None:
        if self.engine is not None:
            self.engine.note_user_turn()

    def clear_confirmations(self) -> None:
        if self.engine is not None:
            self.engine.clear_confirmations()

    # -- phases ---------------------------------------------------------------------------------
    def run(self, a: M.RunTools) -> None:
        if self.phase is not None and self.phase.task is not None and not self.phase.task.done():
            self.queue.append(a)  # a second response's calls wait for the first phase
            return
        self._start(a)

    def _start(self, a: M.RunTools) -> None:
        st = self.stage
        phase = _Phase(a.epoch, a.response_id, tuple(c.call_id for c in a.calls), CancelToken())
        self.phase = phase
        phase.task = st.tasks.spawn(self._phase(a, phase), f"{st.name}:tools", stage=st.name)

    async def _phase(self, a: M.RunTools, phase: _Phase) -> None:
        try:
            await self._run_phase(a, phase)
        finally:
            if self.phase is phase:
                self.phase = None
                self._next()

    async def _run_phase(self, a: M.RunTools, phase: _Phase) -> None:
        st = self.stage
        ctx = st.ctx
        self.phases += 1
        asm = ResponseAssembler()
        for i, c in enumerate(a.calls):
            asm.push_tool_call(i, c.call_id, c.name, c.arguments)
        async with st._ctx_lock:
            calls = asm.finish(a.epoch, ctx).calls
            recorded = tuple(c if isinstance(c, ToolCall) else c.recorded_call() for c in calls)
            st._commit_round(a.epoch, a.round, recorded)
        self.calls += len(calls)
        t0 = st.clock.now()
        if self.engine is None:
            self.no_engine += 1
            results = [ToolMessage(c.id, '{"error":"no_tools","detail":"this agent has no tools"}', True)
                       for c in recorded]
            async with st._ctx_lock:
                ctx.extend(results)
        else:
            execution = await self.engine.execute(calls, a.epoch, phase.token)
            if phase.token.cancelled:
                execution.discard()
                return  # cut: join_cut() closes the calls on both sides
            async with st._ctx_lock:
                execution.append_to(ctx)
                st.flush_pending_user()
            results = list(execution.results)
        dur = round((st.clock.now() - t0) * 1000.0, 1)
        for tc, r in zip(recorded, results, strict=False):
            outcome = _outcome(r)
            self.records.append({"epoch": a.epoch, "call_id": tc.id, "name": tc.name,
                                 "outcome": outcome, "duration_ms": dur})
            if self.on_outcome is not None:
                try:
                    self.on_outcome(a.epoch, tc.id, tc.name, outcome)
                except Exception:  # noqa: BLE001 - a webhook's producer never fails the tool phase
                    log.exception("call %s: the tool outcome hook failed", st.call.call_id)
        del self.records[:-256]
        s = st.session
        if s is None or phase.token.cancelled:
            await st._feed(M.ToolsDone(a.response_id, continued=False), from_reader=True)
            return
        out = [S2sToolResult(tc.provider_id or tc.id, tc.name, r.content) for tc, r in zip(recorded, results,
                                                                                         strict=False)]
        try:
            async with asyncio.timeout(st.cfg.send_timeout * 2):
                await s.send_tool_results(out, st.cfg.send_timeout)
                await st._feed(M.ToolsDone(a.response_id), from_reader=True)
                await s.create_response(st.cfg.send_timeout)
        except (ProviderError, TimeoutError) as e:
            log.warning("call %s: tool results not delivered to the S2S provider: %s", st.call.call_id, e)
            await st._feed(M.ToolsDone(a.response_id, continued=False), from_reader=True)

    def _next(self) -> None:
        while self.queue:
            a = self.queue.pop(0)
            if a.epoch >= self.stage.machine.floor:
                self._start(a)
                return

    def cut(self, floor: int) -> None:
        """A barge-in made every epoch below ``floor`` dead: end their tool phases."""
        self.queue = [a for a in self.queue if a.epoch >= floor]
        p = self.phase
        if p is not None and p.epoch < floor:
            self.cut_phases += 1
            p.token.cancel()

    def cancel_calls(self, call_ids: Sequence[str]) -> None:
        p = self.phase
        if p is not None and set(call_ids) & set(p.provider_ids):
            self.withdrawn += 1
            p.token.cancel()

    async def join_cut(self) -> None:
        """Wait (bounded) for a cancelled phase to end, then close its open calls on both sides."""
        p = self.phase
        if p is not None and p.task is not None and p.token.cancelled:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(p.task), 1.0)
            if not p.task.done():
                p.task.cancel()
            self.phase = None
        st = self.stage
        async with st._ctx_lock:
            opened = st.ctx.open_tool_calls()
            st.ctx.interrupt_pending_tool_calls()
            closed = [m for m in st.ctx.messages[-len(opened):] if isinstance(m, ToolMessage)] if opened else []
            notes = self._take_notes()
        s = st.session
        if s is None:
            return
        if closed:
            answers = [S2sToolResult(c.provider_id or c.id, c.name, m.content) for c, m in zip(opened, closed,
                                                                                               strict=False)]
            with contextlib.suppress(ProviderError, TimeoutError):
                async with asyncio.timeout(st.cfg.send_timeout):
                    await s.send_tool_results(answers, st.cfg.send_timeout)
        await self._send_notes(notes)

    async def deliver_notes(self) -> None:
        """Late notes into the context and to the provider (a new turn: no call is open)."""
        async with self.stage._ctx_lock:
            notes = self._take_notes()
        await self._send_notes(notes)

    async def _send_notes(self, notes: list[str]) -> None:
        s = self.stage.session
        for n in notes:
            if s is None:
                return
            with contextlib.suppress(ProviderError, TimeoutError):
                async with asyncio.timeout(self.stage.cfg.send_timeout):
                    await s.send_note(n, self.stage.cfg.send_timeout)

    def _take_notes(self) -> list[str]:
        if self.engine is None or self.stage.ctx.has_open_tool_calls():
            return []
        notes = self.engine.take_late_notes()
        for n in notes:
            self.stage.ctx.push(n)
        self.late_notes += len(notes)
        return [n.content for n in notes]

    async def stop(self) -> None:
        p = self.phase
        self.queue.clear()
        if p is not None and p.task is not None and not p.task.done():
            p.token.cancel()
            p.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(p.task, 1.0)
        self.phase = None
        with contextlib.suppress(Exception):
            self.stage.ctx.interrupt_pending_tool_calls()

    def stats(self) -> dict[str, int]:
        return {"tool_phases": self.phases, "tool_calls": self.calls, "tool_phases_cut": self.cut_phases,
                "tool_phases_withdrawn": self.withdrawn, "late_notes": self.late_notes,
                "tool_calls_without_engine": self.no_engine}


def _outcome(r: ToolMessage) -> str:
    if not r.is_error:
        return "ok"
    try:
        body = orjson.loads(r.content)
    except orjson.JSONDecodeError:
        return "error"
    return str(body.get("error", "error")) if isinstance(body, dict) else "error"


def history_items(ctx: Context) -> tuple[S2sItem, ...]:
    """The conversation so far, as a new session replays it (system notes as bracketed user text)."""
    items: list[S2sItem] = []
    names: dict[str, str] = {}
    for m in ctx:
        match m:
            case UserMessage():
                items.append(S2sItem("user", m.content))
            case SystemMessage():
                items.append(S2sItem("user", f"[note] {m.content}"))
            case AssistantMessage():
                if m.text.strip():
                    items.append(S2sItem("assistant", m.text))
                for c in m.tool_calls:
                    names[c.id] = c.name
                    items.append(S2sItem("tool_call", call_id=c.id, name=c.name,
                                         arguments=orjson.dumps(c.arguments).decode()))
            case ToolMessage():
                items.append(S2sItem("tool_result", call_id=m.call_id, name=names.get(m.call_id, ""),
                                     output=m.content))
    return tuple(items)
