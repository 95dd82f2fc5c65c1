"""``brisvox call`` over an Exotel Voicebot stream: one call, the client playing Exotel.

Owns :class:`ExotelTransport`, one call of ``brisvox call`` over this
protocol: Exotel's ids, messages and formats (:mod:`brisvox.wire.exotel`) on
the carriers' shared stream client
(:class:`~brisvox.client.media_stream.StreamTransport`). Media payloads are
base64 16-bit linear PCM, little-endian, at the stream's rate (8 kHz by
default; 16 or 24 kHz), one message per 20 ms the runner sends; the call
parameters travel as the ``start`` message's ``custom_parameters``, the
caller and the called number as its ``from`` and ``to``. The bot's audio
arrives in Exotel's chunk sizes (100 ms or more a message).

Invariants: those of :mod:`brisvox.client.media_stream`; a token is sent as
Exotel sends the Basic credential of the applet's URL: ``Authorization:
Basic base64(brisvox:<token>)`` on the upgrade request.
"""

from __future__ import annotations

import time

import numpy as np

from brisvox.client.media_stream import StreamTransport
from brisvox.wire.exotel import FORMATS, ExotelStream, basic_header

BASIC_USER = "brisvox"  # the user name of the Basic credential (the gateway reads the password)


class ExotelTransport(StreamTransport):
    """One ``brisvox call`` over an Exotel Voicebot stream (see :class:`~brisvox.client.transport.CallTransport`)."""

    def __init__(self, url: str, params: dict[str, str] | None = None, tag: str = "cli", *,
                 rate: int = 8000, token: str = "", caller: str = "", called: str = "") -> None:
        super().__init__(url, params)
        if rate not in FORMATS:
            raise ValueError(f"Exotel sample rate {rate} Hz: expected one of {sorted(FORMATS)}")
        self.fmt = FORMATS[rate]
        self.rate = rate
        self.caller, self.called = caller, called
        self.stream = ExotelStream(int(time.time() * 1000) % 1_000_000, tag=tag, fmt=self.fmt)
        self.ids = {"stream_sid": self.stream.stream_sid, "call_sid": self.stream.call_sid}
        if token:
            self.headers["Authorization"] = basic_header(BASIC_USER, token)

    def hello(self) -> list[str]:
        return [self.stream.connected(), self.stream.start(self.params, self.caller, self.called)]

    def decode_audio(self, wire: bytes) -> np.ndarray:
        return self.fmt.codec.decode(wire)

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        return self.fmt.codec.encode(np.ascontiguousarray(pcm, dtype=np.int16)).tobytes()
