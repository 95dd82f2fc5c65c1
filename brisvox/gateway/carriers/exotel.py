"""Exotel Voicebot applet streams (bidirectional AgentStream) over the gateway's WebSocket server.

Owns one Exotel connection and the call leg it becomes: what each inbound
message does (``connected``, ``start``, ``media``, ``mark`` echoes, ``dtmf``,
``stop``) and when the outbound ones are sent (``media`` in the chunk sizes
Exotel requires, ``mark``, ``clear``). The messages themselves, the formats,
the chunking and the outbound byte templates are :mod:`brisvox.wire.exotel`
(with the parsers shared with Twilio and Telnyx, :mod:`brisvox.wire.mediastream`);
what Exotel's stream shares with theirs (the message set, the fault budget,
admission, marks on the echo, in-band DTMF) is
:class:`~brisvox.gateway.carriers.carrier_stream.CarrierStreamSession`. The
handshake check (the Basic credential) is :func:`brisvox.gateway.ws.auth.exotel_auth`.

Invariants:

* Malformed input, before the call and during it, is refused as every
  carrier stream refuses it (:mod:`brisvox.gateway.carriers.carrier_stream`): before
  the call bad JSON or a non-object (1007), a bad ``start`` (1007), media
  before ``start`` (1008), a format other than 16-bit linear PCM mono at
  8, 16 or 24 kHz (1003), a binary frame (1003), no ``start`` in time (1008)
  close at once; during a live call a malformed message (bad JSON, a
  non-object, a missing or bad base64 payload, an odd-length payload, a
  payload over 1 s, a mark without a name, a bad digit, a binary frame) is
  dropped and charged to the call's fault budget, and only the one that
  exceeds it closes. An oversized frame is closed by the server (1009).
  Unknown events and a repeated ``start`` are counted, never charged.
* A call beyond ``max_calls`` (or while draining) is closed with 1013.
* The call's rate is the stream's: ``start.media_format.sample_rate``, else
  the ``sample-rate`` of the request's query, else 8 kHz; 24 kHz is a call
  rate like any other (the workers resample). The bot's audio goes out in
  the same format (little-endian L16).
* The bot's audio reaches Exotel in chunks of at least 3.2 KB, each a
  multiple of 320 bytes (:class:`brisvox.wire.exotel.Chunker`, sent by
  :class:`~brisvox.gateway.carriers.chunked.ChunkedAudio`): the 20 ms
  frames the pacer releases are kept until a chunk is full (200 ms at 8 kHz,
  100 ms at 16 kHz, 80 ms at 24 kHz). What is kept is sent, padded to the
  multiple, when the talkspurt ends, before a ``mark`` (the echo must
  follow the audio before it), after the last DTMF tone and before a
  hang-up; a Pause keeps it (it goes out first on Resume); a Clear drops it.
  ``packets_out`` counts the messages sent.
* A ``mark`` is sent right after the chunk that holds its position and
  Exotel's echo is forwarded to the agent as MarkPlayed; echoes after a
  ``clear`` are swallowed (reported in Cleared instead).
* The stream has no outbound DTMF message: SendDtmf is played in-band as tones.
* The leg cannot transfer; its hang-up closes the stream, and the applet's
  flow goes on to its next applet (a Hangup applet ends the call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from brisvox.gateway.carriers.carrier_stream import CarrierStreamSession, Opening
from brisvox.gateway.carriers.chunked import ChunkedAudio
from brisvox.gateway.config import WsRoute
from brisvox.wire.exotel import DEFAULT_FORMAT, BotStream, parse_start, rate_from_path

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection

TRANSFER_REASON = "an Exotel Voicebot stream cannot transfer; end the stream and let the flow's next applet connect"


class ExotelSession(CarrierStreamSession):
    """One Exotel Voicebot stream: protocol handler and call leg."""

    transport = "exotel"
    binary_reason = "Exotel streams use text messages"
    transfer_reason = TRANSFER_REASON

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        super().__init__(host, conn, route)
        self._chunks = ChunkedAudio(self, lambda: self._prefix)
        self._use(DEFAULT_FORMAT)

    def opening(self, msg: dict[str, Any]) -> Opening:
        request = getattr(self.conn, "request", None)
        s = parse_start(msg, rate_from_path(getattr(request, "path", "") or ""))
        return Opening(s.stream_id, s.ids, s.params, s.numbers, s.dropped, s.format, BotStream(s.stream_id))

    # -- leg: out --------------------------------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        n = len(samples)
        enc = self._enc[:n] if n <= len(self._enc) else np.empty(n, dtype=self._enc.dtype)
        self._codec.encode(samples, out=enc)
        return self._chunks.add(enc.data)

    def flush(self) -> None:
        """Send what the chunker keeps (padded to the chunk multiple)."""
        self._chunks.flush()

    def end_spurt(self) -> None:
        self._chunks.end_spurt()

    def tick_dtmf(self, now: float) -> bool:
        return self._chunks.tick_dtmf(super().tick_dtmf, now)

    def send_mark(self, name: str) -> None:
        self.flush()
        super().send_mark(name)

    def send_clear(self) -> None:
        self._chunks.drop()
        super().send_clear()

    def hangup(self, reason: str) -> None:
        self.flush()
        super().hangup(reason)
