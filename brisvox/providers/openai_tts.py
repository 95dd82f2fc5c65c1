"""OpenAI speech (``POST /v1/audio/speech``, ``response_format: "pcm"``) as a streaming TTS session.

Owns :class:`OpenAiTts` and :class:`SerialTtsSession`, the session shape of
every request-per-chunk TTS (this one and the local Piper job): text chunks
and flushes are queued per session and served IN ORDER by one worker task;
each chunk is one synthesis whose audio streams out as TtsAudio while it
arrives; a flush is answered with TtsFlushed after the audio of every chunk
before it. ``cancel(context)`` is non-blocking: it queues TtsCancelled at
once, drops the context's queued chunks and cancels its running synthesis
(the HTTP response is closed, so the connection is released). No word
timings (OpenAI sends none: the playout book falls back to its speaking-rate
estimate).

The wire: raw PCM16 mono 24 kHz little-endian, chunked; HTTP errors map as in
:mod:`brisvox.providers.http`; a synthesis error ends the session (TtsClosed
with the reason) so the TTS stage marks the utterance lost and reconnects.
Key: ``OPENAI_API_KEY`` (per-request ``Authorization`` header on the shared
client). Options: ``model`` (gpt-4o-mini-tts), ``voice`` (alloy),
``instructions``, ``speed``. ``idle_limit`` None: no socket to keep alive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson

from brisvox.providers import http as nh
from brisvox.providers.base import (
    ProviderError,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsEvent,
    TtsFlushed,
)
from brisvox.providers.ws_common import CancelledIds, EventPipe, TaskSet

RATE = 24000
FLUSH = object()

Synth = Callable[[int, str], AsyncIterator[bytes]]


class SerialTtsSession:
    """``synth(context, text)`` yields PCM bytes at ``sample_rate``; one at a time, in order."""

    def __init__(self, synth: Synth, sample_rate: int, queue_cap: int = 256,
                 on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.sample_rate = sample_rate
        self._synth = synth
        self._queue: deque[tuple[int, Any]] = deque()
        self._cap = queue_cap
        self._wake = asyncio.Event()
        self._pipe = EventPipe(1024)
        self._cancelled = CancelledIds()
        self._tasks = TaskSet()
        self._current: tuple[int, asyncio.Task[None]] | None = None
        self._closed = False
        self._on_close = on_close
        self.syntheses = 0
        self._worker = asyncio.get_running_loop().create_task(self._run())

    def _push(self, context: int, item: Any) -> None:
        if self._closed:
            raise ProviderError("closed", "session closed")
        if len(self._queue) >= self._cap:
            raise ProviderError("timeout", "synthesis queue full")
        self._queue.append((context, item))
        self._wake.set()

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if context not in self._cancelled and text.strip():
            self._push(context, text)

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if context not in self._cancelled:
            self._push(context, FLUSH)

    def cancel(self, context: int) -> None:
        self._cancelled.add(context)
        if any(c == context for c, _ in self._queue):
            self._queue = deque((c, i) for c, i in self._queue if c != context)
        cur = self._current
        if cur is not None and cur[0] == context:
            cur[1].cancel()
        self._pipe.put_soon(TtsCancelled(context), self._tasks)

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._pipe.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            return
        self._closed = True
        self._worker.cancel()
        self._tasks.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._worker, timeout)
        if self._on_close is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._on_close(), timeout)
        self._pipe.end(TtsClosed(""))

    async def _one(self, context: int, text: str) -> None:
        carry = b""
        async for pcm in self._synth(context, text):
            if context in self._cancelled:
                return
            pcm = carry + pcm
            n = len(pcm) & ~1
            carry = pcm[n:]
            if n:
                await self._pipe.put(TtsAudio(context, pcm[:n]))

    async def _run(self) -> None:
        error = ""
        try:
            while True:
                while not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                context, item = self._queue.popleft()
                if context in self._cancelled:
                    continue
                if item is FLUSH:
                    await self._pipe.put(TtsFlushed(context))
                    continue
                task = asyncio.get_running_loop().create_task(self._one(context, item))
                self._current = (context, task)
                try:
                    await task
                except asyncio.CancelledError:
                    me = asyncio.current_task()
                    if me is not None and me.cancelling():
                        raise  # the session is closing
                    # else: cancel(context) stopped this synthesis; go on with the queue
                finally:
                    self._current = None
                self.syntheses += 1
        except ProviderError as e:
            error = f"{e.kind}: {e.detail}"[:300]
        except asyncio.CancelledError:
            cur = self._current
            if cur is not None:
                cur[1].cancel()
            raise
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            if error:
                self._closed = True
                self._pipe.end(TtsClosed(error))


class OpenAiTts:
    def __init__(self, api_key: str | None, *, model: str = "gpt-4o-mini-tts", voice: str = "alloy",
                 base_url: str = "https://api.openai.com/v1", instructions: str = "",
                 connect_timeout: float = 5.0, read_timeout: float = 15.0, name: str = "openai_tts") -> None:
        if not api_key:
            raise ProviderError("auth", "openai speech: no API key (set OPENAI_API_KEY)", retryable=False)
        self.name = name
        self.model = model
        self.voice = voice
        self.base_url = base_url.rstrip("/")
        nh.origin_of(self.base_url)
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self.instructions = instructions
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await nh.warm_origin(self.base_url, timeout, self.connect_timeout)

    async def connect(self, config: TtsConfig, timeout: float) -> SerialTtsSession:  # noqa: ASYNC109
        body: dict[str, Any] = {"model": config.model or self.model, "voice": config.voice or self.voice,
                                "response_format": "pcm"}
        if config.speed != 1.0:
            body["speed"] = config.speed
        if self.instructions:
            body["instructions"] = self.instructions
        return SerialTtsSession(lambda ctx, text: self._synth(body, text), RATE)

    async def _synth(self, base: Mapping[str, Any], text: str) -> AsyncIterator[bytes]:
        payload = orjson.dumps({**base, "input": text})
        headers = {"Content-Type": "application/json", **self._auth}
        async with nh.post_stream(self.base_url + "/audio/speech", payload, headers, read_timeout=self.read_timeout,
                                  connect_timeout=self.connect_timeout) as resp:
            async for chunk in resp.aiter_bytes():
                yield chunk
