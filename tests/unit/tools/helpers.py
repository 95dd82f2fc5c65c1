"""Shared pieces of the tool-engine tests: tools that count, a scripted conversation."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from brisvox.agent.conversation.assemble import ResponseAssembler
from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.tool_engine.config import EngineConfig
from brisvox.agent.tool_engine.delivery import Execution
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import (
    CancelToken,
    ToolContext,
    ToolError,
    ToolKind,
    ToolRegistry,
    ToolSpec,
)
from brisvox.clock import CLOCK

RO = ToolKind.READ_ONLY
SE = ToolKind.SIDE_EFFECT

OBJ = {"type": "object"}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
    "additionalProperties": False,
}


def body(msg: ToolMessage) -> dict[str, Any]:
    return orjson.loads(msg.content)


def kind(msg: ToolMessage) -> str | None:
    if not msg.is_error:
        try:
            b = orjson.loads(msg.content)
        except orjson.JSONDecodeError:
            return None
        return b.get("error") if isinstance(b, dict) else None
    return body(msg)["error"]


class Probe:
    """A tool whose behaviour is scripted: sleeps ``delay`` on the clock, then
    returns ``result`` (or raises). Records every run with its context."""

    def __init__(self, delay: float = 0.0, result: Any = None, error: str | None = None,
                 panic: bool = False, hang: bool = False) -> None:
        self.delay = delay
        self.result = result
        self.error = error
        self.panic = panic
        self.hang = hang
        self.runs: list[tuple[dict[str, Any], ToolContext]] = []
        self.started_at: list[float] = []
        self.finished = 0
        self.cancelled = 0

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        self.runs.append((args, ctx))
        self.started_at.append(CLOCK.now())
        try:
            if self.hang:
                await CLOCK.sleep(10**9)
            if self.delay:
                await CLOCK.sleep(self.delay)
        except BaseException:
            self.cancelled += 1
            raise
        if self.panic:
            raise RuntimeError("boom")
        if self.error is not None:
            raise ToolError(self.error)
        self.finished += 1
        if self.result is not None:
            return self.result
        return {"ok": True, "n": len(self.runs)}

    @property
    def count(self) -> int:
        return len(self.runs)


def registry(**tools: tuple[ToolKind, Callable[..., Awaitable[Any]], dict[str, Any]]) -> ToolRegistry:
    reg = ToolRegistry()
    for name, (k, fn, extra) in tools.items():
        params = extra.pop("parameters", OBJ)
        reg.register(ToolSpec(name, f"{name} tool", params, k, **extra), fn)
    return reg


LIVE_CONVS: list[Conv] = []


class Conv:
    """A scripted conversation the way the call actor drives the engine. Every
    Conv's context is validated at the end of its test (conftest)."""

    def __init__(self, engine: ToolEngine) -> None:
        LIVE_CONVS.append(self)
        self.engine = engine
        self.ctx = Context([SystemMessage("You are a test."), UserMessage("hello")])
        self.epoch = 1
        self.token = CancelToken()

    def new_turn(self, text: str = "again") -> None:
        self.token.cancel()
        self.token = CancelToken()
        self.epoch += 1
        self.ctx.push(UserMessage(text))
        self.engine.note_user_turn()

    def respond(self, *calls: tuple[str, dict[str, Any]] | tuple[str, str], text: str = ""):
        """Assemble a response with ``calls`` (name, args dict or raw JSON text) and push it."""
        asm = ResponseAssembler()
        if text:
            asm.push_text(text)
        for i, (name, args) in enumerate(calls):
            raw = args if isinstance(args, str) else orjson.dumps(args).decode()
            asm.push_tool_call(i, id=f"call_{i}", name=name, arguments=raw)
        resp = asm.finish(self.epoch, self.ctx)
        msg = resp.assistant_message()
        if msg is not None:
            self.ctx.push(msg)
        return resp.calls

    async def run(self, *calls, text: str = "", append: bool = True) -> Execution:
        assembled = self.respond(*calls, text=text)
        ex = await self.engine.execute(assembled, self.epoch, self.token)
        if append:
            ex.append_to(self.ctx)
            self.ctx.validate()
        return ex

    def say(self, text: str) -> None:
        self.ctx.push(AssistantMessage(text))


def engine(reg: ToolRegistry, **cfg: Any) -> ToolEngine:
    return ToolEngine(reg, "sess-1", CLOCK, EngineConfig(**cfg))


class Capture(logging.Handler):
    """Collects the tool events of the brisvox.tools logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[Any] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        ev = getattr(record, "tool_event", None)
        if ev is not None:
            self.events.append(ev)
