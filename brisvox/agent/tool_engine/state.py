"""What the tool engine holds while it handles calls.

Owns :class:`_Item` (one call of a response, from planning to its answer) and
:class:`_Flight` (one running SideEffect call: the task and the slot waiting
for it). The parts of the engine pass them to each other; none of them keeps
an item past the run it belongs to, except a :class:`Speculation
<brisvox.agent.tool_engine.planning.Speculation>` until its commit.

Invariants:

* An item whose ``msg`` is set is answered: it never runs. Only admission
  (``stale_turn``, ``budget_exhausted``) replaces an answer, before anything runs.
* Run on one event loop: nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import ToolCall, ToolMessage
from brisvox.agent.tool_engine.recent import RecentCall
from brisvox.agent.tool_engine.registry import IdempotencyKey, RegisteredTool


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
