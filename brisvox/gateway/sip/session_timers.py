"""The session timers of the SIP user agent's dialogs (RFC 4028) and the refreshes we send.

Owns :class:`SessionTimers`: per dialog, its
:class:`~brisvox.wire.sip_session_timer.SessionTimer` (the pure machine), the one
loop timer that ticks it, the SDP we last sent in it, our refresh in flight
(and the ACK of a re-INVITE's 2xx), and the per-dialog budget of re-INVITEs and
UPDATEs the peer may send (``[sip] refresh_rate``). It decides nothing itself:
the answers come from :func:`~brisvox.wire.sip_session_timer.uas_answer`, the
times and the retries from the machine; it performs the machine's actions:
a refresh as an UPDATE without a body when the peer's ``Allow`` lists UPDATE,
else as a re-INVITE carrying the SDP we last sent, byte for byte (the same
``o=`` version: nothing changes), sent through the dialog layer's client
requests (a trunk's challenge answered there); a BYE through the dialog
layer's hang-up (its reason reaches the call record). The dialog layer
(:mod:`brisvox.gateway.sip.dialogs`) and the dialer
(:mod:`brisvox.gateway.sip.outbound`) tell it what was negotiated.

Invariants:

* A dialog's session state lives from :meth:`SessionTimers.open` to
  :meth:`SessionTimers.forget` (the leg's end); its loop timer is cancelled
  then, so nothing of an ended call is held or fires.
* Every 2xx to our re-INVITE is ACKed (a retransmitted one gets the same
  ACK again), whatever became of the call meanwhile.
* At most one refresh of ours is in flight per dialog (the machine's rule);
  while it is a re-INVITE, :meth:`SessionTimers.invite_pending` is true and
  the dialog layer answers the peer's re-INVITE (or UPDATE with an offer)
  491 (RFC 3261 section 14.2, RFC 3311 section 5.2).
* A peer's re-INVITE or UPDATE beyond ``refresh_rate`` in one dialog is
  refused (491 by the dialog layer) before it is parsed further, counted
  ``sip_refresh_storm``, one log line a minute: a storm costs one window
  check and one response per request, the call goes on.
* An SDP answer in the 2xx to our re-INVITE that cannot be used leaves the
  media as it was (RFC 3261 section 14.1: the session is unchanged), counted
  ``sip_session_bad_answer``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from limits import strategies

from brisvox.gateway.rate_limits import parse_rates, process_storage
from brisvox.gateway.sip.rtp import Addr, SipCall, SipContext
from brisvox.gateway.sip.transactions import TransactionLayer
from brisvox.wire import sdp
from brisvox.wire import sip_session_timer as st
from brisvox.wire.sip_dialog import ALLOW
from brisvox.wire.sip_message import SipMessage
from brisvox.wire.sip_transaction import Action, Deliver, TimedOut

__all__ = ["SessionTimers"]

ClientRequest = Callable[[SipCall, SipMessage, Callable[[Action], None]], None]
Hangup = Callable[[SipCall, str], None]
Negotiate = Callable[..., sdp.Negotiated]  # dialogs.negotiate(offer, ctx, source, *, secure, offered)
Key = tuple[str, str]


def allows_update(msg: SipMessage) -> bool | None:
    """Whether ``msg``'s ``Allow`` lists UPDATE (None: it has no ``Allow``)."""
    allow = msg.get_all("allow")
    if not allow:
        return None
    return any(m.strip().upper() == "UPDATE" for m in allow)


@dataclass(slots=True)
class Session:
    """One dialog's session timer and what performing it needs."""

    machine: st.SessionTimer
    sdp: bytes = b""  # the SDP we last sent in the dialog (a re-INVITE refresh offers it again)
    answer: st.Accept | None = None  # the timer part of our 2xx to the dialog's INVITE, until it is sent
    timer: asyncio.TimerHandle | None = None
    timer_at: float = 0.0
    invite_pending: bool = False  # our refresh in flight is a re-INVITE
    acks: dict[int, bytes] = field(default_factory=dict)  # CSeq of our re-INVITE -> the ACK of its 2xx


