"""The HTTP/SSE LLM adapters against loopback servers that speak each vendor's wire format.

What each test proves (parametrized over OpenAI-compatible, Anthropic, Gemini):

* a body cut into 1-byte chunks (JSON and UTF-8 split everywhere) yields the
  same events as whole events;
* HTTP 400 / 429 / 500 become one LlmError with the stable kind and the right
  ``retryable``; an error event inside the stream too;
* a stream cut mid-way (socket aborted) ends with one LlmError, never a hang
  or an exception out of the iterator;
* a slow first byte is waited for (the runner bounds it, not the adapter);
* garbage (non-JSON data) is ``protocol``; an oversized response is
  ``oversized``; a never-ending stream is ended by the response time bound;
* ``aclose()`` mid-stream returns promptly and the server sees the client go;
* one shared client per origin: three adapter instances, N sequential
  requests, ONE TCP connection at the server; credentials per request;
* presets: base URL, auth header, ``reasoning_effort`` passthrough,
  ``max_completion_tokens`` for OpenAI.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bench.harness.http_server import FakeHttpServer, Reply
from bench.harness.llm_wire import (
    VENDORS,
    Call,
    Resp,
    ScriptedVendor,
    error_reply,
    reply_for,
)
from brisvox.providers.anthropic import AnthropicLlm
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmMessage,
    LlmRequest,
    LlmTool,
    ProviderError,
    TextDelta,
    ToolCallDelta,
)
from brisvox.providers.gemini import GeminiLlm
from brisvox.providers.http import close_all
from brisvox.providers.llm_stream import STATS
from brisvox.providers.openai_compat import OpenAiCompatLlm

pytestmark = pytest.mark.timeout(60)

REQ = LlmRequest((LlmMessage("system", "sys"), LlmMessage("user", "hi")),
                 (LlmTool("get_weather", "weather", {"type": "object"}),))


def provider(vendor: str, url: str, **kw: Any) -> Any:
    if vendor == "openai":
        return OpenAiCompatLlm("m", preset="openai", base_url=url + "/v1", api_key="sk-1", **kw)
    if vendor == "anthropic":
        return AnthropicLlm("m", api_key="ak-1", base_url=url, **kw)
    return GeminiLlm("m", api_key="gk-1", base_url=url, **kw)


async def collect(p: Any, req: LlmRequest = REQ) -> list[Any]:
    s = p.stream(req)
    try:
        return [e async for e in s]
    finally:
        await s.aclose()


def run(handler: Any, body: Any) -> Any:
    async def main() -> Any:
        async with FakeHttpServer(handler) as srv:
            try:
                return await body(srv)
            finally:
                await close_all()

    return asyncio.run(main())


def merged(events: list[Any]) -> tuple[str, dict[int, list[str]]]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            slot = calls.setdefault(e.index, ["", "", ""])
            slot[0] = slot[0] or e.id
            slot[1] = slot[1] or e.name
            slot[2] += e.arguments
    return text, calls


def first_text(vendor: str, text: str) -> list[bytes]:
    """The chunks of a ``vendor`` response up to and including its first text event (no end)."""
    return reply_for(vendor, Resp(text=[text])).chunks[: 3 if vendor == "anthropic" else 1]


RESP = Resp(text=["Zürich ", "is ", "cold ☃."], calls=[Call("c1", "get_weather", {"city": "Zürich"}),
                                                        Call("c2", "get_weather", {"city": "Åre"})], interleave=True)


@pytest.mark.parametrize("vendor", VENDORS)
def test_split_everywhere_equals_whole(vendor: str) -> None:
    whole = Resp(**{**RESP.__dict__})
    split = Resp(**{**RESP.__dict__, "chunk_size": 1})

    async def body(srv: FakeHttpServer) -> tuple[Any, Any]:
        a = await collect(provider(vendor, srv.url))
        b = await collect(provider(vendor, srv.url))
        return a, b

    a, b = run(ScriptedVendor(vendor, [whole, split]), body)
    assert merged(a) == merged(b)
    text, calls = merged(b)
    assert text == "Zürich is cold ☃."
    assert [c[1:] for c in calls.values()] == [["get_weather", '{"city":"Zürich"}'], ["get_weather", '{"city":"Åre"}']]
    assert isinstance(b[-1], Done) and b[-1].stop_reason == "tool_calls"


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("status,kind,retryable", [(400, "bad_request", False), (429, "rate_limited", True),
                                                   (500, "server", True), (401, "auth", False)])
def test_http_errors(vendor: str, status: int, kind: str, retryable: bool) -> None:
    evs = run(ScriptedVendor(vendor, [error_reply(vendor, status)]), lambda srv: collect(provider(vendor, srv.url)))
    assert len(evs) == 1 and isinstance(evs[0], LlmError)
    assert (evs[0].kind, evs[0].retryable) == (kind, retryable)


@pytest.mark.parametrize("vendor", VENDORS)
def test_error_event_inside_the_stream(vendor: str) -> None:
    good = first_text(vendor, "Hello")
    if vendor == "anthropic":
        bad = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}\n\n'
    else:
        bad = b'data: {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}}\n\n'
    evs = run(ScriptedVendor(vendor, [Reply(200, good + [bad])]), lambda srv: collect(provider(vendor, srv.url)))
    assert isinstance(evs[-1], LlmError)
    assert evs[-1].kind in ("server", "rate_limited") and evs[-1].retryable
    assert any(isinstance(e, TextDelta) for e in evs)  # the partial text came first


@pytest.mark.parametrize("vendor", VENDORS)
def test_stream_cut_mid_way(vendor: str) -> None:
    r = reply_for(vendor, RESP)
    r.cut_after = len(r.chunks) // 2
    before = STATS["error.closed"] + STATS["error.truncated"]
    evs = run(ScriptedVendor(vendor, [r]), lambda srv: collect(provider(vendor, srv.url)))
    assert isinstance(evs[-1], LlmError) and evs[-1].kind in ("closed", "truncated")
    assert not any(isinstance(e, Done) for e in evs)
    assert STATS["error.closed"] + STATS["error.truncated"] == before + 1  # counted


@pytest.mark.parametrize("vendor", VENDORS)
def test_slow_first_byte_is_waited_for(vendor: str) -> None:
    r = reply_for(vendor, Resp(text=["late"]))
    r.first_byte_delay = 0.4

    async def body(srv: FakeHttpServer) -> tuple[float, list[Any]]:
        t0 = time.monotonic()
        evs = await collect(provider(vendor, srv.url))
        return time.monotonic() - t0, evs

    took, evs = run(ScriptedVendor(vendor, [r]), body)
    assert merged(evs)[0] == "late" and isinstance(evs[-1], Done)
    assert took >= 0.4


@pytest.mark.parametrize("vendor", VENDORS)
def test_garbage_is_a_protocol_error(vendor: str) -> None:
    r = Reply(200, [b"data: this is not json\n\n"])
    evs = run(ScriptedVendor(vendor, [r]), lambda srv: collect(provider(vendor, srv.url)))
    assert [type(e) for e in evs] == [LlmError] and evs[0].kind == "protocol" and not evs[0].retryable


@pytest.mark.parametrize("vendor", VENDORS)
def test_oversized_response(vendor: str) -> None:
    events = reply_for(vendor, Resp(text=["x" * 200] * 50)).chunks
    evs = run(ScriptedVendor(vendor, [Reply(200, events)]),
              lambda srv: collect(provider(vendor, srv.url, max_response_bytes=4000)))
    assert isinstance(evs[-1], LlmError) and evs[-1].kind == "oversized" and not evs[-1].retryable
    assert sum(len(e.text) for e in evs if isinstance(e, TextDelta)) < 4000


@pytest.mark.parametrize("vendor", VENDORS)
def test_oversized_single_event(vendor: str) -> None:
    r = Reply(200, [b"data: {\"x\": \"" + b"y" * 5000, b"y" * 5000])
    evs = run(ScriptedVendor(vendor, [r]), lambda srv: collect(provider(vendor, srv.url, max_event_bytes=4096)))
    assert isinstance(evs[-1], LlmError) and evs[-1].kind == "oversized"


@pytest.mark.parametrize("vendor", VENDORS)
def test_never_ending_stream_is_bounded(vendor: str) -> None:
    r = Reply(200, first_text(vendor, "forever"), forever=b": keep-alive\n\n", forever_every=0.02)
    evs = run(ScriptedVendor(vendor, [r]), lambda srv: collect(provider(vendor, srv.url, max_seconds=0.5)))
    assert isinstance(evs[-1], LlmError) and evs[-1].kind == "too_long"


@pytest.mark.serial_light  # closed within 1 s
@pytest.mark.parametrize("vendor", VENDORS)
def test_aclose_mid_stream_is_prompt(vendor: str) -> None:
    r = Reply(200, first_text(vendor, "one"), forever=b": ping\n\n", forever_every=0.05)

    async def body(srv: FakeHttpServer) -> tuple[float, int]:
        s = provider(vendor, srv.url).stream(REQ)
        first = await s.__anext__()
        assert isinstance(first, TextDelta)
        t0 = time.monotonic()
        await s.aclose()
        took = time.monotonic() - t0
        for _ in range(50):
            if srv.open_connections == 0:
                break
            await asyncio.sleep(0.02)
        return took, srv.open_connections

    took, still_open = run(ScriptedVendor(vendor, [r]), body)
    assert took < 1.0
    assert still_open == 0  # the streamed connection was released, not parked


def test_one_connection_per_origin_for_many_calls() -> None:
    """Three adapter instances (three 'calls', different keys), 12 sequential requests: ONE connection."""
    sv = ScriptedVendor("openai", lambda i, b: Resp(text=[f"r{i}"]))

    async def body(srv: FakeHttpServer) -> tuple[list[str], int, list[str]]:
        ps = [OpenAiCompatLlm("m", preset="openai", base_url=srv.url + "/v1", api_key=f"sk-{k}") for k in range(3)]
        out = []
        for i in range(12):
            out.append(merged(await collect(ps[i % 3]))[0])
        return out, srv.connections, [r.headers["authorization"] for r in srv.requests]

    out, conns, auths = run(sv, body)
    assert out == [f"r{i}" for i in range(12)]
    assert conns == 1
    assert auths[:3] == ["Bearer sk-0", "Bearer sk-1", "Bearer sk-2"]  # credentials per request


def test_warm_opens_the_connection_the_request_uses() -> None:
    sv = ScriptedVendor("anthropic", [Resp(text=["ok"])])

    async def body(srv: FakeHttpServer) -> tuple[int, list[str]]:
        p = AnthropicLlm("m", api_key="k", base_url=srv.url)
        await p.warm(1.0)
        await collect(p)
        return srv.connections, [r.method for r in srv.requests]

    conns, methods = run(sv, body)
    assert (conns, methods) == (1, ["HEAD", "POST"])


def test_presets_and_passthrough() -> None:
    sv = ScriptedVendor("openai", lambda i, b: Resp(text=["ok"]))

    async def body(srv: FakeHttpServer) -> list[Any]:
        openai = OpenAiCompatLlm("gpt-x", preset="openai", base_url=srv.url + "/v1", api_key="sk")
        ollama = OpenAiCompatLlm("gemma", preset="ollama", base_url=srv.url + "/v1", reasoning_effort="none")
        for p in (openai, ollama):
            await collect(p, LlmRequest(REQ.messages, REQ.tools, temperature=0.2, max_tokens=50))
        return list(srv.requests)

    reqs = run(sv, body)
    a, b = reqs[0], reqs[1]
    assert a.path == "/v1/chat/completions" and a.headers["authorization"] == "Bearer sk"
    assert a.json["max_completion_tokens"] == 50 and "max_tokens" not in a.json
    assert "authorization" not in b.headers
    assert b.json["max_tokens"] == 50 and b.json["reasoning_effort"] == "none"
    assert b.json["temperature"] == 0.2 and b.json["stream"] is True
    assert b.json["tools"][0]["function"]["name"] == "get_weather"


def test_missing_key_fails_at_construction() -> None:
    with pytest.raises(ProviderError) as e:
        OpenAiCompatLlm("m", preset="groq", api_key=None)
    assert e.value.kind == "auth" and "GROQ_API_KEY" in str(e.value)


def test_connection_refused_is_a_connect_error() -> None:
    async def main() -> list[Any]:
        p = OpenAiCompatLlm("m", preset="vllm", base_url="http://127.0.0.1:9/v1")
        evs = await collect(p)
        await close_all()
        return evs

    evs = asyncio.run(main())
    assert len(evs) == 1 and isinstance(evs[0], LlmError) and evs[0].kind == "connect"
