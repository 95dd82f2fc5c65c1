"""Twilio Media Streams (bidirectional) over the gateway's WebSocket server.

Owns one Twilio connection and the call leg it becomes: what each inbound
message does (``connected``, ``start``, ``media``, ``mark`` echoes, ``dtmf``,
``stop``) and when the outbound ones are sent (``media``, ``mark``,
``clear``). The messages themselves, their parsing, their refusals' close
codes and the outbound byte templates are :mod:`brisvox.wire.twilio`.

Invariants:

* Malformed input is counted (``ws_malformed_<kind>``, and the call's
  ``malformed``) and logged bounded (:data:`~brisvox.gateway.leg.SESSION_LOG`).
  Before the call exists it closes THIS connection at once
  with a reason: bad JSON or a non-object (1007), a bad ``start`` (1007),
  media before ``start`` (1008), a media format other than mu-law 8 kHz
  mono (1003), a binary frame (1003), no ``start`` in time (1008). During a
  live call a malformed message (bad JSON, a non-object, a bad base64 or
  missing payload, a mark without a name, a bad digit, a binary frame, a
  payload over 1 s) is dropped and charged to the call's fault budget
  (:mod:`brisvox.gateway.fault_budget`); only the message that exceeds it
  closes the connection, with that kind's code (``CLOSE_CODES``) and a
  reason naming the budget (with ``hangup_on_error``: the first one, with
  its own reason). An oversized frame is closed by the server (1009).
* An unknown event name and a repeated ``start`` are counted and ignored,
  never charged to the budget (Twilio adds events over time; a new one must
  not hang up live calls).
* A call beyond ``max_calls`` (or while draining) is closed with 1013.
* The call's metadata: ``streamSid``/``callSid``/``accountSid`` as its
  transport ids, ``customParameters`` as its parameters, the caller and
  the called number from the ``From``/``To`` (or ``caller``/``called``)
  parameters; a malformed or oversized id or parameter is dropped and
  counted (``call_params_dropped``), never refused.
* Outbound media messages are built from the stream's prefix
  (:class:`~brisvox.wire.twilio.BotStream`) and a reused encode buffer (no
  JSON encoder, no dict per frame); a ``mark`` is sent
  right after the frame that reaches its position and its echo is forwarded
  to the agent as MarkPlayed. After a ``clear``, echoes of marks Twilio
  flushes are swallowed (reported in Cleared instead).
* Twilio has no outbound DTMF event: SendDtmf is played in-band as tones
  through the media channel (paced like audio, pausing the out ring).
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from brisvox.gateway.calls import AdmissionError, Call
from brisvox.gateway.config import WsRoute
from brisvox.gateway.leg import SESSION_LOG, TransportLeg, ws_close_code
from brisvox.wire import dtmf
from brisvox.wire.g711 import PCMU
from brisvox.wire.twilio import (
    MEDIA_SUFFIX,
    RATE,
    BotStream,
    TwilioError,
    dtmf_digit,
    mark_name,
    media_payload,
    parse_start,
)

if TYPE_CHECKING:
    from brisvox.gateway.host import CallHost
    from brisvox.gateway.ws_server import WsConnection



class TwilioSession(TransportLeg):
    """One Twilio media stream: protocol handler and call leg."""

    transport = "twilio"
    marks_by_echo = True

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        self.host = host
        self.conn = conn
        self.route = route
        self.call: Call | None = None
        self.stream_sid = ""
        self._out: BotStream | None = None
        self._prefix = b""  # the stream's media prefix, on self for the per-frame send
        self._enc = np.empty(4096, dtype=np.uint8)
        self._tones: np.ndarray | None = None
        self._tone_pos = 0
        self._faults = host.settings.websocket.fault_budget().counter()
        self.clock: Callable[[], float] = time.monotonic  # the fault budget's clock
        self._start_timer: asyncio.TimerHandle | None = host.call_later(
            host.settings.websocket.start_timeout_s, self._no_start)

    # -- protocol in --------------------------------------------------------------

    def _fail(self, e: TwilioError) -> None:
        """Close at once (before the call exists: there is no call to keep)."""
        self.host.protocol_error(self.call, f"ws_malformed_{e.kind}")
        SESSION_LOG(f"twilio_{e.kind}", "twilio stream %s: closing (%s)", self.stream_sid or "-", e.kind,
                    level=logging.INFO)
        self.conn.close(e.code, e.reason)
        self._ended(f"protocol error: {e.kind}")

    def _malformed(self, e: TwilioError) -> None:
        """A malformed message: before the call, close; during it, count, drop, and close
        only once the fault budget is exceeded."""
        call = self.call
        if call is None:
            self._fail(e)
            return
        self.host.protocol_error(call, f"ws_malformed_{e.kind}")
        verdict = self._faults.fault(self.clock())
        if not verdict.end:
            if self._faults.total == 1:
                SESSION_LOG("twilio_dropped", "twilio stream %s: dropped a malformed message (%s); budget %s",
                            self.stream_sid, e.kind, self._faults.budget.describe(), level=logging.INFO)
            return
        SESSION_LOG("twilio_budget", "twilio stream %s: closing (%s: %s)", self.stream_sid, e.kind,
                    verdict.reason or e.reason, level=logging.INFO)
        self.conn.close(e.code, verdict.reason or e.reason)
        self._ended(verdict.reason or f"protocol error: {e.kind}")

    def _no_start(self) -> None:
        self._start_timer = None
        if self.call is None and not self.conn.closed:
            self._fail(TwilioError("no_start", "no start message"))

    def on_binary(self, data: bytes) -> None:
        self._malformed(TwilioError("binary_frame", "Twilio media streams use text messages"))

    def on_text(self, data: bytes) -> None:
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._malformed(TwilioError("bad_json", "invalid JSON"))
            return
        if type(msg) is not dict:
            self._malformed(TwilioError("bad_message", "expected a JSON object"))
            return
        ev = msg.get("event")
        try:
            if ev == "media":  # 50 a second: one call to the wire, the ring write inline
                call = self.call
                if call is None:
                    raise TwilioError("media_before_start", "media before start")
                raw = media_payload(msg)
                if raw is None:
                    return  # an outbound track copy: not caller audio
                self.host.audio_in(call, PCMU.decode(raw), RATE, len(raw))
            elif ev == "mark":
                name = mark_name(msg)
                if self.call is not None:
                    self.host.mark_echo(self.call, name)
            elif ev == "start":
                self._start(msg)
            elif ev == "dtmf":
                digit = dtmf_digit(msg)
                if self.call is not None:
                    self.host.dtmf_in(self.call, digit, 0)
            elif ev == "stop":
                self._ended("stop")
                self.conn.close(1000, "stop")
            elif ev == "connected":
                pass
            else:
                self.host.protocol_error(self.call, "ws_malformed_unknown_event")
        except TwilioError as e:
            self._malformed(e)

    def _start(self, msg: dict[str, Any]) -> None:
        if self.call is not None:
            self.host.protocol_error(self.call, "ws_malformed_duplicate_start")
            return
        start = parse_start(msg)
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self.stream_sid = start.stream_sid
        try:
            call = self.host.admit(self.transport, self.route.agent, RATE)
        except AdmissionError as e:
            self.conn.close(1013 if e.reason in ("full", "draining") else 1011,
                            "try again later" if e.reason in ("full", "draining") else "cannot serve the call")
            return
        call.transport_ids = start.ids
        if start.params is not None:
            call.params = start.params
        call.caller, call.called = start.numbers
        if start.dropped:
            self.host.count("call_params_dropped", start.dropped)
        self.call = call
        self._out = out = BotStream(start.stream_sid)
        self._prefix = out.media_prefix
        self.host.start_call(call, self, self._on_ready)

    def _on_ready(self, ok: bool, why: str) -> None:
        if not ok:
            self.conn.close(1011, f"agent unavailable: {why}")
            self._ended("agent unavailable")

    def on_closed(self, code: int, reason: str) -> None:
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self._ended(f"closed {code}")

    def _ended(self, reason: str) -> None:
        if self.call is not None and not self.call.transport_done:
            self.host.transport_ended(self.call, reason)

    # -- leg: out --------------------------------------------------------------------

    @property
    def can_send(self) -> bool:
        return not self.conn.closed

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        n = len(samples)
        enc = self._enc[:n] if n <= len(self._enc) else np.empty(n, dtype=np.uint8)
        PCMU.encode(samples, out=enc)
        msg = self._prefix + binascii.b2a_base64(enc.data, newline=False) + MEDIA_SUFFIX
        ok = self.conn.send_text(msg)
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def send_clear(self) -> None:
        self._tones = None
        if self._out is not None:
            self.conn.send_text(self._out.clear)

    def send_mark(self, name: str) -> None:
        if self._out is not None:
            self.conn.send_text(self._out.mark(name))

    def send_dtmf(self, digits: str) -> int:
        valid = "".join(d for d in digits if d.upper() in dtmf.DIGITS)
        tones = dtmf.tone_sequence(valid, RATE)
        if self._tones is not None:
            tones = np.concatenate([self._tones[self._tone_pos:], tones])
        self._tones, self._tone_pos = tones, 0
        return len(digits) - len(valid)

    def tick_dtmf(self, now: float) -> bool:
        t = self._tones
        if t is None:
            return False
        chunk = t[self._tone_pos:self._tone_pos + 160]
        self._tone_pos += 160
        if self._tone_pos >= len(t):
            self._tones = None
        if len(chunk):
            self.send_audio(chunk, now)
        return True

    def hangup(self, reason: str) -> None:
        self.conn.close(ws_close_code(reason), reason)  # the connection cuts it to 123 bytes
        self._ended(reason)

    def transfer(self, target: str, done: Callable[[bool, str], None]) -> None:
        done(False, "a Twilio media stream cannot transfer; use the Twilio REST API (calls update)")
