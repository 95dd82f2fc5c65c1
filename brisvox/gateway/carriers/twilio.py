"""Twilio Media Streams (bidirectional) over the gateway's WebSocket server.

Owns one Twilio connection and the call leg it becomes: Twilio's ``start``
(its ids, parameters and numbers) and Twilio's outbound byte templates. The
messages themselves, their parsing, their refusals' close codes and the
templates are :mod:`brisvox.wire.twilio` (with the parsers shared with
Telnyx, :mod:`brisvox.wire.mediastream`); what each inbound message does
(``connected``, ``start``, ``media``, ``mark`` echoes, ``dtmf``, ``stop``)
and when the outbound ones are sent (``media``, ``mark``, ``clear``) is
:class:`~brisvox.gateway.carriers.carrier_stream.CarrierStreamSession`, which Twilio's
stream shares with Telnyx's.

Invariants:

* Malformed input is refused as every carrier stream refuses it
  (:mod:`brisvox.gateway.carriers.carrier_stream`): counted (``ws_malformed_<kind>``,
  and the call's ``malformed``) and logged bounded; before the call it
  closes THIS connection at once with a reason: bad JSON or a non-object
  (1007), a bad ``start`` (1007), media before ``start`` (1008), a media
  format other than mu-law 8 kHz mono (1003), a binary frame (1003), no
  ``start`` in time (1008); during a live call it is dropped and charged to
  the call's fault budget (:mod:`brisvox.gateway.fault_budget`), and only the
  message that exceeds it closes the connection, with that kind's code and a
  reason naming the budget (with ``hangup_on_error``: the first one, with
  its own reason). An oversized frame is closed by the server (1009).
* An unknown event name and a repeated ``start`` are counted and ignored,
  never charged to the budget (Twilio adds events over time; a new one must
  not hang up live calls).
* A call beyond ``max_calls`` (or while draining) is closed with 1013.
* Before its call is admitted, ``start`` is bound to the call the gateway's
  TwiML webhook answered (:func:`brisvox.gateway.control.stream_tokens.bind_stream`):
  its ``brisvox_stream_token`` parameter must be a token the webhook issued,
  unused and not expired, for this agent, and its callSid and accountSid
  those the webhook bound (and accountSid ``twilio_account_sid`` when set);
  else it closes with 1008 and a reason, counted ``ws_malformed_<kind>``.
  Without ``twiml_path`` (the operator serves the TwiML) no token exists: with
  ``twilio_require_stream_token = false`` the stream is let in unbound. The
  token is removed from the call's parameters.
* The call's metadata: ``streamSid``/``callSid``/``accountSid`` as its
  transport ids, ``customParameters`` as its parameters, the caller and
  the called number from the ``From``/``To`` (or ``caller``/``called``)
  parameters; a malformed or oversized id or parameter is dropped and
  counted (``call_params_dropped``), never refused.
* Outbound media messages are built from the stream's prefix
  (:class:`~brisvox.wire.twilio.BotStream`) and a reused encode buffer (no
  JSON encoder, no dict per frame); a ``mark`` is sent right after the frame
  that reaches its position and its echo is forwarded to the agent as
  MarkPlayed. After a ``clear``, echoes of marks Twilio flushes are
  swallowed (reported in Cleared instead).
* Twilio has no outbound DTMF event: SendDtmf is played in-band as tones
  through the media channel (paced like audio, pausing the out ring).
* Call control goes through Twilio's REST API (:mod:`brisvox.gateway.control.twilio_rest`,
  the server's ``twilio_api``, there only with ``twilio_account_sid``), keyed
  by the callSid bound at the webhook (a stream let in unbound: the ``callSid``
  of its ``start``). Without it a Transfer is refused at once
  with :attr:`TwilioSession.transfer_reason`. With it a Transfer updates the
  call with ``<Dial>`` TwiML and its outcome is the TransferResult (one
  transfer at a time; once one succeeded the call is Twilio's to end: no
  hang-up of ours completes it). A hang-up of ours closes the stream and
  then completes the call (``Status=completed``), so the caller's line ends
  whatever TwiML follows the ``<Connect>``; not for ``shutdown`` (going
  away: that TwiML may route the call elsewhere), nor after the stream
  already ended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brisvox.gateway.carriers.carrier_stream import CarrierStreamSession, Opening
from brisvox.gateway.control.stream_tokens import Binding, bind_stream
from brisvox.gateway.control.twilio_rest import TwilioApi
from brisvox.gateway.control.twiml import webhook_of
from brisvox.gateway.core.leg import GOING_AWAY_REASONS
from brisvox.wire.mediastream import PCMU_8K
from brisvox.wire.twilio import TOKEN_PARAM, BotStream, parse_start


class TwilioSession(CarrierStreamSession):
    """One Twilio media stream: protocol handler and call leg."""

    transport = "twilio"
    binary_reason = "Twilio media streams use text messages"
    transfer_reason = ("a Twilio media stream cannot transfer without the REST API: set "
                       "[websocket] twilio_account_sid")
    _transfer_state = ""  # "" | "pending" | "done"
    binding: Binding | None = None  # the call the webhook answered (its token redeemed by start)

    def opening(self, msg: dict[str, Any]) -> Opening:
        s = parse_start(msg)
        server = getattr(self.conn, "server", None)  # a test's connection has none
        hook = webhook_of(server)
        self.binding = bind_stream(s, hook.tokens if hook is not None else None, self.host.settings.websocket,
                                   self.route.agent)
        params = s.params
        if params is not None and TOKEN_PARAM in params:  # a credential never reaches the agent
            params = {k: v for k, v in params.items() if k != TOKEN_PARAM}
        return Opening(s.stream_sid, s.ids, params, s.numbers, s.dropped, PCMU_8K, BotStream(s.stream_sid))

    # -- call control (the REST API) ---------------------------------------------------

    def _api(self) -> tuple[TwilioApi | None, str]:
        """The REST client and the callSid it acts on: the one bound at the webhook, else
        (a stream let in without a token) the one the stream's start named."""
        api = getattr(getattr(self.conn, "server", None), "twilio_api", None)  # a test's connection has none
        if self.binding is not None:
            return api, self.binding.call_sid
        call_sid = self.call.transport_ids.get("callSid", "") if self.call is not None else ""
        return api, call_sid

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        # ``summary`` is not sent: Twilio's REST call update (new TwiML) has no header to carry it
        api, call_sid = self._api()
        if api is None:
            done(False, self.transfer_reason)
        elif not call_sid:
            done(False, "no callSid in the stream's start")
        elif self._transfer_state:
            done(False, "a transfer is in progress" if self._transfer_state == "pending" else "already transferred")
        else:
            self._transfer_state = "pending"
            self.host.spawn(self._transfer(api, call_sid, target, done))

    async def _transfer(self, api: TwilioApi, call_sid: str, target: str, done: Callable[[bool, str], None]) -> None:
        outcome = await api.transfer(call_sid, target)
        self._transfer_state = "done" if outcome.ok else ""
        done(outcome.ok, outcome.detail)

    def hangup(self, reason: str) -> None:
        live = not self.conn.closed
        super().hangup(reason)
        api, call_sid = self._api()
        if api is not None and call_sid and live and not self._transfer_state and reason not in GOING_AWAY_REASONS:
            self.host.spawn(api.complete(call_sid))
