"""The three LLM vendors' streaming wire formats, written by a fake "model".

Owns how a scripted model response (:class:`Resp`: text parts and tool calls)
is encoded as OpenAI Chat Completions SSE, Anthropic Messages SSE and Gemini
``streamGenerateContent?alt=sse``, with tool-call arguments split into
fragments (optionally interleaved across calls), chunks cut at arbitrary byte
boundaries, and how each vendor's REQUEST carries the tool results back
(:func:`results_on_wire`), so tests can assert the exact wire order.

:class:`ScriptedVendor` is a FakeHttpServer handler that answers the i-th
request with the i-th Resp (or a Reply for error cases), recording bodies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.harness.http_server import Reply, Request, json_reply, split_bytes

VENDORS = ("openai", "anthropic", "gemini")


@dataclass
class Call:
    id: str
    name: str
    args: dict[str, Any]


@dataclass
class Resp:
    text: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    interleave: bool = False
    chunk_size: int = 0  # >0: cut the body into chunks of this many bytes
    delays: list[float] | None = None


def _frags(s: str, n: int = 3) -> list[str]:
    k = max(1, len(s) // n)
    return [s[i : i + k] for i in range(0, len(s), k)]


def _call_frags(calls: list[Call], interleave: bool) -> list[tuple[int, str]]:
    per = [[(i, f) for f in _frags(orjson.dumps(c.args).decode())] for i, c in enumerate(calls)]
    if not interleave:
        return [x for p in per for x in p]
    out: list[tuple[int, str]] = []
    while any(per):
        for p in per:
            if p:
                out.append(p.pop(0))
    return out


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def openai_events(r: Resp) -> list[bytes]:
    out = []
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake"}
    for t in r.text:
        out.append(_sse({**base, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}))
    for i, c in enumerate(r.calls):
        out.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}}]}))
    for i, f in _call_frags(r.calls, r.interleave):
        out.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "function": {"arguments": f}}]}}]}))
    out.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if r.calls else "stop"}]}))
    out.append(_sse({**base, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}))
    out.append(b"data: [DONE]\n\n")
    return out


def anthropic_events(r: Resp) -> list[bytes]:
    out = [_sse({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [],
                                                       "usage": {"input_tokens": 11, "output_tokens": 1}}},
                "message_start")]
    idx = 0
    if r.text:
        out.append(_sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                        "content_block_start"))
        for t in r.text:
            out.append(_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}},
                            "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        idx = 1
    out.append(b"event: ping\ndata: {\"type\": \"ping\"}\n\n")
    for i, c in enumerate(r.calls):
        out.append(_sse({"type": "content_block_start", "index": idx + i,
                         "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}},
                        "content_block_start"))
    for i, f in _call_frags(r.calls, r.interleave):
        out.append(_sse({"type": "content_block_delta", "index": idx + i,
                         "delta": {"type": "input_json_delta", "partial_json": f}}, "content_block_delta"))
    for i in range(len(r.calls)):
        out.append(_sse({"type": "content_block_stop", "index": idx + i}, "content_block_stop"))
    out.append(_sse({"type": "message_delta", "delta": {"stop_reason": "tool_use" if r.calls else "end_turn"},
                     "usage": {"output_tokens": 7}}, "message_delta"))
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def gemini_events(r: Resp) -> list[bytes]:
    out = []
    for t in r.text:
        out.append(_sse({"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}, "index": 0}]}))
    if r.calls:
        parts = [{"functionCall": {"name": c.name, "args": c.args}, "thoughtSignature": f"sig-{c.id}"}
                 for c in r.calls]
        out.append(_sse({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}]}))
    out.append(_sse({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP",
                                     "index": 0}],
                     "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 7}}))
    return out


ENCODERS: dict[str, Callable[[Resp], list[bytes]]] = {
    "openai": openai_events, "anthropic": anthropic_events, "gemini": gemini_events}


def reply_for(vendor: str, r: Resp) -> Reply:
    events = ENCODERS[vendor](r)
    if r.chunk_size:
        return Reply(200, split_bytes(b"".join(events), r.chunk_size), delays=r.delays)
    return Reply(200, events, delays=r.delays)


def error_reply(vendor: str, status: int) -> Reply:
    if vendor == "anthropic":
        return json_reply(status, {"type": "error", "error": {"type": "rate_limit_error" if status == 429 else "api_error",
                                                               "message": "fake"}})
    return json_reply(status, {"error": {"code": status, "message": "fake"}})


class ScriptedVendor:
    """Answers request i with ``script[i]`` (a Resp or a ready Reply); records bodies."""

    def __init__(self, vendor: str, script: list[Resp | Reply] | Callable[[int, Any], Resp | Reply]) -> None:
        self.vendor = vendor
        self.script = script
        self.bodies: list[Any] = []

    def __call__(self, req: Request) -> Reply:
        body = req.json
        self.bodies.append(body)
        i = len(self.bodies) - 1
        item = self.script(i, body) if callable(self.script) else self.script[min(i, len(self.script) - 1)]
        return item if isinstance(item, Reply) else reply_for(self.vendor, item)


def results_on_wire(vendor: str, body: Any) -> list[tuple[str, Any]]:
    """The tool results a request carries for its last round: (call ref, result), in wire order.

    OpenAI: the trailing ``tool`` messages (ref = tool_call_id). Anthropic: the
    ``tool_result`` blocks of the last user message (ref = tool_use_id). Gemini:
    the ``functionResponse`` parts of the last user content (ref = name)."""
    if vendor == "openai":
        msgs = body["messages"]
        j = len(msgs)
        while j > 0 and msgs[j - 1]["role"] == "tool":
            j -= 1
        return [(m["tool_call_id"], m["content"]) for m in msgs[j:]]
    if vendor == "anthropic":
        last = body["messages"][-1]
        assert last["role"] == "user"
        return [(b["tool_use_id"], b["content"]) for b in last["content"] if b["type"] == "tool_result"]
    last = body["contents"][-1]
    assert last["role"] == "user"
    return [(p["functionResponse"]["name"], p["functionResponse"]["response"])
            for p in last["parts"] if "functionResponse" in p]


def result_messages_on_wire(vendor: str, body: Any) -> int:
    """How many wire messages carry the last round's results (OpenAI: one per result; others: one)."""
    if vendor == "openai":
        return len(results_on_wire(vendor, body))
    return 1 if results_on_wire(vendor, body) else 0
