"""The native brisvox WebSocket protocol: JSON control plus binary PCM16 frames.

Owns one ``/ws`` connection (documented in docs/PROTOCOL.md) and the call
leg it becomes: what each client message does and when the gateway's are
sent. The messages themselves (builders, parsers, error codes) are
:mod:`brisvox.wire.native`.

Client -> server: ``start`` (rate, params, marks release | echo); binary
frames of PCM16 little-endian mono at the declared rate; ``mark`` (echo
mode: the client played that mark); ``dtmf``; ``stop``.

Server -> client: ``started`` (call_id, rate, frame_ms, agent); binary 20 ms
PCM16 frames of bot audio; ``mark`` (echo mode, right after the frame that
reaches it); ``clear``; ``dtmf`` (digits); ``transfer``; ``error`` (code,
message); ``stop`` (reason).

Invariants:

* Recoverable mistakes (bad JSON, an unknown event, audio before start, an
  odd-length audio frame, a bad digit) get an ``error`` message with a stable
  ``code`` and are counted (``ws_malformed_<code>``, and the call's
  ``malformed``) and logged bounded (:data:`~brisvox.gateway.core.leg.SESSION_LOG`);
  the message is dropped. Before ``start`` that is all (the
  start timeout bounds such a connection). During a live call each one is
  also charged to the call's fault budget
  (:mod:`brisvox.gateway.fault_budget`): the one that exceeds it closes the
  connection with its code's close code (:data:`FAULT_CLOSE_CODES`: 1007
  for bad data, 1008 for a message out of place) and a reason naming the
  budget (with ``hangup_on_error``: the first one, with its own message).
* A bad ``start`` (rate not offered) closes with 1003, a full gateway with
  1013 (so does a source beyond its share of the calls,
  :func:`~brisvox.gateway.carriers.stream_session.admission_close`), an oversized
  frame is closed by the server with 1009. A live call without a binary frame for
  ``media_timeout_s`` gets ``stop`` and a close 1000, both "media timeout"; one older
  than ``[gateway] max_call_s``, "max call duration" (the core's call timers).
* A connection let in with a signed token that carries ``params`` gets
  exactly those as the call's parameters (the ``start`` message's are
  ignored); otherwise the ``start`` message's are used. The caller and the
  called number are the parameters ``caller``/``from`` and ``called``/``to``
  (:func:`~brisvox.wire.jsontext.caller_called`); a malformed or oversized
  parameter is dropped and counted (``call_params_dropped``), never refused.
* In ``release`` mark mode (default) the gateway reports a mark as played
  when its release position passes it; in ``echo`` mode the client's echo
  does, as with Twilio.
* The call's events (``call_event`` messages: transcript lines, turn
  latencies, tool calls) reach only a client whose ``start`` said
  ``"events": true`` (the agent is told in ``CallStart.events`` and sends
  nothing otherwise). One is written like any message, never queued: when the
  connection cannot take it now (closed, or its unsent bytes beyond half of
  ``max_send_buffer_bytes``, so events never crowd out the bot's audio) it is
  dropped and counted (``call_events_dropped``); a call never waits for one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from brisvox.gateway.carriers.stream_session import admission_close
from brisvox.gateway.config import WsRoute
from brisvox.gateway.core.calls import AdmissionError, Call
from brisvox.gateway.core.leg import SESSION_LOG, TransportLeg, ws_close_code
from brisvox.wire import dtmf, native
from brisvox.wire.jsontext import caller_called
from brisvox.wire.native import NativeError

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection


# the close code of a live call whose fault budget a recoverable mistake exceeded (docs/PROTOCOL.md)
FAULT_CLOSE_CODES: dict[str, int] = {
    "bad_json": 1007, "bad_message": 1007, "odd_frame": 1007, "bad_dtmf": 1007, "bad_mark": 1007,
    "bad_start": 1007, "unknown_event": 1008, "duplicate_start": 1008,
}


class NativeSession(TransportLeg):
    """One native stream: protocol handler and call leg."""

    transport = "native"

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        self.host = host
        self.conn = conn
        self.route = route
        self.call: Call | None = None
        self.marks_by_echo = False
        self.rate = 0
        self._faults = host.settings.websocket.fault_budget().counter()
        self.clock: Callable[[], float] = time.monotonic  # the fault budget's clock
        self._start_timer: asyncio.TimerHandle | None = host.call_later(
            host.settings.websocket.start_timeout_s, self._no_start)

    # -- errors ---------------------------------------------------------------------

    def _error(self, code: str, message: str) -> None:
        """A recoverable mistake: answered, counted, dropped; during a live call also
        charged to the fault budget, and the one that exceeds it closes the connection."""
        call = self.call
        self.host.protocol_error(call, f"ws_malformed_{code}")
        self.conn.send_text(native.error(code, message))
        if call is None:
            return
        verdict = self._faults.fault(self.clock())
        if not verdict.end:
            if self._faults.total == 1:
                SESSION_LOG("native_dropped", "native call %s: dropped a malformed message (%s); budget %s",
                            call.call_id, code, self._faults.budget.describe(), level=logging.INFO)
            return
        SESSION_LOG("native_budget", "native call %s: closing (%s: %s)", call.call_id, code,
                    verdict.reason or message, level=logging.INFO)
        self.conn.close(FAULT_CLOSE_CODES.get(code, 1008), verdict.reason or message)
        self._ended(verdict.reason or f"protocol error: {code}")

    def _close(self, kind: str, code: int, reason: str) -> None:
        self.host.count(f"ws_malformed_{kind}")
        self.conn.close(code, reason)
        self._ended(f"protocol error: {kind}")

    def _no_start(self) -> None:
        self._start_timer = None
        if self.call is None and not self.conn.closed:
            self._close("no_start", 1008, "no start message")

    # -- protocol in ------------------------------------------------------------------

    def on_binary(self, data: bytes) -> None:
        call = self.call
        if call is None:
            self._error("media_before_start", "send start before audio")
            return
        if len(data) % 2:
            self._error("odd_frame", "PCM16 frames have an even number of bytes")
            return
        self.host.audio_in(call, np.frombuffer(data, dtype="<i2"), self.rate, len(data))

    def on_text(self, data: bytes) -> None:
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._error("bad_json", "invalid JSON")
            return
        try:
            ev = native.event_name(msg)
            if ev == "start":
                self._start(msg)
            elif ev == "mark":
                name = native.mark_name(msg)
                if self.call is not None and self.marks_by_echo:
                    self.host.mark_echo(self.call, name)
            elif ev == "dtmf":
                digit, dur = native.parse_dtmf(msg)
                if self.call is None:
                    self._error("dtmf_before_start", "send start first")
                else:
                    self.host.dtmf_in(self.call, digit, dur)
            elif ev == "stop":
                self._ended("stop")
                self.conn.send_text(native.stop("client stop"))
                self.conn.close(1000, "stop")
            else:
                self._error("unknown_event", f"unknown event {ev[:32]!r}")
        except NativeError as e:
            if e.close:
                self._close(e.code, e.close, e.message)
            else:
                self._error(e.code, e.message)

    def _start(self, msg: dict[str, Any]) -> None:
        if self.call is not None:
            self._error("duplicate_start", "the stream already started")
            return
        start = native.parse_start(msg, self.host.settings.websocket.native_rates)
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        try:
            call = self.host.admit(self.transport, self.route.agent, start.rate, source=self.conn.source,
                                   media_timeout_s=self.host.settings.websocket.media_timeout_s)
        except AdmissionError as e:
            self.conn.close(*admission_close(e))
            return
        self.rate = start.rate
        self.marks_by_echo = start.marks_echo
        grant = getattr(self.conn, "grant", None)
        if grant is not None and grant.params is not None:
            call.params = grant.params  # a signed token's parameters: the client cannot change them
        elif start.params is not None:
            call.params = start.params
        call.caller, call.called = caller_called(call.params)
        call.events = start.events
        if start.dropped:
            self.host.count("call_params_dropped", start.dropped)
        self.call = call
        self.conn.send_text(native.started(call.call_id, start.rate, call.agent))
        self.host.start_call(call, self, self._on_ready)

    def _on_ready(self, ok: bool, why: str) -> None:
        if not ok:
            self.conn.send_text(native.stop(f"agent unavailable: {why}"))
            self.conn.close(1011, "agent unavailable")
            self._ended("agent unavailable")

    def on_closed(self, code: int, reason: str) -> None:
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self._ended(f"closed {code}")

    def _ended(self, reason: str) -> None:
        if self.call is not None and not self.call.transport_done:
            self.host.transport_ended(self.call, reason)

    # -- leg: out ----------------------------------------------------------------------

    @property
    def can_send(self) -> bool:
        return not self.conn.closed

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        ok = self.conn.send_binary(samples.astype("<i2", copy=False).tobytes())
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def send_clear(self) -> None:
        self.conn.send_text(native.CLEAR)

    def send_mark(self, name: str) -> None:
        self.conn.send_text(native.mark(name))

    def send_dtmf(self, digits: str) -> int:
        valid = "".join(d.upper() for d in digits if d.upper() in dtmf.DIGITS)
        if valid:
            self.conn.send_text(native.dtmf(valid))
        return len(digits) - len(valid)

    def hangup(self, reason: str) -> None:
        self.conn.send_text(native.stop(reason))
        self.conn.close(ws_close_code(reason), reason)  # the connection cuts it to 123 bytes
        self._ended(reason)

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        ok = self.conn.send_text(native.transfer(target))
        done(ok, "delegated to the client" if ok else "connection closed")

    def send_call_event(self, name: str, fields: dict[str, Any]) -> bool:
        t = self.conn.transport
        if self.call is None or not self.call.events or t is None \
                or t.get_write_buffer_size() > self.conn.max_buffer // 2:
            return False
        return self.conn.send_text(native.call_event(name, fields))
