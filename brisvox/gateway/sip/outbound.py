"""Outbound SIP calls (the UAC side): ``brisvoxd dial`` places an INVITE, the answered call runs the agent.

Owns :class:`SipDialer` (the user agent's outbound dialer): resolving a dial
target (a ``sip:`` URI, or a number through ``[sip] trunk``), the outbound
INVITE with our SDP offer (PCMU/PCMA on a port of the call's own RTP
allocation) in an INVITE client transaction
(:class:`~brisvox.wire.sip_transaction.ClientInvite`), the provisional
responses and their early media, the 2xx (our ACK, the answer's negotiation,
then the agent side started exactly as for an inbound call, unless early media
started it: :meth:`~brisvox.gateway.core.host.CallHost.start_call`),
a failure (4xx/5xx/6xx, Timer B, the ring timeout) and CANCEL for a hang-up
before the answer. Once answered the leg is an ordinary
:class:`~brisvox.gateway.sip.rtp.SipCall` of the dialog layer: BYE either
way, RTP, DTMF, REFER. The dialer sends through the
:class:`~brisvox.gateway.sip.transactions.TransactionLayer` and reaches the
dialog layer only through :class:`DialogTable` (enter a leg, end one).

Invariants:

* A dial is reported exactly once (``done(data, error)``): the call id once
  the callee answered and the agent side started, else the failure reason
  (``busy``, ``no answer``, ``declined``, ``not found``, ``incompatible
  media``, ``cancelled``, ``timeout``, ``agent unavailable: ...``,
  ``gateway stopped`` or the status line), each counted (``sip_dial_answered``, ``sip_dial_failed_<reason>``).
* The call is admitted (rings created, capacity taken) before the INVITE
  goes out, as an inbound call is at its INVITE: a full or draining gateway
  refuses the dial without sending anything; a dial that fails is released
  through :meth:`~brisvox.gateway.core.host.CallHost.transport_ended` and
  :meth:`~brisvox.gateway.core.host.CallHost.abandon`, never left in the table.
* Our offer follows ``[sip] srtp`` (:meth:`~brisvox.gateway.sip.rtp.SipCall.offer_sdp`):
  keys only over TLS signalling (unless ``srtp_allow_insecure_signalling``), so with
  ``srtp = "required"`` a dial over UDP or TCP is refused before anything is sent
  (``sip_dial_refused_srtp_insecure_signalling``); the 2xx's answer must choose one of our
  a=crypto lines, else the call is ACKed and ended with BYE (``incompatible media``).
* Only targets inside ``[sip] allow`` are dialled (the callee's responses
  and RTP would be dropped otherwise); the host must be an IP address (no
  DNS). A target is a plain SIP URI or number: no spaces, quotes or angle
  brackets, at most ``MAX_TARGET`` characters. The answer cannot move the
  call outside ``[sip] allow`` either: a 2xx whose Contact / Record-Route
  names an address outside is ACKed and ended with BYE at the address we
  dialled (``destination not allowed``), one whose SDP does is
  ``incompatible media`` (``[sip] nat = "signalling_source"``: the dialled
  address replaces it instead).
* Every 2xx to our INVITE is ACKed (a retransmitted 2xx gets the same ACK
  again); a 2xx that comes after we cancelled, or whose SDP we cannot use,
  is ACKed and then ended with BYE.
* CANCEL is sent only after a provisional response (RFC 3261 9.1); a
  hang-up before one is remembered and sent with the first.
* Session timers (RFC 4028): the INVITE says ``Supported: timer`` and asks
  for ``[sip] session_expires_s`` (``Min-SE: min_se_s``); a 422 is answered
  once, the INVITE sent again (the same Call-ID and From tag, the CSeq
  advanced) asking for the 422's ``Min-SE``; a second 422 fails the dial. The
  2xx starts the dialog's session timer (section 7.2: its ``Session-Expires``
  decides, else we refresh what we asked for), run by the dialog layer's
  :class:`~brisvox.gateway.sip.session_timers.SessionTimers`; we own the
  Call-ID (a 491 to our refresh waits 2.1-4 s).
* The dial's leg is in the dialog table from the INVITE on (so the callee's
  BYE or INFO finds it); a dial is in :attr:`SipDialer.outgoing` only until
  its final response.
* Early media (a 18x with SDP, RFC 3261 13.2.1; no 100rel: we offer no PRACK): its SDP
  is negotiated like an answer (a usable one, inside ``[sip] allow``; one that is not is
  ignored and counted, ``sip_dial_bad_early_sdp``: the 200 may still bring a good one),
  the RTP latch and codec follow it (the newest 18x SDP, whichever fork sent it), and its
  audio reaches the call's ``in`` ring: the first such 18x starts the agent side with the
  media state ``"early"`` (``CallMedia``), which hears it but does not answer it. Nothing
  is sent towards the far end before the 200 (the leg cannot send while ``outgoing``).
  A 18x without SDP is ringing only. The 200 ends early media: its SDP is the answer
  (when it differs from the 18x's, e.g. another fork answered, the 200's is applied); a
  200 without SDP takes the 18x's answer of the same dialog (To tag), else it is
  ``incompatible media``. The agent side then hears ``"answered"``. An agent side that
  cannot start during early media ends the dial (CANCEL, ``agent unavailable``).
* A dial's result and its call's ``CallMedia.dial`` carry its signalling times in ms
  from the first INVITE sent: ``ringing_at_ms`` (the first 18x), ``progress_at_ms`` (the
  first usable 18x SDP), ``answered_at_ms`` (the 200); null (absent in ``dial``) when
  the callee never sent it.
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from brisvox.gateway.config import SipTrunk
from brisvox.gateway.core.calls import AdmissionError, Call
from brisvox.gateway.sip.client_auth import ClientAuth, resend, trunk_credentials
from brisvox.gateway.sip.dialogs import bye_reason, negotiate, sdp_refusal
from brisvox.gateway.sip.rtp import RATE, Addr, RtpPorts, SipCall, SipContext
from brisvox.gateway.sip.session_timers import SessionTimers
from brisvox.gateway.sip.transactions import TransactionLayer, timeout_counter
from brisvox.wire import sdp
from brisvox.wire import sip_session_timer as session_timer
from brisvox.wire.jsontext import checked_params, param_text
from brisvox.wire.sip_dialog import ALLOW, Dialog, is_ip
from brisvox.wire.sip_message import (
    SipMessage,
    new_branch,
    new_call_id,
    new_tag,
    parse_uri,
    split_hostport,
    uri_number,
)
from brisvox.wire.sip_transaction import Action, ClientInvite, Deliver, TimedOut
from ipc.frames import MEDIA_ANSWERED, MEDIA_EARLY

MAX_TARGET = 256
_TARGET_RE = re.compile(r"^[!-~]+$")  # printable ASCII, no space
_NUMBER_RE = re.compile(r"^\+?[0-9*#]{1,32}$")
# final status -> the reason the dial reports
FAILURES = {486: "busy", 600: "busy", 480: "no answer", 408: "no answer", 404: "not found",
            604: "not found", 484: "not found", 403: "declined", 603: "declined",
            488: "incompatible media", 606: "incompatible media", 487: "cancelled"}
Done = Callable[[dict[str, Any] | None, str], None]


def resolve_target(target: str, trunk: str | SipTrunk) -> tuple[str, Addr]:
    """(Request-URI, where the INVITE goes) for a ``sip:`` URI or a number, through ``trunk``
    (``[sip] trunk`` "ip:port", or a ``[[sip.trunks]]`` entry: its outbound proxy or registrar,
    a number as ``sip:NUMBER@<registrar>``); ValueError why not."""
    t = target.strip()
    if not t or len(t) > MAX_TARGET or not _TARGET_RE.match(t) or any(c in t for c in '<>"\\,'):
        raise ValueError("invalid target")
    if isinstance(trunk, SipTrunk):
        if not _NUMBER_RE.match(t):
            raise ValueError("a trunk dials a number")
        return f"sip:{t}@{trunk.domain}", trunk.next_hop
    dest: Addr | None = split_hostport(trunk) if trunk else None
    if _NUMBER_RE.match(t):
        if dest is None:
            raise ValueError("a number needs [sip] trunk (or dial a sip: URI)")
        host = f"[{dest[0]}]" if ":" in dest[0] else dest[0]
        return f"sip:{t}@{host}:{dest[1]}", dest
    if not t.lower().startswith(("sip:", "sips:")):
        raise ValueError("expected a sip: or sips: URI or a number")
    uri = parse_uri(t)  # ValueError: a bad URI
    if dest is None:
        if not is_ip(uri.host):
            raise ValueError("the target's host must be an IP address (no DNS), or set [sip] trunk")
        dest = (uri.host, uri.port or (5061 if target_transport(t) == "TLS" else 5060))
    return t, dest


def target_transport(target: str | SipTrunk) -> str:
    """The transport a dial goes over: a trunk's, a ``sips:`` URI's (TLS), a ``;transport=``
    parameter's, else UDP ("UDP" | "TCP" | "TLS")."""
    if isinstance(target, SipTrunk):
        return target.transport.upper()
    if target.lower().startswith("sips:"):
        return "TLS"
    try:
        param = parse_uri(target).params.get("transport", "udp").upper()
    except ValueError:
        return "UDP"
    return param if param in ("UDP", "TCP", "TLS") else "UDP"


