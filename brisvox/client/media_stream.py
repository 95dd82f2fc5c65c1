"""``brisvox call`` over a carrier's JSON media stream, the client playing the carrier.

Owns :class:`StreamTransport`, what the client's Twilio and Telnyx
transports share (:mod:`brisvox.client.twilio`, :mod:`brisvox.client.telnyx`):
the connection (with the carrier's handshake headers), the messages that
open the stream, the bot's ``media`` / ``mark`` / ``clear`` (read with
:func:`brisvox.wire.mediastream.bot_event`, whose shapes both carriers'
bots send), the caller's media and digits, the ``stop`` and the close. A
subclass names its carrier: the builder of what the carrier sends
(``stream``: ``media``, ``mark``, ``dtmf``, ``stop``), the messages sent on
open (:meth:`StreamTransport.hello`) and the stream's audio codec
(:meth:`StreamTransport.decode_audio`, :meth:`StreamTransport.encode_audio`).
A carrier whose media is binary (:mod:`brisvox.client.vonage`) reads its own
messages (:meth:`StreamTransport.on_message`) and sends none at hang-up
(:meth:`StreamTransport.bye`).

Invariants: the transport echoes each ``mark`` as soon as it arrives (the
client plays audio as it arrives, so the audio before the mark has been
heard); a message it cannot read (bad JSON, audio its codec refuses) is
counted (``invalid``), never fatal; ``on_end`` is called at most once and
never after ``close()``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
import orjson

from brisvox.client.transport import CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S, BotEvents, TransportError
from brisvox.wire.mediastream import bot_event


class StreamTransport:
    """One ``brisvox call`` over a carrier's media stream (see the module docstring and
    :class:`~brisvox.client.transport.CallTransport`)."""

    rate = 8000
    stream: Any  # the carrier's message builder (subclass)
    ids: dict[str, str]

    def __init__(self, url: str, params: dict[str, str] | None = None) -> None:
        self.url = url
        self.params = params or {}
        self.headers: dict[str, str] = {}  # extra headers of the upgrade request
        self.subprotocols: list[str] | None = None  # offered in the upgrade request (the server picks one)
        self.call_id = ""
        self.ws: Any = None
        self._rx: asyncio.Task[None] | None = None
        self._events = BotEvents()
        self._ended = False
        self._closing = False
        self.invalid = 0

    # -- the carrier (subclass) --------------------------------------------------------

    def hello(self) -> list[str]:
        """The messages the carrier sends once connected (``connected``, ``start``)."""
        raise NotImplementedError

    def decode_audio(self, wire: bytes) -> np.ndarray:
        raise NotImplementedError

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        raise NotImplementedError

    def read(self, msg: Any) -> tuple[str, Any]:
        """``(event, value)`` of one decoded bot message, in the shared names (``media``, ``mark``,
        ``clear``): :func:`brisvox.wire.mediastream.bot_event` (a carrier with other names maps them)."""
        return bot_event(msg)

    async def other(self, event: str, value: Any, now: float) -> None:
        """A bot message of another event (a carrier's own, e.g. Plivo's ``sendDTMF``): ignored here."""

    def bye(self) -> str | None:
        """What the carrier sends when the caller hangs up (its ``stop``); None: it only closes."""
        return self.stream.stop()

    # -- the call ----------------------------------------------------------------------

    async def open(self, events: BotEvents) -> None:
        from websockets.asyncio.client import connect
        from websockets.typing import Subprotocol

        self._events = events
        try:
            self.ws = await asyncio.wait_for(
                connect(self.url, compression=None, ping_interval=None, open_timeout=CONNECT_TIMEOUT_S,
                        close_timeout=CLOSE_TIMEOUT_S, max_size=2**20,
                        additional_headers=self.headers or None,
                        subprotocols=[Subprotocol(p) for p in self.subprotocols or ()] or None),
                CONNECT_TIMEOUT_S + 1.0)
            for message in self.hello():
                await self.ws.send(message)
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
                await self.on_message(message, time.monotonic())
        except Exception as e:  # noqa: BLE001 - a reset ends the call like a close
            reason = f"connection lost: {type(e).__name__}"
        code = getattr(ws, "close_code", None)
        if code is not None:
            why = getattr(ws, "close_reason", "") or ""
            reason = f"closed by the server ({code}{': ' + why if why else ''})"
        if not self._closing:
            self._end(reason)

    async def on_message(self, message: str | bytes, now: float) -> None:
        """One message of the bot's (a carrier whose media is binary reads its own)."""
        try:
            event, value = self.read(orjson.loads(message))
            pcm = self.decode_audio(value) if event == "media" else None
        except ValueError:  # bad JSON (orjson's error is one), audio the codec refuses
            event, value, pcm = "invalid", None, None
        if pcm is not None:
            self._events.on_audio(pcm, now)
        elif event == "clear":
            self._events.on_clear(now)
        elif event == "mark":
            await self.ws.send(self.stream.mark(value))
        elif event == "invalid":
            self.invalid += 1
        else:
            await self.other(event, value, now)

    def heard(self, wire: bytes, now: float) -> None:
        """A binary message of the bot's audio (a carrier whose media is binary): decoded and
        handed to ``on_audio``; one the codec refuses is counted ``invalid``."""
        try:
            self._events.on_audio(self.decode_audio(wire), now)
        except ValueError:
            self.invalid += 1

    async def send_audio(self, pcm: np.ndarray) -> None:
        if self._ended or self.ws is None:
            return
        await self.send(self.stream.media(base64.b64encode(self.encode_audio(pcm)).decode()))

    async def send(self, message: str | bytes) -> None:
        """One message to the bot, while the call lasts (a failure: the receive task reports the end)."""
        if self._ended or self.ws is None:
            return
        try:
            await self.ws.send(message)
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
                bye = None if self._ended else self.bye()
                if bye is not None:
                    await asyncio.wait_for(ws.send(bye), CLOSE_TIMEOUT_S)
                await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - best effort at hang-up
                pass
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        if ws is not None and ws.transport is not None:
            ws.transport.abort()
        self._ended = True
