"""GeneratedStream: an :class:`~brisvox.providers.base.LlmStream` over an adapter's async generator.

Owns the rules every streaming LLM adapter shares, so each vendor module only
translates its wire format:

* The generator yields LlmEvents; the stream ends after :class:`Done` or
  :class:`LlmError` (nothing is read after either).
* A :class:`ProviderError`, an :class:`~brisvox.providers.sse.SseError` or an
  unexpected exception inside the generator becomes ONE final
  :class:`LlmError` (kind kept; unexpected ones are ``protocol``), never an
  exception out of ``__anext__``; the generator ending without Done is
  ``truncated``.
* Bounds: ``max_seconds`` on the whole response (a never-ending stream ends
  with ``too_long``) on the loop clock; the byte bound lives in the adapters
  (they see the bytes).
* ``aclose()`` is idempotent, prompt (bounded by ``close_timeout``) and never
  raises; it closes the generator, whose ``async with`` releases the HTTP
  response or socket.
* :data:`STATS` counts streams, errors by kind and closes, process-wide
  (the "counted error" of every bad-input case).

:class:`HttpSseLlm` is the skeleton of the HTTP/SSE adapters (OpenAI-compatible,
Anthropic, Gemini): the options they share (:class:`HttpLlmOptions`, the keys
the registry passes as ``COMMON_HTTP``), ``warm`` (a pooled connection to the
origin), ``stream`` and the request loop: one streamed POST
(:func:`brisvox.providers.http.post_stream`), the body's SSE events bounded by
``max_response_bytes`` / ``max_event_bytes`` (:class:`~brisvox.providers.sse.SseBody`),
each event handed to the vendor's :class:`SseDecoder`. A :class:`Done` from the
decoder ends the stream after the rest of the body is drained (the connection
goes back to the pool); a body that ends is handed to ``decoder.end`` (no events
= ``truncated``). The vendor module keeps its wire: URL, body, extra headers and
the decoder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Protocol, TypedDict

import orjson

from brisvox.providers import http as nh
from brisvox.providers.base import Done, LlmError, LlmEvent, LlmRequest, ProviderError
from brisvox.providers.sse import SseBody, SseError, SseEvent

log = logging.getLogger("brisvox.providers")

STATS: Counter[str] = Counter()


def count_error(provider: str, kind: str) -> None:
    STATS[f"{provider}.error.{kind}"] += 1
    STATS[f"error.{kind}"] += 1


class GeneratedStream:
    def __init__(self, provider: str, gen: AsyncGenerator[LlmEvent, None], *, max_seconds: float = 120.0,
                 close_timeout: float = 1.0) -> None:
        self.provider = provider
        self._gen = gen
        self._done = False
        self._closed = False
        self._close_timeout = close_timeout
        self._deadline = asyncio.get_running_loop().time() + max_seconds
        STATS[f"{provider}.streams"] += 1

    def __aiter__(self) -> AsyncIterator[LlmEvent]:
        return self

    async def __anext__(self) -> LlmEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            async with asyncio.timeout_at(self._deadline):
                ev = await self._gen.__anext__()
        except StopAsyncIteration:
            return self._fail("truncated", "the stream ended before the response was complete")
        except TimeoutError:
            return self._fail("too_long", "the response exceeded its time bound", retryable=False)
        except ProviderError as e:
            return self._fail(e.kind, e.detail, e.retryable, e.retry_after)
        except SseError as e:
            return self._fail(e.kind if e.kind == "oversized" else "protocol", str(e), retryable=False)
        except asyncio.CancelledError:
            self._done = True
            raise
        except Exception as e:  # noqa: BLE001 - a broken stream is an error event, never a crash
            log.warning("%s: stream failed: %s", self.provider, type(e).__name__)
            return self._fail("protocol", f"{type(e).__name__}: {str(e)[:200]}")
        if isinstance(ev, Done):
            self._done = True
        elif isinstance(ev, LlmError):
            self._done = True
            count_error(self.provider, ev.kind)
        return ev

    def _fail(self, kind: str, detail: str, retryable: bool = True, retry_after: float | None = None) -> LlmError:
        self._done = True
        count_error(self.provider, kind)
        return LlmError(kind, detail, retryable, retry_after)

    async def aclose(self) -> None:
        self._done = True
        if self._closed:
            return
        self._closed = True
        STATS[f"{self.provider}.closed"] += 1
        with contextlib.suppress(Exception):  # a cancellation of the caller still propagates
            async with asyncio.timeout(self._close_timeout):
                await self._gen.aclose()


class ErrorStream:
    """A stream that fails at once (a request that could not even be built)."""

    def __init__(self, provider: str, kind: str, detail: str, retryable: bool = False) -> None:
        self._ev: LlmError | None = LlmError(kind, detail, retryable)
        count_error(provider, kind)

    def __aiter__(self) -> AsyncIterator[LlmEvent]:
        return self

    async def __anext__(self) -> LlmEvent:
        ev, self._ev = self._ev, None
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def aclose(self) -> None:
        self._ev = None


class SseDecoder(Protocol):
    """One response's wire state: SSE events in, LlmEvents out."""

    def event(self, ev: SseEvent) -> list[LlmEvent]:
        """The events one SSE event carries (a Done among them ends the stream);
        raises ProviderError for an error event or a broken one."""
        ...

    def end(self, pending: bool) -> list[LlmEvent]:
        """The body ended without a Done (``pending``: inside an event). The last
        events (a Done when the response was complete), or none: ``truncated``."""
        ...


