"""Deepgram streaming speech-to-text over a WebSocket (``/v1/listen``).

Owns :class:`DeepgramStt` and its session. Wire: the client sends binary
PCM16 frames and JSON controls ``{"type": "Finalize"}`` (flush what was sent
so far; answered by a ``Results`` message with ``from_finalize: true``),
``{"type": "KeepAlive"}`` (sent when no audio went out for
``keepalive_interval`` s: Deepgram closes a socket after about 10 s without
data) and ``{"type": "CloseStream"}``. The server sends ``Results``
(``channel.alternatives[0].transcript``, ``is_final``, ``speech_final``,
``from_finalize``, ``start``, ``duration``), ``Metadata``, ``SpeechStarted``
and ``UtteranceEnd`` (ignored: the VAD and the turn driver decide turns).

Mapping to the contract of :mod:`brisvox.providers.base`: interims ->
``Transcript(is_final=False)``; finals -> ``is_final=True`` with the
provider's own ``speech_final`` (its endpointing: closes nothing); the
``from_finalize`` final -> ``Transcript(is_final=True, speech_final=True,
from_finalize=True)``, exactly one per Finalize (a second from_finalize
result before the next Finalize is folded into a plain final).

Query options: ``model`` (default nova-3), ``encoding=linear16``,
``sample_rate``, ``channels=1``, ``interim_results``, ``punctuate``,
``smart_format``, ``language``, ``endpointing`` (ms, default 300),
``keyterm`` per keyword (nova-3); anything in ``options`` is added verbatim.
Key: ``DEEPGRAM_API_KEY`` -> ``Authorization: Token <key>`` header. A
garbage message is counted (``bad_messages``) and skipped; the session's
death ends the event stream with SttClosed(error) and the STT stage answers
the open Finalizes itself (the turn proceeds with what it has) and reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlencode

import orjson
from websockets.asyncio.client import ClientConnection

from brisvox.providers.base import ProviderError, SttClosed, SttConfig, SttEvent, Transcript
from brisvox.providers.ws_common import WsSession, resolve_url, send_bounded, ws_connect

log = logging.getLogger("brisvox.providers.deepgram")

FINALIZE = orjson.dumps({"type": "Finalize"}).decode()
KEEPALIVE = orjson.dumps({"type": "KeepAlive"}).decode()
CLOSE = orjson.dumps({"type": "CloseStream"}).decode()


class DeepgramSession(WsSession):
    def __init__(self, ws: ClientConnection, keepalive_interval: float) -> None:
        super().__init__(ws, 512, SttClosed)
        self._keepalive = keepalive_interval
        self._last_send = time.monotonic()
        self._outstanding = 0  # Finalizes not yet answered
        self.keepalives = 0
        self._tasks.spawn(self._keepalive_loop())

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        await send_bounded(self._ws, pcm, timeout)
        self._last_send = time.monotonic()

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        self._outstanding += 1
        await send_bounded(self._ws, FINALIZE, timeout)
        self._last_send = time.monotonic()

    def events(self) -> AsyncIterator[SttEvent]:
        return self._pipe.iterate()

    def _goodbye(self) -> str | None:
        return CLOSE

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self._keepalive / 4))
            if self._closed:
                return
            if time.monotonic() - self._last_send >= self._keepalive:
                try:
                    await send_bounded(self._ws, KEEPALIVE, 2.0)
                except ProviderError:
                    return
                self.keepalives += 1
                self._last_send = time.monotonic()

    async def _message(self, msg: str | bytes) -> str:
        """Binary frames and garbage are counted and skipped (never fatal)."""
        if isinstance(msg, bytes):
            self.bad_messages += 1
            return ""
        try:
            obj = orjson.loads(msg)
        except orjson.JSONDecodeError:
            self.bad_messages += 1
            return ""
        ev = self._translate(obj) if isinstance(obj, dict) else None
        if ev is not None:
            await self._pipe.put(ev)
        return ""

    def _translate(self, obj: dict[str, Any]) -> Transcript | None:
        t = obj.get("type")
        if t == "Error" or "err_code" in obj:
            self.bad_messages += 1
            return None
        if t != "Results":
            return None
        try:
            alt = obj["channel"]["alternatives"][0]
            text = str(alt.get("transcript") or "")
            conf = float(alt.get("confidence") or 0.0)
        except (KeyError, IndexError, TypeError, ValueError):
            self.bad_messages += 1
            return None
        start = float(obj.get("start") or 0.0)
        end = start + float(obj.get("duration") or 0.0)
        is_final = bool(obj.get("is_final"))
        if obj.get("from_finalize") and self._outstanding > 0:
            self._outstanding -= 1
            return Transcript(text, True, True, True, conf, start, end)
        if not is_final and not text:
            return None
        return Transcript(text, is_final, bool(obj.get("speech_final")) and is_final, False, conf, start, end)


class DeepgramStt:
    def __init__(self, api_key: str | None, *, model: str = "nova-3", base_url: str = "wss://api.deepgram.com",
                 endpointing_ms: int = 300, keepalive_interval: float = 5.0,
                 options: Mapping[str, Any] | None = None, name: str = "deepgram") -> None:
        if not api_key:
            raise ProviderError("auth", "deepgram: no API key (set DEEPGRAM_API_KEY)", retryable=False)
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Token {api_key}"}
        self.endpointing_ms = endpointing_ms
        self.keepalive_interval = keepalive_interval
        self.options = dict(options or {})

    def url(self, cfg: SttConfig) -> str:
        q: list[tuple[str, str]] = [
            ("model", cfg.model or self.model), ("encoding", "linear16"), ("sample_rate", str(cfg.sample_rate)),
            ("channels", "1"), ("interim_results", "true" if cfg.interim_results else "false"),
            ("punctuate", "true"), ("smart_format", "true"), ("endpointing", str(self.endpointing_ms)),
        ]
        if cfg.language:
            q.append(("language", cfg.language))
        for kw in cfg.keywords:
            q.append(("keyterm", kw))
        for k, v in {**self.options, **dict(cfg.extra)}.items():
            q.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
        return f"{self.base_url}/v1/listen?{urlencode(q)}"

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await resolve_url(self.base_url, timeout)

    async def connect(self, config: SttConfig, timeout: float) -> DeepgramSession:  # noqa: ASYNC109
        ws = await ws_connect(self.url(config), self._headers, timeout)
        return DeepgramSession(ws, self.keepalive_interval)
