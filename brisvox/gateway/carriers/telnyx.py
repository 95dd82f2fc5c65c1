"""Telnyx Media Streaming (bidirectional, RTP mode) over the gateway's WebSocket server.

Owns one Telnyx connection and the call leg it becomes: what each inbound
message does (``connected``, ``start``, ``media``, ``mark`` echoes, ``dtmf``,
``error``, ``stop``) and when the outbound ones are sent (``media``,
``mark``, ``clear``). The messages themselves, the stream's media formats,
the refusals' close codes and the outbound byte templates are
:mod:`brisvox.wire.telnyx` (with the parsers shared with Twilio,
:mod:`brisvox.wire.mediastream`); what Telnyx's stream shares with
Twilio's (the message set, the fault budget, admission, the outbound media,
marks, in-band DTMF) is :class:`~brisvox.gateway.carriers.carrier_stream.CarrierStreamSession`.
The handshake check (the stream token) is :func:`brisvox.gateway.ws.auth.telnyx_auth`.

Invariants:

* Malformed input, before the call and during it, is refused as every
  carrier stream refuses it (:mod:`brisvox.gateway.carriers.carrier_stream`): before
  the call bad JSON or a non-object (1007), a bad ``start`` (1007), media
  before ``start`` (1008), a format other than PCMU/PCMA 8 kHz or L16 8 or
  16 kHz mono (1003), a binary frame (1003), no ``start`` in time (1008)
  close at once; during a live call a malformed message (bad JSON, a
  non-object, a missing or bad base64 payload, an odd L16 payload, a payload
  over 1 s, a mark without a name, a bad digit, a binary frame) is dropped
  and charged to the call's fault budget, and only the one that exceeds it
  closes. An oversized frame is closed by the server (1009).
* An unknown event name and a repeated ``start`` are counted and ignored,
  never charged to the budget (Telnyx adds events over time). Telnyx's own
  ``error`` frames (it refused one of the bot's frames) are counted
  (``ws_telnyx_errors``) and logged bounded, never charged.
* A call beyond ``max_calls`` (or while draining) is closed with 1013.
* The call's rate is the stream's (``start.media_format``: 16 kHz for
  L16/16000, else 8 kHz); the bot's audio goes out in that same format
  (Telnyx does not announce the bidirectional codec: docs/TRANSPORTS.md).
* The call's metadata: ``stream_id``, ``call_control_id``,
  ``call_session_id``, ``user_id`` and ``client_state`` as its transport
  ids, ``custom_parameters`` as its parameters (a signed stream token's
  parameters replace them), the caller and the called number from
  ``start.from``/``start.to``, else from the From/To (or caller/called)
  parameters; a malformed or oversized id or parameter is dropped and
  counted (``call_params_dropped``), never refused.
* A ``mark`` is sent right after the frame that reaches its position and
  Telnyx's echo is forwarded to the agent as MarkPlayed. Telnyx echoes the
  marks a ``clear`` flushes: those echoes are swallowed (reported in
  Cleared instead), as with Twilio.
* Telnyx's stream has no outbound DTMF message (Call Control's
  ``send_dtmf`` is a REST command): SendDtmf is played in-band as tones.
* The leg cannot transfer (Call Control's ``transfer`` command can); its
  hang-up closes the stream, which ends the call under TeXML
  ``<Connect><Stream>`` with nothing after it; under Call Control the
  application hangs up on ``streaming.stopped``.
"""

from __future__ import annotations

import logging
from typing import Any

from brisvox.gateway.carriers.carrier_stream import CarrierStreamSession, Opening
from brisvox.gateway.core.leg import SESSION_LOG
from brisvox.wire.telnyx import BotStream, error_info, parse_start

TRANSFER_REASON = "a Telnyx media stream cannot transfer; use Call Control (the transfer command)"


class TelnyxSession(CarrierStreamSession):
    """One Telnyx media stream: protocol handler and call leg."""

    transport = "telnyx"
    binary_reason = "Telnyx media streams use text messages"
    transfer_reason = TRANSFER_REASON

    def opening(self, msg: dict[str, Any]) -> Opening:
        s = parse_start(msg)
        return Opening(s.stream_id, s.ids, s.params, s.numbers, s.dropped, s.format, BotStream())

    def other_event(self, ev: Any, msg: dict[str, Any]) -> None:
        if ev != "error":
            super().other_event(ev, msg)
            return
        code, title = error_info(msg)  # Telnyx refused one of the bot's frames: not bad input
        self.host.count("ws_telnyx_errors")
        SESSION_LOG("telnyx_error", "telnyx stream %s: Telnyx reported error %s (%s)", self.stream_id or "-",
                    code or "-", title or "-", level=logging.WARNING)
