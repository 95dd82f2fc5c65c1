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

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from websockets.asyncio.client import ClientConnection

from brisvox.providers.base import ProviderError, TtsConfig, TtsFlushed, TtsWord
from brisvox.providers.ws_common import (
    WsTtsSession,
    context_id,
    context_of,
    resolve_url,
    ws_connect,
)

RATES = (8000, 16000, 22050, 24000, 44100)
CLOSE_SOCKET = orjson.dumps({"close_socket": True}).decode()


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


class ElevenLabsSession(WsTtsSession):
    def __init__(self, ws: ClientConnection, sample_rate: int, voice_settings: Mapping[str, Any] | None) -> None:
        super().__init__(ws, sample_rate)
        self._settings = dict(voice_settings or {})
        self._audio_s: dict[int, float] = {}  # seconds of audio of each open context so far

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if context in self._cancelled or not text:
            return
        msg: dict[str, Any] = {"text": text, "context_id": context_id(context)}
        if context not in self._open:
            self._open.add(context)
            self._audio_s[context] = 0.0
            if self._settings:
                msg["voice_settings"] = self._settings
        await self._send_json(msg, timeout)

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if context in self._cancelled:
            return
        if context not in self._open:  # nothing was sent: nothing to wait for
            await self._pipe.put(TtsFlushed(context))
            return
        self._flushing.add(context)
        await self._send_json({"context_id": context_id(context), "flush": True}, timeout)
        await self._send_json({"context_id": context_id(context), "close_context": True}, timeout)

    def _cancel_message(self, context: int) -> dict[str, Any]:
        return {"context_id": context_id(context), "close_context": True}

    def _goodbye(self) -> str | None:
        return CLOSE_SOCKET

    async def _handle(self, obj: dict[str, Any]) -> str:
        if "error" in obj or obj.get("message_type") == "error":
            return f"error: {str(obj.get('error') or obj.get('message') or '')[:200]}"
        ctx = context_of(obj.get("contextId") or obj.get("context_id"))
        if ctx is None or ctx in self._cancelled:
            return ""
        audio = obj.get("audio")
        if isinstance(audio, str) and audio:
            pcm = self._pcm(audio)
            if pcm is None:
                return "bad audio chunk"
            offset = self._audio_s.get(ctx, 0.0)
            al = obj.get("alignment") or obj.get("normalizedAlignment")
            if isinstance(al, dict):
                for w, s, e in words_from_alignment(al, offset):
                    await self._pipe.put(TtsWord(ctx, w, s, e))
            self._audio_s[ctx] = offset + len(pcm) / 2 / self.sample_rate
            await self._audio(ctx, pcm)
        if obj.get("isFinal") is True and ctx in self._flushing:
            self._audio_s.pop(ctx, None)
            await self._flushed(ctx)
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
        await resolve_url(self.base_url, timeout)

    async def connect(self, config: TtsConfig, timeout: float) -> ElevenLabsSession:  # noqa: ASYNC109
        ws = await ws_connect(self.url(config), self._headers, timeout)
        return ElevenLabsSession(ws, self.sample_rate, self.voice_settings)
