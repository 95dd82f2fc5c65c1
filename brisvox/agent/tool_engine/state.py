"""What the tool engine holds while it handles calls, and the trace of settled calls.

Owns :class:`_Item` (one call of a response, from planning to its answer),
:class:`_Flight` (one running SideEffect call: the task and the slot waiting for
it), :class:`_EngineState` (the state every part of the engine shares, declared
here once and set by :class:`~brisvox.agent.tool_engine.engine.ToolEngine`;
each part declares the state only it uses) and :meth:`_EngineState._settled`,
the trace.

Invariants:

* Each settled call emits one DEBUG event on the ``brisvox.tools`` logger
  (session, epoch, call id, tool, outcome, duration, retries).
* Arguments are never logged (nor results).
* Run on one event loop: nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.agent.conversation.context import ToolCall, ToolMessage
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.config import EngineConfig
from brisvox.agent.tool_engine.recent import RecentCall, RecentCalls
from brisvox.agent.tool_engine.registry import IdempotencyKey, RegisteredTool, ToolRegistry
from brisvox.clock import Clock


class _Item:
    __slots__ = ("call_id", "tool", "call", "entry", "msg", "outcome", "held", "retries", "t0",
                 "flight", "recent")

    def __init__(self, call_id: str, tool: str, call: ToolCall | None, entry: RegisteredTool | None) -> None:
        self.call_id = call_id
        self.tool = tool
        self.call = call
        self.entry = entry
        self.msg: ToolMessage | None = None
        self.outcome = ""
        self.held = False
        self.retries = 0
        self.t0: float | None = None
        self.flight: _Flight | None = None
        self.recent: RecentCall | None = None

    def answer(self, msg: ToolMessage, outcome: str) -> None:
        self.msg = msg
        self.outcome = outcome

    def error(self, kind: str, detail: str, outcome: str, extra: dict[str, Any] | None = None) -> None:
        self.answer(ToolMessage(self.call_id, te.error_body(kind, self.tool, detail, extra=extra), True), outcome)


class _Flight:
    """One running SideEffect call: the task and the slot waiting for it."""

    __slots__ = ("key", "tool", "call_id", "epoch", "recent", "waiter", "closed", "task", "timeout")

    def __init__(self, key: IdempotencyKey, tool: str, call_id: str, epoch: int,
                 recent: RecentCall | None, timeout: float) -> None:
        self.key = key
        self.tool = tool
        self.timeout = timeout
        self.call_id = call_id
        self.epoch = epoch
        self.recent = recent
        self.waiter: asyncio.Future[tuple[ToolMessage, str]] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.task: asyncio.Task[None] | None = None


class _EngineState:
    """The state shared by the engine's parts (set in ``ToolEngine.__init__``)."""

    registry: ToolRegistry
    session: str
    call_info: CallInfo
    clock: Clock
    config: EngineConfig
    _recent: RecentCalls
    _stats: ev.ToolStats

    # ------------------------------------------------------------------ trace
    def _settled(self, epoch: int, it: _Item) -> None:
        dur = 0
        if it.t0 is not None:
            dur = int(round((self.clock.now() - it.t0) * 1e6))
        ev.emit("tool call settled", self.session, epoch, it.call_id, it.tool, it.outcome, dur, it.retries)

