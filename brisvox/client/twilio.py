"""``brisvox call`` over Twilio Media Streams: one call, the client playing Twilio.

Owns :class:`TwilioTransport`, one call of ``brisvox call`` over this
protocol. The messages (what Twilio sends, what a bot sends back) are
:mod:`brisvox.wire.twilio` and the mu-law codec :mod:`brisvox.wire.g711`.
Media payloads are base64 mu-law 8 kHz mono, 20 ms (160 bytes) per message.

Invariants: the transport echoes each ``mark`` as soon as it arrives (the
client plays audio as it arrives, so the audio before the mark has been
heard); a message it cannot read is counted (``invalid``), never fatal.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
import orjson

from brisvox.client.transport import CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S, BotEvents, TransportError
from brisvox.wire.g711 import ulaw_decode, ulaw_encode
from brisvox.wire.twilio import RATE, TwilioStream, bot_event


class TwilioTransport:
    """One ``brisvox call`` over Twilio Media Streams (see :class:`~brisvox.client.transport.CallTransport`)."""

    rate = RATE

    def __init__(self, url: str, params: dict[str, str] | None = None, tag: str = "cli") -> None:
        self.url = url
        self.params = params or {}
        self.stream = TwilioStream(int(time.time() * 1000) % 1_000_000, tag=tag)
        self.call_id = ""
        self.ids = {"streamSid": self.stream.stream_sid, "callSid": self.stream.call_sid}
        self.ws: Any = None
        self._rx: asyncio.Task[None] | None = None
        self._events = BotEvents()
        self._ended = False
        self._closing = False
        self.invalid = 0

    async def open(self, events: BotEvents) -> None:
        from websockets.asyncio.client import connect

        self._events = events
        try:
            self.ws = await asyncio.wait_for(
                connect(self.url, compression=None, ping_interval=None, open_timeout=CONNECT_TIMEOUT_S,
                        close_timeout=CLOSE_TIMEOUT_S, max_size=2**20),
                CONNECT_TIMEOUT_S + 1.0)
            await self.ws.send(self.stream.connected())
            await self.ws.send(self.stream.start(self.params))
        except Exception as e:  # refused, timeout, handshake rejected
            raise TransportError(f"cannot connect to {self.url}: {type(e).__name__}: {e}") from None
        self._rx = asyncio.create_task(self._receive())

    def _end(self, reason: str) -> None:
        if not self._ended:
            self._ended = True
            self._events.on_end(reason, time.monotonic())

    async def _receive(self) -> None:
        ws = self.ws
        reason = "closed by the server"
        try:
            async for message in ws:
                now = time.monotonic()
                try:
                    event, value = bot_event(orjson.loads(message))
                except orjson.JSONDecodeError:
                    event, value = "invalid", None
                if event == "media":
                    self._events.on_audio(ulaw_decode(value), now)
                elif event == "clear":
                    self._events.on_clear(now)
                elif event == "mark":
                    await ws.send(self.stream.mark(value))
                elif event == "invalid":
                    self.invalid += 1
        except Exception as e:  # noqa: BLE001 - a reset ends the call like a close
            reason = f"connection lost: {type(e).__name__}"
        code = getattr(ws, "close_code", None)
        if code is not None:
            why = getattr(ws, "close_reason", "") or ""
            reason = f"closed by the server ({code}{': ' + why if why else ''})"
        if not self._closing:
            self._end(reason)

    async def send_audio(self, pcm: np.ndarray) -> None:
        if self._ended or self.ws is None:
            return
        payload = base64.b64encode(ulaw_encode(pcm)).decode()
        try:
            await self.ws.send(self.stream.media(payload))
        except Exception:  # noqa: BLE001 - the receive task reports the end
            return

    async def send_dtmf(self, digits: str) -> None:
        if self._ended or self.ws is None:
            return
        for d in digits:
            try:
                await self.ws.send(self.stream.dtmf(d))
            except Exception:  # noqa: BLE001
                return

    async def close(self) -> None:
        self._closing = True
        ws = self.ws
        if ws is not None:
            try:
                if not self._ended:
                    await asyncio.wait_for(ws.send(self.stream.stop()), CLOSE_TIMEOUT_S)
                await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - best effort at hang-up
                pass
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        if ws is not None and ws.transport is not None:
            ws.transport.abort()
        self._ended = True
