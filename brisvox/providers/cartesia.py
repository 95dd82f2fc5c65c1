"""Cartesia streaming text-to-speech over one WebSocket per call (``/tts/websocket``).

Owns :class:`CartesiaTts` and its session. Wire: every text chunk is a JSON
request on the context's ``context_id`` with ``"continue": true`` (more text
may follow: Cartesia keeps prosody across the chunks of one context); the
flush is an empty ``transcript`` with ``"continue": false``; a barge-in sends
``{"context_id", "cancel": true}``. The server answers ``chunk`` (base64
``pcm_s16le`` at the requested rate), ``timestamps``
(``word_timestamps.words/start/end`` in seconds from the context's start,
requested with ``add_timestamps``), ``done`` and ``error``.

Contract mapping: chunk -> TtsAudio, each timestamped word -> TtsWord,
``done`` of a flushed context -> TtsFlushed. ``cancel()`` is non-blocking:
TtsCancelled is queued at once, the cancel request goes out on its own task,
and every later message of that context is dropped (the last 64 cancelled
ids are remembered). An ``error`` message or a garbage frame that cannot be
attributed ends the session (TtsClosed with the reason): the TTS stage marks
the open utterances lost and reconnects. Cartesia closes a socket idle for 5
minutes (``idle_limit`` 300 s); there is no keepalive message.

Options: ``model`` (sonic-2), ``voice`` (a voice id), ``language``,
``sample_rate`` (default: what the stage asks for), ``version``
(``Cartesia-Version`` header). Key: ``CARTESIA_API_KEY`` -> ``X-API-Key``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from brisvox.providers.base import (
    ProviderError,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsEvent,
    TtsFlushed,
    TtsWord,
)
from brisvox.providers.ws_common import (
    CancelledIds,
    EventPipe,
    close_ws,
    resolve,
    send_bounded,
    ws_connect,
)

API_VERSION = "2025-04-16"


def _cid(context: int) -> str:
    return f"bv-{context}"


def _ctx(cid: Any) -> int | None:
    if isinstance(cid, str) and cid.startswith("bv-") and cid[3:].isdigit():
        return int(cid[3:])
    return None


class CartesiaSession:
    def __init__(self, ws: ClientConnection, model: str, voice: str, language: str, sample_rate: int,
                 speed: float, extra: Mapping[str, Any]) -> None:
        self._ws = ws
        self.sample_rate = sample_rate
        self._base: dict[str, Any] = {
            "model_id": model, "voice": {"mode": "id", "id": voice}, "language": language,
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": sample_rate},
            "add_timestamps": True,
        }
        if speed != 1.0:
            self._base["speed"] = speed
        self._base.update(extra)
        self._pipe = EventPipe(1024)
        self._cancelled = CancelledIds()
        self._flushing: set[int] = set()
        self._open: set[int] = set()
        self._closed = False
        self.bad_messages = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            raise ProviderError("closed", "session closed")
        if context in self._cancelled or not text:
            return
        self._open.add(context)
        msg = {**self._base, "context_id": _cid(context), "transcript": text, "continue": True}
        await send_bounded(self._ws, orjson.dumps(msg).decode(), timeout)

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            raise ProviderError("closed", "session closed")
        if context in self._cancelled:
            return
        self._flushing.add(context)
        self._open.add(context)
        msg = {**self._base, "context_id": _cid(context), "transcript": "", "continue": False}
        await send_bounded(self._ws, orjson.dumps(msg).decode(), timeout)

    def cancel(self, context: int) -> None:
        self._cancelled.add(context)
        self._flushing.discard(context)
        was_open = context in self._open
        self._open.discard(context)
        if not self._pipe.put_nowait(TtsCancelled(context)):
            self._spawn(self._pipe.put(TtsCancelled(context)))
        if was_open and not self._closed:
            self._spawn(self._send_cancel(context))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _send_cancel(self, context: int) -> None:
        with contextlib.suppress(ProviderError):
            await send_bounded(self._ws, orjson.dumps({"context_id": _cid(context), "cancel": True}).decode(), 2.0)

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._pipe.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            return
        self._closed = True
        await close_ws(self._ws, timeout)
        self._reader.cancel()
        for t in list(self._tasks):
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._reader, timeout)
        self._pipe.end(TtsClosed(""))

    async def _read(self) -> None:
        error = ""
        try:
            async for msg in self._ws:
                try:
                    obj = orjson.loads(msg)
                except orjson.JSONDecodeError:
                    self.bad_messages += 1
                    error = "garbage from the server"
                    break
                if not isinstance(obj, dict):
                    self.bad_messages += 1
                    continue
                err = await self._handle(obj)
                if err:
                    error = err
                    break
        except ConnectionClosed as e:
            error = "" if self._closed else f"closed: {e.rcvd.code if e.rcvd else 1006}"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            error = type(e).__name__
        finally:
            if not self._closed and not error:
                error = "closed by the server"
            self._closed = True
            self._pipe.end(TtsClosed(error))
            if error:
                await close_ws(self._ws, 0.5)

    async def _handle(self, obj: dict[str, Any]) -> str:
        t = obj.get("type")
        ctx = _ctx(obj.get("context_id"))
        if t == "error":
            if ctx is not None and ctx in self._cancelled:
                return ""
            return f"error {obj.get('status_code', '')}: {str(obj.get('error', ''))[:200]}"
        if ctx is None or ctx in self._cancelled:
            return ""
        if t == "chunk":
            try:
                pcm = base64.b64decode(obj.get("data") or "", validate=True)
            except (binascii.Error, ValueError):
                self.bad_messages += 1
                return "bad audio chunk"
            if len(pcm) % 2:
                pcm = pcm[:-1]
            if pcm:
                await self._pipe.put(TtsAudio(ctx, pcm))
        elif t == "timestamps":
            wt = obj.get("word_timestamps") or {}
            words, starts, ends = wt.get("words") or [], wt.get("start") or [], wt.get("end") or []
            for w, s, e in zip(words, starts, ends, strict=False):
                await self._pipe.put(TtsWord(ctx, str(w), float(s), float(e)))
        elif t == "done":
            if ctx in self._flushing:
                self._flushing.discard(ctx)
                self._open.discard(ctx)
                await self._pipe.put(TtsFlushed(ctx))
        return ""


class CartesiaTts:
    def __init__(self, api_key: str | None, *, model: str = "sonic-2", voice: str = "",
                 base_url: str = "wss://api.cartesia.ai", version: str = API_VERSION,
                 sample_rate: int | None = None, options: Mapping[str, Any] | None = None,
                 name: str = "cartesia") -> None:
        if not api_key:
            raise ProviderError("auth", "cartesia: no API key (set CARTESIA_API_KEY)", retryable=False)
        self.name = name
        self.model = model
        self.voice = voice
        self.base_url = base_url.rstrip("/")
        self._headers = {"X-API-Key": api_key, "Cartesia-Version": version}
        self.sample_rate = sample_rate
        self.options = dict(options or {})

    def idle_limit(self) -> float | None:
        return 300.0

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        u = urlsplit(self.base_url)
        await resolve(u.hostname or "", u.port or (443 if u.scheme == "wss" else 80), timeout)

    async def connect(self, config: TtsConfig, timeout: float) -> CartesiaSession:  # noqa: ASYNC109
        ws = await ws_connect(f"{self.base_url}/tts/websocket", self._headers, timeout)
        rate = self.sample_rate or config.sample_rate
        return CartesiaSession(ws, config.model or self.model, config.voice or self.voice, config.language or "en",
                               rate, config.speed, {**self.options, **dict(config.extra)})
