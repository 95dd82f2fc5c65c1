"""The tool phase of an LLM runner's turn: how a round's calls are run and answered.

Owns :class:`ToolPhase` (one per runner with a tool engine) and :func:`unrun_answers`.
The runner's module docstring states the tool loop's rules; here:

* :meth:`ToolPhase.execute` runs a round's calls through the ToolEngine (or a committed
  speculation's held ones: ``turn.tools_from``, taken once) raced against the filler
  delay of the :class:`~brisvox.agent.tool_engine.filler.FillerPolicy`; when the tools are
  slow it has ONE filler spoken through the :class:`FillerVoice` (its own round, a clip
  round when ``clips``: the TTS stage plays its pre-rendered audio once it has it). The
  caller flushed the round's text before. A cancelled phase discards a finished
  execution undelivered (its SideEffect results become late notes) or cancels the
  running one, records every call ``interrupted`` and re-raises.
* Every call's outcome is recorded once (:attr:`ToolPhase.records`, the call record's
  ``tools``: at most 4096, never the arguments) and told to the observer, if any.
* :func:`unrun_answers`: the structured error results of calls that will not run (the
  tool-round limit, no tool engine), in issue order.
* Counts into the runner's :class:`~brisvox.agent.pipeline.llm.policy.RunnerStats`:
  ``fillers``, ``tool_calls``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import ToolCall, ToolMessage
from brisvox.agent.pipeline.llm.observer import CallObserver
from brisvox.agent.pipeline.llm.policy import RunnerStats, ToolRecord
from brisvox.agent.pipeline.llm.turn import Turn
from brisvox.agent.tool_engine.delivery import Execution
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.filler import FillerPolicy
from brisvox.clock import Clock

MAX_RECORDS = 4096


class FillerVoice(Protocol):
    """Speaks a filler while the tools run (the runner: its own round, pending for the context)."""

    async def speak_filler(self, turn: Turn, text: str, clip: bool) -> None: ...


def call_name(call: Any) -> str:
    """A call's tool name for its answer and its record (an invalid call may have none)."""
    return call.name if isinstance(call, ToolCall) else (call.name or "unknown_tool")


def unrun_answers(calls: Sequence[Any], kind: str) -> list[ToolMessage]:
    """The error results of ``calls`` that will not run in this turn, in issue order."""
    return [ToolMessage(c.id, te.error_body(kind, call_name(c), "no more tool calls run in this turn"), True)
            for c in calls]


class ToolPhase:
    """Runs and records a round's calls (see the module docstring)."""

    def __init__(self, engine: ToolEngine, filler: FillerPolicy, *, clips: bool, clock: Clock,
                 st: RunnerStats) -> None:
        self.engine = engine
        self.filler = filler
        self.clips = clips  # fillers are clip rounds (FillerConfig.clips)
        self.clock = clock
        self.st = st
        self.records: list[ToolRecord] = []

    async def execute(self, turn: Turn, calls: list[Any], voice: FillerVoice,
                      observer: CallObserver | None) -> Execution:
        engine = self.engine
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
                        await voice.speak_filler(turn, choice.text, self.clips)
            execution = await exec_task
        except asyncio.CancelledError:
            if exec_task.done() and not exec_task.cancelled() and exec_task.exception() is None:
                exec_task.result().discard()
            else:
                exec_task.cancel()
            dur = (self.clock.now() - t0) * 1000.0
            for c in calls:
                self._record(turn.epoch, c, None, dur, observer)
            raise
        dur = (self.clock.now() - t0) * 1000.0
        self.st.tool_calls += len(calls)
        for c, res in zip(calls, execution.results, strict=False):
            self._record(turn.epoch, c, res, dur, observer)
        return execution

    def _record(self, epoch: int, call: Any, res: ToolMessage | None, dur_ms: float,
                observer: CallObserver | None) -> None:
        outcome = "ok"
        if res is None:
            outcome = "interrupted"
        elif res.is_error:
            try:
                body = orjson.loads(res.content)
                outcome = str(body.get("error", "error")) if isinstance(body, dict) else "error"
            except orjson.JSONDecodeError:
                outcome = "error"
        name = call_name(call)
        if len(self.records) < MAX_RECORDS:
            self.records.append(ToolRecord(epoch, call.id, name, outcome, round(dur_ms, 1), self.clock.now()))
        if observer is not None:
            observer.on_tool_outcome(epoch, call.id, name, outcome)
