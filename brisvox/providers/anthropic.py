"""Anthropic Messages API streaming (``POST /v1/messages`` with ``stream: true``).

Owns the adapter :class:`AnthropicLlm`. Wire (SSE, ``event:`` names the type):
``message_start`` (input usage), ``content_block_start`` (a ``text``,
``tool_use`` {id, name} or ``thinking`` block at ``index``),
``content_block_delta`` (``text_delta``, ``input_json_delta`` with
``partial_json`` split anywhere, ``thinking_delta``, ``signature_delta``),
``content_block_stop``, ``message_delta`` (``stop_reason``, output usage),
``message_stop``, ``ping``, and ``error`` (``overloaded_error`` and
``rate_limit_error`` are retryable).

Mapping: text deltas -> TextDelta; each ``tool_use`` block -> a ToolCallDelta
slot (0-based in the order the blocks start) carrying id and name, then its
``partial_json`` fragments; thinking blocks are never spoken: they are
collected whole (with their signatures) and returned as the response's
provider data ``{"anthropic_thinking": [...]}`` on Done, which the converter
echoes first in the assistant message of the next request (required when
extended thinking and tools are combined). ``stop_reason`` end_turn -> stop,
tool_use -> tool_calls, max_tokens -> length.

The key (``ANTHROPIC_API_KEY`` via the registry) travels in the per-request
``x-api-key`` header on the shared client of the origin. Bounds as in
:mod:`brisvox.providers.openai_compat`.
"""

from __future__ import annotations

from typing import Any, Unpack

import orjson

from brisvox.providers import convert_anthropic as conv
from brisvox.providers.base import (
    Done,
    LlmEvent,
    LlmRequest,
    ProviderError,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from brisvox.providers.llm_stream import HttpLlmOptions, HttpSseLlm
from brisvox.providers.sse import SseEvent, json_object

API_VERSION = "2023-06-01"
STOP = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
        "pause_turn": "stop", "refusal": "content_filter"}
RETRYABLE = {"overloaded_error": "server", "api_error": "server", "rate_limit_error": "rate_limited"}


class AnthropicLlm(HttpSseLlm):
    wire_headers = {"anthropic-version": API_VERSION}

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = "https://api.anthropic.com",
        max_tokens: int = 1024,
        name: str = "anthropic",
        **http: Unpack[HttpLlmOptions],
    ) -> None:
        if not api_key:
            raise ProviderError("auth", "anthropic: no API key (set ANTHROPIC_API_KEY)", retryable=False)
        super().__init__(name, model, base_url, {"x-api-key": api_key}, **http)
        self.max_tokens = max_tokens

    @property
    def url(self) -> str:
        return self.base_url + "/v1/messages"

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        return conv.body(request, self.model, self.max_tokens, self.options)

    def decoder(self) -> _State:
        return _State()


class _State:
    def __init__(self) -> None:
        self.tool_slot: dict[int, int] = {}  # content block index -> tool call index
        self.thinking: dict[int, dict[str, Any]] = {}
        self.stop = "stop"
        self.input_tokens = 0
        self.cached = 0

    def event(self, ev: SseEvent) -> list[LlmEvent]:
        return self.translate(json_object(ev))

    def end(self, pending: bool) -> list[LlmEvent]:
        return []  # only message_stop completes a response

    def translate(self, obj: dict[str, Any]) -> list[LlmEvent]:
        t = obj.get("type")
        if t == "content_block_delta":
            d = obj.get("delta") or {}
            idx = obj.get("index")
            dt = d.get("type")
            if dt == "text_delta":
                text = d.get("text")
                return [TextDelta(text)] if isinstance(text, str) and text else []
            if dt == "input_json_delta":
                if idx not in self.tool_slot:
                    raise ProviderError("protocol", "input_json_delta outside a tool_use block", retryable=False)
                part = d.get("partial_json")
                return [ToolCallDelta(self.tool_slot[idx], arguments=part)] if isinstance(part, str) and part else []
            if dt in ("thinking_delta", "signature_delta") and isinstance(idx, int) and idx in self.thinking:
                blk = self.thinking[idx]
                key = "thinking" if dt == "thinking_delta" else "signature"
                val = d.get(key)
                if isinstance(val, str):
                    blk[key] = blk.get(key, "") + val
            return []
        if t == "content_block_start":
            idx = obj.get("index")
            blk = obj.get("content_block") or {}
            if not isinstance(idx, int) or not isinstance(blk, dict):
                raise ProviderError("protocol", "bad content_block_start", retryable=False)
            bt = blk.get("type")
            if bt == "tool_use":
                slot = len(self.tool_slot)
                self.tool_slot[idx] = slot
                out: list[LlmEvent] = [ToolCallDelta(slot, id=str(blk.get("id") or ""), name=str(blk.get("name") or ""))]
                inp = blk.get("input")
                if isinstance(inp, dict) and inp:
                    out.append(ToolCallDelta(slot, arguments=orjson.dumps(inp).decode()))
                return out
            if bt in ("thinking", "redacted_thinking"):
                self.thinking[idx] = dict(blk)
                return []
            if bt == "text":
                text = blk.get("text")
                return [TextDelta(text)] if isinstance(text, str) and text else []
            return []
        if t == "message_start":
            u = (obj.get("message") or {}).get("usage") or {}
            self.input_tokens = int(u.get("input_tokens") or 0)
            self.cached = int(u.get("cache_read_input_tokens") or 0)
            return []
        if t == "message_delta":
            d = obj.get("delta") or {}
            sr = d.get("stop_reason")
            if isinstance(sr, str):
                self.stop = STOP.get(sr, sr)
            u = obj.get("usage") or {}
            if "output_tokens" in u:
                return [Usage(self.input_tokens, int(u.get("output_tokens") or 0), self.cached)]
            return []
        if t == "message_stop":
            pd = {"anthropic_thinking": [self.thinking[i] for i in sorted(self.thinking)]} if self.thinking else None
            return [Done(self.stop, pd)]
        if t == "error":
            err = obj.get("error") or {}
            et = err.get("type") if isinstance(err, dict) else ""
            kind = RETRYABLE.get(str(et))
            if kind is not None:
                raise ProviderError(kind, f"stream error {et}", retryable=True)
            raise ProviderError("bad_request" if et == "invalid_request_error" else "server",
                                f"stream error {et}", retryable=et != "invalid_request_error")
        return []  # ping, content_block_stop, unknown types
