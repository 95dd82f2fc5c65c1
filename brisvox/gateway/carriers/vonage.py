"""Vonage Voice API WebSockets (NCCO ``connect``, endpoint ``websocket``) over the gateway's WebSocket server.

Owns one Vonage connection and the call leg it becomes: what each inbound
message does (the text ``websocket:connected``, ``websocket:dtmf``,
``websocket:notify`` and ``websocket:cleared``; the caller's audio as binary
frames) and when the outbound ones are sent (the bot's audio as binary
20 ms frames, ``notify`` for a mark, ``clear``). The messages themselves, the
format, what Vonage documents and what was chosen where it is silent are
:mod:`brisvox.wire.vonage`; the start timeout, the fault budget, admission
and the end of the call are :class:`~brisvox.gateway.carriers.stream_session.StreamSession`;
the handshake check (``Authorization: Bearer`` or ``?token=``, a native
credential) is :func:`brisvox.gateway.ws.auth.vonage_auth`.

Unlike the JSON carriers (:mod:`brisvox.gateway.carriers.carrier_stream`), the media
is binary: a binary frame is the caller's audio, never ``binary_frame``.

Invariants:

* Malformed input is refused as every vendor stream refuses it
  (:mod:`brisvox.gateway.carriers.stream_session`): before the call (no
  ``websocket:connected`` yet) bad JSON or a non-object (1007), a connected
  event whose ``content-type`` is not ``audio/l16`` at 8000 or 16000 Hz
  (1003), audio before it (1008), no connected event in time (1008) close
  at once; during a live call a malformed message (bad JSON, a non-object,
  a binary frame of an odd length or over 1 s, a ``websocket:notify``
  without a mark, a bad digit) is counted (``ws_malformed_<kind>``), dropped
  and charged to the call's fault budget, and only the one that exceeds it
  closes, with that kind's code. An oversized frame is closed by the server
  (1009).
* An unknown event (or a text message without one) and a repeated
  ``websocket:connected`` are counted and ignored, never charged (Vonage
  adds events over time). ``websocket:cleared`` (the answer to a clear) is
  read and ignored.
* The call's rate is the stream's (``content-type``); the bot's audio goes
  out in that same format, one binary message per 20 ms (a shorter tail
  padded with silence: Vonage takes 320 or 640 bytes, nothing else).
* The call's metadata: the connected event's headers as its parameters (a
  signed token's parameters replace them), ``uuid`` / ``conversation_uuid``
  as its transport ids, the caller and the called number from the
  ``from``/``to`` headers; a malformed header is dropped and counted
  (``call_params_dropped``), never refused.
* A mark is a ``notify`` sent right after the frame that reaches its
  position; Vonage's ``websocket:notify`` for it (after the audio before it
  played) is forwarded to the agent as MarkPlayed. A mark flushed by a
  ``clear`` is reported in Cleared; a late notify for it is swallowed.
* Clear is ``{"action":"clear"}`` (Vonage drops what it buffered).
* The socket has no DTMF message (the Voice API's REST call has): SendDtmf
  is played in-band as tones at the stream's rate.
* The leg cannot transfer (the Voice API's REST call or a new NCCO can); its
  hang-up closes the socket, which ends the NCCO's ``connect`` (the call
  ends when nothing follows it). The caller's hang-up closes the socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from brisvox.gateway.carriers.stream_session import StreamSession
from brisvox.gateway.config import WsRoute
from brisvox.wire.mediastream import L16LE
from brisvox.wire.vonage import (
    CLEAR,
    CLEARED,
    CONNECTED,
    DTMF,
    NOTIFY,
    Connected,
    Format,
    VonageError,
    dtmf_event,
    notify,
    notify_name,
    parse_connected,
)

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection

TRANSFER_REASON = ("a Vonage WebSocket cannot transfer; use the Voice API (PUT /v1/calls/{uuid} "
                   "with a transfer action)")


class VonageSession(StreamSession):
    """One Vonage WebSocket: protocol handler and call leg."""

    transport = "vonage"
    refusal = VonageError

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        super().__init__(host, conn, route)
        self._use(Format())

    def _use(self, fmt: Format) -> None:
        """The stream's format, on self for the per-frame paths."""
        self.fmt = fmt
        self.rate = fmt.rate
        self._frame = fmt.frame
        self._max_bytes = fmt.max_bytes

    # -- protocol in --------------------------------------------------------------

    def on_binary(self, data: bytes) -> None:
        """The caller's audio (:meth:`StreamSession.audio_frame`)."""
        self.audio_frame(data, L16LE, self.rate, self._max_bytes)

    def on_text(self, data: bytes) -> None:
        msg = self.decode(data)  # None: refused already (bad JSON, not an object)
        if msg is not None:
            try:
                self._event(msg.get("event"), msg)
            except VonageError as e:
                self.malformed(e)

    def _event(self, ev: Any, msg: dict[str, Any]) -> None:
        if ev == DTMF:
            digit, ms = dtmf_event(msg)
            if self.call is not None:
                self.host.dtmf_in(self.call, digit, ms)
        elif ev == NOTIFY:
            self.echoed(notify_name(msg))
        elif ev == CONNECTED:
            if not self.repeated_start():
                self._open(parse_connected(msg))
        elif ev != CLEARED:
            self.host.protocol_error(self.call, "ws_malformed_unknown_event")

    def _open(self, c: Connected) -> None:
        """Admit the call of the connected event ``c`` (the connection is closed when refused)."""
        call = self.admit(c.stream_id, c.fmt.rate)
        if call is not None:
            self.describe(call, c)
            self._use(c.fmt)
            self.start(call)

    # -- leg: out --------------------------------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        if len(samples) == self._frame:  # the pacer's 20 ms: one message
            ok = self.conn.send_binary(L16LE.encode(samples).tobytes())
            sent = int(ok)
        else:  # DTMF tones' tail, a short frame: whole messages, padded
            sent = sum(self.conn.send_binary(m) for m in self.fmt.frames(samples))
            ok = sent > 0
        if sent and self.call is not None:
            self.call.stats.packets_out += sent
        return ok

    def send_clear(self) -> None:
        self.tones.drop()
        self.conn.send_text(CLEAR)

    def send_mark(self, name: str) -> None:
        self.conn.send_text(notify(name))

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        done(False, TRANSFER_REASON)
