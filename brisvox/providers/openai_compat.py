"""OpenAI Chat Completions streaming, for OpenAI itself and every OpenAI-compatible server.

Owns the adapter :class:`OpenAiCompatLlm` and its presets (for Ollama, see
``configs/agents/ollama.toml`` and docs/PROVIDERS.md):

==========  ======================================  ====================  ======================
preset      base URL                                key variable          notes
==========  ======================================  ====================  ======================
openai      https://api.openai.com/v1               OPENAI_API_KEY        ``max_completion_tokens``
ollama      http://127.0.0.1:11434/v1               (none)                ``reasoning_effort`` "none" turns thinking off
vllm        http://127.0.0.1:8000/v1                VLLM_API_KEY (opt.)
openrouter  https://openrouter.ai/api/v1            OPENROUTER_API_KEY
groq        https://api.groq.com/openai/v1          GROQ_API_KEY
==========  ======================================  ====================  ======================

Wire: ``POST {base}/chat/completions`` with ``stream: true`` and
``stream_options.include_usage``; SSE ``data:`` chunks carry
``choices[0].delta.content`` (spoken text), ``delta.tool_calls[]`` fragments
keyed by ``index`` (id/name on the first fragment, ``arguments`` split
anywhere: passed through as ToolCallDelta), ``finish_reason``, then a usage
chunk and ``data: [DONE]``. Reasoning deltas (``reasoning``,
``reasoning_content``) are never spoken. An ``{"error": ...}`` chunk ends the
stream with an LlmError. A stream that ends after a ``finish_reason`` but
without ``[DONE]`` is complete; one without either is ``truncated``.

``reasoning_effort`` (an option, or ``LlmRequest.extra``) is passed through
verbatim. The key is read from the environment by the registry and sent as a
per-request ``Authorization`` header on the process's shared client for the
origin (:mod:`brisvox.providers.http`). Bounds: ``max_response_bytes``
(default 2 MiB, ``oversized``), ``max_event_bytes`` per SSE event,
``max_seconds`` per response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Unpack

import orjson

from brisvox.providers import convert_openai as conv
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


@dataclass(frozen=True, slots=True)
class Preset:
    base_url: str
    key_env: str
    key_required: bool
    max_tokens_field: str = "max_tokens"


PRESETS: dict[str, Preset] = {
    "openai": Preset("https://api.openai.com/v1", "OPENAI_API_KEY", True, "max_completion_tokens"),
    "ollama": Preset("http://127.0.0.1:11434/v1", "", False),
    "vllm": Preset("http://127.0.0.1:8000/v1", "VLLM_API_KEY", False),
    "openrouter": Preset("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", True),
    "groq": Preset("https://api.groq.com/openai/v1", "GROQ_API_KEY", True),
}

FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
          "content_filter": "content_filter"}


def _error_kind(err: Any) -> tuple[str, bool]:
    if not isinstance(err, dict):
        return "server", True
    code = str(err.get("code", "")) + " " + str(err.get("type", ""))
    if "429" in code or "rate" in code:
        return "rate_limited", True
    if "400" in code or "invalid" in code:
        return "bad_request", False
    return "server", True


class OpenAiCompatLlm(HttpSseLlm):
    def __init__(
        self,
        model: str,
        *,
        preset: str = "openai",
        base_url: str | None = None,
        api_key: str | None = None,
        reasoning_effort: str | None = None,
        name: str | None = None,
        **http: Unpack[HttpLlmOptions],
    ) -> None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
        p = PRESETS[preset]
        self.preset = preset
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        super().__init__(name or preset, model, base_url or p.base_url, auth, **http)
        if p.key_required and not api_key:
            raise ProviderError("auth", f"{preset}: no API key (set {p.key_env})", retryable=False)
        self.max_tokens_field = p.max_tokens_field
        if reasoning_effort is not None:
            self.options["reasoning_effort"] = reasoning_effort

    @property
    def url(self) -> str:
        return self.base_url + "/chat/completions"

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        return conv.body(request, self.model, max_tokens_field=self.max_tokens_field, options=self.options)

    def decoder(self) -> _Decoder:
        return _Decoder()


class _Decoder:
    """Chat Completions chunks: ``[DONE]`` ends the response; so does the body ending after a finish_reason."""

    def __init__(self) -> None:
        self.finish: str | None = None

    def event(self, ev: SseEvent) -> list[LlmEvent]:
        if ev.data.strip() == "[DONE]":
            finish = self.finish or "stop"
            return [Done(FINISH.get(finish, finish))]
        obj = json_object(ev, "a stream chunk")
        if "error" in obj:
            kind, retry = _error_kind(obj["error"])
            raise ProviderError(kind, "error event in the stream", retryable=retry)
        out: list[LlmEvent] = []
        for item in _translate(obj):
            if isinstance(item, str):
                self.finish = item
            else:
                out.append(item)
        return out

    def end(self, pending: bool) -> list[LlmEvent]:
        if self.finish is None or pending:
            return []
        return [Done(FINISH.get(self.finish, self.finish))]


def _translate(obj: dict[str, Any]) -> list[LlmEvent | str]:
    """One chunk -> events; a ``str`` item is the finish reason."""
    out: list[LlmEvent | str] = []
    usage = obj.get("usage")
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise ProviderError("protocol", "choices is not a list", retryable=False)
    for ch in choices[:1]:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta") or {}
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(TextDelta(text))
            for tc in delta.get("tool_calls") or []:
                if not isinstance(tc, dict):
                    continue
                fn = tc.get("function") or {}
                idx = tc.get("index", 0)
                if not isinstance(idx, int):
                    raise ProviderError("protocol", "tool call index is not an integer", retryable=False)
                args = fn.get("arguments") if isinstance(fn, dict) else None
                out.append(ToolCallDelta(
                    idx,
                    id=tc.get("id") or "",
                    name=(fn.get("name") if isinstance(fn, dict) else "") or "",
                    arguments=args if isinstance(args, str) else ("" if args is None else orjson.dumps(args).decode()),
                ))
        fr = ch.get("finish_reason")
        if isinstance(fr, str) and fr:
            out.append(fr)
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        out.append(Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                         int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)))
    return out
