"""Provider-neutral request rows -> Gemini ``generateContent`` JSON.

Owns the Gemini content shape (one internal representation, translated per vendor;
Gemini's ``parameters`` only takes an OpenAPI subset of JSON Schema):

* leading system rows -> ``systemInstruction``; later system rows (late tool
  notes) -> a text part of the next user content.
* assistant -> a ``model`` content: the text part (carrying the response's
  text ``thoughtSignature`` when it had one), then one ``functionCall`` part
  per call (``name``, ``args`` object, ``id`` when Gemini gave one) with
  **its thought signature echoed** from the call's provider data
  ``{"thoughtSignature": ...}``.
* Consecutive assistant messages (a filler, then the answer after the tool
  results) are ONE ``model`` content (their parts in order): a function call
  turn must follow a user or function response turn.
* **the results of one round are ``functionResponse`` parts of ONE user
  content** in issue order: ``{"name", "response": {...}, "id"?}`` where the
  response is the result object (a non-object result is wrapped as
  ``{"result": value}``; an error as ``{"error": value}``).
* A conversation that starts with the bot (an agent greeting) gets a short
  user content (:data:`CALL_OPENED`) before it, so turns start with the user.
* tools -> ONE ``{"functionDeclarations": [...]}`` whose declarations carry
  the JSON Schema in ``parametersJsonSchema`` (never ``parameters``).

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from brisvox.providers.base import LlmMessage, LlmRequest, LlmTool


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return None


def _obj(text: str) -> dict[str, Any]:
    v = _loads(text)
    return v if isinstance(v, dict) else {}

# The user turn put before a conversation that starts with the bot (its greeting).
CALL_OPENED = "[The call connected.]"


def convert(msgs: Sequence[LlmMessage]) -> tuple[str, list[dict[str, Any]]]:
    names: dict[str, str] = {}
    gids: dict[str, str] = {}
    for m in msgs:
        for c in m.tool_calls:
            names[c.id] = c.name
            if c.provider_id:
                gids[c.id] = c.provider_id
    system: list[str] = []
    i = 0
    while i < len(msgs) and msgs[i].role == "system":
        system.append(msgs[i].text)
        i += 1
    out: list[dict[str, Any]] = []

    def user_parts() -> list[dict[str, Any]]:
        if out and out[-1]["role"] == "user":
            parts: list[dict[str, Any]] = out[-1]["parts"]
            return parts
        row: dict[str, Any] = {"role": "user", "parts": []}
        out.append(row)
        return row["parts"]

    for m in msgs[i:]:
        if m.role == "user":
            user_parts().append({"text": m.text or " "})
        elif m.role == "system":
            user_parts().append({"text": f"[note] {m.text}"})
        elif m.role == "tool":
            value = _loads(m.text)
            if value is None and m.text:
                value = m.text
            if m.is_error:
                resp: dict[str, Any] = {"error": value}
            else:
                resp = value if isinstance(value, dict) else {"result": value}
            fr: dict[str, Any] = {"name": m.name or names.get(m.call_id, "unknown_tool"), "response": resp}
            if m.call_id in gids:
                fr["id"] = gids[m.call_id]
            user_parts().append({"functionResponse": fr})
        elif m.role == "assistant":
            parts: list[dict[str, Any]] = []
            pd = _obj(m.provider_data)
            if m.text:
                tp: dict[str, Any] = {"text": m.text}
                sig = pd.get("textSignature")
                if isinstance(sig, str) and sig:
                    tp["thoughtSignature"] = sig
                parts.append(tp)
            for c in m.tool_calls:
                fc: dict[str, Any] = {"name": c.name, "args": _obj(c.arguments)}
                if c.provider_id:
                    fc["id"] = c.provider_id
                part: dict[str, Any] = {"functionCall": fc}
                sig = _obj(c.provider_data).get("thoughtSignature")
                if isinstance(sig, str) and sig:
                    part["thoughtSignature"] = sig
                parts.append(part)
            if out and out[-1]["role"] == "model":  # one turn: roles alternate
                out[-1]["parts"].extend(parts)
                continue
            if not parts:
                parts.append({"text": " "})
            out.append({"role": "model", "parts": parts})
    if out and out[0]["role"] == "model":  # a greeting came first: the API wants a user turn first
        out.insert(0, {"role": "user", "parts": [{"text": CALL_OPENED}]})
    return "\n\n".join(s for s in system if s), out


def tools(ts: Sequence[LlmTool]) -> list[dict[str, Any]]:
    return [{"functionDeclarations": [{"name": t.name, "description": t.description,
                                       "parametersJsonSchema": dict(t.parameters)} for t in ts]}]


MODE = {"auto": "AUTO", "required": "ANY", "none": "NONE"}


def body(req: LlmRequest, options: dict[str, Any] | None = None) -> dict[str, Any]:
    system, contents = convert(req.messages)
    b: dict[str, Any] = {"contents": contents}
    if system:
        b["systemInstruction"] = {"parts": [{"text": system}]}
    if req.tools:
        b["tools"] = tools(req.tools)
        b["toolConfig"] = {"functionCallingConfig": {"mode": MODE[req.tool_choice]}}
    gen: dict[str, Any] = {}
    if req.temperature is not None:
        gen["temperature"] = req.temperature
    if req.max_tokens:
        gen["maxOutputTokens"] = req.max_tokens
    opts = dict(options or {})
    opts.update({k: v for k, v in req.extra.items() if v is not None})
    thinking = opts.pop("thinking_budget", None)
    if thinking is not None:
        gen["thinkingConfig"] = {"thinkingBudget": int(thinking)}
    gen.update(opts.pop("generationConfig", {}) or {})
    if gen:
        b["generationConfig"] = gen
    for k, v in opts.items():
        if v is not None:
            b[k] = v
    return b
