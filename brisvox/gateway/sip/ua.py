"""The SIP user agent (server side, UDP): receiving, request dispatch, in-dialog requests, REFER.

Owns :class:`SipUserAgent`, the SIP listener of the transport registry
(section ``[sip]``): every datagram's parse and the request dispatch by
method, OPTIONS, the in-dialog requests INFO (dtmf-relay, dtmf) and NOTIFY (for
our REFER), and REFER (the agent's Transfer). Its parts, each with its
invariants: :mod:`brisvox.gateway.sip.transactions` (socket, transactions,
timers), :mod:`brisvox.gateway.sip.dialogs` (INVITE, ACK, re-INVITE,
CANCEL, BYE, hang-up), :mod:`brisvox.gateway.sip.outbound` (outbound calls:
``brisvoxd dial``) and :mod:`brisvox.gateway.sip.rtp` (the call leg and
its RTP).

Behaviour (details in docs/PROTOCOL.md): INVITE with an SDP offer (or none:
we offer in the 200 and take the answer from the ACK) -> 100, optional 180,
200 with the answer; 488 when no PCMU/PCMA; 503 when full or draining; 420 for
a required extension; re-INVITE (hold/unhold, new address) answered with the
mirrored direction; BYE both ways; CANCEL -> 200 + 487; OPTIONS -> 200, or 503
"Draining" (Retry-After 30) / "Full" (Retry-After 10) whenever a new INVITE
would be refused now (the call host's admission rule,
:meth:`~brisvox.gateway.core.host.CallHost.refusal`), so a dispatcher in front
(Kamailio) stops sending calls; INFO dtmf-relay and dtmf (a key press);
NOTIFY for our REFER; other known methods 405, unknown ones 501; malformed
requests 400 when they can be answered, else
dropped. All of it counted.

Invariants:

* Sources outside ``[sip] allow`` are dropped before parsing (SIP and RTP)
  and counted.
* A malformed datagram costs one parse, a counter and at most one log line
  per kind per minute (no traceback); it never touches another call and
  never admits one. Answerable ones get 400 (513 when over
  ``max_message_bytes``), statelessly, counted ``sip_refused_malformed`` /
  ``sip_refused_too_large``. Per call, everything buffered is bounded:
  jitter buffer slots, pending client transactions (``MAX_CLIENT_TX``),
  marks and DTMF (core), and the call's rings.
* New INVITEs (no To tag) and OPTIONS over their source's rate limit, and
  any new request while the transaction table is full, get 503 with
  Retry-After before a transaction exists (retransmissions of a live
  transaction are absorbed first and cost no rate). The source is the
  caller's address: the packet's, or the one a trusted proxy's Vias name
  (:meth:`~brisvox.gateway.sip.transactions.SipTransactions.caller_host`).
* An exception while handling one message is counted
  (``sip_internal_errors``) and logged bounded, with its type and place
  instead of a traceback; it ends nothing else.
* Every header value we build from what a model or a caller said is escaped
  (:func:`~brisvox.wire.sip_message.quoted_string`) or refused (a transfer
  target that is not a plain SIP/tel URI).
* A REFER's outcome is reported once: its final response (failure), or the
  NOTIFY that reports the transfer's final status (success hangs the call
  up, "transferred").
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable

from brisvox.gateway.sip.outbound import SipOutbound
from brisvox.gateway.sip.rtp import FRAME, RATE, Addr, RtpProtocol, SipCall
from brisvox.gateway.sip.transactions import MAX_CLIENT_TX
from brisvox.wire import dtmf
from brisvox.wire.sip_message import SipMessage, SipParseError, is_digits, parse, parse_uri
from brisvox.wire.sip_transaction import Action, Deliver, ServerInvite, ServerNonInvite, TimedOut

__all__ = ["FRAME", "MAX_CLIENT_TX", "RATE", "RtpProtocol", "SipCall", "SipUserAgent"]

log = logging.getLogger("brisvox.gateway.sip")

KNOWN_METHODS = {"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "UPDATE", "PRACK", "REFER"}
_COUNTED = {"INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "NOTIFY", "REFER"}
MAX_TARGET = 256
# OPTIONS while a new call would be refused: the reason phrase and Retry-After (s) per refusal
UNAVAILABLE = {"draining": ("Draining", "30"), "full": ("Full", "10")}
_TARGET_RE = re.compile(r"^[!-~]+$")  # printable ASCII, no space


class SipUserAgent(SipOutbound):
    """The SIP endpoint (see the module docstring)."""

    # -- receive ---------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        if not self.allowed(addr[0]):
            self.count("sip_refused_allowlist")
            self.guard.log_limit("sip_allowlist", "SIP from %s dropped: not in [sip] allow", addr[0],
                                 level=logging.INFO)
            return
        if not data.strip():
            return  # CRLF keep-alive
        try:
            msg = parse(data, self.cfg.max_message_bytes)
        except SipParseError as e:
            self.count(f"sip_malformed_{e.kind}")
            self.guard.log_limit(f"sip_malformed_{e.kind}", "malformed SIP from %s: %s", addr[0],
                                 e.detail[:120], level=logging.INFO)
            if e.can_reply and e.msg is not None and e.msg.method != "ACK":
                too_large = e.kind == "oversized"
                self.count("sip_refused_too_large" if too_large else "sip_refused_malformed")
                self._stateless(e.msg, 513 if too_large else 400, self._reply_addr(e.msg, addr),
                                "" if too_large else e.detail[:60])
            return
        try:
            if msg.is_request:
                self.count(f"sip_requests_{msg.method if msg.method in _COUNTED else 'other'}")
                self._on_request(msg, addr)
            else:
                self._on_response(msg, addr)
        except Exception as e:
            self.count("sip_internal_errors")
            frames = traceback.extract_tb(e.__traceback__)
            where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
            self.guard.log_limit("sip_internal", "SIP %s from %s failed: %s: %s (at %s)",
                                 msg.method or msg.status, addr[0], type(e).__name__, str(e)[:200], where,
                                 level=logging.ERROR)


    def _on_request(self, req: SipMessage, addr: Addr) -> None:
        method = req.method
        if method == "ACK":
            self._on_ack(req, addr)
            return
        key = self._tx_key(req)
        old = self.server_tx.get(key)
        if old is not None:
            self.count("sip_retransmissions_in")
            self._perform(old, old.on_retransmit(self.loop.time()))  # type: ignore[attr-defined]
            return
        reply_to = self._reply_addr(req, addr)
        if method == "OPTIONS" or (method == "INVITE" and not req.to_tag):
            caller = self.caller_host(req, addr[0])  # behind a trusted proxy: the caller it names
            retry = self.guard.admit(method, caller)
            if retry:
                self.refuse("rate_limit", "%s from %s over its rate limit", method, caller)
                self._stateless(req, 503, reply_to, "Rate Limited", extra=[("retry-after", str(retry))])
                return
        if len(self.server_tx) >= self.cfg.max_transactions:
            self.refuse("tx_table_full", "%s from %s: %d transactions", method, addr[0], len(self.server_tx))
            self._stateless(req, 503, reply_to, extra=[("retry-after", "5")])
            return
        if method == "INVITE":
            itx = ServerInvite(key, reply_to, self.timers)
            self.server_tx[key] = itx
            self._track(itx)
            if req.get("max-forwards") == "0":
                self._respond(itx, req, 483)
            else:
                self._on_invite(req, addr, itx)
            return
        tx = ServerNonInvite(key, reply_to, self.timers)
        self.server_tx[key] = tx
        self._track(tx)
        if req.get("max-forwards") == "0" and method != "OPTIONS":
            self._respond(tx, req, 483)
            return
        if method == "CANCEL":
            self._on_cancel(req, tx)
        elif method == "OPTIONS":
            refusal = self.call_host.refusal()  # the rule admission applies, nothing taken
            extra = [("accept", "application/sdp"), ("supported", "replaces")]
            if refusal:
                self.count(f"sip_options_{refusal}")
                reason, after = UNAVAILABLE.get(refusal, ("", "10"))
                self._respond(tx, req, 503, reason, extra=[*extra, ("retry-after", after)])
            else:
                self._respond(tx, req, 200, extra=extra)
        elif method in ("BYE", "INFO", "NOTIFY"):
            leg = self._dialog_for(req)
            if leg is None:
                self._respond(tx, req, 481)
            elif not leg.dialog.accept_cseq(req):
                self._respond(tx, req, 500, "CSeq out of order")
            elif method == "BYE":
                self._respond(tx, req, 200)
                self._end_leg(leg, "bye")
            elif method == "INFO":
                self._on_info(leg, req, tx)
            else:
                self._on_notify(leg, req, tx)
        elif method in KNOWN_METHODS:
            self._respond(tx, req, 405)
        else:
            self.count("sip_unknown_method")
            self._respond(tx, req, 501)


    # -- in-dialog requests ------------------------------------------------------------------------

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
                self.refuse("malformed", "bad %s body from %s", kind, leg.dialog.source[0])
                self._respond(tx, req, 400, f"Bad {kind} body")
                return
            self.call_host.dtmf_in(leg.call, digit, dur)
        self._respond(tx, req, 200)

    def _on_notify(self, leg: SipCall, req: SipMessage, tx: ServerNonInvite) -> None:
        self._respond(tx, req, 200)
        if not req.get("event").lower().startswith("refer"):
            return
        frag = req.body.decode("utf-8", "replace").strip().split("\r\n")[0].split("\n")[0]
        parts = frag.split(" ", 2)
        if len(parts) >= 2 and parts[0] == "SIP/2.0" and len(parts[1]) == 3 and is_digits(parts[1]):
            status = int(parts[1])
            if status >= 200:
                self.count("sip_refer_notify_final")
                if status < 300:
                    self.call_host.hangup(leg.call, "transferred")
                elif leg.transfer_done is not None:
                    leg.transfer_done(False, f"transfer failed: {frag[8:60]}")
                    leg.transfer_done = None

    def refer(self, leg: SipCall, target: str, done: Callable[[bool, str], None]) -> None:
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
            host = leg.dialog.next_hop()[0]
            target = f"sip:{target}@{host}"
        try:
            parse_uri(target)
        except ValueError:
            done(False, "invalid target")
            return
        req = leg.dialog.request("REFER", self.via_host, extra=[
            ("refer-to", f"<{target}>"), ("referred-by", f"<{leg.dialog.local_uri}>")])

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
