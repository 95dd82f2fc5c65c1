"""The LlmRunner with a budgeted request window and a scripted summarizer, on virtual time.

Owns what the window and summarizer tests share: :class:`WindowRig` (a runner wired
as the call actor wires it, its window and summary configured, a collecting sink),
:class:`SummaryLlm` (a summarizer that answers after a delay, hangs, fails, or answers
too large; each summary names the turns it covers, ``turn <n>`` tags), a tool that
returns large results, a scripted agent LLM that calls it and then answers (every
request recorded with its size and time) and :func:`as_context` (a built request
read back as a Context, to check it with ``Context.validate``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.conversation.request import RequestConfig, WindowConfig, request_tokens
from brisvox.agent.pipeline.llm.policy import LlmRunnerConfig
from brisvox.agent.pipeline.llm.runner import LlmRunner
from brisvox.agent.pipeline.llm.summarizer import SummaryConfig
from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import BotEnded, BotStarted, Stop, UserTurnEnded
from brisvox.agent.tool_engine.config import EngineConfig
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.agent.tool_engine.registry import ToolContext, ToolKind, ToolRegistry, ToolSpec
from brisvox.clock import CLOCK
from brisvox.providers.base import Done, LlmError, LlmEvent, LlmProvider, LlmRequest, TextDelta
from brisvox.providers.seeded_fakes import Call, FakeLlm, LlmScript, Say
from tests.providers_fakes.runner_rig import Sink

TAG = re.compile(r"turn (\d+)\b")


def as_context(req: LlmRequest) -> Context:
    """The request's messages as a Context (the converse of the request conversion)."""
    out: list[Message] = []
    for m in req.messages:
        if m.role == "system":
            out.append(SystemMessage(m.text))
        elif m.role == "user":
            out.append(UserMessage(m.text))
        elif m.role == "assistant":
            calls = tuple(ToolCall(c.id, c.name, orjson.loads(c.arguments), c.provider_id or None)
                          for c in m.tool_calls)
            out.append(AssistantMessage(m.text, calls))
        else:
            out.append(ToolMessage(m.call_id, m.text, m.is_error))
    return Context(out)


def lookup_registry(result_bytes: int = 16_000, delay: float = 0.05) -> ToolRegistry:
    """One ReadOnly tool, ``lookup``, whose result is about ``result_bytes`` of JSON
    (``kb`` in the arguments: that many KB instead)."""
    reg = ToolRegistry()

    async def lookup(args: dict[str, Any], ctx: ToolContext) -> Any:
        await CLOCK.sleep(delay)
        q = args.get("q", 0)
        size = int(args.get("kb", 0)) * 1000 or result_bytes
        return {"q": q, "rows": f"row {q} " + "r" * max(0, size - 40)}

    params = {"type": "object", "properties": {"q": {"type": "integer"}, "kb": {"type": "integer"}}}
    reg.register(ToolSpec("lookup", "Look records up.", params, ToolKind.READ_ONLY, timeout=5.0), lookup)
    return reg


@dataclass
class Seen:
    """One request of the agent LLM: when it left, its size, its windowed user turns and
    the summary it carried (or None)."""

    at: float
    tokens: int
    turns: list[int]
    summary: str | None
    request: LlmRequest


@dataclass
class AgentScript:
    """The agent LLM's behaviour: a user message ``... report ...`` makes 12 lookups of
    ``report_kb`` KB each, ``... lookup ...`` one, anything else (and every tool result) a
    short answer."""

    report_kb: int = 60

    seen: list[Seen] = field(default_factory=list)

    def __call__(self, req: LlmRequest) -> LlmScript:
        summary = next((m.text for m in req.messages[1:2] if m.role == "system"), None)
        turns = [int(t) for m in req.messages if m.role == "user" for t in TAG.findall(m.text)]
        self.seen.append(Seen(CLOCK.now(), request_tokens(req), turns, summary, req))
        last = req.messages[-1]
        if last.role == "user" and "report" in last.text:
            return LlmScript(tuple(Call("lookup", {"q": i, "kb": self.report_kb}) for i in range(12)), ttft=0.3)
        if last.role == "user" and "lookup" in last.text:
            return LlmScript((Call("lookup", {"q": 1}),), ttft=0.3)
        return LlmScript((Say("Here is what I found for you."),), ttft=0.3)


