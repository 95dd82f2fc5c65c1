"""Provider-neutral request rows -> OpenAI Chat Completions JSON (also every OpenAI-compatible server).

Owns the OpenAI message shape (one internal representation, translated per vendor):

* system / user -> ``{"role", "content"}``; a system row in the middle of the
  conversation (a late tool note) stays a system message (the API allows it).
* assistant -> ``content`` (null when it only calls tools) and
  ``tool_calls`` ``[{"id", "type": "function", "function": {"name",
  "arguments"}}]``; the wire id is the provider's id when the call has one,
  else brisvox's stable id.
* Consecutive assistant messages (a filler, then the answer after the tool
  results) are ONE assistant message, the texts joined by a space (servers
  whose chat template wants alternating roles refuse two in a row).
* **one ``tool`` message per result**, ``tool_call_id`` = the wire id of the
  call it answers, in the order of the context (the LLM's issue order).
* tools -> ``[{"type": "function", "function": {"name", "description",
  "parameters"}}]`` in the request's (name) order.

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from brisvox.providers.base import LlmMessage, LlmRequest, LlmTool


def wire_ids(messages: Sequence[LlmMessage]) -> dict[str, str]:
    """brisvox call id -> the id the vendor saw for that call."""
    out: dict[str, str] = {}
    for m in messages:
        for c in m.tool_calls:
            out[c.id] = c.provider_id or c.id
    return out


def messages(msgs: Sequence[LlmMessage]) -> list[dict[str, Any]]:
    ids = wire_ids(msgs)
    out: list[dict[str, Any]] = []
    for m in msgs:
        if m.role in ("system", "user"):
            out.append({"role": m.role, "content": m.text})
        elif m.role == "assistant":
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and "tool_calls" not in prev:
                out.pop()  # one turn: the earlier text goes first
                m = replace(m, text=" ".join(t for t in (prev["content"] or "", m.text) if t))
            row: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                row["tool_calls"] = [
                    {"id": ids[c.id], "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                    for c in m.tool_calls
                ]
            elif not m.text:
                row["content"] = ""
            out.append(row)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": ids.get(m.call_id, m.call_id), "content": m.text})
    return out


def tools(ts: Sequence[LlmTool]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": dict(t.parameters)}} for t in ts]


def body(req: LlmRequest, model: str, *, max_tokens_field: str = "max_tokens",
         include_usage: bool = True, options: dict[str, Any] | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"model": model, "messages": messages(req.messages), "stream": True}
    if include_usage:
        b["stream_options"] = {"include_usage": True}
    if req.tools:
        b["tools"] = tools(req.tools)
        b["tool_choice"] = req.tool_choice
    if req.temperature is not None:
        b["temperature"] = req.temperature
    if req.max_tokens:
        b[max_tokens_field] = req.max_tokens
    for k, v in (options or {}).items():
        if v is not None and k not in b:
            b[k] = v
    for k, v in req.extra.items():
        if v is not None:
            b[k] = v
    return b
