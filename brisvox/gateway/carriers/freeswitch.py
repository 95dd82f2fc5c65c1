"""FreeSWITCH ``mod_audio_stream`` streams (``uuid_audio_stream <uuid> start <wss-url> mono 16k <metadata>``) over the gateway's WebSocket server.

Owns one mod_audio_stream connection and the call leg it becomes: the
metadata text that opens the call, the caller's audio as BINARY L16 frames,
the later TEXT messages of the FreeSWITCH event handler (``dtmf``), and what
the bot sends: ``streamAudio`` messages (the module writes each to a file and
fires ``mod_audio_stream::play``), ``{"type":"clear"}`` on a Clear and
``{"type":"hangup"}`` on the agent's hang-up (fired as
``mod_audio_stream::json``: the handler breaks the playback or kills the
channel). The messages, the formats and what the module documents are
:mod:`brisvox.wire.audio_stream`; the start timeout, the fault budget,
admission and the end of the call are
:class:`~brisvox.gateway.carriers.stream_session.StreamSession`; the
handshake check (``Authorization: Bearer`` from ``STREAM_EXTRA_HEADERS``, or
``?token=`` in the URL) is :func:`brisvox.gateway.ws.auth.freeswitch_auth`.

Invariants:

* Malformed input is refused as every vendor stream refuses it: before the
  call a metadata that is not a JSON object (1007), audio first (1008), a
  URL ``sample-rate`` other than 8000 or 16000 (1003), no metadata within
  ``start_timeout_s`` (1008) close at once; during a live call a malformed
  message (bad JSON, a non-object, a message without a ``type``, a bad
  digit, a binary frame of an odd length or over 1 s) is counted
  (``ws_malformed_<kind>``), dropped and charged to the fault budget; only
  the one that exceeds it closes. An unknown ``type`` is counted
  (``ws_malformed_unknown_event``), never charged. Over ``max_message_bytes``: 1009.
* The call's rate is the URL's ``sample-rate``; the bot's audio goes out at
  it, in ``streamAudio`` chunks of at least 3.2 KB, each a multiple of 320
  bytes (:class:`~brisvox.gateway.carriers.chunked.ChunkedAudio`: a file per message): what is
  kept is sent, padded, when the talkspurt ends, after the last DTMF tone and
  before a hang-up; a Pause keeps it; a Clear drops it. ``packets_out``
  counts the messages sent.
* A Clear drops the kept chunk and the queued tones and sends
  ``{"type":"clear"}``; what FreeSWITCH already holds stops only when its
  event handler runs ``uuid_break`` (docs/TRANSPORTS.md).
* Marks are reported on release; SendDtmf is played in-band; the leg cannot
  transfer. The agent's hang-up sends ``{"type":"hangup"}`` and closes 1000;
  the channel's hang-up (or ``uuid_audio_stream ... stop``) closes the socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from brisvox.gateway.carriers.chunked import ChunkedAudio
from brisvox.gateway.carriers.stream_session import StreamSession
from brisvox.gateway.config import WsRoute
from brisvox.wire.audio_stream import (
    CLEAR,
    FORMATS,
    HANGUP,
    AudioStreamError,
    BotStream,
    parse_event,
    parse_metadata,
    stream_format,
)
from brisvox.wire.mediastream import L16LE

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection

TRANSFER_REASON = "a mod_audio_stream stream cannot transfer; the FreeSWITCH dialplan or ESL (uuid_transfer) does"


class FreeSwitchSession(StreamSession):
    """One mod_audio_stream stream: protocol handler and call leg."""

    transport = "freeswitch"
    refusal = AudioStreamError
    marks_by_echo = False  # reported on release: the module echoes nothing

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        super().__init__(host, conn, route)
        self._chunks = ChunkedAudio(self, lambda: self._prefix)
        self.rate = FORMATS[8000].rate
        self._max_bytes = FORMATS[8000].max_media_bytes
        self._prefix = BotStream(self.rate).media_prefix

    # -- protocol in --------------------------------------------------------------

    def on_binary(self, data: bytes) -> None:
        """The caller's audio (:meth:`StreamSession.audio_frame`)."""
        self.audio_frame(data, L16LE, self.rate, self._max_bytes)

    def on_text(self, data: bytes) -> None:
        try:
            if self.call is None:
                self._open(data)
                return
            kind, digit = parse_event(data)
            if kind == "dtmf":
                self.host.dtmf_in(self.call, digit, 0)
            else:
                self.host.protocol_error(self.call, "ws_malformed_unknown_event")
        except AudioStreamError as e:
            self.malformed(e)

    def _open(self, data: bytes) -> None:
        request = getattr(self.conn, "request", None)
        fmt = stream_format(getattr(request, "path", "") or "")
        meta = parse_metadata(data)
        call = self.admit(meta.ids.get("uuid", ""), fmt.rate)
        if call is None:
            return
        self.describe(call, meta)
        self.rate = fmt.rate
        self._max_bytes = fmt.max_media_bytes
        self._prefix = BotStream(fmt.rate).media_prefix
        self.start(call)

    # -- leg: out --------------------------------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        return self._chunks.add(L16LE.encode(samples).data)

    def end_spurt(self) -> None:
        self._chunks.end_spurt()

    def tick_dtmf(self, now: float) -> bool:
        return self._chunks.tick_dtmf(super().tick_dtmf, now)

    def send_clear(self) -> None:
        self._chunks.drop()
        self.tones.drop()
        self.conn.send_text(CLEAR)

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        done(False, TRANSFER_REASON)

    def hangup(self, reason: str) -> None:
        if not self.conn.closed:
            self._chunks.flush()
            self.conn.send_text(HANGUP)
        super().hangup(reason)
