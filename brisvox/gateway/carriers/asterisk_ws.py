"""Asterisk ``chan_websocket`` media connections (``Dial(WebSocket/<connection>/c(ulaw))``) over the gateway's WebSocket server.

Owns one media WebSocket Asterisk opens to the gateway (an outgoing
connection of ``websocket_client.conf`` whose ``uri`` is the route) and the
call leg it becomes: what each inbound message does (the TEXT events
``MEDIA_START``, ``DTMF_END``, ``MEDIA_XOFF``/``MEDIA_XON``, ``ERROR``; the
caller's audio as BINARY frames) and what the bot sends (its audio as BINARY
20 ms frames, ``FLUSH_MEDIA`` on a Clear, ``HANGUP`` on the agent's
hang-up). The messages, the formats and what Asterisk documents are
:mod:`brisvox.wire.asterisk_ws`; the start timeout, the fault budget,
admission and the end of the call are
:class:`~brisvox.gateway.carriers.stream_session.StreamSession`; the handshake
check (the password of ``Authorization: Basic``, what ``websocket_client.conf``
``username``/``password`` send, or ``?token=``) is
:func:`brisvox.gateway.ws.auth.asterisk_ws_auth`.

Invariants:

* Malformed input is refused as every vendor stream refuses it
  (:mod:`brisvox.gateway.carriers.stream_session`): before the call (no
  ``MEDIA_START`` yet) bad JSON (1007), a text the grammar refuses or
  another event first (1007), a ``MEDIA_START`` without a connection id
  (1007), a format other than ``ulaw``/``alaw``/``slin``/``slin16`` (1003),
  audio before it (1008), no ``MEDIA_START`` in time (1008) close at once;
  during a live call a malformed message (bad JSON, a text the grammar
  refuses, a ``DTMF_END`` without a digit, a binary frame that is not whole
  samples or holds over 1 s) is counted (``ws_malformed_<kind>``), dropped
  and charged to the call's fault budget; only the one that exceeds it
  closes, with that kind's code. An oversized frame is closed by the server
  (1009).
* An unknown event and a repeated ``MEDIA_START`` are counted and ignored,
  never charged. ``MEDIA_XOFF`` is counted (``asterisk_ws_xoff``: the pacer
  sends in real time, so Asterisk's queue should never fill) and Asterisk's
  ``ERROR`` (a command it refused) counted (``asterisk_ws_error``) with one
  rate-limited log line; the other events are read and ignored.
* The call's rate and both directions' codec are ``MEDIA_START``'s format;
  one 20 ms frame (the ``optimal_frame_size`` for 20 ms ptime) is one BINARY
  message, so Asterisk neither buffers nor drops a remainder.
* A Clear is ``FLUSH_MEDIA``: Asterisk discards every frame it queued and
  not yet played (exact; the in-band DTMF tones queued here are dropped too).
* The call's metadata: the route URI's query (what the dial string's
  ``v(...)`` appends; ``token`` excluded) and, in the JSON format, the
  ``channel_variables`` as its parameters (a signed token's replace them);
  ``connection_id``, ``channel`` and ``channel_id`` as its transport ids; the
  caller and the called number from the ``caller``/``from`` and
  ``called``/``to`` parameters. A malformed one is dropped and counted
  (``call_params_dropped``), never refused.
* Marks are reported on release (the pacer sends in real time; MEDIA_MARK_PROCESSED
  exists only in newer releases and JSON format). SendDtmf is played in-band
  (chan_websocket has no command to send a digit). The leg cannot transfer.
* The agent's hang-up sends ``HANGUP`` (Asterisk hangs the channel up and
  closes the socket) and closes 1000; Asterisk's hang-up closes the socket.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from brisvox.gateway.carriers.stream_session import StreamSession
from brisvox.gateway.config import WsRoute
from brisvox.gateway.core.leg import SESSION_LOG
from brisvox.wire.asterisk_ws import (
    FORMATS,
    PLAIN,
    AsteriskError,
    Event,
    MediaStart,
    command,
    dtmf_digit,
    media_start,
    parse_event,
)
from brisvox.wire.jsontext import caller_called, checked_params
from brisvox.wire.mediastream import MediaFormat

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import WsConnection

TRANSFER_REASON = "a chan_websocket channel cannot transfer; redirect the bridged channel (AMI Redirect, ARI)"
_IGNORED = ("MEDIA_XON", "STATUS", "MEDIA_BUFFERING_COMPLETED", "MEDIA_MARK_PROCESSED", "QUEUE_DRAINED")


@dataclass(frozen=True, slots=True)
class Opened:
    """The call's metadata from ``MEDIA_START`` and the route URI's query."""

    ids: dict[str, str]
    params: dict[str, str] | None
    numbers: tuple[str, str]
    dropped: int


def opened(start: MediaStart, path: str) -> Opened:
    """The metadata of a call: ``start``'s ids, the query's parameters and the channel variables."""
    query = {k: v for k, v in parse_qsl(urlsplit(path).query, keep_blank_values=True) if k != "token"}
    params, dropped = checked_params(query) if query else (None, 0)
    if start.variables:
        params = {**(params or {}), **start.variables}
    ids = {k: v for k, v in (("connection_id", start.connection_id), ("channel", start.channel),
                             ("channel_id", start.channel_id)) if v}
    return Opened(ids, params, caller_called(params), dropped + start.dropped)


class AsteriskWsSession(StreamSession):
    """One chan_websocket media connection: protocol handler and call leg."""

    transport = "asterisk_ws"
    refusal = AsteriskError
    marks_by_echo = False  # reported on release (module invariants)

    def __init__(self, host: CallHost, conn: WsConnection, route: WsRoute) -> None:
        super().__init__(host, conn, route)
        self.fmt = PLAIN
        self._use(FORMATS["ulaw"])
        self._flush = command("FLUSH_MEDIA")

    def _use(self, media: MediaFormat) -> None:
        """The stream's format, on self for the per-frame paths."""
        self.media = media
        self.rate = media.rate
        self._codec = media.codec
        self._max_bytes = media.max_media_bytes
        self._whole = media.width
        self._enc = np.empty(media.frame, dtype=media.wire_dtype)

    # -- protocol in --------------------------------------------------------------

    def on_binary(self, data: bytes) -> None:
        """The caller's audio (:meth:`StreamSession.audio_frame`)."""
        self.audio_frame(data, self._codec, self.rate, self._max_bytes, self._whole)

    def on_text(self, data: bytes) -> None:
        try:
            self._event(parse_event(data))
        except AsteriskError as e:
            self.malformed(e)

    def _event(self, ev: Event) -> None:
        name, call = ev.name, self.call
        if name == "MEDIA_START":
            if not self.repeated_start():
                self._open(media_start(ev))
        elif call is None:
            raise AsteriskError("bad_message", f"{name[:32]} before MEDIA_START")
        elif name == "DTMF_END":
            self.host.dtmf_in(call, dtmf_digit(ev), 0)
        elif name == "MEDIA_XOFF":
            self.host.count("asterisk_ws_xoff")
        elif name == "ERROR":
            self.host.count("asterisk_ws_error")
            SESSION_LOG("asterisk_ws_error", "asterisk_ws %s: Asterisk refused a command: %.128s", self.stream_id,
                        ev.params.get("error_text", ""), level=logging.INFO)
        elif name not in _IGNORED:
            self.host.protocol_error(call, "ws_malformed_unknown_event")

    def _open(self, start: MediaStart) -> None:
        """Admit the call of ``start`` (the connection is closed when refused)."""
        call = self.admit(start.connection_id, start.media.rate)
        if call is None:
            return
        request = getattr(self.conn, "request", None)
        self.describe(call, opened(start, getattr(request, "path", "") or ""))
        self.fmt = start.fmt
        self._flush = command("FLUSH_MEDIA", start.fmt)
        self._use(start.media)
        self.start(call)

    # -- leg: out --------------------------------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        n = len(samples)
        enc = self._enc[:n] if n <= len(self._enc) else np.empty(n, dtype=self._enc.dtype)
        self._codec.encode(samples, out=enc)
        ok = self.conn.send_binary(enc.tobytes())
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def send_clear(self) -> None:
        self.tones.drop()
        self.conn.send_text(self._flush)

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        done(False, TRANSFER_REASON)

    def hangup(self, reason: str) -> None:
        if not self.conn.closed:
            self.conn.send_text(command("HANGUP", self.fmt))
        super().hangup(reason)
