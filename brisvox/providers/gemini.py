"""Gemini ``streamGenerateContent`` (SSE: ``?alt=sse``) with tool calling.

Owns the adapter :class:`GeminiLlm`. Wire: ``POST
{base}/v1beta/models/{model}:streamGenerateContent?alt=sse`` with the key in
the per-request ``x-goog-api-key`` header. Every SSE event is a
``GenerateContentResponse``: ``candidates[0].content.parts`` hold ``text``
parts (``thought: true`` parts are thought summaries, never spoken) and
``functionCall`` parts that arrive WHOLE (``name``, ``args``, optional
``id``) with an optional ``thoughtSignature``; ``finishReason`` on the last
candidate; ``usageMetadata`` (cumulative). There is no ``[DONE]``: the
stream is complete when it ends after a ``finishReason``; ending without one
is ``truncated``. An ``{"error": {...}}`` event ends it with an LlmError
(429 / RESOURCE_EXHAUSTED retryable).

Mapping: every functionCall part is one ToolCallDelta slot (in order, across
chunks) with the whole ``args`` JSON and ``provider_data
{"thoughtSignature": sig}``, which the converter echoes on the same part of
the next request (Gemini 2.5+/3 require it with thinking). A signature on a
text part becomes the response's provider data ``{"textSignature": sig}``
(sent with Done). Gemini reports STOP also for function calls: Done says
``tool_calls`` whenever calls were seen.
"""

from __future__ import annotations

from typing import Any, Unpack
from urllib.parse import quote

import orjson

from brisvox.providers import convert_gemini as conv
from brisvox.providers import http as nh
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

FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter"}


class GeminiLlm(HttpSseLlm):
    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = "https://generativelanguage.googleapis.com",
        name: str = "gemini",
        **http: Unpack[HttpLlmOptions],
    ) -> None:
        if not api_key:
            raise ProviderError("auth", "gemini: no API key (set GEMINI_API_KEY)", retryable=False)
        super().__init__(name, model, base_url, {"x-goog-api-key": api_key}, **http)

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1beta/models/{quote(self.model, safe='')}:streamGenerateContent?alt=sse"

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        return conv.body(request, self.options)

    def decoder(self) -> _Decoder:
        return _Decoder()


class _Decoder:
    """``GenerateContentResponse`` events; the response is complete when the body ends after a finishReason."""

    def __init__(self) -> None:
        self.calls = 0
        self.finish: str | None = None
        self.text_sig: str | None = None
        self.usage: Usage | None = None

    def event(self, ev: SseEvent) -> list[LlmEvent]:
        obj = json_object(ev)
        if "error" in obj:
            err = obj["error"] if isinstance(obj["error"], dict) else {}
            code = int(err.get("code") or 500) if str(err.get("code", "")).isdigit() else 500
            raise nh.status_error(code if code >= 400 else 500)
        um = obj.get("usageMetadata")
        if isinstance(um, dict):
            self.usage = Usage(int(um.get("promptTokenCount") or 0), int(um.get("candidatesTokenCount") or 0),
                               int(um.get("cachedContentTokenCount") or 0))
        cands = obj.get("candidates") or []
        if not isinstance(cands, list):
            raise ProviderError("protocol", "candidates is not a list", retryable=False)
        out: list[LlmEvent] = []
        for cand in cands[:1]:
            if not isinstance(cand, dict):
                continue
            parts = (cand.get("content") or {}).get("parts") or []
            for part in parts if isinstance(parts, list) else []:
                if isinstance(part, dict):
                    out += self._part(part)
            fr = cand.get("finishReason")
            if isinstance(fr, str) and fr:
                self.finish = fr
        return out

    def _part(self, part: dict[str, Any]) -> list[LlmEvent]:
        sig = part.get("thoughtSignature")
        fc = part.get("functionCall")
        if isinstance(fc, dict):
            args = fc.get("args")
            slot, self.calls = self.calls, self.calls + 1
            return [ToolCallDelta(
                slot,
                id=str(fc.get("id") or ""),
                name=str(fc.get("name") or ""),
                arguments=orjson.dumps(args if args is not None else {}).decode(),
                provider_data={"thoughtSignature": sig} if isinstance(sig, str) and sig else None,
            )]
        if part.get("thought") is True:
            return []
        if isinstance(sig, str) and sig:
            self.text_sig = sig
        text = part.get("text")
        return [TextDelta(text)] if isinstance(text, str) and text else []

    def end(self, pending: bool) -> list[LlmEvent]:
        if self.finish is None or pending:
            return []  # truncated
        reason = "tool_calls" if self.calls else FINISH.get(self.finish, self.finish.lower())
        done = Done(reason, {"textSignature": self.text_sig} if self.text_sig else None)
        return [done] if self.usage is None else [self.usage, done]
