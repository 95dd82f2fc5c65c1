"""RequestBuilder: the single seam from the call's Context to a provider LlmRequest.

Owns the conversion of the agent's Context/Message/ToolSpec to the
providers' types and the request window:

* assistant tool calls keep the internal id (``t<epoch>.<seq>``) and the
  provider's id; arguments and provider data become JSON text;
* tool results carry the name of the tool they answer;
* tools are name-ordered (prompt-cache stability);
* window: the first system message plus the last ``window_turns`` user
  turns (a window always starts at a user message, so no tool result is cut
  from its call). The context itself is never trimmed here.

Pure and synchronous; the cost is O(messages in the window).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    Message,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.tool_engine.registry import ToolSpec
from brisvox.providers.base import LlmMessage, LlmRequest, LlmTool, LlmToolCall


@dataclass(frozen=True, slots=True)
class RequestConfig:
    window_turns: int = 40
    temperature: float | None = None
    max_tokens: int = 0


def _json(v: Any) -> str:
    if v is None:
        return ""
    try:
        return orjson.dumps(v).decode()
    except (TypeError, orjson.JSONEncodeError):
        return ""


def window_start(ctx: Context, turns: int) -> int:
    """Index of the first message of the window (after the leading system prompt)."""
    n = len(ctx)
    seen = 0
    for i in range(n - 1, 0, -1):
        if isinstance(ctx[i], UserMessage):
            seen += 1
            if seen >= turns:
                return i
    return 1 if n and isinstance(ctx[0], SystemMessage) else 0


def convert(msgs: Sequence[Message], names: dict[str, str]) -> list[LlmMessage]:
    out: list[LlmMessage] = []
    for m in msgs:
        if isinstance(m, SystemMessage):
            out.append(LlmMessage("system", m.content))
        elif isinstance(m, UserMessage):
            out.append(LlmMessage("user", m.content))
        elif isinstance(m, AssistantMessage):
            calls = []
            for c in m.tool_calls:
                names[c.id] = c.name
                calls.append(LlmToolCall(c.id, c.name, _json(c.arguments) or "{}", c.provider_id or "", _json(c.provider_data)))
            out.append(LlmMessage("assistant", m.text, tuple(calls), provider_data=_json(m.provider_data)))
        elif isinstance(m, ToolMessage):
            out.append(LlmMessage("tool", m.content, call_id=m.call_id, name=names.get(m.call_id, ""), is_error=m.is_error))
    return out


def build_request(ctx: Context, tools: Sequence[ToolSpec], cfg: RequestConfig) -> LlmRequest:
    start = window_start(ctx, cfg.window_turns)
    head: list[Message] = [ctx[0]] if len(ctx) and isinstance(ctx[0], SystemMessage) and start > 0 else []
    names: dict[str, str] = {}
    msgs = convert(head, names) + convert(list(ctx.messages[start:]) if start else list(ctx.messages), names)
    specs = sorted(tools, key=lambda s: s.name)
    return LlmRequest(
        messages=tuple(msgs),
        tools=tuple(LlmTool(s.name, s.description, s.parameters) for s in specs),
        temperature=cfg.temperature,
        max_tokens=cfg.max_tokens,
    )
