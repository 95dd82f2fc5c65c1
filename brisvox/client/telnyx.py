"""``brisvox call`` over Telnyx Media Streaming: one call, the client playing Telnyx.

Owns :class:`TelnyxTransport`, one call of ``brisvox call`` over this
protocol: Telnyx's ids, messages and media formats (:mod:`brisvox.wire.telnyx`)
on the carriers' shared stream client
(:class:`~brisvox.client.media_stream.StreamTransport`). Media payloads are
base64 audio in the stream's format (PCMU 8 kHz by default; PCMA 8 kHz, L16
8 or 16 kHz), 20 ms per message; the call parameters travel as the
``start`` message's ``custom_parameters``, the caller and the called number
as its ``from`` and ``to``.

Invariants: those of :mod:`brisvox.client.media_stream`; a stream token is
sent as Telnyx sends it: the ``x-telnyx-streaming-auth-token`` header of the
upgrade request and the same field of ``connected``.
"""

from __future__ import annotations

import time

import numpy as np

from brisvox.client.media_stream import StreamTransport
from brisvox.wire.telnyx import AUTH_HEADER, FORMATS, TelnyxStream


class TelnyxTransport(StreamTransport):
    """One ``brisvox call`` over Telnyx Media Streaming (see :class:`~brisvox.client.transport.CallTransport`)."""

    def __init__(self, url: str, params: dict[str, str] | None = None, tag: str = "cli", *,
                 encoding: str = "PCMU", rate: int = 8000, token: str = "", caller: str = "",
                 called: str = "") -> None:
        super().__init__(url, params)
        if (encoding, rate) not in FORMATS:
            raise ValueError(f"Telnyx format {encoding} {rate} Hz: expected one of {sorted(FORMATS)}")
        self.fmt = FORMATS[encoding, rate]
        self.rate = rate
        self.token, self.caller, self.called = token, caller, called
        self.stream = TelnyxStream(int(time.time() * 1000) % 1_000_000, tag=tag, fmt=self.fmt)
        self.ids = {"stream_id": self.stream.stream_id, "call_control_id": self.stream.call_control_id}
        if token:
            self.headers[AUTH_HEADER] = token

    def hello(self) -> list[str]:
        return [self.stream.connected(self.token), self.stream.start(self.params, self.caller, self.called)]

    def decode_audio(self, wire: bytes) -> np.ndarray:
        return self.fmt.codec.decode(wire)

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        return self.fmt.codec.encode(np.ascontiguousarray(pcm, dtype=np.int16)).tobytes()
