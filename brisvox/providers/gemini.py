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

from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import quote

import httpx
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
from brisvox.providers.llm_stream import GeneratedStream
from brisvox.providers.sse import SseParser

FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter"}


class GeminiLlm:
    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str = "https://generativelanguage.googleapis.com",
        headers: Mapping[str, str] | None = None,
        options: Mapping[str, Any] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_response_bytes: int = 2 << 20,
        max_event_bytes: int = 256 << 10,
        max_seconds: float = 120.0,
        name: str = "gemini",
    ) -> None:
        if not api_key:
            raise ProviderError("auth", "gemini: no API key (set GEMINI_API_KEY)", retryable=False)
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        nh.origin_of(self.base_url)
        self._auth = {"x-goog-api-key": api_key}
        self.headers = dict(headers or {})
        self.options = dict(options or {})
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_response_bytes = max_response_bytes
        self.max_event_bytes = max_event_bytes
        self.max_seconds = max_seconds

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1beta/models/{quote(self.model, safe='')}:streamGenerateContent?alt=sse"

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await nh.warm_origin(self.base_url, timeout, self.connect_timeout)

    def stream(self, request: LlmRequest) -> GeneratedStream:
        return GeneratedStream(self.name, self._events(request), max_seconds=self.max_seconds)

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        return conv.body(request, self.options)

    async def _events(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        client = nh.shared_client(self.base_url, connect_timeout=self.connect_timeout)
        payload = orjson.dumps(self.request_body(request))
        headers = nh.merge_headers({"Content-Type": "application/json", "Accept": "text/event-stream"},
                                   self.headers, self._auth)
        try:
            async with client.stream("POST", self.url, content=payload, headers=headers,
                                     timeout=nh.timeout(self.read_timeout, self.connect_timeout)) as resp:
                if resp.status_code != 200:
                    raise nh.status_error(resp.status_code, await nh.read_bounded(resp))
                parser = SseParser(self.max_event_bytes)
                total = 0
                calls = 0
                finish: str | None = None
                text_sig: str | None = None
                usage: Usage | None = None
                async for chunk in resp.aiter_bytes():
                    total += len(chunk)
                    if total > self.max_response_bytes:
                        raise ProviderError("oversized", f"response over {self.max_response_bytes} bytes",
                                            retryable=False)
                    for ev in parser.feed(chunk):
                        try:
                            obj = orjson.loads(ev.data)
                        except orjson.JSONDecodeError:
                            raise ProviderError("protocol", "an event is not JSON", retryable=False) from None
                        if not isinstance(obj, dict):
                            raise ProviderError("protocol", "an event is not an object", retryable=False)
                        if "error" in obj:
                            err = obj["error"] if isinstance(obj["error"], dict) else {}
                            code = int(err.get("code") or 500) if str(err.get("code", "")).isdigit() else 500
                            raise nh.status_error(code if code >= 400 else 500)
                        um = obj.get("usageMetadata")
                        if isinstance(um, dict):
                            usage = Usage(int(um.get("promptTokenCount") or 0),
                                          int(um.get("candidatesTokenCount") or 0),
                                          int(um.get("cachedContentTokenCount") or 0))
                        cands = obj.get("candidates") or []
                        if not isinstance(cands, list):
                            raise ProviderError("protocol", "candidates is not a list", retryable=False)
                        for cand in cands[:1]:
                            if not isinstance(cand, dict):
                                continue
                            parts = (cand.get("content") or {}).get("parts") or []
                            for part in parts if isinstance(parts, list) else []:
                                if not isinstance(part, dict):
                                    continue
                                sig = part.get("thoughtSignature")
                                fc = part.get("functionCall")
                                if isinstance(fc, dict):
                                    args = fc.get("args")
                                    yield ToolCallDelta(
                                        calls,
                                        id=str(fc.get("id") or ""),
                                        name=str(fc.get("name") or ""),
                                        arguments=orjson.dumps(args if args is not None else {}).decode(),
                                        provider_data={"thoughtSignature": sig} if isinstance(sig, str) and sig else None,
                                    )
                                    calls += 1
                                    continue
                                if part.get("thought") is True:
                                    continue
                                text = part.get("text")
                                if isinstance(sig, str) and sig:
                                    text_sig = sig
                                if isinstance(text, str) and text:
                                    yield TextDelta(text)
                            fr = cand.get("finishReason")
                            if isinstance(fr, str) and fr:
                                finish = fr
                if finish is None or parser.pending():
                    return  # truncated
                if usage is not None:
                    yield usage
                reason = "tool_calls" if calls else FINISH.get(finish, finish.lower())
                yield Done(reason, {"textSignature": text_sig} if text_sig else None)
        except httpx.HTTPError as e:
            raise nh.transport_error(e) from None
