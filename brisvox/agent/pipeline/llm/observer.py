"""The runner's observer seam: what an outside party (the agent link) hears and shapes.

Owns :class:`CallObserver`, the only hook :class:`~brisvox.agent.pipeline.llm.runner.LlmRunner`
calls out through (``runner.observer``, None by default: nothing is called). The runner calls
it synchronously at fixed points and never awaits it:

* ``on_user_turn(epoch, text)``: the user message was pushed.
* ``on_settled(ctx)``: the played-text cut and the late notes are applied (before a user
  message, at hang-up) and no call is open; the returned messages (system notes) are
  appended to the context there and then.
* ``on_tool_outcome(epoch, call_id, tool, outcome)``: one tool call's outcome, as recorded.
* ``offered(specs)``: the tools a free conversation's next request offers (a flow's node
  keeps its own); ``screened(name)``: True if a call of ``name`` must be answered
  ``unknown_tool`` without running (a tool narrowed away).

An observer must not raise and must not block: it queues what it sends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from brisvox.agent.conversation.context import Context, Message
    from brisvox.agent.tool_engine.registry import ToolSpec


class CallObserver(Protocol):
    def on_user_turn(self, epoch: int, text: str) -> None: ...

    def on_settled(self, ctx: Context) -> list[Message]: ...

    def on_tool_outcome(self, epoch: int, call_id: str, tool: str, outcome: str) -> None: ...

    def offered(self, specs: list[ToolSpec]) -> list[ToolSpec]: ...

    def screened(self, name: str) -> bool: ...
