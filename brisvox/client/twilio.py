"""``brisvox call`` over Twilio Media Streams: one call, the client playing Twilio.

Owns :class:`TwilioTransport`, one call of ``brisvox call`` over this
protocol: Twilio's ids and messages (what Twilio sends, what a bot sends
back: :mod:`brisvox.wire.twilio`) on the carriers' shared stream client
(:class:`~brisvox.client.media_stream.StreamTransport`), with the mu-law
codec of :mod:`brisvox.wire.g711`. Media payloads are base64 mu-law 8 kHz
mono, 20 ms (160 bytes) per message.

Invariants: those of :mod:`brisvox.client.media_stream` (each ``mark`` echoed
as soon as it arrives; a message it cannot read counted as ``invalid``,
never fatal).
"""

from __future__ import annotations

import time

import numpy as np

from brisvox.client.media_stream import StreamTransport
from brisvox.wire.g711 import ulaw_decode, ulaw_encode
from brisvox.wire.twilio import RATE, TwilioStream


class TwilioTransport(StreamTransport):
    """One ``brisvox call`` over Twilio Media Streams (see :class:`~brisvox.client.transport.CallTransport`)."""

    rate = RATE

    def __init__(self, url: str, params: dict[str, str] | None = None, tag: str = "cli") -> None:
        super().__init__(url, params)
        self.stream = TwilioStream(int(time.time() * 1000) % 1_000_000, tag=tag)
        self.ids = {"streamSid": self.stream.stream_sid, "callSid": self.stream.call_sid}

    def hello(self) -> list[str]:
        return [self.stream.connected(), self.stream.start(self.params)]

    def decode_audio(self, wire: bytes) -> np.ndarray:
        return ulaw_decode(wire)

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        return ulaw_encode(pcm)
