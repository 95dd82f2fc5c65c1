"""Plivo Audio Streams (``<Stream bidirectional="true">``) over the gateway's WebSocket server.

Owns one Plivo connection and the call leg it becomes: what each inbound
message does (``start``, ``media``, ``playedStream`` echoes, ``clearedAudio``,
``dtmf``, ``stop``) and when the outbound ones are sent (``playAudio``,
``checkpoint``, ``clearAudio``, ``sendDTMF``). The messages themselves, the
stream's audio formats, the refusals' close codes and the outbound byte
templates are :mod:`brisvox.wire.plivo`; the start timeout, the fault budget,
admission and the end of the call are :class:`~brisvox.gateway.carriers.stream_session.StreamSession`.

Invariants:

* Malformed input, before the call and during it, is refused as every vendor
  stream refuses it (:mod:`brisvox.gateway.carriers.stream_session`): before the call
  bad JSON or a non-object (1007), a bad ``start`` (1007), media before
  ``start`` (1008), a format other than mu-law 8 kHz or L16 8 or 16 kHz
  (1003), a binary frame (1003), no ``start`` in time (1008) close at once;
  during a live call a malformed message (bad JSON, a non-object, a missing
  or bad base64 payload, an odd L16 payload, a payload over 1 s, a
  ``playedStream`` without a name, a bad digit, a binary frame) is dropped
  and charged to the fault budget. An oversized frame is closed by the
  server (1009).
* An unknown event name and a repeated ``start`` are counted and ignored,
  never charged to the budget (Plivo adds events over time). ``clearedAudio``
  (the answer to a clearAudio) is read and ignored.
* The call's rate is the stream's: 16 kHz for ``audio/x-l16;rate=16000``,
  else 8 kHz; the bot's audio goes out in the stream's own format.
* The call's metadata: ``streamId``/``callId``/``accountId`` as its transport
  ids, the ``extra_headers`` of ``start`` as its parameters, the caller and
  the called number from the ``from``/``to`` (or ``caller``/``called``)
  headers; a malformed or oversized id or header is dropped and counted
  (``call_params_dropped``), never refused.
* A mark is a ``checkpoint`` sent right after the frame that reaches its
  position; Plivo's ``playedStream`` for it is forwarded to the agent as
  MarkPlayed. Plivo answers a checkpoint only when the audio before it
  played, so a checkpoint flushed by a ``clearAudio`` has no echo: the
  gateway reports it in Cleared.
* DTMF out is Plivo's ``sendDTMF`` (the digits at once, no in-band tones).
* The leg cannot transfer (Plivo's REST API does); its hang-up closes the
  stream, which ends the call when ``<Stream>`` is the XML's last element.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from brisvox.gateway.carriers.stream_session import StreamSession
from brisvox.gateway.config import WsRoute
from brisvox.wire import dtmf
from brisvox.wire.g711 import PCMU
from brisvox.wire.plivo import (
    L16,
    MEDIA_SUFFIX,
    BotStream,
    Format,
    PlivoError,
    dtmf_digit,
    media_payload,
    parse_start,
    played_name,
)

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection

TRANSFER_REASON = "a Plivo audio stream cannot transfer; use the Plivo REST API (Transfer a call)"


class PlivoSession(StreamSession):
    """One Plivo audio stream: protocol handler and call leg."""

    transport = "plivo"
    refusal = PlivoError
    binary_reason = "Plivo audio streams use text messages"

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        super().__init__(host, conn, route)
        self.fmt = Format()
        self._out: BotStream | None = None
        self._prefix = b""  # the stream's playAudio prefix, on self for the per-frame send
        self._enc = np.empty(4096, dtype=np.uint8)

    # -- protocol in --------------------------------------------------------------

    def on_text(self, data: bytes) -> None:
        msg = self.decode(data)
        if msg is None:
            return
        ev = msg.get("event")
        try:
            if ev == "media":  # 50 a second: one call to the wire, the ring write inline
                call = self.call
                if call is None:
                    raise PlivoError("media_before_start", "media before start")
                raw = media_payload(msg, self.fmt)
                if raw is not None:  # None: an outbound track copy, not caller audio
                    self.host.audio_in(call, self.fmt.decode(raw), self.fmt.rate, len(raw))
            elif ev == "playedStream" or ev == "played":
                self.echoed(played_name(msg))
            elif ev == "start":
                self._start(msg)
            elif ev == "dtmf":
                self.pressed(dtmf_digit(msg))
            elif ev == "clearedAudio":
                pass
            elif ev == "stop":
                self.stop()
            else:
                self.host.protocol_error(self.call, "ws_malformed_unknown_event")
        except PlivoError as e:
            self.malformed(e)

    def _start(self, msg: dict[str, Any]) -> None:
        if self.repeated_start():
            return
        start = parse_start(msg)
        call = self.admit(start.stream_id, start.fmt.rate)
        if call is None:
            return
        self.describe(call, start)
        self.fmt = start.fmt
        self._out = out = BotStream(start.stream_id, start.fmt)
        self._prefix = out.media_prefix
        self.start(call)

    # -- leg: out --------------------------------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        if self.fmt.encoding == L16:
            wire = np.ascontiguousarray(samples, dtype="<i2").data
        else:
            n = len(samples)
            enc = self._enc[:n] if n <= len(self._enc) else np.empty(n, dtype=np.uint8)
            PCMU.encode(samples, out=enc)
            wire = enc.data
        ok = self.conn.send_text(self._prefix + binascii.b2a_base64(wire, newline=False) + MEDIA_SUFFIX)
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def send_clear(self) -> None:
        if self._out is not None:
            self.conn.send_text(self._out.clear)

    def send_mark(self, name: str) -> None:
        if self._out is not None:
            self.conn.send_text(self._out.checkpoint(name))

    def send_dtmf(self, digits: str) -> int:
        valid = "".join(d.upper() for d in digits if d.upper() in dtmf.DIGITS)
        if self._out is None:
            return len(digits)
        if valid:
            self.conn.send_text(BotStream.send_dtmf(valid))
        return len(digits) - len(valid)

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        done(False, TRANSFER_REASON)
