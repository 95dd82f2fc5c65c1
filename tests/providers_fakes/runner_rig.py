"""The LlmRunner on its own, over any LlmProvider: the rig of the tool scenarios S1-S6.

Owns a runner wired the way the call actor wires it (a CallContext: PlayoutBook,
Timeline, EpochWatch, TaskOwner; a ToolEngine over a registry) with a collecting sink
stage downstream and an upstream inbox, plus the scenario tools: each records
when it started and finished (on the loop clock) and how often it ran.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from brisvox.agent.conversation.request import RequestConfig
from brisvox.agent.pipeline.llm.policy import LlmRunnerConfig
from brisvox.agent.pipeline.llm.runner import LlmRunner
from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    BotEnded,
    BotStarted,
    Interrupt,
    LlmResponseEnded,
    LlmText,
    PipelineFrame,
    Start,
    Stop,
    UserTurnEnded,
)
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.agent.tool_engine.registry import ToolContext, ToolKind, ToolRegistry, ToolSpec
from brisvox.clock import CLOCK
from brisvox.providers.base import LlmProvider, ProviderTimeouts


class Sink(Stage):
    def __init__(self, call: CallContext) -> None:
        super().__init__(call, None, Inbox("sink", 1024, sys_cap=64))
        self.frames: list[PipelineFrame] = []
        self.ended: dict[int, asyncio.Event] = {}

    async def process(self, frame: PipelineFrame) -> None:
        self.frames.append(frame)
        if isinstance(frame, LlmResponseEnded):
            self.ended.setdefault(frame.epoch, asyncio.Event()).set()

    def text(self, epoch: int) -> str:
        return "".join(f.text for f in self.frames if isinstance(f, LlmText) and f.epoch == epoch)

    def round_texts(self, epoch: int) -> dict[int, str]:
        out: dict[int, str] = {}
        for f in self.frames:
            if isinstance(f, LlmText) and f.epoch == epoch:
                out[f.round] = out.get(f.round, "") + f.text
        return out


@dataclass
class ToolLog:
    runs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    started: list[tuple[str, float]] = field(default_factory=list)
    finished: list[tuple[str, float]] = field(default_factory=list)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.runs if n == name)


WEATHER = {"Paris": 18, "Rome": 24, "Izmir": 27, "Ankara": 21}


def scenario_registry(log: ToolLog, *, weather_delay: float = 0.15, booking_delay: float = 0.1) -> ToolRegistry:
    reg = ToolRegistry()

    def tool(name: str, delay: float, fn: Any) -> Any:
        async def run(args: dict[str, Any], ctx: ToolContext) -> Any:
            log.runs.append((name, args))
            log.started.append((name, CLOCK.now()))
            await CLOCK.sleep(delay)
            log.finished.append((name, CLOCK.now()))
            return fn(args)

        return run

    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": False}
    reg.register(ToolSpec("get_weather", "Current weather of a city.", city, ToolKind.READ_ONLY, timeout=5.0,
                          filler_after=0.2),
                 tool("get_weather", weather_delay, lambda a: {"city": a["city"], "temp": WEATHER.get(a["city"], 20)}))
    reg.register(ToolSpec("get_customer", "The caller's customer record.", {"type": "object"}, ToolKind.READ_ONLY),
                 tool("get_customer", 0.02, lambda a: {"name": "Kaya", "country": "Turkey"}))
    reg.register(ToolSpec("get_capital", "Capital of a country.",
                          {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]},
                          ToolKind.READ_ONLY),
                 tool("get_capital", 0.02, lambda a: {"capital": "Ankara" if a["country"] == "Turkey" else "?"}))
    reg.register(ToolSpec("get_forecast", "Forecast for up to 7 days.",
                          {"type": "object", "properties": {"city": {"type": "string"},
                                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                           "required": ["city", "days"], "additionalProperties": False},
                          ToolKind.READ_ONLY),
                 tool("get_forecast", 0.02, lambda a: {"city": a["city"], "days": a["days"], "forecast": "sunny"}))
    counter = {"n": 1000}

    def book(a: dict[str, Any]) -> Any:
        counter["n"] += 1
        return {"booking": f"BK-{counter['n']}", "name": a.get("name"), "time": a.get("time")}

    reg.register(ToolSpec("book_table", "Book a table.",
                          {"type": "object", "properties": {"name": {"type": "string"}, "time": {"type": "string"},
                                                            "people": {"type": "integer"}},
                           "required": ["name", "time", "people"]},
                          ToolKind.SIDE_EFFECT, timeout=5.0, filler_after=None),
                 tool("book_table", booking_delay, book))
    return reg


class Rig:
    def __init__(self, provider: LlmProvider, registry: ToolRegistry, *, filler: FillerConfig | None = None,
                 filler_phrases: tuple[str, ...] = ("One moment, please.",),
                 timeouts: ProviderTimeouts | None = None, speculation: SpeculationConfig | None = None,
                 request: RequestConfig | None = None) -> None:
        self.call = CallContext.detached("rig", call_rate=8000, tts_rate=24000, clock=CLOCK)
        self.tasks = self.call.tasks
        self.watch = self.call.watch
        self.book = self.call.book
        self.timeline = self.call.timeline
        self.upstream = Inbox("upstream", 64, sys_cap=64)
        self.call.upstream.bind((BotStarted, BotEnded), self.upstream)
        self.engine = ToolEngine(registry, "sess-rig", CLOCK)
        cfg = LlmRunnerConfig(system_prompt="You are a test agent.", filler=filler or FillerConfig(enabled=False),
                              filler_phrases=filler_phrases, timeouts=timeouts or ProviderTimeouts(),
                              speculation=speculation or SpeculationConfig(), request=request or RequestConfig())
        self.runner = LlmRunner(self.call, cfg, Inbox("llm", 32, sys_cap=32), provider, engine=self.engine)
        self.sink = Sink(self.call)
        self.runner.pipe(self.sink)
        self.snapshot: list[Any] = []

    async def __aenter__(self) -> Rig:
        self.runner.start()
        self.sink.start()
        self.runner.inbox.put_nowait(Start())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.runner.inbox.put_nowait(Stop("test"))
        t = self.runner.task
        if t is not None:
            await asyncio.wait([t], timeout=3.0)
        await self.engine.aclose()
        await self.tasks.close()

    async def turn(self, epoch: int, text: str, timeout: float = 10.0) -> str:  # noqa: ASYNC109
        ev = self.sink.ended.setdefault(epoch, asyncio.Event())
        self.runner.inbox.put_nowait(UserTurnEnded(epoch, text, CLOCK.now()))
        await asyncio.wait_for(ev.wait(), timeout)
        self.snapshot = list(self.runner.ctx.messages)  # before a hang-up's played-text cut
        return self.sink.text(epoch)

    def start_turn(self, epoch: int, text: str) -> None:
        self.sink.ended.setdefault(epoch, asyncio.Event())
        self.runner.inbox.put_nowait(UserTurnEnded(epoch, text, CLOCK.now()))

    def barge_in(self, new_epoch: int, old_epoch: int) -> None:
        self.watch.bump(new_epoch)
        self.runner.inbox.put_nowait(Interrupt(new_epoch, old_epoch, CLOCK.now()))