def failure_reason(status: int, reason: str) -> str:
    return FAILURES.get(status, f"{status} {reason}"[:80])


class DialogTable(Protocol):
    """What the dialer asks of the dialog layer (:class:`~brisvox.gateway.sip.dialogs.SipDialogs`)."""

    timers: SessionTimers  # the dialogs' session timers (an answered dial's starts at its 2xx)

    def add(self, leg: SipCall) -> None: ...

    def end(self, leg: SipCall, reason: str, send_bye: bool = False) -> None: ...


@dataclass(slots=True)
class Dialing:
    """One outbound INVITE until its final response (and the 2xx's ACK after it)."""

    leg: SipCall
    dest: Addr
    done: Done
    tx: ClientInvite | None = None
    provisional: bool = False
    cancel_reason: str = ""  # a hang-up before the answer asked for CANCEL
    cancel_sent: bool = False
    ack: bytes = b""
    ack_addr: Addr = ("", 0)
    auth: ClientAuth | None = None  # the trunk's credentials for a 401/407 to our INVITE
    se_asked: int = 0  # the Session-Expires our INVITE asks for (0: none)
    min_se: int = session_timer.MIN_SE_FLOOR  # the Min-SE it names
    retried_422: bool = False  # asked again after a 422 (once)
    reported: bool = False
    ring_timer: Any = None
    sent_at: float = 0.0  # loop time the first INVITE went out
    ringing_ms: int | None = None  # the first 18x, ms after sent_at
    progress_ms: int | None = None  # the first usable 18x SDP
    answered_ms: int | None = None  # the 200
    early_tag: str = ""  # the To tag of the dialog whose 18x SDP plays (early_neg)
    early_neg: sdp.Negotiated | None = None
    agent: str = ""  # the agent side: "" not started, "starting", "ready"

    def times(self) -> dict[str, int | None]:
        """The dial's signalling times (see the module docstring)."""
        return {"ringing_at_ms": self.ringing_ms, "progress_at_ms": self.progress_ms,
                "answered_at_ms": self.answered_ms}

    def report(self, data: dict[str, Any] | None, error: str) -> None:
        if self.reported:
            return
        self.reported = True
        if self.ring_timer is not None:
            self.ring_timer.cancel()
        self.done(data, error)


