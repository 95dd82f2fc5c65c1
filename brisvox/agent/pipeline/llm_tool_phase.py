"""The tool phase of an LLM runner's turn (a mixin of :class:`LlmRunner`).

Owns how a round's calls are run and answered: ``_execute`` flushes the round's text, runs
the calls through the ToolEngine (or a committed speculation's held ones) raced against the
filler delay, speaks one filler as its own round when the tools are slow (a clip round: the
TTS stage plays its pre-rendered audio once it has it), and records every call's outcome
(``_record_tool``: the call record's ``tools``); ``_answer_unrun`` answers calls that will not
run (the tool-round limit) with a structured error; ``_enter_filler`` puts a spoken filler
into the context once no call is open, before the next assistant message or when the turn
is settled. The runner's module docstring states the tool loop's rules.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from brisvox.agent.conversation.context import AssistantMessage, ToolCall, ToolMessage
from brisvox.agent.pipeline.llm_policy import ToolRecord
from brisvox.agent.pipeline.llm_round import _RunnerParts, _Turn
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine.delivery import Execution


class _ToolPhase(_RunnerParts):
    @property
    def filler_clips(self) -> bool:
        """Fillers are clip rounds (played from memory once rendered): ``FillerConfig.clips``."""
        return self.cfg.filler.clips

    def _enter_filler(self, turn: _Turn) -> None:
        """A spoken filler enters the context once no call is open, and only right before the
        next assistant message (``_push_assistant``) or when the turn is settled (its end, a
        halt): never right after the tool results, where the next request would end on it
        (an assistant prefill, which Anthropic rejects). Its ``msg_index`` is set then, so
        the played-text cut reaches it like any round."""
        if turn.filler is None or self.ctx.has_open_tool_calls():
            return
        rnd, text = turn.filler
        turn.filler = None
        self._push_assistant(turn, rnd, AssistantMessage(text))

    def _answer_unrun(self, calls: list[Any], kind: str) -> None:
        for c in calls:
            name = c.name if isinstance(c, ToolCall) else (c.name or "unknown_tool")
            self.ctx.push(ToolMessage(c.id, te.error_body(kind, name, "no more tool calls run in this turn"), True))
        self._check()

    async def _execute(self, turn: _Turn, rnd: int, calls: list[Any]) -> Execution | None:
        engine = self.engine
        assert engine is not None
        await self._flush(turn, rnd)
        t0 = self.clock.now()
        spec, turn.tools_from = turn.tools_from, None
        exec_task = asyncio.ensure_future(spec.execute(engine, calls, turn.epoch, turn.token) if spec is not None
                                          else engine.execute(calls, turn.epoch, turn.token))
        try:
            plan = self.filler.plan(engine.call_specs(calls))
            if plan is not None:
                done, _ = await asyncio.wait([exec_task], timeout=plan.delay)
                if not done and not turn.token.cancelled:
                    choice = self.filler.choose(plan.tool)
                    if choice is not None:
                        self.st.fillers += 1
                        await self._speak_line(turn, choice.text, into_context=False, clip=self.filler_clips)
            execution = await exec_task
        except asyncio.CancelledError:
            if exec_task.done() and not exec_task.cancelled() and exec_task.exception() is None:
                exec_task.result().discard()
            else:
                exec_task.cancel()
            dur = (self.clock.now() - t0) * 1000.0
            for c in calls:
                self._record_tool(turn.epoch, c, None, dur)
            raise
        dur = (self.clock.now() - t0) * 1000.0
        self.st.tool_calls += len(calls)
        for c, res in zip(calls, execution.results, strict=False):
            self._record_tool(turn.epoch, c, res, dur)
        return execution

    def _record_tool(self, epoch: int, call: Any, res: ToolMessage | None, dur_ms: float) -> None:
        outcome = "ok"
        if res is None:
            outcome = "interrupted"
        elif res.is_error:
            try:
                body = orjson.loads(res.content)
                outcome = str(body.get("error", "error")) if isinstance(body, dict) else "error"
            except orjson.JSONDecodeError:
                outcome = "error"
        name = call.name if isinstance(call, ToolCall) else (call.name or "unknown_tool")
        if len(self.tool_records) < 4096:
            self.tool_records.append(ToolRecord(epoch, call.id, name, outcome, round(dur_ms, 1), self.clock.now()))
        if self.observer is not None:
            self.observer.on_tool_outcome(epoch, call.id, name, outcome)

