"""What the vendors' JSON media-stream legs share (Twilio, Telnyx, Plivo).

Owns :class:`StreamSession`, the base of a WebSocket leg whose peer is a
telephony vendor streaming JSON text messages: the start timeout, the
refusal of malformed input (before the call: close at once; during it: the
fault budget), admission (1013 when full or draining), the end of the
transport side, and the hang-up. A subclass reads its vendor's messages
(``on_text``, with :meth:`StreamSession.decode`, :meth:`StreamSession.admit`,
:meth:`StreamSession.describe`, :meth:`StreamSession.echoed`, :meth:`StreamSession.pressed`)
and writes them (``send_audio``, ``send_clear``, ``send_mark``, DTMF); the
messages themselves are the vendor's wire module (:mod:`brisvox.wire.twilio`,
:mod:`brisvox.wire.telnyx`, :mod:`brisvox.wire.plivo`; the legs of Twilio's
message set share :mod:`brisvox.gateway.carriers.carrier_stream` on top of this one),
whose refusals carry ``kind`` (the counter label),
``code`` (the close code) and ``reason``.

Invariants:

* Malformed input is counted (``ws_malformed_<kind>``, and the call's
  ``malformed``) and logged bounded (:data:`SESSION_LOG`, one line per site
  per minute, sites named ``<transport>_<kind>``, ``<transport>_dropped``,
  ``<transport>_budget``). Before the call exists it closes THIS connection
  at once with the kind's code and reason. During a live call it is dropped
  and charged to the call's fault budget (:mod:`brisvox.gateway.fault_budget`);
  only the message that exceeds it closes the connection, with that kind's
  code and a reason naming the budget (with ``hangup_on_error``: the first
  one, with its own reason). No ``start`` within ``start_timeout_s`` is
  ``no_start``; a binary frame is ``binary_frame``.
* SendDtmf is played in-band (:class:`~brisvox.gateway.core.leg.InbandTones`, at
  the call's rate) unless the vendor's leg overrides ``send_dtmf`` (Plivo's ``sendDTMF``).
* A call beyond ``max_calls`` (or while draining) is closed with 1013 and
  "try again later", one beyond its source's share (``[gateway]
  max_calls_per_source``, the source being the client after ``trusted_proxies``)
  with 1013 and "too many calls from this address" (:func:`admission_close`);
  any other admission failure with 1011.
* A live call without an inbound message carrying media for ``[websocket]
  media_timeout_s`` is closed 1000 "media timeout" (the core's call timer: the
  reason is the call's end reason, in ``CallEnd`` and the call record).
* The transport side is reported ended (``transport_ended``) once, whatever
  ends it: the vendor's stop, a close, a protocol error, the hang-up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from brisvox.gateway.config import WsRoute
from brisvox.gateway.core.calls import AdmissionError, Call
from brisvox.gateway.core.leg import (
    SESSION_LOG,
    InbandTones,
    TransportLeg,
    send_tones,
    ws_close_code,
)
from brisvox.wire.mediastream import Codec

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection


class Refusal(Protocol):
    """A wire module's refusal (``TwilioError``, ``PlivoError``)."""

    kind: str
    code: int
    reason: str


class StartInfo(Protocol):
    """What a wire module keeps of a ``start`` (its ``Start``): the call's metadata."""

    @property
    def ids(self) -> dict[str, str]: ...

    @property
    def params(self) -> dict[str, str] | None: ...

    @property
    def numbers(self) -> tuple[str, str]: ...

    @property
    def dropped(self) -> int: ...


def admission_close(e: AdmissionError) -> tuple[int, str]:
    """The close of a refused call (every WebSocket leg): 1013 with a reason when full, draining
    or its source holds its share of the calls; 1011 for anything else."""
    if e.reason == "source":
        return 1013, "too many calls from this address"
    if e.reason in ("full", "draining"):
        return 1013, "try again later"
    return 1011, "cannot serve the call"