class SipDialer:
    """Outbound calls (see the module docstring)."""

    def __init__(self, ctx: SipContext, transactions: TransactionLayer, dialogs: DialogTable,
                 rtp_ports: RtpPorts) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.call_host = ctx.call_host
        self.counters = ctx.counters
        self.transactions = transactions
        self.dialogs = dialogs
        self.rtp_ports = rtp_ports
        self.outgoing: dict[str, Dialing] = {}  # SIP Call-ID -> the dial until its final response
        self._bye_result = timeout_counter(self.counters, "sip_bye_timeouts")
        self._cancel_result = timeout_counter(self.counters, "sip_dial_cancel_timeouts")

    def close(self) -> None:
        for d in list(self.outgoing.values()):  # an unanswered dial is over with the gateway
            d.report(None, "gateway stopped")
        self.outgoing.clear()

    def dial(self, target: str, agent: str, done: Done, ring_timeout_s: float = 0.0, trunk: str = "",
             params: dict[str, str] | None = None, admitted: Callable[[Call], None] | None = None) -> None:
        """Call ``target`` (through ``trunk``, a ``[[sip.trunks]]`` name; "": ``[sip] trunk``) with
        the call parameters ``params`` (checked by :func:`brisvox.wire.jsontext.dial_params`; the
        gateway's ``from``/``to``/``direction`` are added); ``done(data, "")`` with the call id once
        answered, else ``done(None, why)``; ``admitted(call)`` as soon as the call is admitted, before
        the INVITE (a warm transfer's consult leg is marked there, before its agent side can start)."""
        self.counters.count("sip_dial_attempts")
        via: str | SipTrunk = self.cfg.trunk
        if trunk or self.cfg.trunk_named(self.cfg.trunk):
            named = self.cfg.trunk_named(trunk or self.cfg.trunk)
            if named is None:
                self._dial_refused("unknown_trunk", done, f"no [[sip.trunks]] entry named {trunk[:40]!r}")
                return
            via = named
        try:
            ruri, dest = resolve_target(target, via)
            transport = target_transport(via if isinstance(via, SipTrunk) else ruri)
            if transport != "UDP" and transport not in self.transactions.stream_transports:
                raise ValueError(f"{transport} needs a [[sip.listeners]] entry with transport = "
                                 f"\"{transport.lower()}\"")
        except ValueError as e:
            self._dial_refused("invalid_target", done, str(e)[:120])
            return
        if not self.ctx.allowed(dest[0]):
            self._dial_refused("not_allowed", done, f"{dest[0]} is not in [sip] allow")
            return
        if self.cfg.srtp == "required" and not self.cfg.srtp_policy.keys_allowed(transport == "TLS"):
            self._dial_refused("srtp_insecure_signalling", done, "srtp = \"required\" dials only over TLS "
                               "(a sips: URI, ;transport=tls or a TLS trunk)")
            return
        if not self.transactions.started:
            self._dial_refused("not_started", done, "the SIP user agent is not started")
            return
        try:
            # an operator's dial: without --agent, [sip] default_agent, else the agents' "default"
            default = via.agent if isinstance(via, SipTrunk) and via.agent else self.cfg.default_agent
            call = self.call_host.admit("sip", agent or default or "default", RATE)
        except AdmissionError as e:
            self._dial_refused(e.reason, done, f"refused: {e.reason}")
            return
        tag = new_tag()
        contact = self.transactions.contact_for(transport)
        inv = SipMessage(method="INVITE", uri=ruri)
        h = inv.headers
        h.append(("via", f"SIP/2.0/{transport} {self.transactions.via_host_for(transport)};branch={new_branch()};rport"))
        h.append(("max-forwards", "70"))
        if isinstance(via, SipTrunk):  # the trunk's account is who calls
            h.append(("from", f"<sip:{via.username}@{via.domain}>;tag={tag}"))
        else:
            h.append(("from", f"{contact};tag={tag}"))  # our address of record is our contact
        h.append(("to", f"<{ruri}>"))
        h.append(("call-id", new_call_id(self.cfg.advertised_host)))
        h.append(("cseq", f"{secrets.randbelow(10_000) + 1} INVITE"))
        h.append(("contact", contact))
        h.append(("allow", ALLOW))
        h.extend(self.dialogs.timers.request_headers())  # RFC 4028 7.1
        h.append(("user-agent", self.cfg.user_agent))
        dialog = Dialog.for_outgoing(inv, contact, dest)
        dialog.transport = transport
        leg = SipCall(self.ctx, call, inv, None, dialog, None, None, secure_signalling=transport == "TLS")
        leg.state = "outgoing"
        call.leg = leg  # a hang-up (shutdown, the ring timeout) reaches the leg: CANCEL
        call.transport_ids = {"sip_call_id": inv.call_id[:128], "direction": "outbound"}
        if isinstance(via, SipTrunk):
            call.transport_ids["sip_trunk"] = via.name
            leg.auth_creds = trunk_credentials(via)
        kept, dropped = checked_params({**(params or {}), "from": dialog.local_uri, "to": ruri,
                                        "direction": "outbound"})  # the gateway's own keys win
        call.params = kept or {}
        call.caller = "brisvox"
        call.called = param_text(uri_number(ruri)) or ""
        if dropped:
            self.counters.count("call_params_dropped", dropped)
        if admitted is not None:
            admitted(call)
        d = Dialing(leg, dest, done, auth=ClientAuth(leg.auth_creds) if leg.auth_creds else None,
                    se_asked=self.cfg.session_expires_s, min_se=self.cfg.min_se_s)
        self.outgoing[inv.call_id] = d
        self.dialogs.add(leg)
        timeout = ring_timeout_s if ring_timeout_s > 0 else self.cfg.dial_ring_timeout_s
        d.ring_timer = self.ctx.loop.call_later(timeout, self._ring_timeout, d)
        self.call_host.spawn(self._place(d))

    def _dial_refused(self, key: str, done: Done, why: str) -> None:
        self.counters.count(f"sip_dial_refused_{key}")
        done(None, why)

    def _fail(self, d: Dialing, reason: str) -> None:
        """The dial failed before an answer: report (once), end the leg (no BYE), release the
        call (an agent side started by early media ends through the leg's end)."""
        if not d.reported:
            self.counters.count(f"sip_dial_failed_{reason.split(':')[0].replace(' ', '_')[:40]}")
        self.outgoing.pop(d.leg.dialog.call_id, None)
        d.report(None, reason)
        leg = d.leg
        if not leg.ended:
            self.dialogs.end(leg, reason, send_bye=False)
        self.call_host.abandon(leg.call)

    async def _place(self, d: Dialing) -> None:
        leg = d.leg
        try:
            await self.rtp_ports.open(leg, self.ctx.loop)
        except Exception:  # OSError (none free) or anything else: the call must not stay
            self.counters.count("rtp_no_port")
            self._fail(d, "no rtp port")
            return
        if leg.ended:  # hung up while we opened the socket
            self._fail(d, d.cancel_reason or "cancelled")
            return
        inv = leg.invite
        inv.headers.append(("content-type", "application/sdp"))
        inv.body = leg.offer_sdp()
        d.sent_at = self.ctx.loop.time()
        d.tx = self.transactions.invite(inv, d.dest, functools.partial(self._invite_event, d))

    def _ms(self, d: Dialing) -> int:
        return max(0, round((self.ctx.loop.time() - d.sent_at) * 1000))

    def _ring_timeout(self, d: Dialing) -> None:
        d.ring_timer = None
        if not d.reported and d.leg.state == "outgoing":
            self.counters.count("sip_dial_ring_timeouts")
            d.leg.call.end_reason = d.leg.call.end_reason or "no answer"
            self.cancel(d.leg, "no answer")

    def cancel(self, leg: SipCall, reason: str) -> None:
        """Our side hangs up an unanswered outbound call: CANCEL (after a provisional)."""
        d = self.outgoing.get(leg.dialog.call_id)
        if d is None:
            self.dialogs.end(leg, reason, send_bye=False)
            return
        d.cancel_reason = d.cancel_reason or reason
        if d.tx is None:  # not sent yet (opening the RTP socket): _place sees the leg ended
            self.dialogs.end(leg, reason, send_bye=False)
        elif d.provisional:
            self._send_cancel(d)

    def _send_cancel(self, d: Dialing) -> None:
        if d.cancel_sent or d.tx is None:
            return
        d.cancel_sent = True
        inv = d.leg.invite
        req = SipMessage(method="CANCEL", uri=inv.uri)
        for k in ("via", "max-forwards", "from", "to", "call-id"):
            req.headers.append((k, inv.get(k)))
        req.headers.append(("cseq", f"{inv.cseq[0]} CANCEL"))
        self.counters.count("sip_dial_cancel_sent")
        self.transactions.request(req, d.dest, self._cancel_result)

    def _invite_event(self, d: Dialing, a: Action) -> None:
        if isinstance(a, TimedOut):
            if not d.leg.ended or not d.reported:
                self._fail(d, d.cancel_reason or "timeout")
            return
        if not isinstance(a, Deliver):
            return
        resp = a.msg
        st = resp.status
        if st < 200:
            self.counters.count("sip_dial_provisional")
            d.provisional = True
            if d.cancel_reason:
                self._send_cancel(d)
            elif st >= 180 and not d.leg.ended:
                self._progress(d, resp)
            return
        if st in (401, 407) and d.auth is not None and not d.reported and not d.cancel_reason:
            self._answer_challenge(d, resp)
            return
        if st == 422 and not d.reported and not d.cancel_reason and self._retry_422(d, resp):
            return
        if st >= 300:
            if not d.leg.ended or not d.reported:
                self._fail(d, d.cancel_reason if (d.cancel_reason and st == 487) else failure_reason(st, resp.reason))
            return
        if d.ack:  # a retransmitted 2xx: the same ACK again
            self.transactions.send(d.ack, d.ack_addr, d.leg.dialog.transport)
            return
        self._answered(d, resp)

    def _progress(self, d: Dialing, resp: SipMessage) -> None:
        """A 18x: ringing; with a usable SDP, early media (see the module docstring)."""
        now = self._ms(d)
        if d.ringing_ms is None:
            d.ringing_ms = now
        if not resp.body or resp.get("content-type").split(";")[0].strip().lower() != "application/sdp":
            return
        leg = d.leg
        try:
            neg = negotiate(sdp.parse(resp.body), self.ctx, d.dest, secure=leg.secure_signalling,
                            offered=leg.offered or ())
        except sdp.SdpError as e:
            self.counters.count("sip_dial_bad_early_sdp")
            sdp_refusal(self.counters, e, f"{resp.status}", d.dest[0])
            return
        if d.progress_ms is None:
            d.progress_ms = now
        d.early_tag = resp.to_tag
        if neg == d.early_neg:
            return  # the same early answer again (a repeated 183)
        d.early_neg = neg
        leg.start_early_media(neg)
        if d.agent:
            return
        self.counters.count("sip_dial_early_media")
        d.agent = "starting"
        self.call_host.media_state(leg.call, MEDIA_EARLY)
        self.call_host.start_call(leg.call, leg, functools.partial(self._dial_ready, d))

    def _answer_challenge(self, d: Dialing, resp: SipMessage) -> None:
        """Send the INVITE again with the trunk's credentials (its CSeq advanced, a new branch and
        transaction; the challenged one ACKed its 401/407 itself), or fail the dial with why."""
        assert d.auth is not None
        leg = d.leg
        again, why = d.auth.retry(leg.invite, resp)
        if again is None:
            self.counters.log_limit("sip_auth_client", "dial %s: %s", leg.dialog.remote_uri[:80], why,
                                    level=logging.WARNING)
            self._fail(d, why)
            return
        self.counters.count("sip_auth_answered")
        leg.invite = again
        leg.dialog.local_cseq = again.cseq[0]
        d.provisional = False
        d.tx = self.transactions.invite(again, d.dest, functools.partial(self._invite_event, d))

    def _retry_422(self, d: Dialing, resp: SipMessage) -> bool:
        """RFC 4028 7.3: the INVITE again, once, asking for the 422's ``Min-SE`` (the same Call-ID
        and From tag, the CSeq advanced, a new branch and transaction); False: not retried."""
        again = session_timer.uac_after_422(resp, d.se_asked, d.min_se)
        self.counters.count("sip_session_422_received")
        if d.retried_422 or again is None:
            return False
        d.retried_422 = True
        d.se_asked, d.min_se = again
        if d.auth is not None:
            d.auth.reset()  # a new request: its challenge is answered afresh
        leg = d.leg
        inv = resend(leg.invite, "min-se", str(d.min_se))
        inv.set("session-expires", str(d.se_asked))
        leg.invite = inv
        leg.dialog.local_cseq = inv.cseq[0]
        d.provisional = False
        d.tx = self.transactions.invite(inv, d.dest, functools.partial(self._invite_event, d))
        return True

    def _answered(self, d: Dialing, resp: SipMessage) -> None:
        leg = d.leg
        leg.dialog.answered(resp)
        ack = leg.dialog.request("ACK", self.transactions.via_host_for(leg.dialog.transport), cseq=leg.invite.cseq[0])
        d.ack = ack.serialize()
        hop = self.ctx.destination(leg.dialog.next_hop(), d.dest)
        refused = ""
        if hop is None:  # the 2xx's Contact / Record-Route names an address outside allow: never sent there
            refused = "destination not allowed"
            self.counters.refuse("destination", "dial %s: the 2xx names %s, not in [sip] allow", d.dest[0],
                                 leg.dialog.next_hop()[0])
        d.ack_addr = hop or d.dest  # the ACK and BYE of a refused answer go where we sent the INVITE
        self.transactions.send(d.ack, d.ack_addr, leg.dialog.transport)
        self.outgoing.pop(leg.dialog.call_id, None)
        leg.state = "confirmed"
        leg.last_rx = self.ctx.loop.time()
        if refused or d.cancel_reason or leg.ended or d.reported:  # answered while we cancelled: end it with BYE
            reason = refused or d.cancel_reason or "cancelled"
            self.counters.count("sip_dial_failed_destination" if refused else "sip_dial_answered_after_cancel")
            bye = leg.dialog.request("BYE", self.transactions.via_host_for(leg.dialog.transport),
                                     extra=[("reason", bye_reason(reason))])
            self.transactions.request(bye, d.ack_addr, self._bye_result)
            if not leg.ended:
                self.dialogs.end(leg, reason, send_bye=False)
            d.report(None, reason)
            self.call_host.abandon(leg.call)
            return
        try:
            if resp.body and resp.get("content-type").split(";")[0].strip().lower() == "application/sdp":
                neg = negotiate(sdp.parse(resp.body), self.ctx, d.dest, secure=leg.secure_signalling,
                                offered=leg.offered or ())
            elif d.early_neg is not None and resp.to_tag == d.early_tag:
                neg = d.early_neg  # the answer came in this dialog's 18x
            else:
                raise sdp.SdpError("the 2xx carries no SDP answer")
        except sdp.SdpError as e:
            self.counters.count("sip_dial_bad_answer")
            sdp_refusal(self.counters, e, "2xx", d.dest[0])
            self.dialogs.end(leg, "incompatible media", send_bye=True)
            self.counters.count("sip_dial_failed_incompatible_media")
            d.report(None, f"incompatible media: {str(e)[:80]}")
            self.call_host.abandon(leg.call)
            return
        leg.offer = None
        leg.end_early_media(neg)
        timers = self.dialogs.timers
        timers.open(leg, owner=True, peer=resp, local_sdp=leg.invite.body, min_se=d.min_se)
        timers.dial_answered(leg, resp, d.se_asked)  # RFC 4028 7.2
        d.answered_ms = self._ms(d)
        self.call_host.media_state(leg.call, MEDIA_ANSWERED,
                                   {k: v for k, v in d.times().items() if v is not None})
        if not d.agent:
            d.agent = "starting"
            self.call_host.start_call(leg.call, leg, functools.partial(self._dial_ready, d))
        elif d.agent == "ready":  # early media started it
            self._report_answered(d)

    def _dial_ready(self, d: Dialing, ok: bool, why: str) -> None:
        leg = d.leg
        if not ok:
            self.counters.count("sip_dial_failed_agent_unavailable")
            d.report(None, f"agent unavailable: {why}"[:120])
            if leg.state == "outgoing":  # during early media: the dial is given up
                self.cancel(leg, "agent unavailable")
            else:
                self.dialogs.end(leg, "agent unavailable", send_bye=True)
            return
        d.agent = "ready"
        if leg.state == "outgoing" and not leg.ended:
            return  # early media: reported at the answer
        self._report_answered(d)

    def _report_answered(self, d: Dialing) -> None:
        leg = d.leg
        if leg.ended:  # the callee hung up while the agent side started
            d.report(None, f"ended: {leg.call.end_reason or 'bye'}")
            return
        self.counters.count("sip_dial_answered")
        d.report({"call_id": leg.call.call_id, "sip_call_id": leg.dialog.call_id, "agent": leg.call.agent,
                  "target": leg.dialog.remote_uri, "codec": leg.codec.name if leg.codec else "",
                  "srtp": leg.srtp.suite if leg.srtp is not None else "", **d.times()}, "")
