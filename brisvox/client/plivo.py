"""``brisvox call`` over Plivo Audio Streams: one call, the client playing Plivo.

Owns :class:`PlivoTransport`, one call of ``brisvox call`` over this
protocol: Plivo's ids and messages (what Plivo sends, what a bot sends back:
:mod:`brisvox.wire.plivo`) on the carriers' shared stream client
(:class:`~brisvox.client.media_stream.StreamTransport`). Media payloads are
base64 audio in the stream's format (mu-law 8 kHz by default, L16 at 8 or
16 kHz), 20 ms per message; the call parameters travel as the ``start``
message's ``extra_headers``.

Invariants: those of :mod:`brisvox.client.media_stream`, with Plivo's names:
each ``checkpoint`` is answered with ``playedStream`` as soon as it arrives
(the client plays audio as it arrives, so the audio before it has been
heard), a ``clearAudio`` is the bot's clear (the client sends no
``clearedAudio``: the gateway reads nothing from it), a ``sendDTMF`` reaches
the runner as the digits the bot pressed; a message it cannot read (an
odd-length L16 payload among them) is counted as ``invalid``, never fatal.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from brisvox.client.media_stream import StreamTransport
from brisvox.wire.plivo import MULAW, Format, PlivoStream, bot_event

# Plivo's bot messages by the shared client's names
SHARED = {"playAudio": "media", "checkpoint": "mark", "clearAudio": "clear"}


class PlivoTransport(StreamTransport):
    """One ``brisvox call`` over Plivo Audio Streams (see :class:`~brisvox.client.transport.CallTransport`)."""

    def __init__(self, url: str, params: dict[str, str] | None = None, tag: str = "cli", *,
                 encoding: str = MULAW, rate: int = 8000) -> None:
        super().__init__(url, params)
        self.fmt = Format(encoding, rate)
        self.rate = rate
        self.stream = PlivoStream(int(time.time() * 1000) % 1_000_000, tag=tag, fmt=self.fmt)
        self.ids = {"streamId": self.stream.stream_id, "callId": self.stream.call_id}

    def hello(self) -> list[str]:
        return [self.stream.start(self.params)]

    def read(self, msg: Any) -> tuple[str, Any]:
        event, value = bot_event(msg)
        return SHARED.get(event, event), value

    async def other(self, event: str, value: Any, now: float) -> None:
        if event == "sendDTMF":
            self._events.on_dtmf(value, now)

    def decode_audio(self, wire: bytes) -> np.ndarray:
        if len(wire) % self.fmt.width:
            raise ValueError("an L16 payload has an even number of bytes")
        return self.fmt.decode(wire)

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        return self.fmt.encode(pcm)
