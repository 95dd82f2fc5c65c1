"""ElevenLabs streaming text-to-speech over the multi-context WebSocket.

Owns :class:`ElevenLabsTts` and its session. Wire
(``/v1/text-to-speech/{voice}/multi-stream-input``, ``xi-api-key`` header):
text goes out as ``{"text", "context_id"}`` (the first message of a context
opens it, with ``voice_settings`` when configured); our flush sends
``{"context_id", "flush": true}`` then ``{"context_id", "close_context":
true}``; a barge-in sends ``close_context`` alone. The server sends
``{"audio": base64 PCM, "alignment": {"chars", "charStartTimesMs",
"charDurationsMs"}, "contextId"}`` and ``{"isFinal": true, "contextId"}``
when a closed context has no more audio.

Contract mapping: audio -> TtsAudio (``output_format`` ``pcm_<rate>``),
character alignment -> TtsWord (characters grouped into words at spaces,
times offset by the context's audio before the chunk), ``isFinal`` of a
flushed context -> TtsFlushed. ``cancel()`` queues TtsCancelled at once and
drops every later message of the context. ``inactivity_timeout`` (default
180 s, the server's maximum) is the provider's ``idle_limit``. A garbage
frame or an error message ends the session (TtsClosed with the reason).
Key: ``ELEVENLABS_API_KEY``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

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

RATES = (8000, 16000, 22050, 24000, 44100)


def _ctx(cid: Any) -> int | None:
    if isinstance(cid, str) and cid.startswith("bv-") and cid[3:].isdigit():
        return int(cid[3:])
    return None


def words_from_alignment(al: Mapping[str, Any], offset: float) -> list[tuple[str, float, float]]:
    chars = al.get("chars") or []
    starts = al.get("charStartTimesMs") or []
    durs = al.get("charDurationsMs") or []
    out: list[tuple[str, float, float]] = []
    word = ""
    ws = we = 0.0
    for c, s, d in zip(chars, starts, durs, strict=False):
        if str(c).isspace():
            if word:
                out.append((word, offset + ws / 1000.0, offset + we / 1000.0))
                word = ""
            continue
        if not word:
            ws = float(s)
        word += str(c)
        we = float(s) + float(d)
    if word:
        out.append((word, offset + ws / 1000.0, offset + we / 1000.0))
    return out


class ElevenLabsSession:
    def __init__(self, ws: ClientConnection, sample_rate: int, voice_settings: Mapping[str, Any] | None) -> None:
        self._ws = ws
        self.sample_rate = sample_rate
        self._settings = dict(voice_settings or {})
        self._pipe = EventPipe(1024)
        self._cancelled = CancelledIds()
        self._opened: set[int] = set()
        self._flushing: set[int] = set()
        self._audio_s: dict[int, float] = {}
        self._closed = False
        self.bad_messages = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _send(self, obj: dict[str, Any], timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            raise ProviderError("closed", "session closed")
        await send_bounded(self._ws, orjson.dumps(obj).decode(), timeout)

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if context in self._cancelled or not text:
            return
        msg: dict[str, Any] = {"text": text, "context_id": f"bv-{context}"}
        if context not in self._opened:
            self._opened.add(context)
            self._audio_s[context] = 0.0
            if self._settings:
                msg["voice_settings"] = self._settings
        await self._send(msg, timeout)

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if context in self._cancelled:
            return
        if context not in self._opened:  # nothing was sent: nothing to wait for
            await self._pipe.put(TtsFlushed(context))
            return
        self._flushing.add(context)
        await self._send({"context_id": f"bv-{context}", "flush": True}, timeout)
        await self._send({"context_id": f"bv-{context}", "close_context": True}, timeout)

    def cancel(self, context: int) -> None:
        self._cancelled.add(context)
        self._flushing.discard(context)
        was_open = context in self._opened
        self._opened.discard(context)
        if not self._pipe.put_nowait(TtsCancelled(context)):
            self._spawn(self._pipe.put(TtsCancelled(context)))
        if was_open and not self._closed:
            self._spawn(self._send_close(context))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _send_close(self, context: int) -> None:
        with contextlib.suppress(ProviderError):
            await self._send({"context_id": f"bv-{context}", "close_context": True}, 2.0)

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._pipe.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            return
        with contextlib.suppress(ProviderError):
            await self._send({"close_socket": True}, min(timeout, 0.2))
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
                if "error" in obj or obj.get("message_type") == "error":
                    error = f"error: {str(obj.get('error') or obj.get('message') or '')[:200]}"
                    break
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
        ctx = _ctx(obj.get("contextId") or obj.get("context_id"))
        if ctx is None or ctx in self._cancelled:
            return ""
        audio = obj.get("audio")
        if isinstance(audio, str) and audio:
            try:
                pcm = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError):
                self.bad_messages += 1
                return "bad audio chunk"
            if len(pcm) % 2:
                pcm = pcm[:-1]
            offset = self._audio_s.get(ctx, 0.0)
            al = obj.get("alignment") or obj.get("normalizedAlignment")
            if isinstance(al, dict):
                for w, s, e in words_from_alignment(al, offset):
                    await self._pipe.put(TtsWord(ctx, w, s, e))
            self._audio_s[ctx] = offset + len(pcm) / 2 / self.sample_rate
            if pcm:
                await self._pipe.put(TtsAudio(ctx, pcm))
        if obj.get("isFinal") is True and ctx in self._flushing:
            self._flushing.discard(ctx)
            self._opened.discard(ctx)
            self._audio_s.pop(ctx, None)
            await self._pipe.put(TtsFlushed(ctx))
        return ""


class ElevenLabsTts:
    def __init__(self, api_key: str | None, *, voice: str, model: str = "eleven_flash_v2_5",
                 base_url: str = "wss://api.elevenlabs.io", sample_rate: int = 24000,
                 inactivity_timeout: int = 180, voice_settings: Mapping[str, Any] | None = None,
                 name: str = "elevenlabs") -> None:
        if not api_key:
            raise ProviderError("auth", "elevenlabs: no API key (set ELEVENLABS_API_KEY)", retryable=False)
        if sample_rate not in RATES:
            raise ValueError(f"elevenlabs: sample_rate must be one of {RATES}")
        self.name = name
        self.voice = voice
        self.model = model
        self.base_url = base_url.rstrip("/")
        self._headers = {"xi-api-key": api_key}
        self.sample_rate = sample_rate
        self.inactivity_timeout = inactivity_timeout
        self.voice_settings = dict(voice_settings or {})

    def idle_limit(self) -> float | None:
        return float(self.inactivity_timeout)

    def url(self, cfg: TtsConfig) -> str:
        q = urlencode({"model_id": cfg.model or self.model, "output_format": f"pcm_{self.sample_rate}",
                       "sync_alignment": "true", "inactivity_timeout": str(self.inactivity_timeout)})
        voice = quote(cfg.voice or self.voice, safe="")
        return f"{self.base_url}/v1/text-to-speech/{voice}/multi-stream-input?{q}"

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        u = urlsplit(self.base_url)
        await resolve(u.hostname or "", u.port or (443 if u.scheme == "wss" else 80), timeout)

    async def connect(self, config: TtsConfig, timeout: float) -> ElevenLabsSession:  # noqa: ASYNC109
        ws = await ws_connect(self.url(config), self._headers, timeout)
        return ElevenLabsSession(ws, self.sample_rate, self.voice_settings)