class SummaryLlm:
    """A summarizer: ``mode`` "ok" (answers after ``delay`` with ``turn <n>`` tags of every
    turn it saw, the previous summary included), "hang" (never answers), "fail" (an error
    after ``delay``), "huge" (``huge_after`` good answers, then ``size`` bytes)."""

    name = "summary-fake"

    def __init__(self, mode: str = "ok", delay: float = 1.0, *, huge_after: int = 0, size: int = 40_000) -> None:
        self.mode = mode
        self.delay = delay
        self.huge_after = huge_after
        self.size = size
        self.calls: list[float] = []
        self.answers: list[str] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        pass

    def stream(self, request: LlmRequest) -> Any:
        self.calls.append(CLOCK.now())
        return self._run(request, len(self.calls))

    async def _run(self, request: LlmRequest, n: int) -> AsyncIterator[LlmEvent]:
        if self.mode == "hang":
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay)
        if self.mode == "fail":
            yield LlmError("server", "scripted summarizer failure")
            return
        if self.mode == "huge" and n > self.huge_after:
            text = ("word " * (self.size // 5 + 1))[: self.size]
        else:
            tags = sorted({int(t) for t in TAG.findall(request.messages[-1].text)})
            text = "The caller spoke about " + ", ".join(f"turn {t}" for t in tags) + "."
        self.answers.append(text)
        yield TextDelta(text)
        yield Done()


class WindowRig:
    def __init__(self, llm: LlmProvider, registry: ToolRegistry, *, window: WindowConfig,
                 summary_llm: LlmProvider | None = None, summary: SummaryConfig | None = None) -> None:
        self.call = CallContext.detached("window", clock=CLOCK)
        self.tasks = self.call.tasks
        self.upstream = Inbox("upstream", 64, sys_cap=64)
        self.call.upstream.bind((BotStarted, BotEnded), self.upstream)
        self.engine = ToolEngine(registry, "sess-window", CLOCK, config=EngineConfig(max_result_bytes=64 * 1024))
        cfg = LlmRunnerConfig(system_prompt="You are a test agent.", filler=FillerConfig(enabled=False),
                              request=RequestConfig(window=window), summary=summary or SummaryConfig())
        self.runner = LlmRunner(self.call, cfg, Inbox("llm", 32, sys_cap=32), llm, engine=self.engine,
                                summary_llm=summary_llm)
        self.sink = Sink(self.call)
        self.runner.pipe(self.sink)
        self.turn_ends: dict[int, float] = {}

    async def __aenter__(self) -> WindowRig:
        self.runner.start()
        self.sink.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.runner.inbox.put_nowait(Stop("test"))
        t = self.runner.task
        if t is not None:
            await asyncio.wait([t], timeout=3.0)
        await self.engine.aclose()
        await self.tasks.close()

    async def turn(self, epoch: int, text: str, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        ev = self.sink.ended.setdefault(epoch, asyncio.Event())
        self.turn_ends[epoch] = CLOCK.now()
        self.runner.inbox.put_nowait(UserTurnEnded(epoch, text, CLOCK.now()))
        await asyncio.wait_for(ev.wait(), timeout)


def agent_llm(script: AgentScript) -> FakeLlm:
    return FakeLlm([], seed=7, default=script)


async def run_call(rig: WindowRig, turns: int, *, every: float, text: Any) -> None:
    """``turns`` user turns, one every ``every`` seconds (``text(i)``: the user's words)."""
    t0 = CLOCK.now()
    for i in range(1, turns + 1):
        await rig.turn(i, text(i))
        await CLOCK.sleep_until(t0 + i * every)
