"""``brisvox call`` over the Vonage Voice API WebSocket: one call, the client playing Vonage.

Owns :class:`VonageTransport`, one call of ``brisvox call`` over this
protocol: what Vonage sends and what a bot sends back
(:mod:`brisvox.wire.vonage`) on the carriers' shared stream client
(:class:`~brisvox.client.media_stream.StreamTransport`: the connection, the
``websocket:dtmf`` digits, the close). The audio goes both ways as binary
frames of 16-bit linear PCM, little-endian, 20 ms each, at 16 kHz by default
(or 8 kHz, as the NCCO endpoint's ``content-type`` chooses); the call
parameters, the caller and the called number and a ``uuid`` travel as the
connected event's top-level headers, as the NCCO's ``headers`` do.

Invariants: those of :mod:`brisvox.client.media_stream`, with Vonage's
messages: each ``notify`` is answered with ``websocket:notify`` (its payload
echoed) as soon as it arrives (the client plays audio as it arrives, so the
audio before it has been heard), each ``clear`` with ``websocket:cleared``;
a message it cannot read (bad JSON, an odd-length binary frame) is counted
as ``invalid``, never fatal; a hang-up only closes the socket (Vonage sends
no stop). A token is sent as the NCCO endpoint's ``authorization`` of type
``custom`` sends it: ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import time

import numpy as np
import orjson

from brisvox.client.media_stream import StreamTransport
from brisvox.wire.mediastream import L16LE
from brisvox.wire.vonage import RATES, Format, VonageStream, bot_event


class VonageTransport(StreamTransport):
    """One ``brisvox call`` over a Vonage WebSocket (see :class:`~brisvox.client.transport.CallTransport`)."""

    def __init__(self, url: str, params: dict[str, str] | None = None, *, rate: int = 16000, token: str = "",
                 caller: str = "", called: str = "") -> None:
        super().__init__(url, params)
        if rate not in RATES:
            raise ValueError(f"Vonage content-type rate {rate} Hz: expected one of {RATES}")
        self.rate = rate
        self.fmt = Format(rate)
        uuid = f"{int(time.time() * 1000) % 1_000_000:08d}-cli-call"
        numbers = {k: v for k, v in (("from", caller), ("to", called)) if v}
        self.stream = VonageStream(self.fmt, {**self.params, **numbers, "uuid": uuid})
        self.ids = {"uuid": uuid}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def hello(self) -> list[str]:
        return [self.stream.connected()]

    def bye(self) -> str | None:
        return None

    def decode_audio(self, wire: bytes) -> np.ndarray:
        return L16LE.decode(wire)

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        return b"".join(self.fmt.frames(np.ascontiguousarray(pcm, dtype=np.int16)))

    async def on_message(self, message: str | bytes, now: float) -> None:
        if isinstance(message, bytes):
            self.heard(message, now)
            return
        try:
            event, value = bot_event(orjson.loads(message))
        except ValueError:
            event, value = "invalid", None
        if event == "clear":
            self._events.on_clear(now)
            await self.ws.send(self.stream.cleared())
        elif event == "notify":
            await self.ws.send(self.stream.notified(value))
        else:
            self.invalid += 1

    async def send_audio(self, pcm: np.ndarray) -> None:
        if self._ended or self.ws is None:
            return
        try:
            for frame in self.fmt.frames(np.ascontiguousarray(pcm, dtype=np.int16)):  # 20 ms a message
                await self.ws.send(frame)
        except Exception:  # noqa: BLE001 - the receive task reports the end
            return
