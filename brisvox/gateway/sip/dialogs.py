"""The SIP dialog layer: inbound INVITE -> call, and every request inside a dialog.

Owns :class:`SipDialogs`, the call-facing half of the SIP user agent: the
dialog table (every leg, inbound or outbound, by Call-ID and local tag),
the dialog-creating INVITE (admission, the SDP offer/answer, the call's RTP
socket, 100/180/200, 403/404/488/503/420/415/482/422 refusals), the 2xx retransmission
until the ACK (or the late offer's answer in it), re-INVITE and UPDATE (RFC
3311; hold/unhold, new address: answered with the mirrored direction; a hold or
an unhold is the call's media state, ``held`` / ``answered``, for the agent; both
are RFC 4028 session refreshes), CANCEL (200 + 487), BYE,
INFO (a key press: dtmf-relay, dtmf), NOTIFY (for our REFER), REFER (the
agent's Transfer) and ending a dialog from either side (BYE in, BYE out, 480
before the answer). It sends nothing itself: every message goes
through the :class:`~brisvox.gateway.sip.transactions.TransactionLayer` it
is given; each dialog's session timer, and the refreshes we send, are its
:class:`~brisvox.gateway.sip.session_timers.SessionTimers`.

Invariants:

* A call is admitted (rings created) only after the INVITE passed every
  check that can refuse it without the core: the message, its dialog
  (Contact, From), its SDP (parsed, negotiated, an IP address of the RTP
  socket's family), the agent its Request-URI user reaches -- 400, 403, 404,
  415, 420, 482 or 488 before anything is taken.
* A Request-URI user that is not in ``[sip] users`` gets ``[sip]
  default_agent``; when that is "" (the default) the INVITE is refused 404
  (``sip_invite_404``, ``sip_refused_unknown_user``): no name is answered
  unless the config says so.
* Nothing is sent to an address a message named unless it is allowed
  (:meth:`~brisvox.gateway.sip.rtp.SipContext.destination`): an INVITE whose
  next hop (first Record-Route, else Contact) is outside ``[sip] allow`` is
  refused 403 (``sip_invite_403``, ``sip_refused_destination``), one whose
  SDP connection address is outside 488 (``sip_refused_media_address``); a
  re-INVITE that would move the target or the media outside is refused the
  same way and the dialog keeps what it had; an ACK's late answer naming an
  address outside ends the call. Every in-dialog request goes to the
  checked hop (:meth:`SipDialogs.hop`). With ``[sip] nat =
  "signalling_source"`` such an address is replaced by the signalling
  source instead of refused. Responses go to the request's source address
  (the transaction layer: RFC 3261 18.2.2 with ``rport``, a Via naming
  another host is answered at the source).
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
* A leg ends once (``SipCall.ended``, :meth:`SipDialogs.end`): RTP closed,
  dialog forgotten, :meth:`~brisvox.gateway.core.host.CallHost.transport_ended` called.
* SRTP (``[sip] srtp``): whether an SDP's SDES keys may be taken (and ours sent in the
  answer) is judged by the transport its request arrived over
  (:meth:`~brisvox.gateway.sip.transactions.TransactionLayer.arrived_over`: TLS), never by
  its Via; the SRTP rules' refusals are 488 (``sip_refused_srtp_<why>``). The answer in the
  ACK to our offer in a 2xx is applied for a late offer, and for a re-INVITE without SDP
  when our offer carried a=crypto lines (the answer picks the line whose key we send with).
* A re-INVITE while the previous INVITE is unfinished, or while a re-INVITE
  of ours is pending (glare, RFC 3261 14.2), is answered 491, as is an UPDATE
  with an offer while an offer of ours is unanswered (RFC 3311 5.2); a CSeq
  out of order 500; a request naming no dialog of ours 481. A re-INVITE or
  UPDATE beyond ``[sip] refresh_rate`` in its dialog is 491 before anything
  else is read of it (``sip_refresh_storm``).
* Session timers (RFC 4028, :mod:`brisvox.wire.sip_session_timer`): the INVITE,
  re-INVITE and UPDATE we answer get the timer headers of section 9 in their
  2xx; one asking for less than ``[sip] min_se_s`` (from a peer that supports
  timers) is 422 with our ``Min-SE`` before anything is taken, a malformed
  ``Session-Expires``/``Min-SE`` 400; ``Require: timer`` is supported (any other
  required extension is 420). ``Allow`` lists UPDATE, which is served.
* Per dialog at most ``MAX_CLIENT_TX`` client transactions (BYE, REFER) are pending;
  our session refreshes (UPDATE, re-INVITE) count among them.
* Every header value we build from what a model or a caller said is escaped
  (:func:`~brisvox.wire.sip_message.quoted_string`) or refused (a transfer
  target that is not a plain SIP/tel URI).
* A REFER's outcome is reported once: its final response (failure), or the
  NOTIFY that reports the transfer's final status (success hangs the call
  up, "transferred").
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import logging
import re
from collections.abc import Callable

from brisvox.gateway.config import SipTrunk
from brisvox.gateway.core.calls import AdmissionError, Call
from brisvox.gateway.core.leg import REASON_TEXT_MAX, q850_cause, reason_text
from brisvox.gateway.sip.client_auth import ClientAuth, trunk_credentials
from brisvox.gateway.sip.counters import SipCounters
from brisvox.gateway.sip.rtp import RATE, Addr, RtpPorts, SipCall, SipContext
from brisvox.gateway.sip.session_timers import SessionTimers
from brisvox.gateway.sip.transactions import TransactionLayer, timeout_counter
from brisvox.wire import dtmf, sdp, srtp
from brisvox.wire import sip_session_timer as st
from brisvox.wire.jsontext import checked_params, param_text
from brisvox.wire.sip_dialog import Dialog
from brisvox.wire.sip_message import (
    SipMessage,
    is_digits,
    new_tag,
    parse_uri,
    quoted_string,
    uri_number,
)
from brisvox.wire.sip_transaction import Action, Deliver, ServerInvite, ServerNonInvite, TimedOut
from ipc.frames import MEDIA_ANSWERED, MEDIA_HELD

MAX_CLIENT_TX = 8
MAX_TARGET = 256
_TARGET_RE = re.compile(r"^[!-~]+$")  # printable ASCII, no space


def bye_reason(reason: str) -> str:
    """The BYE's Reason header value (RFC 3326): Q.850 cause 16 (normal clearing), or 41
    (temporary failure) for a call the agent ended because a stage failed; the text is
    the reason as a quoted-string (:func:`~brisvox.gateway.core.leg.reason_text`)."""
    return f'Q.850;cause={q850_cause(reason)};text="{reason_text(reason, REASON_TEXT_MAX)}"'


TRANSFER_SUMMARY_MAX = 256  # X-Transfer-Summary: UTF-8 bytes inside the quotes


def transfer_summary_header(summary: str) -> tuple[str, bool]:
    """A blind transfer's summary as the REFER's ``X-Transfer-Summary`` value: an RFC 3261
    quoted-string (:func:`~brisvox.wire.sip_message.quoted_string`: control characters, CR
    and LF among them, become spaces, ``"`` and ``\\`` are escaped) of at most
    :data:`TRANSFER_SUMMARY_MAX` bytes; ``changed``: the text had to be altered (counted)."""
    body = quoted_string(summary, TRANSFER_SUMMARY_MAX)
    changed = body.replace('\\"', '"').replace("\\\\", "\\") != summary
    return f'"{body}"', changed


def warning(text: str) -> list[tuple[str, str]]:
    """A Warning header (RFC 3261 20.43, code 305: incompatible media) with ``text`` escaped."""
    return [("warning", f'305 brisvox "{quoted_string(text, 80)}"')]


class MediaRefused(sdp.SdpError):
    """The SDP's connection address is outside ``[sip] allow`` (and ``[sip] nat`` is strict): 488."""


def negotiate(offer: sdp.SessionDescription, ctx: SipContext, source: Addr, *, secure: bool = False,
              offered: tuple[srtp.Crypto, ...] | None = None) -> sdp.Negotiated:
    """Offer/answer, and an address our RTP socket can send to and may (SdpError -> 488): inside
    ``[sip] allow`` (else :class:`MediaRefused`), or with ``nat = "signalling_source"`` the
    signalling ``source``'s IP instead (:meth:`~brisvox.gateway.sip.rtp.SipContext.destination`).
    ``[sip] srtp``'s rules with ``secure`` (the SDP came over TLS) and, for an answer to our
    offer, the a=crypto lines we ``offered`` (:func:`brisvox.wire.sdp.negotiate`)."""
    cfg = ctx.cfg
    neg = sdp.negotiate(offer, cfg.codecs, policy=cfg.srtp_policy, secure_signalling=secure, offered=offered)
    host = neg.remote_host
    if host in ("0.0.0.0", "::"):
        return neg  # hold: no address to send to
    if (":" in host) != (":" in cfg.host):  # the RTP sockets' family is the listener's
        raise sdp.SdpError(f"connection address {host} is not of our RTP socket's family")
    dest = ctx.destination((host, neg.remote_port), source, media=True)
    if dest is None:
        raise MediaRefused(f"connection address {host} is not allowed")
    return neg if dest[0] == host else dataclasses.replace(neg, remote_host=dest[0])


def unsupported(req: SipMessage) -> list[str]:
    """The option tags ``req`` requires that we do not support (we support ``timer``)."""
    return [v for v in req.get_all("require") if v.strip().lower() != st.TIMER]


def sdp_refusal(counters: SipCounters, e: sdp.SdpError, what: str, source: str) -> None:
    """Count and log (bounded) an SDP refused: ``sip_refused_media_address`` for an address
    outside ``[sip] allow``, ``sip_refused_srtp_<why>`` for the SRTP rules, else ``sip_refused_sdp``."""
    kind = "media_address" if isinstance(e, MediaRefused) else e.reason if isinstance(e, sdp.SrtpRefused) else "sdp"
    counters.refuse(kind, "%s from %s: %s", what, source, str(e)[:80])


class SipDialogs:
    """Dialogs and the requests inside them (see the module docstring)."""

    def __init__(self, ctx: SipContext, transactions: TransactionLayer, rtp_ports: RtpPorts) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.call_host = ctx.call_host
        self.counters = ctx.counters
        self.transactions = transactions
        self.rtp_ports = rtp_ports
        self.dialogs: dict[tuple[str, str], SipCall] = {}
        self.by_call_id: dict[str, SipCall] = {}
        self._bye_result = timeout_counter(self.counters, "sip_bye_timeouts")
        self._invite_tx_event = timeout_counter(self.counters, "sip_ack_timeouts")  # no ACK for our non-2xx
        self.timers = SessionTimers(ctx, transactions, self._client_request, self.hangup, self.hop, negotiate)

    def add(self, leg: SipCall) -> None:
        """Put ``leg`` in the dialog table (in-dialog requests reach it from now on)."""
        self.dialogs[(leg.dialog.call_id, leg.dialog.local_tag)] = leg
        self.by_call_id[leg.dialog.call_id] = leg

    def close(self) -> None:
        """The user agent stops: every leg's RTP socket is closed, every session timer cancelled."""
        for leg in list(self.by_call_id.values()):
            self.rtp_ports.close(leg)
            self.timers.forget(leg)

    def stats(self) -> dict[str, int]:
        return {"sip_dialogs": len(self.dialogs), **self.timers.stats(),
                "sip_srtp_sessions_open": sum(1 for leg in self.by_call_id.values() if leg.srtp is not None)}

    def _dialog_for(self, req: SipMessage) -> SipCall | None:
        tag = req.to_tag
        if not tag:
            return None
        return self.dialogs.get((req.call_id, tag))

    # -- INVITE ------------------------------------------------------------------------------------

    def on_invite(self, req: SipMessage, addr: Addr, tx: ServerInvite, auth_user: str = "") -> None:
        """A new INVITE (or a re-INVITE: To tag). ``auth_user``: the user ``[sip] auth`` authenticated
        it as (its agent serves the call, the record names it); "" for one passed by address."""
        if req.to_tag:
            leg = self._dialog_for(req)
            if leg is None:
                self.transactions.respond(tx, req, 481)
            else:
                self._on_reinvite(leg, req, tx)
            return
        respond = self.transactions.respond
        respond(tx, req, 100)
        if self.call_host.draining:
            self.call_host.note_refused("draining")
            respond(tx, req, 503, extra=[("retry-after", "30")])
            return
        require = unsupported(req)
        if require:
            self.counters.refuse("extension", "Require %s", ", ".join(require)[:40])
            respond(tx, req, 420, extra=[("unsupported", ", ".join(require))])
            return
        timer = self._session_timer(req, tx, "INVITE", addr[0])
        if timer is None:
            return
        trunk = None if auth_user else self._trunk_for(req, addr[0])
        if auth_user:
            user, agent = auth_user, self.cfg.user_agents.get(auth_user, "")
        elif trunk is not None:  # a call from a [[sip.trunks]] entry runs its agent
            user, agent = trunk.name, trunk.agent or self.cfg.default_agent
        else:
            user, agent = self._agent_for(req)
        if not agent:  # no [sip] users entry and no default_agent: nobody answers this name
            self.counters.count("sip_invite_404")
            self.counters.refuse("unknown_user", "INVITE from %s for user %r: not in [sip] users and no "
                                 "[sip] default_agent", addr[0], user[:40])
            respond(tx, req, 404)
            return
        try:
            via_transport = req.top_via.transport
            dialog = Dialog.from_invite(req, new_tag(), self.transactions.contact_for(via_transport), addr)
        except ValueError as e:
            self.counters.refuse("malformed", "INVITE from %s: %s", addr[0], str(e)[:80])
            respond(tx, req, 400, "Bad Contact or From")
            return
        hop = dialog.next_hop()
        if self.ctx.destination(hop, addr) is None:
            self.counters.count("sip_invite_403")
            self.counters.refuse("destination", "INVITE from %s: its Contact/Record-Route names %s, not in "
                                 "[sip] allow", addr[0], hop[0])
            respond(tx, req, 403, "Target Not Allowed")
            return
        offer: sdp.SessionDescription | None = None
        neg: sdp.Negotiated | None = None
        secure = self.transactions.arrived_over(tx) == "TLS"
        if req.body:
            ctype = req.get("content-type").split(";")[0].strip().lower()
            if ctype != "application/sdp":
                self.counters.refuse("media_type", "Content-Type %s", ctype[:40])
                respond(tx, req, 415, extra=[("accept", "application/sdp")])
                return
            try:
                offer = sdp.parse(req.body)
                neg = negotiate(offer, self.ctx, addr, secure=secure)
            except sdp.SdpError as e:
                self.counters.count("sip_invite_488")
                sdp_refusal(self.counters, e, "INVITE", addr[0])
                respond(tx, req, 488, extra=warning(str(e)))
                return
        if req.call_id in self.by_call_id:
            self.counters.refuse("loop", "Call-ID already in a call")
            respond(tx, req, 482)
            return
        try:
            call = self.call_host.admit("sip", agent, RATE, source=self.transactions.caller_of(req, addr[0]))
        except AdmissionError as e:
            self.counters.count(f"sip_invite_503_{e.reason}")
            respond(tx, req, 503, extra=[("retry-after", "10")])
            return
        try:
            leg = SipCall(self.ctx, call, req, tx, dialog, offer, neg, secure_signalling=secure)
        except Exception:
            self.call_host.transport_ended(call, "internal error")
            self.call_host.abandon(call)
            respond(tx, req, 500)
            raise
        call.transport_ids = {"sip_call_id": req.call_id[:128]}
        leg.record_srtp()
        if auth_user:
            call.transport_ids["sip_user"] = auth_user
        if trunk is not None:
            call.transport_ids["sip_trunk"] = trunk.name
            if self._from_trunk(trunk, addr[0]):  # our BYE or REFER to it may be challenged; never
                leg.auth_creds = trunk_credentials(trunk)  # a digest of its secret to another source
        self._call_metadata(call, dialog)
        self.add(leg)
        self.timers.open(leg, owner=False, peer=req, answer=timer)
        self.transactions.watch(tx, self._invite_tx_event)
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
            self.counters.count("call_params_dropped", dropped)

    async def _setup(self, leg: SipCall) -> None:
        """Open the call's RTP socket, then start the agent side (answer in _call_ready)."""
        try:
            await self.rtp_ports.open(leg, self.ctx.loop)
        except Exception as e:  # OSError (none free) or anything else: the call must not stay
            self.counters.log_limit("rtp_no_port", "no RTP port for %s: %s", leg.call.call_id, e,
                                    level=logging.ERROR)
            self.counters.count("rtp_no_port")
            tx = leg.invite_tx
            if tx is not None and tx.state == "proceeding":
                self.transactions.respond(tx, leg.invite, 503, to_tag=leg.dialog.local_tag, extra=[("retry-after", "10")])
            self.end(leg, "no rtp port")
            self.call_host.abandon(leg.call)
            return
        if leg.ended:  # cancelled while we opened the socket
            self.rtp_ports.close(leg)
            self.call_host.abandon(leg.call)
            return
        self.call_host.start_call(leg.call, leg, functools.partial(self._call_ready, leg))

    def _trunk_for(self, req: SipMessage, src: str) -> SipTrunk | None:
        """The ``[[sip.trunks]]`` entry an INVITE comes from: its source inside the trunk's
        ``addresses`` (default: its registrar's address), or its Request-URI user the Contact
        user a registering trunk registered."""
        if not self.cfg.trunks:
            return None
        try:
            user = parse_uri(req.uri).user
        except ValueError:
            return None
        for t in self.cfg.trunks:
            if self._from_trunk(t, src):
                return t
        return next((t for t in self.cfg.trunks if t.register and user == (t.contact_user or t.username)), None)

    @staticmethod
    def _from_trunk(t: SipTrunk, src: str) -> bool:
        try:
            ip = ipaddress.ip_address(src)
        except ValueError:
            return False
        return any(ip in ipaddress.ip_network(n, strict=False) for n in t.networks)

    def _agent_for(self, req: SipMessage) -> tuple[str, str]:
        """(the Request-URI's user, the agent it reaches: ``[sip] users``, else ``default_agent``;
        "" for none)."""
        try:
            user = parse_uri(req.uri).user
        except ValueError:
            user = ""
        return user, self.cfg.user_agents.get(user, self.cfg.default_agent)

    def _call_ready(self, leg: SipCall, ok: bool, why: str) -> None:
        tx = leg.invite_tx
        if tx is None or tx.state != "proceeding" or leg.ended:
            return
        if not ok:
            self.transactions.respond(tx, leg.invite, 503, reason_text(why, 60) or "Service Unavailable",
                            to_tag=leg.dialog.local_tag, extra=[("retry-after", "10")])
            self.end(leg, "agent unavailable", send_bye=False)
            return
        if self.cfg.ring_ms > 0:
            self.transactions.respond(tx, leg.invite, 180, to_tag=leg.dialog.local_tag, contact=leg.dialog.local_contact)
            self.ctx.loop.call_later(self.cfg.ring_ms / 1000, self._answer, leg)
        else:
            self._answer(leg)

    def _answer(self, leg: SipCall) -> None:
        tx = leg.invite_tx
        if tx is None or tx.state != "proceeding" or leg.ended:
            return
        body = leg.answer_sdp()
        leg.ok_retx = self.transactions.accept(tx, leg.invite, functools.partial(self._ack_timeout, leg),
                                     to_tag=leg.dialog.local_tag, contact=leg.dialog.local_contact, body=body,
                                     content_type="application/sdp", extra=self.timers.answer_headers(leg))
        leg.state = "answered"
        leg.last_rx = self.ctx.loop.time()
        self.timers.invite_answered(leg, body)

    def _ack_timeout(self, leg: SipCall, a: Action) -> None:
        if isinstance(a, TimedOut) and not leg.ended:
            self.counters.count("sip_2xx_ack_timeouts")
            leg.state = "confirmed"  # RFC 3261 13.3.1.4: give up and end the session with a BYE
            self.end(leg, "no ack", send_bye=True)

    def on_ack(self, req: SipMessage, addr: Addr) -> bool:
        """The ACK of a 2xx in one of our dialogs (True); anything else is the transactions'."""
        leg = self._dialog_for(req)
        if leg is None:
            return False
        if leg.ok_retx is not None and not leg.ok_retx.done:
            self.transactions.acked(leg.ok_retx)
        if leg.state == "answered":
            leg.state = "confirmed"
            leg.dialog.state = "confirmed"
        if req.body and (leg.neg is None or leg.offered):  # our offer in the 2xx: the ACK answers
            try:
                ans = sdp.parse(req.body)
                leg.offer = None
                leg.apply_negotiation(negotiate(ans, self.ctx, leg.dialog.source, secure=leg.secure_signalling,
                                                offered=leg.offered or ()))
            except sdp.SdpError as e:
                self.counters.count("sip_bad_ack_sdp")
                sdp_refusal(self.counters, e, "ACK", addr[0])
                self.end(leg, "bad sdp in ack", send_bye=True)
                return True
        if leg.bye_after_ack:  # the hang-up's own reason (transport_ended kept it)
            self.end(leg, leg.call.end_reason or "hangup", send_bye=True)
        return True

    def _on_reinvite(self, leg: SipCall, req: SipMessage, tx: ServerInvite) -> None:
        if not self.timers.admit(leg, "re-INVITE"):  # a refresh storm: over [sip] refresh_rate
            self.transactions.respond(tx, req, 491)
            return
        if not leg.dialog.accept_cseq(req):
            self.transactions.respond(tx, req, 500, "CSeq out of order")
            return
        if (leg.invite_tx is not None and leg.invite_tx.state == "proceeding") or \
                (leg.ok_retx is not None and not leg.ok_retx.done) or self.timers.invite_pending(leg):
            self.counters.count("sip_reinvite_491")  # glare (RFC 3261 14.2): the peer tries again later
            self.transactions.respond(tx, req, 491)
            return
        timer = self._refresh_checks(leg, req, tx, "re-INVITE")
        if timer is None:
            return
        offer = None
        if req.body:
            offer = self._take_offer(leg, req, tx, "re-INVITE")
            if offer is None:
                return
        leg.dialog.refresh_target(req)
        leg.sdp_version += 1
        if offer is None:  # no offer: we offer in the 200, the ACK answers
            body = leg.offer_sdp()
        else:
            body = leg.answer_sdp()
        leg.invite = req
        leg.invite_tx = tx
        leg.ok_retx = self.transactions.accept(tx, req, functools.partial(self._ack_timeout, leg),
                                     to_tag=leg.dialog.local_tag, contact=leg.dialog.local_contact, body=body,
                                     content_type="application/sdp", extra=list(timer.headers))
        self.timers.refreshed(leg, timer, req, body)

    def _session_timer(self, req: SipMessage, tx: ServerInvite | ServerNonInvite, what: str,
                       source: str, leg: SipCall | None = None) -> st.Accept | None:
        """The timer part of our answer to a session refresh request (RFC 4028 section 9), or None
        when it was refused: 400 for a malformed ``Session-Expires``/``Min-SE``, 422 with our
        ``Min-SE`` for an interval below ``[sip] min_se_s``."""
        try:
            timer = self.timers.decide(req, leg)
        except ValueError as e:
            self.counters.refuse("malformed", "%s from %s: %s", what, source, str(e)[:80])
            self.transactions.respond(tx, req, 400, "Bad Session-Expires or Min-SE")
            return None
        if isinstance(timer, st.Reject422):
            self.counters.count("sip_session_422_sent")
            self.counters.refuse("session_interval", "%s from %s: Session-Expires %s is below [sip] min_se_s",
                                 what, source, req.get("session-expires")[:20])
            self.transactions.respond(tx, req, 422, "Session Interval Too Small", extra=timer.headers)
            return None
        return timer

    def _refresh_checks(self, leg: SipCall, req: SipMessage, tx: ServerInvite | ServerNonInvite,
                        what: str) -> st.Accept | None:
        """What a re-INVITE and an UPDATE must pass before their offer is read: no extension we
        lack (420), a new target inside ``[sip] allow`` (403: the dialog keeps its target), a
        session interval we take (400, 422). The timer part of the 2xx, or None: answered."""
        source = leg.dialog.source
        require = unsupported(req)
        if require:
            self.counters.refuse("extension", "%s Require %s", what, ", ".join(require)[:40])
            self.transactions.respond(tx, req, 420, extra=[("unsupported", ", ".join(require))])
            return None
        target = leg.dialog.target_in(req)
        if target is not None and self.ctx.destination(leg.dialog.hop_for(target), source) is None:
            self.counters.count("sip_reinvite_403")
            self.counters.refuse("destination", "%s from %s: its Contact names %s, not in [sip] allow",
                                 what, source[0], leg.dialog.hop_for(target)[0])
            self.transactions.respond(tx, req, 403, "Target Not Allowed")  # the dialog keeps its target
            return None
        return self._session_timer(req, tx, what, source[0], leg)

    def _take_offer(self, leg: SipCall, req: SipMessage, tx: ServerInvite | ServerNonInvite,
                    what: str) -> sdp.SessionDescription | None:
        """A re-INVITE's or an UPDATE's offer, negotiated and applied (hold, unhold, a new address);
        None when it was refused 488 (the media stay as they were)."""
        source = leg.dialog.source
        try:
            offer = sdp.parse(req.body)
            neg = negotiate(offer, self.ctx, source, secure=self.transactions.arrived_over(tx) == "TLS")
        except sdp.SdpError as e:
            sdp_refusal(self.counters, e, what, source[0])
            self.transactions.respond(tx, req, 488, extra=warning(str(e)))
            return None
        leg.offer = offer
        was_hold = leg.neg.on_hold if leg.neg else False
        leg.apply_negotiation(neg)
        self.counters.count("sip_hold" if neg.on_hold and not was_hold else
                            "sip_unhold" if was_hold and not neg.on_hold else "sip_reinvite")
        if neg.on_hold != was_hold:  # the agent falls silent on hold and goes on after it
            self.call_host.media_state(leg.call, MEDIA_HELD if neg.on_hold else MEDIA_ANSWERED)
        return offer

    def _on_update(self, leg: SipCall, req: SipMessage, tx: ServerNonInvite) -> None:
        """RFC 3311 UPDATE: a session refresh (RFC 4028) without a body, answered 200 with the
        timer headers; with an offer, answered as a re-INVITE's is (hold, unhold, a new address),
        the answer in the 200. An offer is 491 while our re-INVITE is pending or our last 2xx is
        not yet ACKed (RFC 3311 5.2); before our 2xx to the dialog's INVITE it is 500 with
        Retry-After (RFC 3311 5.2) and a plain UPDATE 200 without timer headers."""
        self.counters.count("sip_update_received")
        if not self.timers.admit(leg, "UPDATE"):
            self.transactions.respond(tx, req, 491)
            return
        if leg.state not in ("answered", "confirmed"):
            if req.body:
                self.transactions.respond(tx, req, 500, extra=[("retry-after", "2")])
            else:
                self.transactions.respond(tx, req, 200, extra=[("contact", leg.dialog.local_contact)])
            return
        if req.body and (self.timers.invite_pending(leg) or (leg.ok_retx is not None and not leg.ok_retx.done)):
            self.counters.count("sip_update_491")
            self.transactions.respond(tx, req, 491)
            return
        timer = self._refresh_checks(leg, req, tx, "UPDATE")
        if timer is None:
            return
        body: bytes | None = None
        if req.body:
            if self._take_offer(leg, req, tx, "UPDATE") is None:
                return
            leg.sdp_version += 1
            body = leg.answer_sdp()
        leg.dialog.refresh_target(req)
        extra = [("contact", leg.dialog.local_contact), *timer.headers]
        if body is None:
            self.transactions.respond(tx, req, 200, extra=extra)
        else:
            self.transactions.respond(tx, req, 200, extra=extra, body=body, content_type="application/sdp")
        self.timers.refreshed(leg, timer, req, body)

    def on_cancel(self, req: SipMessage, tx: ServerNonInvite, inv: ServerInvite | None) -> None:
        """A CANCEL (``inv``: the INVITE server transaction it names, if any)."""
        if inv is None:
            self.transactions.respond(tx, req, 481)
            return
        self.transactions.respond(tx, req, 200)
        if inv.state != "proceeding":
            return  # the INVITE already has its final response: CANCEL has no effect
        leg = self.by_call_id.get(req.call_id)
        if leg is not None and leg.invite_tx is inv:
            self.transactions.respond(inv, leg.invite, 487, to_tag=leg.dialog.local_tag)
            self.counters.count("sip_cancelled")
            self.end(leg, "cancel", send_bye=False)

    # -- in-dialog requests ------------------------------------------------------------------------

    def on_in_dialog(self, req: SipMessage, tx: ServerNonInvite) -> None:
        """BYE, INFO, NOTIFY or UPDATE: in one of our dialogs (else 481), in CSeq order (else 500)."""
        leg = self._dialog_for(req)
        if leg is None:
            self.transactions.respond(tx, req, 481)
        elif not leg.dialog.accept_cseq(req):
            self.transactions.respond(tx, req, 500, "CSeq out of order")
        elif req.method == "BYE":
            self.transactions.respond(tx, req, 200)
            self.end(leg, "bye")
        elif req.method == "INFO":
            self._on_info(leg, req, tx)
        elif req.method == "UPDATE":
            self._on_update(leg, req, tx)
        else:
            self._on_notify(leg, req, tx)

    def _on_info(self, leg: SipCall, req: SipMessage, tx: ServerNonInvite) -> None:
        """A key press as INFO: ``application/dtmf-relay`` (``Signal=5``) or ``application/dtmf``
        (the key alone); a bad body is 400; any other INFO (no key in it) is answered 200."""
        ctype = req.get("content-type").split(";")[0].strip().lower()
        if ctype in ("application/dtmf-relay", "application/dtmf"):
            kind = ctype.split("/")[1]
            try:
                digit, dur = dtmf.parse_dtmf_relay(req.body) if kind == "dtmf-relay" else (
                    dtmf.parse_dtmf_body(req.body), 0)
            except dtmf.DtmfError:
                self.counters.refuse("malformed", "bad %s body from %s", kind, leg.dialog.source[0])
                self.transactions.respond(tx, req, 400, f"Bad {kind} body")
                return
            self.call_host.dtmf_in(leg.call, digit, dur)
        self.transactions.respond(tx, req, 200)

    def _on_notify(self, leg: SipCall, req: SipMessage, tx: ServerNonInvite) -> None:
        self.transactions.respond(tx, req, 200)
        if not req.get("event").lower().startswith("refer"):
            return
        frag = req.body.decode("utf-8", "replace").strip().split("\r\n")[0].split("\n")[0]
        parts = frag.split(" ", 2)
        if len(parts) >= 2 and parts[0] == "SIP/2.0" and len(parts[1]) == 3 and is_digits(parts[1]):
            status = int(parts[1])
            if status >= 200:
                self.counters.count("sip_refer_notify_final")
                if status < 300:
                    self.call_host.hangup(leg.call, "transferred")
                elif leg.transfer_done is not None:
                    leg.transfer_done(False, f"transfer failed: {frag[8:60]}")
                    leg.transfer_done = None

    def refer(self, leg: SipCall, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        """The agent's Transfer: REFER in ``leg``'s dialog; ``done(ok, why)`` once (see the invariants).
        A ``summary`` goes as ``X-Transfer-Summary`` (:func:`transfer_summary_header`)."""
        if leg.state != "confirmed" or leg.ended:
            done(False, "call not confirmed")
            return
        if leg.client_tx >= MAX_CLIENT_TX:
            done(False, "too many pending requests")
            return
        target = target.strip()
        if not target or len(target) > MAX_TARGET or not _TARGET_RE.match(target) or \
                any(c in target for c in '<>"\\'):
            done(False, "invalid target")
            return
        if ":" not in target.split("@")[0] and not target.startswith(("sip:", "sips:", "tel:")):
            host = (self.hop(leg) or leg.dialog.source)[0]
            target = f"sip:{target}@{host}"
        try:
            parse_uri(target)
        except ValueError:
            done(False, "invalid target")
            return
        extra = [("refer-to", f"<{target}>"), ("referred-by", f"<{leg.dialog.local_uri}>")]
        if summary:
            value, changed = transfer_summary_header(summary)
            if changed:
                self.counters.count("sip_transfer_summaries_sanitised")
            extra.append(("x-transfer-summary", value))
        req = leg.dialog.request("REFER", self.transactions.via_host_for(leg.dialog.transport), extra=extra)

        def on_action(a: Action) -> None:
            if isinstance(a, Deliver) and a.msg.status >= 200:
                if a.msg.status < 300:
                    leg.transfer_done = done  # a failing NOTIFY later reports through it
                    done(True, f"{a.msg.status} {a.msg.reason}")
                else:
                    done(False, f"{a.msg.status} {a.msg.reason}")
            elif isinstance(a, TimedOut):
                done(False, "REFER timed out")

        self._client_request(leg, req, on_action)

    def _client_request(self, leg: SipCall, req: SipMessage, cb: Callable[[Action], None]) -> None:
        """A request in ``leg``'s dialog (a re-INVITE in an INVITE client transaction: ``cb``
        sees every 2xx, its ACK is the caller's), counted in its pending client transactions until
        final. A 401/407 to it is answered with the leg's trunk credentials (``leg.auth_creds``,
        :class:`~brisvox.gateway.sip.client_auth.ClientAuth`: once per challenge, the CSeq
        advanced); ``cb`` then sees the answer to the re-sent request, or the challenge when it
        cannot be answered."""
        auth = ClientAuth(leg.auth_creds) if leg.auth_creds is not None else None
        sent = [req]
        final = [False]

        def send(r: SipMessage, to: Addr) -> None:
            if r.method == "INVITE":
                self.transactions.invite(r, to, counted)
            else:
                self.transactions.request(r, to, counted)

        def counted(a: Action) -> None:
            if auth is not None and isinstance(a, Deliver) and a.msg.status in (401, 407) and not final[0]:
                again, why = auth.retry(sent[0], a.msg)
                if again is not None and hop is not None:
                    self.counters.count("sip_auth_answered")
                    leg.dialog.local_cseq = max(leg.dialog.local_cseq, again.cseq[0])
                    sent[0] = again
                    send(again, hop)
                    return
                self.counters.count("sip_auth_client_failed")
                self.counters.log_limit("sip_auth_client", "%s for call %s: %s", req.method, leg.call.call_id, why,
                                        level=logging.WARNING)
            if not final[0] and (isinstance(a, TimedOut) or (isinstance(a, Deliver) and a.msg.status >= 200)):
                final[0] = True
                leg.client_tx = max(0, leg.client_tx - 1)
            cb(a)

        hop = self.hop(leg)
        if hop is None:  # unreachable while every target is checked when it is set; never sent there
            self.counters.refuse("destination", "%s for call %s: next hop %s not in [sip] allow", req.method,
                                 leg.call.call_id, leg.dialog.next_hop()[0])
            cb(TimedOut("destination not allowed"))
            return
        leg.client_tx += 1
        send(req, hop)

    def hop(self, leg: SipCall) -> Addr | None:
        """Where ``leg``'s in-dialog requests go: its dialog's next hop, checked
        (:meth:`~brisvox.gateway.sip.rtp.SipContext.destination`; None: nowhere allowed)."""
        return self.ctx.destination(leg.dialog.next_hop(), leg.dialog.source)

    # -- ending -------------------------------------------------------------------------------------

    def hangup(self, leg: SipCall, reason: str) -> None:
        """Our side ends an inbound call, or an answered outbound one (agent Hangup, shutdown,
        RTP timeout, transfer done); an unanswered outbound call is the dialer's."""
        if leg.ended:
            return
        tx = leg.invite_tx
        if leg.state == "incoming" and tx is not None and tx.state == "proceeding":
            self.transactions.respond(tx, leg.invite, 480, "Temporarily Unavailable", to_tag=leg.dialog.local_tag)
            self.end(leg, reason, send_bye=False)
        elif leg.state == "answered" and leg.ok_retx is not None and not leg.ok_retx.done:
            leg.bye_after_ack = True  # RFC 3261 15: the UAS sends BYE only once the ACK came (or timed out)
            self.call_host.transport_ended(leg.call, reason)
        else:
            self.end(leg, reason, send_bye=True)

    def end(self, leg: SipCall, reason: str, send_bye: bool = False) -> None:
        """End ``leg`` once (BYE first when asked and the dialog is answered or confirmed)."""
        if send_bye and leg.state in ("answered", "confirmed") and not leg.ended:
            req = leg.dialog.request("BYE", self.transactions.via_host_for(leg.dialog.transport), extra=[("reason", bye_reason(reason))])
            self.counters.count("sip_bye_sent")
            self._client_request(leg, req, self._bye_result)
        if leg.ended:
            return
        leg.ended = True
        leg.state = "ended"
        leg.dialog.state = "terminated"
        leg.sync_stats()
        self.timers.forget(leg)
        if leg.ok_retx is not None and not leg.ok_retx.done:
            self.transactions.acked(leg.ok_retx)
        self.rtp_ports.close(leg)
        self.dialogs.pop((leg.dialog.call_id, leg.dialog.local_tag), None)
        self.by_call_id.pop(leg.dialog.call_id, None)
        self.call_host.transport_ended(leg.call, reason)
