"""The legs of the carriers whose media streams speak Twilio's message set: Twilio and Telnyx.

Owns :class:`CarrierStreamSession`, what :mod:`brisvox.gateway.carriers.twilio`
and :mod:`brisvox.gateway.carriers.telnyx` share on top of the vendor-stream base
(:class:`~brisvox.gateway.carriers.stream_session.StreamSession`: start timeout,
fault budget, admission, end of the call) and the in-band DTMF
(:class:`~brisvox.gateway.core.leg.InbandTones`, held): what each inbound message
does (``connected``, ``start``, ``media``, ``mark`` echoes, ``dtmf``,
``stop``; the carriers' shared parsers are :mod:`brisvox.wire.mediastream`)
and how the outbound ones go (``media``, ``mark``, ``clear``, from the
carrier's byte templates). A subclass names the carrier: its ``start``
(:meth:`CarrierStreamSession.opening`: the stream's id, metadata, format and
outbound builder), the events only it sends (:meth:`CarrierStreamSession.other_event`),
and why it cannot transfer.

Invariants:

* Before the call exists a malformed message closes THIS connection at once
  with its kind's close code (:data:`brisvox.wire.mediastream.CLOSE_CODES`):
  bad JSON or a non-object (1007), a bad ``start`` (1007), media before
  ``start`` (1008), a media format the carrier's wire module refuses (1003),
  a binary frame (1003), no ``start`` in time (1008). During a live call a
  malformed message (bad JSON, a non-object, a bad base64 or missing
  payload, audio the format's codec refuses, a mark without a name, a bad
  digit, a binary frame, a payload over 1 s) is dropped and charged to the
  call's fault budget; only the one that exceeds it closes, with that kind's
  code and a reason naming the budget. An oversized frame is closed by the
  server (1009).
* An unknown event name and a repeated ``start`` are counted and ignored,
  never charged to the budget (carriers add events over time).
* The call's metadata comes from ``start``: the carrier's ids as its
  transport ids, its custom parameters as its parameters (a signed token's
  parameters, when the handshake had one, replace them), the caller and
  the called number; malformed ones were dropped by the wire module and are
  counted here (``call_params_dropped``), never refused.
* The call's rate and both directions' codec are the stream's format; an
  outbound media message is the stream's prefix + base64 of the frame,
  encoded into a reused buffer (no JSON encoder, no dict per frame) +
  :data:`~brisvox.wire.mediastream.MEDIA_SUFFIX`.
* A ``mark`` is sent right after the frame that reaches its position and
  the carrier's echo is forwarded as MarkPlayed; after a ``clear`` the
  echoes of the marks it flushed are swallowed (reported in Cleared).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from brisvox.gateway.carriers.stream_session import StreamSession
from brisvox.gateway.config import WsRoute
from brisvox.wire.mediastream import (
    MEDIA_SUFFIX,
    PCMU_8K,
    MediaFormat,
    StreamError,
    dtmf_digit,
    mark_name,
    media_payload,
)

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection


class BotMessages(Protocol):
    """A carrier's outbound builder for one stream (``brisvox.wire.twilio.BotStream``, ...)."""

    media_prefix: bytes
    clear: bytes

    def mark(self, name: str) -> bytes: ...


class Opening(NamedTuple):
    """What a carrier's ``start`` opens: the stream and the call's metadata."""

    stream_id: str
    ids: dict[str, str]
    params: dict[str, str] | None
    numbers: tuple[str, str]  # (caller, called)
    dropped: int
    format: MediaFormat
    out: BotMessages


class CarrierStreamSession(StreamSession):
    """One carrier media stream of Twilio's message set (see the module docstring)."""

    refusal = StreamError
    transfer_reason = "a media stream cannot transfer"

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        super().__init__(host, conn, route)
        self._out: BotMessages | None = None
        self._prefix = b""  # the stream's media prefix, on self for the per-frame send
        self._use(PCMU_8K)

    def _use(self, fmt: MediaFormat) -> None:
        """The stream's format, on self for the per-frame paths."""
        self.fmt = fmt
        self.rate = fmt.rate
        self._codec = fmt.codec
        self._max_media = fmt.max_media_bytes
        self._enc = np.empty(4096, dtype=fmt.wire_dtype)

    # -- the carrier (subclass) --------------------------------------------------------

    def opening(self, msg: dict[str, Any]) -> Opening:
        """The carrier's ``start`` read; raises :class:`StreamError`."""
        raise NotImplementedError

    def other_event(self, ev: Any, msg: dict[str, Any]) -> None:
        """An event outside the shared set: counted as unknown, never charged."""
        self.host.protocol_error(self.call, "ws_malformed_unknown_event")

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
                    raise StreamError("media_before_start", "media before start")
                raw = media_payload(msg, self._max_media)
                if raw is not None:  # None: an outbound track copy, not caller audio
                    self.host.audio_in(call, self._codec.decode(raw), self.rate, len(raw))
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
                self.stop()
            elif ev != "connected":
                self.other_event(ev, msg)
        except StreamError as e:
            self.malformed(e)

    def _start(self, msg: dict[str, Any]) -> None:
        if self.repeated_start():
            return
        o = self.opening(msg)
        call = self.admit(o.stream_id, o.format.rate)
        if call is None:
            return
        call.transport_ids = o.ids
        grant = getattr(self.conn, "grant", None)
        if grant is not None and grant.params is not None:
            call.params = grant.params  # a signed token's parameters: the carrier's cannot change them
        elif o.params is not None:
            call.params = o.params
        call.caller, call.called = o.numbers
        if o.dropped:
            self.host.count("call_params_dropped", o.dropped)
        self._use(o.format)
        self._out = o.out
        self._prefix = o.out.media_prefix
        self.start(call)

    # -- leg: out --------------------------------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        n = len(samples)
        enc = self._enc[:n] if n <= len(self._enc) else np.empty(n, dtype=self._enc.dtype)
        self._codec.encode(samples, out=enc)
        ok = self.conn.send_text(self._prefix + binascii.b2a_base64(enc.data, newline=False) + MEDIA_SUFFIX)
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def send_clear(self) -> None:
        self.tones.drop()
        if self._out is not None:
            self.conn.send_text(self._out.clear)

    def send_mark(self, name: str) -> None:
        if self._out is not None:
            self.conn.send_text(self._out.mark(name))

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        done(False, self.transfer_reason)
