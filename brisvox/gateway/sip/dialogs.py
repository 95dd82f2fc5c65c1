"""SIP dialogs: the INVITE server transaction of a call, its answer, re-INVITE, CANCEL and the end.

Owns :class:`SipDialogs` (a base of the SIP user agent): the dialog-creating
INVITE (admission, the SDP offer/answer, the call's RTP socket, 100/180/200,
488/503/420/415/482 refusals), the 2xx retransmission until the ACK (or the
late offer's answer in it), re-INVITE (hold/unhold, new address: answered
with the mirrored direction), CANCEL (200 + 487) and ending a dialog from
either side (BYE in, BYE out, 480 before the answer).

Invariants:

* A call is admitted (rings created) only after the INVITE passed every
  check that can refuse it without the core: the message, its dialog
  (Contact, From), its SDP (parsed, negotiated, an IP address of the RTP
  socket's family) -- 400, 415, 420, 482 or 488 before anything is taken.
  A call refused or abandoned after admission (no RTP port, the agent
  refused, an error while building the leg) is released through
  :meth:`~brisvox.gateway.core.host.CallHost.transport_ended` and
  :meth:`~brisvox.gateway.core.host.CallHost.abandon`, never left in the table.
* The UAS sends BYE only once the 2xx was ACKed, or its retransmission timed
  out (RFC 3261 section 15): a hang-up while the 2xx is unacknowledged waits for the ACK.
* Our BYE carries a Reason header (:func:`bye_reason`): Q.850 cause 16 with
  the hang-up reason as its text, cause 41 for ``stage_failed:<stage>``; the
  text is a quoted-string whatever the reason holds (control characters
  removed, quotes and backslashes escaped, at most ``REASON_TEXT_MAX``
  bytes), so a reason cannot add a header.
* The call's metadata: the Call-ID as its transport id, the From and To
  users as the caller and the called number, both URIs as the parameters
  ``from`` and ``to`` (a URI over the parameter bound is dropped and counted).
* A leg ends once (``SipCall.ended``): RTP closed, dialog forgotten,
  :meth:`~brisvox.gateway.core.host.CallHost.transport_ended` called.
* A re-INVITE while the previous INVITE is unfinished is answered 491; a
  CSeq out of order 500.
"""

from __future__ import annotations

import functools
import logging
from socket import AF_INET6
from typing import TYPE_CHECKING, cast

from brisvox.gateway.core.calls import AdmissionError, Call
from brisvox.gateway.core.leg import REASON_TEXT_MAX, q850_cause, reason_text
from brisvox.gateway.sip.rtp import RATE, Addr, SipCall
from brisvox.gateway.sip.transactions import SipTransactions
from brisvox.wire import sdp
from brisvox.wire.jsontext import checked_params, param_text
from brisvox.wire.sip_dialog import Dialog, make_response
from brisvox.wire.sip_message import SipMessage, new_tag, parse_uri, quoted_string, uri_number
from brisvox.wire.sip_transaction import (
    Action,
    Retransmit2xx,
    ServerInvite,
    ServerNonInvite,
    TimedOut,
)

if TYPE_CHECKING:
    from brisvox.gateway.sip.ua import SipUserAgent

log = logging.getLogger("brisvox.gateway.sip")


def bye_reason(reason: str) -> str:
    """The BYE's Reason header value (RFC 3326): Q.850 cause 16 (normal clearing), or 41
    (temporary failure) for a call the agent ended because a stage failed; the text is
    the reason as a quoted-string (:func:`~brisvox.gateway.core.leg.reason_text`)."""
    return f'Q.850;cause={q850_cause(reason)};text="{reason_text(reason, REASON_TEXT_MAX)}"'


def warning(text: str) -> list[tuple[str, str]]:
    """A Warning header (RFC 3261 20.43, code 305: incompatible media) with ``text`` escaped."""
    return [("warning", f'305 brisvox "{quoted_string(text, 80)}"')]


