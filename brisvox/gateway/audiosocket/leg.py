"""The call leg of one AudioSocket connection: Asterisk's messages in, the bot's audio out.

Owns :class:`AudioSocketLeg`, the :class:`~brisvox.gateway.core.leg.TransportLeg` of one
connection (the listener's :class:`~brisvox.gateway.audiosocket.listener.AudioSocketConn`
reads the bytes, :class:`~brisvox.wire.audiosocket.Decoder` frames them, this leg acts on
each message and writes through the connection's ``write``/``close``).

Invariants:

* The first message names the call (``UUID``): the call is admitted then (transport
  ``audiosocket``, ``[audiosocket] agent``, ``[audiosocket] rate``, the peer's address as
  its source, so ``[gateway] max_calls_per_source`` bounds one Asterisk's calls) and the
  UUID is its transport id ``uuid``. A refused admission (full, draining, the source's
  share) is answered with a hangup message and the connection is closed.
* Malformed input (any :class:`~brisvox.wire.audiosocket.AudioSocketError`, audio or DTMF
  before the UUID, a second UUID, audio of another rate than the call's) is refused: counted
  ``audiosocket_malformed_<kind>`` (and the call's ``malformed``), logged once per kind a
  minute (:data:`~brisvox.gateway.core.leg.SESSION_LOG`), and the leg ends (hangup message,
  close; the call's end reason ``protocol error: <kind>``). A TCP stream that carried a bad
  message is out of step: there is no fault budget.
* The bot's audio goes out as audio messages of the call's rate, one per pacer frame. A
  Clear stops the pacer releasing audio; AudioSocket has no flush message, and Asterisk
  plays what it reads as it reads it, so nothing more is sent. Outbound DTMF is in-band
  tones (:class:`~brisvox.gateway.core.leg.InbandTones`): Asterisk reads no DTMF message.
* Hang-up both ways: the peer's hangup message, its error message (``0xff``, counted
  ``audiosocket_peer_error``) or its close ends the transport side once; our hangup sends a
  hangup message, then closes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import numpy as np

from brisvox.gateway.config import AudioSocketConfig
from brisvox.gateway.core.calls import AdmissionError, Call
from brisvox.gateway.core.leg import SESSION_LOG, InbandTones, TransportLeg, send_tones
from brisvox.wire import audiosocket as wire

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost

__all__ = ["AudioSocketLeg", "Conn"]


class Conn(Protocol):
    """What the leg asks of its connection."""

    source: str
    closed: bool

    def write(self, data: bytes) -> bool: ...

    def close(self) -> None: ...


class AudioSocketLeg(TransportLeg):
    """The transport side of one AudioSocket call (see the module docstring)."""

    transport = "audiosocket"

    def __init__(self, host: CallHost, conn: Conn, cfg: AudioSocketConfig) -> None:
        self.host = host
        self.conn = conn
        self.cfg = cfg
        self.rate = cfg.rate
        self._kind = wire.audio_kind(cfg.rate)
        self.call: Call | None = None
        self.call_uuid = ""
        self.tones = InbandTones()

    # -- in ------------------------------------------------------------------------------

    def on_message(self, m: wire.Message) -> None:
        """One message from Asterisk."""
        if self.conn.closed:
            return
        call = self.call
        if m.kind == self._kind and call is not None:  # 50 a second: first
            self.host.audio_in(call, np.frombuffer(m.payload, dtype="<i2"), self.rate, len(m.payload))
        elif m.kind == wire.UUID:
            if call is not None:
                self.refuse(wire.AudioSocketError("duplicate_uuid", "a second UUID message"))
            else:
                self._admit(m.uuid)
        elif call is None and m.kind not in (wire.HANGUP, wire.ERROR):
            self.refuse(wire.AudioSocketError("no_uuid", f"kind 0x{m.kind:02x} before the UUID message"))
        elif m.kind in wire.KIND_RATES:
            self.refuse(wire.AudioSocketError("wrong_rate", f"{m.rate} Hz audio on a {self.rate} Hz call "
                                              "(audiosocket.rate)"))
        elif m.kind == wire.DTMF:
            assert call is not None
            self.host.dtmf_in(call, m.digit, 0)
        elif m.kind == wire.HANGUP:
            self.conn.close()
            self.ended("hangup")
        else:  # ERROR: Asterisk's code (0x01 the caller hung up, 0x02 frame forwarding, 0x04 memory)
            self.host.count("audiosocket_peer_error")
            code = m.payload[0] if m.payload else 0
            self.conn.close()
            self.ended(f"peer error 0x{code:02x}")

    def refuse(self, e: wire.AudioSocketError) -> None:
        """Malformed input: counted, logged bounded, and the leg ends."""
        self.host.protocol_error(self.call, f"audiosocket_malformed_{e.kind}")
        SESSION_LOG(f"audiosocket_{e.kind}", "AudioSocket %s from %s: closing (%s)", self.call_uuid or "-",
                    self.conn.source, e, level=logging.INFO)
        self.conn.write(wire.hangup())
        self.conn.close()
        self.ended(f"protocol error: {e.kind}")

    def _admit(self, call_uuid: str) -> None:
        self.call_uuid = call_uuid
        try:
            call = self.host.admit(self.transport, self.cfg.agent, self.rate, source=self.conn.source,
                                   media_timeout_s=self.cfg.media_timeout_s)
        except AdmissionError as e:
            self.host.count(f"audiosocket_refused_{e.reason}")
            self.conn.write(wire.hangup())
            self.conn.close()
            return
        call.transport_ids = {"uuid": call_uuid}
        self.call = call
        self.host.start_call(call, self, self._on_ready)

    def _on_ready(self, ok: bool, why: str) -> None:
        if not ok:
            self.hangup(f"agent unavailable: {why}")

    def ended(self, reason: str) -> None:
        """The transport side is gone (idempotent)."""
        if self.call is not None and not self.call.transport_done:
            self.host.transport_ended(self.call, reason)

    # -- out ----------------------------------------------------------------------------

    @property
    def can_send(self) -> bool:
        return not self.conn.closed

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        pcm = samples.astype("<i2", copy=False).tobytes()
        ok = self.conn.write(wire.encode(self._kind, pcm))
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def send_clear(self) -> None:
        self.tones.drop()  # no flush message: the pacer stops releasing, nothing more goes out

    def send_dtmf(self, digits: str) -> int:
        return self.tones.queue(digits, self.rate)

    def tick_dtmf(self, now: float) -> bool:
        return send_tones(self, self.tones, self.rate, now)

    def hangup(self, reason: str) -> None:
        self.conn.write(wire.hangup())
        self.conn.close()
        self.ended(reason)
