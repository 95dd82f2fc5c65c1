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

from collections.abc import Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection

from brisvox.providers.base import ProviderError, TtsConfig, TtsWord
from brisvox.providers.ws_common import (
    WsTtsSession,
    context_id,
    context_of,
    resolve_url,
    ws_connect,
)

API_VERSION = "2025-04-16"


class CartesiaSession(WsTtsSession):
    def __init__(self, ws: ClientConnection, model: str, voice: str, language: str, sample_rate: int,
                 speed: float, extra: Mapping[str, Any]) -> None:
        super().__init__(ws, sample_rate)
        self._base: dict[str, Any] = {
            "model_id": model, "voice": {"mode": "id", "id": voice}, "language": language,
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": sample_rate},
            "add_timestamps": True,
        }
        if speed != 1.0:
            self._base["speed"] = speed
        self._base.update(extra)

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        if context in self._cancelled or not text:
            return
        self._open.add(context)
        await self._send_json({**self._base, "context_id": context_id(context), "transcript": text,
                               "continue": True}, timeout)

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        if context in self._cancelled:
            return
        self._flushing.add(context)
        self._open.add(context)
        await self._send_json({**self._base, "context_id": context_id(context), "transcript": "",
                               "continue": False}, timeout)

    def _cancel_message(self, context: int) -> dict[str, Any]:
        return {"context_id": context_id(context), "cancel": True}

    async def _handle(self, obj: dict[str, Any]) -> str:
        t = obj.get("type")
        ctx = context_of(obj.get("context_id"))
        if t == "error":
            if ctx is not None and ctx in self._cancelled:
                return ""
            return f"error {obj.get('status_code', '')}: {str(obj.get('error', ''))[:200]}"
        if ctx is None or ctx in self._cancelled:
            return ""
        if t == "chunk":
            pcm = self._pcm(obj.get("data") or "")
            if pcm is None:
                return "bad audio chunk"
            await self._audio(ctx, pcm)
        elif t == "timestamps":
            wt = obj.get("word_timestamps") or {}
            words, starts, ends = wt.get("words") or [], wt.get("start") or [], wt.get("end") or []
            for w, s, e in zip(words, starts, ends, strict=False):
                await self._pipe.put(TtsWord(ctx, str(w), float(s), float(e)))
        elif t == "done":
            await self._flushed(ctx)
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
        await resolve_url(self.base_url, timeout)

    async def connect(self, config: TtsConfig, timeout: float) -> CartesiaSession:  # noqa: ASYNC109
        ws = await ws_connect(f"{self.base_url}/tts/websocket", self._headers, timeout)
        rate = self.sample_rate or config.sample_rate
        return CartesiaSession(ws, config.model or self.model, config.voice or self.voice, config.language or "en",
                               rate, config.speed, {**self.options, **dict(config.extra)})
