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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator

from brisvox.providers.base import Done, LlmError, LlmEvent, ProviderError
from brisvox.providers.sse import SseError

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
            return self._fail(e.kind, e.detail, e.retryable)
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

    def _fail(self, kind: str, detail: str, retryable: bool = True) -> LlmError:
        self._done = True
        count_error(self.provider, kind)
        return LlmError(kind, detail, retryable)

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