class StreamSession(TransportLeg):
    """One vendor media stream: the protocol-independent half (see the module docstring)."""

    marks_by_echo = True
    refusal: Callable[[str, str], Any]  # the wire module's error class: (kind, reason) -> Refusal
    binary_reason = "media streams use text messages"

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        self.host = host
        self.conn = conn
        self.route = route
        self.call: Call | None = None
        self.stream_id = ""
        self._faults = host.settings.websocket.fault_budget().counter()
        self.clock: Callable[[], float] = time.monotonic  # the fault budget's clock
        self._start_timer: asyncio.TimerHandle | None = host.call_later(
            host.settings.websocket.start_timeout_s, self._no_start)
        self.tones = InbandTones()  # SendDtmf as in-band tones (a vendor with a DTMF message overrides send_dtmf)

    # -- refusals --------------------------------------------------------------------

    def _fail(self, e: Refusal) -> None:
        """Close at once (before the call exists: there is no call to keep)."""
        self.host.protocol_error(self.call, f"ws_malformed_{e.kind}")
        SESSION_LOG(f"{self.transport}_{e.kind}", "%s stream %s: closing (%s)", self.transport,
                    self.stream_id or "-", e.kind, level=logging.INFO)
        self.conn.close(e.code, e.reason)
        self._ended(f"protocol error: {e.kind}")

    def malformed(self, e: Refusal) -> None:
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
                SESSION_LOG(f"{self.transport}_dropped", "%s stream %s: dropped a malformed message (%s); "
                            "budget %s", self.transport, self.stream_id, e.kind, self._faults.budget.describe(),
                            level=logging.INFO)
            return
        SESSION_LOG(f"{self.transport}_budget", "%s stream %s: closing (%s: %s)", self.transport,
                    self.stream_id, e.kind, verdict.reason or e.reason, level=logging.INFO)
        self.conn.close(e.code, verdict.reason or e.reason)
        self._ended(verdict.reason or f"protocol error: {e.kind}")

    def _no_start(self) -> None:
        self._start_timer = None
        if self.call is None and not self.conn.closed:
            self._fail(self.refusal("no_start", "no start message"))

    def on_binary(self, data: bytes) -> None:
        self.malformed(self.refusal("binary_frame", self.binary_reason))

    def audio_frame(self, data: bytes, codec: Codec, rate: int, max_bytes: int, width: int = 2) -> None:
        """A binary frame of the caller's audio (the binary-media legs: Vonage, Asterisk, FreeSWITCH):
        refused before the call (``media_before_start``), when not whole samples of ``width``
        bytes (``bad_media``) or over ``max_bytes`` (``media_too_large``); else decoded by
        ``codec`` into the call at ``rate``. 50 a second: the checks and the ring write inline."""
        call = self.call
        n = len(data)
        if call is None:
            self.malformed(self.refusal("media_before_start", "audio before the stream's start"))
        elif n % width:
            self.malformed(self.refusal("bad_media", "a binary frame that is not whole samples"))
        elif n > max_bytes:
            self.malformed(self.refusal("media_too_large", "a binary frame over 1 s of audio"))
        elif n:
            self.host.audio_in(call, codec.decode(data), rate, n)

    def decode(self, data: bytes) -> dict[str, Any] | None:
        """The JSON object of a text message; None (refused as ``bad_json`` or ``bad_message``)
        for anything else."""
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.malformed(self.refusal("bad_json", "invalid JSON"))
            return None
        if type(msg) is not dict:
            self.malformed(self.refusal("bad_message", "expected a JSON object"))
            return None
        return msg

    # -- the call --------------------------------------------------------------------

    def repeated_start(self) -> bool:
        """A ``start`` on a live stream: counted, ignored (True), never charged to the budget."""
        if self.call is None:
            return False
        self.host.protocol_error(self.call, "ws_malformed_duplicate_start")
        return True

    def admit(self, stream_id: str, rate: int) -> Call | None:
        """Admit the stream's call at ``rate`` (the start timeout ends); None when refused
        (the connection is closed: 1013 when full or draining, else 1011)."""
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self.stream_id = stream_id
        try:
            return self.host.admit(self.transport, self.route.agent, rate, source=self.conn.source,
                                   media_timeout_s=self.host.settings.websocket.media_timeout_s)
        except AdmissionError as e:
            self.conn.close(*admission_close(e))
            return None

    def describe(self, call: Call, start: StartInfo) -> None:
        """The call's metadata from ``start``: its transport ids, its parameters (a signed
        token's, when the handshake had one, replace the stream's), the caller and the called
        number; the ids and parameters the wire dropped are counted (``call_params_dropped``)."""
        call.transport_ids = start.ids
        grant = getattr(self.conn, "grant", None)
        if grant is not None and grant.params is not None:
            call.params = grant.params
        elif start.params is not None:
            call.params = start.params
        call.caller, call.called = start.numbers
        if start.dropped:
            self.host.count("call_params_dropped", start.dropped)

    def start(self, call: Call) -> None:
        """The admitted call, its metadata set: attach this leg and start the agent side."""
        self.call = call
        self.host.start_call(call, self, self._on_ready)

    def _on_ready(self, ok: bool, why: str) -> None:
        if not ok:
            self.conn.close(1011, f"agent unavailable: {why}")
            self._ended("agent unavailable")

    def echoed(self, name: str) -> None:
        """The peer played the mark ``name`` (nothing before the call)."""
        if self.call is not None:
            self.host.mark_echo(self.call, name)

    def pressed(self, digit: str) -> None:
        """The caller pressed ``digit`` (nothing before the call)."""
        if self.call is not None:
            self.host.dtmf_in(self.call, digit, 0)

    def stop(self) -> None:
        """The vendor's ``stop``: the stream is over."""
        self._ended("stop")
        self.conn.close(1000, "stop")

    def on_closed(self, code: int, reason: str) -> None:
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self._ended(f"closed {code}")

    def _ended(self, reason: str) -> None:
        if self.call is not None and not self.call.transport_done:
            self.host.transport_ended(self.call, reason)

    # -- leg: out --------------------------------------------------------------------

    def send_dtmf(self, digits: str) -> int:
        """In-band tones at the call's rate (the protocol has no DTMF message)."""
        return self.tones.queue(digits, self.call.call_rate if self.call is not None else 8000)

    def tick_dtmf(self, now: float) -> bool:
        call = self.call
        return call is not None and send_tones(self, self.tones, call.call_rate, now)

    @property
    def can_send(self) -> bool:
        return not self.conn.closed

    def hangup(self, reason: str) -> None:
        self.conn.close(ws_close_code(reason), reason)  # the connection cuts it to 123 bytes
        self._ended(reason)