class SessionTimers:
    """Every dialog's session timer (see the module docstring)."""

    def __init__(self, ctx: SipContext, transactions: TransactionLayer, send: ClientRequest, hangup: Hangup,
                 hop: Callable[[SipCall], Addr | None], negotiate: Negotiate) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.counters = ctx.counters
        self.transactions = transactions
        self._send = send
        self._hangup = hangup
        self._hop = hop
        self._negotiate = negotiate
        self.policy = st.TimerPolicy(self.cfg.session_expires_s, self.cfg.min_se_s)
        self.sessions: dict[Key, Session] = {}
        self._limiter = strategies.MovingWindowRateLimiter(process_storage())
        self._rates = parse_rates(self.cfg.refresh_rate)
        self._rng = random.SystemRandom()

    @staticmethod
    def _key(leg: SipCall) -> Key:
        return leg.dialog.call_id, leg.dialog.local_tag

    def stats(self) -> dict[str, int]:
        return {"sip_session_timers": sum(1 for s in self.sessions.values() if s.machine.deadline is not None)}

    # -- what the dialog layer and the dialer ask -------------------------------------------------

    def decide(self, req: SipMessage, leg: SipCall | None = None) -> st.Accept | st.Reject422:
        """Our answer's timer part to a session refresh request (INVITE; a re-INVITE or UPDATE
        in ``leg``'s dialog, whose interval we never shorten below the largest ``Min-SE`` the
        dialog has seen); ValueError for a malformed ``Session-Expires`` or ``Min-SE`` (the
        caller answers 400)."""
        tr = st.TimerRequest.of(req)
        s = self.sessions.get(self._key(leg)) if leg is not None else None
        if s is not None and s.machine.min_se > (tr.min_se or 0):
            tr = dataclasses.replace(tr, min_se=s.machine.min_se)
        return st.uas_answer(tr, self.policy)

    def request_headers(self, interval: int | None = None, min_se: int | None = None) -> list[tuple[str, str]]:
        """The timer headers of an INVITE we place (:func:`~brisvox.wire.sip_session_timer.uac_headers`)."""
        return st.uac_headers(self.cfg.session_expires_s if interval is None else interval,
                              self.cfg.min_se_s if min_se is None else min_se)

    def open(self, leg: SipCall, *, owner: bool, peer: SipMessage, local_sdp: bytes = b"",
             answer: st.Accept | None = None, min_se: int = 0) -> None:
        """``leg``'s dialog exists: ``owner`` when we sent its INVITE (its Call-ID is ours),
        ``peer`` the message of the peer's that made it (its ``Allow``), ``answer`` the timer part
        of the 2xx we are to send to the peer's INVITE, ``min_se`` the largest ``Min-SE`` our
        INVITE named (a 422 raised it); the peer's own ``Min-SE`` counts too."""
        key = self._key(leg)
        if key in self.sessions:
            return
        try:
            min_se = max(min_se, st.parse_min_se(peer.get("min-se")) if peer.get("min-se") else 0)
        except ValueError:
            pass
        self.sessions[key] = Session(
            st.SessionTimer(max(self.cfg.min_se_s, min_se), owner=owner, update=bool(allows_update(peer))),
            sdp=local_sdp, answer=answer)

    def answer_headers(self, leg: SipCall) -> list[tuple[str, str]]:
        """The timer headers of our 2xx to the dialog's INVITE (``Supported: timer`` at least)."""
        s = self.sessions.get(self._key(leg))
        return list(s.answer.headers) if s is not None and s.answer is not None else [("supported", st.TIMER)]

    def invite_answered(self, leg: SipCall, body: bytes) -> None:
        """Our 2xx (with ``body``, our SDP) to the dialog's INVITE is sent: the timer runs."""
        s = self.sessions.get(self._key(leg))
        if s is not None and s.answer is not None:
            accept, s.answer = s.answer, None
            self.answered(leg, accept, body)

    def forget(self, leg: SipCall) -> None:
        """``leg`` ended: its timer is cancelled and its state dropped."""
        s = self.sessions.pop(self._key(leg), None)
        if s is not None and s.timer is not None:
            s.timer.cancel()

    def invite_pending(self, leg: SipCall) -> bool:
        """Whether a re-INVITE of ours is in flight in ``leg``'s dialog (glare: 491 to the peer's)."""
        s = self.sessions.get(self._key(leg))
        return s is not None and s.invite_pending

    def admit(self, leg: SipCall, method: str) -> bool:
        """Whether the peer's re-INVITE or UPDATE fits ``refresh_rate`` (False: refuse it, counted)."""
        ns_key = f"{leg.dialog.call_id}|{leg.dialog.local_tag}"
        if all(self._limiter.hit(item, "sip_refresh", ns_key) for item in self._rates):
            return True
        self.counters.count("sip_refresh_storm")
        self.counters.log_limit("sip_refresh_storm", "SIP %s for call %s from %s refused 491: over [sip] "
                                "refresh_rate", method, leg.call.call_id, leg.dialog.source[0],
                                level=logging.WARNING)
        return False

    def answered(self, leg: SipCall, accept: st.Accept, body: bytes | None = None, *,
                 peer: SipMessage | None = None) -> None:
        """We sent a 2xx carrying ``accept``'s headers (and ``body``, our SDP, if any) to the
        peer's INVITE, re-INVITE or UPDATE (``peer``: that request, its ``Allow``)."""
        s = self.sessions.get(self._key(leg))
        if s is None:
            return
        if body:
            s.sdp = body
        if peer is not None:
            self._peer_allow(s, peer)
        self._feed(leg, s, st.Negotiated(self.ctx.loop.time(), accept.interval, accept.we_refresh))

    def refreshed(self, leg: SipCall, accept: st.Accept, req: SipMessage, body: bytes | None) -> None:
        """The peer's re-INVITE or UPDATE was answered 2xx (see :meth:`answered`)."""
        self.counters.count("sip_session_refreshes_received")
        self.answered(leg, accept, body, peer=req)

    def dial_answered(self, leg: SipCall, resp: SipMessage, asked: int) -> None:
        """The 2xx to the INVITE we placed (which asked for ``asked`` s): section 7.2."""
        s = self.sessions.get(self._key(leg))
        if s is None:
            return
        interval, we_refresh = st.uac_result(resp, asked)
        self._feed(leg, s, st.Negotiated(self.ctx.loop.time(), interval, we_refresh))

    # -- the machine and its actions ---------------------------------------------------------------

    def _peer_allow(self, s: Session, msg: SipMessage) -> None:
        update = allows_update(msg)
        if update is not None:
            s.machine.handle(st.PeerAllows(update))

    def _feed(self, leg: SipCall, s: Session, e: st.Event) -> None:
        for a in s.machine.handle(e):
            if isinstance(a, st.Count):
                self.counters.count(a.name)
            elif isinstance(a, st.SendRefresh):
                self._refresh(leg, s, a)
            else:
                self.counters.log_limit(f"sip_{a.reason.replace(' ', '_')}", "SIP call %s: %s, BYE",
                                        leg.call.call_id, a.reason, level=logging.INFO)
                self._hangup(leg, a.reason)
        self._arm(leg, s)

    def _arm(self, leg: SipCall, s: Session) -> None:
        at = s.machine.deadline
        if s.timer is not None and (at is None or at != s.timer_at):
            s.timer.cancel()
            s.timer = None
        if at is not None and s.timer is None:
            s.timer_at = at
            s.timer = self.ctx.loop.call_at(at, self._on_timer, leg)

    def _on_timer(self, leg: SipCall) -> None:
        s = self.sessions.get(self._key(leg))
        if s is None:
            return
        s.timer = None
        self.tick(leg, self.ctx.loop.time())

    def tick(self, leg: SipCall, now: float) -> None:
        """Run ``leg``'s machine at ``now`` (the loop timer does, at its deadline)."""
        s = self.sessions.get(self._key(leg))
        if s is not None and not leg.ended:
            self._feed(leg, s, st.Tick(now))

    def _refresh(self, leg: SipCall, s: Session, a: st.SendRefresh) -> None:
        extra = [*st.uac_headers(a.interval, a.min_se, refreshing=True), ("allow", ALLOW)]
        via = self.transactions.via_host_for(leg.dialog.transport)
        if a.method == "INVITE":
            req = leg.dialog.request("INVITE", via, body=s.sdp, content_type="application/sdp", extra=extra)
            s.invite_pending = True
        else:
            req = leg.dialog.request("UPDATE", via, extra=extra)
        self.counters.count("sip_session_refreshes_sent")
        self.counters.count(f"sip_session_refreshes_sent_{a.method.lower()}")
        done = [False]

        def on_action(act: Action) -> None:
            if isinstance(act, Deliver):
                resp = act.msg
                if resp.status < 200:
                    return
                if 200 <= resp.status < 300 and a.method == "INVITE":
                    self._ack(leg, s, resp)
                if done[0]:
                    return
                done[0] = True
                self._refresh_done(leg, s, a, resp)
            elif isinstance(act, TimedOut) and not done[0]:
                done[0] = True
                self._refresh_done(leg, s, a, None)

        self._send(leg, req, on_action)

    def _ack(self, leg: SipCall, s: Session, resp: SipMessage) -> None:
        """ACK a 2xx to our re-INVITE (RFC 3261 13.2.2.4), again for a retransmission."""
        cseq = resp.cseq[0]
        ack = s.acks.get(cseq)
        if ack is None:
            ack = leg.dialog.request("ACK", self.transactions.via_host_for(leg.dialog.transport),
                                     cseq=cseq).serialize()
            s.acks = {cseq: ack}  # only the latest re-INVITE's 2xx can still come
        hop = self._hop(leg)
        if hop is not None:
            self.transactions.send(ack, hop, leg.dialog.transport)

    def _refresh_done(self, leg: SipCall, s: Session, a: st.SendRefresh, resp: SipMessage | None) -> None:
        if a.method == "INVITE":
            s.invite_pending = False
        if leg.ended or self.sessions.get(self._key(leg)) is not s:
            return
        now = self.ctx.loop.time()
        if resp is None:
            self._feed(leg, s, st.RefreshFailed(now, 0))
            return
        if resp.status >= 300:
            min_se = 0
            if resp.status == 422:
                again = st.uac_after_422(resp, a.interval, a.min_se)
                min_se = again[1] if again is not None else 0
            self._feed(leg, s, st.RefreshFailed(now, resp.status, min_se, self._rng.random()))
            return
        self._peer_allow(s, resp)
        if a.method == "INVITE" and resp.body:
            self._take_answer(leg, resp)
        interval, we_refresh = st.uac_result(resp, a.interval)
        self._feed(leg, s, st.RefreshAnswered(now, interval, we_refresh))

    def _take_answer(self, leg: SipCall, resp: SipMessage) -> None:
        try:
            # an SRTP call's refresh offers the key it sends with: the answer must take that line
            offered = (leg.srtp.local,) if leg.srtp is not None else ()
            neg = self._negotiate(sdp.parse(resp.body), self.ctx, leg.dialog.source, secure=leg.secure_signalling,
                                  offered=offered)
        except sdp.SdpError as e:
            self.counters.count("sip_session_bad_answer")
            self.counters.log_limit("sip_session_bad_answer", "SIP call %s: the answer to our re-INVITE is "
                                    "unusable (%s); the media stay as they were", leg.call.call_id,
                                    str(e)[:80], level=logging.INFO)
            return
        leg.apply_negotiation(neg)