class HttpLlmOptions(TypedDict, total=False):
    """The options every HTTP/SSE LLM adapter takes (defaults in :class:`HttpSseLlm`)."""

    headers: Mapping[str, str] | None
    options: Mapping[str, Any] | None
    connect_timeout: float
    read_timeout: float
    max_response_bytes: int
    max_event_bytes: int
    max_seconds: float


SSE_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


class HttpSseLlm:
    """Base of the HTTP/SSE LLM adapters; a vendor supplies ``url``, ``request_body`` and ``decoder``."""

    wire_headers: Mapping[str, str] = {}  # the vendor's fixed request headers (API version, ...)

    def __init__(
        self,
        name: str,
        model: str,
        base_url: str,
        auth: Mapping[str, str],
        *,
        headers: Mapping[str, str] | None = None,
        options: Mapping[str, Any] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_response_bytes: int = 2 << 20,
        max_event_bytes: int = 256 << 10,
        max_seconds: float = 120.0,
    ) -> None:
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        nh.origin_of(self.base_url)  # validates the URL
        self._auth = dict(auth)
        self.headers = dict(headers or {})
        self.options: dict[str, Any] = dict(options or {})
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_response_bytes = max_response_bytes
        self.max_event_bytes = max_event_bytes
        self.max_seconds = max_seconds

    @property
    def url(self) -> str:
        raise NotImplementedError

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        raise NotImplementedError

    def decoder(self) -> SseDecoder:
        raise NotImplementedError

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await nh.warm_origin(self.base_url, timeout, self.connect_timeout)

    def stream(self, request: LlmRequest) -> GeneratedStream:
        return GeneratedStream(self.name, self._events(request), max_seconds=self.max_seconds)

    async def _events(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        payload = orjson.dumps(self.request_body(request))
        headers = nh.merge_headers(SSE_JSON_HEADERS, dict(self.wire_headers), self.headers, self._auth)
        decoder = self.decoder()
        async with nh.post_stream(self.url, payload, headers, read_timeout=self.read_timeout,
                                  connect_timeout=self.connect_timeout) as resp:
            body = SseBody(resp.aiter_bytes(), max_bytes=self.max_response_bytes, max_event=self.max_event_bytes)
            async for ev in body:
                for out in decoder.event(ev):
                    if isinstance(out, Done):
                        await nh.drain(body.rest)
                        yield out
                        return
                    yield out
            for out in decoder.end(body.pending()):
                yield out