class SipDialogs(SipTransactions):
    """INVITE, ACK, re-INVITE, CANCEL, BYE and hang-up (see the module docstring)."""

    # -- INVITE ------------------------------------------------------------------------------------

    def _on_invite(self, req: SipMessage, addr: Addr, tx: ServerInvite) -> None:
        if req.to_tag:
            leg = self._dialog_for(req)
            if leg is None:
                self._respond(tx, req, 481)
            else:
                self._on_reinvite(leg, req, tx)
            return
        self._respond(tx, req, 100)
        if self.call_host.draining:
            self.call_host.note_refused("draining")
            self._respond(tx, req, 503, extra=[("retry-after", "30")])
            return
        require = req.get("require")
        if require:
            self.refuse("extension", "Require %s", require[:40])
            self._respond(tx, req, 420, extra=[("unsupported", require)])
            return
        try:
            dialog = Dialog.from_invite(req, new_tag(), self.contact, addr)
        except ValueError as e:
            self.refuse("malformed", "INVITE from %s: %s", addr[0], str(e)[:80])
            self._respond(tx, req, 400, "Bad Contact or From")
            return
        offer: sdp.SessionDescription | None = None
        neg: sdp.Negotiated | None = None
        if req.body:
            ctype = req.get("content-type").split(";")[0].strip().lower()
            if ctype != "application/sdp":
                self.refuse("media_type", "Content-Type %s", ctype[:40])
                self._respond(tx, req, 415, extra=[("accept", "application/sdp")])
                return
            try:
                offer = sdp.parse(req.body)
                neg = self._negotiate(offer)
            except sdp.SdpError as e:
                self.count("sip_invite_488")
                self.refuse("sdp", "INVITE from %s: %s", addr[0], str(e)[:80])
                self._respond(tx, req, 488, extra=warning(str(e)))
                return
        if req.call_id in self.by_call_id:
            self.refuse("loop", "Call-ID already in a call")
            self._respond(tx, req, 482)
            return
        agent = self._agent_for(req)
        try:
            call = self.call_host.admit("sip", agent, RATE)
        except AdmissionError as e:
            self.count(f"sip_invite_503_{e.reason}")
            self._respond(tx, req, 503, extra=[("retry-after", "10")])
            return
        try:
            leg = SipCall(cast("SipUserAgent", self), call, req, tx, dialog, offer, neg)
        except Exception:
            self.call_host.transport_ended(call, "internal error")
            self.call_host.abandon(call)
            self._respond(tx, req, 500)
            raise
        call.transport_ids = {"sip_call_id": req.call_id[:128]}
        self._call_metadata(call, dialog)
        self.dialogs[(dialog.call_id, dialog.local_tag)] = leg
        self.by_call_id[dialog.call_id] = leg
        self._track(tx, functools.partial(self._invite_tx_event, leg))
        self.call_host.spawn(self._setup(leg))

    def _call_metadata(self, call: Call, dialog: Dialog) -> None:
        """The caller and the called number (the From and To users, a tel: URI's number) and
        both URIs as the parameters ``from`` and ``to``; one that is no parameter value (too
        long) is dropped and counted (``call_params_dropped``), the call goes on."""
        params, dropped = checked_params({"from": dialog.remote_uri, "to": dialog.local_uri})
        call.params = params or {}
        call.caller = param_text(uri_number(dialog.remote_uri)) or ""
        call.called = param_text(uri_number(dialog.local_uri)) or ""
        if dropped:
            self.count("call_params_dropped", dropped)

    def _negotiate(self, offer: sdp.SessionDescription) -> sdp.Negotiated:
        """Offer/answer, and an address our RTP socket can send to (SdpError -> 488)."""
        neg = sdp.negotiate(offer, self.cfg.codecs)
        if neg.remote_host not in ("0.0.0.0", "::") and (":" in neg.remote_host) != (self.rtp_family == AF_INET6):
            raise sdp.SdpError(f"connection address {neg.remote_host} is not of our RTP socket's family")
        return neg

    async def _setup(self, leg: SipCall) -> None:
        """Open the call's RTP socket, then start the agent side (answer in _call_ready)."""
        try:
            await self.rtp_ports.open(leg, self.loop)
        except Exception as e:  # OSError (none free) or anything else: the call must not stay
            self.guard.log_limit("rtp_no_port", "no RTP port for %s: %s", leg.call.call_id, e, level=logging.ERROR)
            self.count("rtp_no_port")
            tx = leg.invite_tx
            if tx is not None and tx.state == "proceeding":
                self._respond(tx, leg.invite, 503, to_tag=leg.dialog.local_tag, extra=[("retry-after", "10")])
            self._end_leg(leg, "no rtp port")
            self.call_host.abandon(leg.call)
            return
        if leg.ended:  # cancelled while we opened the socket
            self.rtp_ports.close(leg)
            self.call_host.abandon(leg.call)
            return
        self.call_host.start_call(leg.call, leg, functools.partial(self._call_ready, leg))

    def _agent_for(self, req: SipMessage) -> str:
        try:
            user = parse_uri(req.uri).user
        except ValueError:
            user = ""
        return self.cfg.users.get(user, self.cfg.default_agent)

    def _call_ready(self, leg: SipCall, ok: bool, why: str) -> None:
        tx = leg.invite_tx
        if tx is None or tx.state != "proceeding" or leg.ended:
            return
        if not ok:
            self._respond(tx, leg.invite, 503, reason_text(why, 60) or "Service Unavailable", to_tag=leg.dialog.local_tag,
                          extra=[("retry-after", "10")])
            self._end_leg(leg, "agent unavailable", send_bye=False)
            return
        if self.cfg.ring_ms > 0:
            self._respond(tx, leg.invite, 180, to_tag=leg.dialog.local_tag, contact=self.contact)
            self.loop.call_later(self.cfg.ring_ms / 1000, self._answer, leg)
        else:
            self._answer(leg)

    def _answer(self, leg: SipCall) -> None:
        tx = leg.invite_tx
        if tx is None or tx.state != "proceeding" or leg.ended:
            return
        body = leg.answer_sdp()
        resp = make_response(leg.invite, 200, to_tag=leg.dialog.local_tag, contact=self.contact,
                             server=self.cfg.user_agent, body=body, content_type="application/sdp")
        data = resp.serialize()
        now = self.loop.time()
        self._perform(tx, tx.respond(resp, now))
        self._schedule(tx)
        leg.state = "answered"
        leg.last_rx = now
        retx = Retransmit2xx(("2xx", leg.dialog.call_id, leg.invite.cseq[0]), tx.addr, self.timers, data, now)
        leg.ok_retx = retx
        self._track(retx, functools.partial(self._ack_timeout, leg))

    def _invite_tx_event(self, leg: SipCall, a: Action) -> None:
        if isinstance(a, TimedOut):  # no ACK for our non-2xx final: nothing more to do
            self.count("sip_ack_timeouts")

    def _ack_timeout(self, leg: SipCall, a: Action) -> None:
        if isinstance(a, TimedOut) and not leg.ended:
            self.count("sip_2xx_ack_timeouts")
            leg.state = "confirmed"  # RFC 3261 13.3.1.4: give up and end the session with a BYE
            self._end_leg(leg, "no ack", send_bye=True)

    def _on_ack(self, req: SipMessage, addr: Addr) -> None:
        if req.to_tag:
            leg = self._dialog_for(req)
            if leg is not None:
                if leg.ok_retx is not None and not leg.ok_retx.done:
                    leg.ok_retx.acked()
                    self._forget(leg.ok_retx)
                if leg.state == "answered":
                    leg.state = "confirmed"
                    leg.dialog.state = "confirmed"
                if req.body and leg.neg is None:  # late offer: the ACK carries the answer
                    try:
                        ans = sdp.parse(req.body)
                        leg.offer = None
                        leg.apply_negotiation(self._negotiate(ans))
                    except sdp.SdpError:
                        self.count("sip_bad_ack_sdp")
                        self._end_leg(leg, "bad sdp in ack", send_bye=True)
                        return
                if leg.bye_after_ack:  # the hang-up's own reason (transport_ended kept it)
                    self._end_leg(leg, leg.call.end_reason or "hangup", send_bye=True)
                return
        # ACK for a non-2xx final: same branch as the INVITE
        tx = self.server_tx.get(self._tx_key(req, "INVITE"))
        if isinstance(tx, ServerInvite):
            tx.on_ack(self.loop.time())
            self._schedule(tx)

    def _on_reinvite(self, leg: SipCall, req: SipMessage, tx: ServerInvite) -> None:
        if not leg.dialog.accept_cseq(req):
            self._respond(tx, req, 500, "CSeq out of order")
            return
        if (leg.invite_tx is not None and leg.invite_tx.state == "proceeding") or \
                (leg.ok_retx is not None and not leg.ok_retx.done):
            self._respond(tx, req, 491)
            return
        offer = None
        if req.body:
            try:
                offer = sdp.parse(req.body)
                neg = self._negotiate(offer)
            except sdp.SdpError as e:
                self.refuse("sdp", "re-INVITE: %s", str(e)[:80])
                self._respond(tx, req, 488, extra=warning(str(e)))
                return
            leg.offer = offer
            was_hold = leg.neg.on_hold if leg.neg else False
            leg.apply_negotiation(neg)
            self.count("sip_hold" if neg.on_hold and not was_hold else
                       "sip_unhold" if was_hold and not neg.on_hold else "sip_reinvite")
        leg.dialog.refresh_target(req)
        leg.sdp_version += 1
        if offer is None:  # no offer: we offer in the 200, the ACK answers
            body = sdp.build(host=self.cfg.advertised_host, port=leg.rtp_port, session_id=leg.sdp_session,
                             version=leg.sdp_version, neg=None, codecs=self.cfg.codecs)
        else:
            body = leg.answer_sdp()
        leg.invite = req
        leg.invite_tx = tx
        resp = make_response(req, 200, to_tag=leg.dialog.local_tag, contact=self.contact,
                             server=self.cfg.user_agent, body=body, content_type="application/sdp")
        now = self.loop.time()
        self._perform(tx, tx.respond(resp, now))
        self._schedule(tx)
        retx = Retransmit2xx(("2xx", leg.dialog.call_id, req.cseq[0]), tx.addr, self.timers, resp.serialize(), now)
        leg.ok_retx = retx
        self._track(retx, functools.partial(self._ack_timeout, leg))

    def _on_cancel(self, req: SipMessage, tx: ServerNonInvite) -> None:
        inv = self.server_tx.get(self._tx_key(req, "INVITE"))
        if not isinstance(inv, ServerInvite):
            self._respond(tx, req, 481)
            return
        self._respond(tx, req, 200)
        if inv.state != "proceeding":
            return  # the INVITE already has its final response: CANCEL has no effect
        leg = self.by_call_id.get(req.call_id)
        if leg is not None and leg.invite_tx is inv:
            self._respond(inv, leg.invite, 487, to_tag=leg.dialog.local_tag)
            self.count("sip_cancelled")
            self._end_leg(leg, "cancel", send_bye=False)

    # -- ending -------------------------------------------------------------------------------------

    def hangup(self, leg: SipCall, reason: str) -> None:
        """Our side ends the call (agent Hangup, shutdown, RTP timeout, transfer done)."""
        if leg.ended:
            return
        if leg.state == "outgoing":  # our INVITE is unanswered: CANCEL it (sip_outbound)
            cast("SipUserAgent", self).cancel_outgoing(leg, reason)
            return
        tx = leg.invite_tx
        if leg.state == "incoming" and tx is not None and tx.state == "proceeding":
            self._respond(tx, leg.invite, 480, "Temporarily Unavailable", to_tag=leg.dialog.local_tag)
            self._end_leg(leg, reason, send_bye=False)
        elif leg.state == "answered" and leg.ok_retx is not None and not leg.ok_retx.done:
            leg.bye_after_ack = True  # RFC 3261 15: the UAS sends BYE only once the ACK came (or timed out)
            self.call_host.transport_ended(leg.call, reason)
        else:
            self._end_leg(leg, reason, send_bye=True)

    def _end_leg(self, leg: SipCall, reason: str, send_bye: bool = False) -> None:
        if send_bye and leg.state in ("answered", "confirmed") and not leg.ended:
            req = leg.dialog.request("BYE", self.via_host,
                                     extra=[("reason", bye_reason(reason))])
            self.count("sip_bye_sent")
            self._client_request(leg, req, self._bye_result)
        if leg.ended:
            return
        leg.ended = True
        leg.state = "ended"
        leg.dialog.state = "terminated"
        leg.sync_stats()
        if leg.ok_retx is not None and not leg.ok_retx.done:
            leg.ok_retx.acked()
            self._forget(leg.ok_retx)
        self.rtp_ports.close(leg)
        self.dialogs.pop((leg.dialog.call_id, leg.dialog.local_tag), None)
        self.by_call_id.pop(leg.dialog.call_id, None)
        self.call_host.transport_ended(leg.call, reason)

    def _bye_result(self, a: Action) -> None:
        if isinstance(a, TimedOut):
            self.count("sip_bye_timeouts")
