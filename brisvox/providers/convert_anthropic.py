"""Provider-neutral request rows -> Anthropic Messages JSON.

Owns the Anthropic message shape (one internal representation, translated per vendor):

* The leading system rows become the top-level ``system`` string; a system
  row later in the conversation (a late tool note) becomes a text block of
  the next user message (the API has no mid-conversation system role).
* assistant -> ``content`` blocks: the echoed thinking blocks of that
  response (provider data ``{"anthropic_thinking": [...]}``, signatures
  intact) first, then ``text``, then one ``tool_use`` block per call
  (``id``, ``name``, ``input`` object).
* **the results of one round are ``tool_result`` blocks of ONE user message**,
  in the context's (issue) order, ``is_error`` set on errors; a user text
  that follows them joins the same message, so roles strictly alternate.
* Consecutive assistant messages (a filler, then the answer after the tool
  results) are ONE assistant message: the later one's thinking blocks go
  after the earlier ones' (an assistant message starts with its thinking),
  its text and tool_use blocks at the end.
* Tool-use ids must match ``[A-Za-z0-9_-]+``: a call without a provider id
  gets brisvox's id with every other character replaced by ``_``.
* A conversation that starts with the bot (an agent greeting) gets a short
  user turn (:data:`CALL_OPENED`) before it: the Messages API expects the
  first message to be the user's.
* tools -> ``[{"name", "description", "input_schema"}]``.

Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

from brisvox.providers.base import LlmMessage, LlmRequest, LlmTool

_BAD_ID = re.compile(r"[^A-Za-z0-9_-]")
_THINKING = ("thinking", "redacted_thinking")


def wire_id(call_id: str, provider_id: str) -> str:
    return provider_id if provider_id and not _BAD_ID.search(provider_id) else _BAD_ID.sub("_", call_id)


def _json_obj(text: str) -> dict[str, Any]:
    try:
        v = orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def _thinking(provider_data: str) -> list[dict[str, Any]]:
    pd = _json_obj(provider_data)
    blocks = pd.get("anthropic_thinking")
    return [b for b in blocks if isinstance(b, dict)] if isinstance(blocks, list) else []

# The user turn put before a conversation that starts with the bot (its greeting).
CALL_OPENED = "[The call connected.]"


def convert(msgs: Sequence[LlmMessage]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages)."""
    ids: dict[str, str] = {}
    for m in msgs:
        for c in m.tool_calls:
            ids[c.id] = wire_id(c.id, c.provider_id)
    system: list[str] = []
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(msgs) and msgs[i].role == "system":
        system.append(msgs[i].text)
        i += 1

    def user_blocks() -> list[dict[str, Any]]:
        if out and out[-1]["role"] == "user":
            blocks: list[dict[str, Any]] = out[-1]["content"]
            return blocks
        row: dict[str, Any] = {"role": "user", "content": []}
        out.append(row)
        return row["content"]

    for m in msgs[i:]:
        if m.role == "user":
            user_blocks().append({"type": "text", "text": m.text or " "})
        elif m.role == "system":
            user_blocks().append({"type": "text", "text": f"[note] {m.text}"})
        elif m.role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": ids.get(m.call_id, wire_id(m.call_id, "")),
                                     "content": m.text}
            if m.is_error:
                block["is_error"] = True
            user_blocks().append(block)
        elif m.role == "assistant":
            thinking = _thinking(m.provider_data)
            content: list[dict[str, Any]] = []
            if m.text:
                content.append({"type": "text", "text": m.text})
            for c in m.tool_calls:
                content.append({"type": "tool_use", "id": ids[c.id], "name": c.name, "input": _json_obj(c.arguments)})
            if out and out[-1]["role"] == "assistant":  # one turn: roles alternate
                prev: list[dict[str, Any]] = out[-1]["content"]
                n = sum(1 for b in prev if b.get("type") in _THINKING)
                prev[n:n] = thinking
                prev.extend(content)
                continue
            content[:0] = thinking
            if not content:
                content.append({"type": "text", "text": " "})
            out.append({"role": "assistant", "content": content})
    if out and out[0]["role"] == "assistant":  # a greeting came first: the API wants a user turn first
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": CALL_OPENED}]})
    return "\n\n".join(s for s in system if s), out


def tools(ts: Sequence[LlmTool]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)} for t in ts]


CHOICE = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}


def body(req: LlmRequest, model: str, default_max_tokens: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
    system, msgs = convert(req.messages)
    b: dict[str, Any] = {"model": model, "max_tokens": req.max_tokens or default_max_tokens,
                         "messages": msgs, "stream": True}
    if system:
        b["system"] = system
    if req.tools:
        b["tools"] = tools(req.tools)
        b["tool_choice"] = CHOICE[req.tool_choice]
    if req.temperature is not None:
        b["temperature"] = req.temperature
    for k, v in (options or {}).items():
        if v is not None and k not in b:
            b[k] = v
    for k, v in req.extra.items():
        if v is not None:
            b[k] = v
    return b
