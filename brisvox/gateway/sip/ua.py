"""The SIP user agent (UDP): the ``[sip]`` listener, built from its layers.

Owns :class:`SipUserAgent`, the SIP listener of the transport registry
(section ``[sip]``): what the gateway core starts (:meth:`~SipUserAgent.start`,
:meth:`~SipUserAgent.shutdown`, :meth:`~SipUserAgent.stats`) and asks to
dial (:meth:`~SipUserAgent.dial`, ``brisvoxd dial``). It holds its parts and
routes between them; each part owns its state and is handed what it needs:

* the transaction layer, :class:`~brisvox.gateway.sip.transactions.SipTransactions`
  (transport-facing): the UDP endpoint, the allow-list and the per-source
  rate limits (:class:`~brisvox.gateway.sip.guard.SipGuard`), every
  datagram's parse, the server and client transactions of RFC 3261 section
  17 with their retransmissions and timers;
* the dialog layer, :class:`~brisvox.gateway.sip.dialogs.SipDialogs`
  (call-facing): inbound INVITE -> call, and ACK, BYE, CANCEL, re-INVITE,
  INFO, NOTIFY and REFER in a dialog, the dialog table;
* the outbound dialer, :class:`~brisvox.gateway.sip.outbound.SipDialer`: the
  UAC INVITE, CANCEL, the ring timeout;
* the RTP sessions, :mod:`brisvox.gateway.sip.rtp`: each call's leg
  (:class:`~brisvox.gateway.sip.rtp.SipCall`) and the port allocator;
* the counters and their bounded log, :class:`~brisvox.gateway.sip.counters.SipCounters`.

The seam between the transaction layer and the dialog layer (RFC 3261's
transaction user): upward, the transaction layer hands the user agent
(:class:`~brisvox.gateway.sip.transactions.TransactionUser`) only requests
that survived the allow-list, the parse, retransmission absorption, the rate
limits, the stateless answers (405, 481, 483, 501: RFC 3261 needs no
transaction for them; the one question it asks the user agent is whether a
dialog matches, ``in_dialog``), the table bound and the source's share of
it, each with its fresh server transaction (``on_invite``, ``on_request``)
or, for an ACK, asks whether a dialog claims it (``on_ack``); responses go
to the callback of their client transaction.
Downward, the dialog layer and the dialer see only
:class:`~brisvox.gateway.sip.transactions.TransactionLayer`: respond in a
server transaction, answer 200 with its retransmission until the ACK, send a
request or an INVITE in a new client transaction, send one datagram, and our
Via host and Contact. Nothing below the seam knows of calls, legs or
dialogs (it keys transactions by branch, answers 400/405/481/483/501/503 itself and
times retransmissions); above it nothing opens a socket, matches a message
to a transaction or runs an RFC 3261 section 17 timer (the dialog layer's
own timers are the ring delay, the dial's ring timeout and each dialog's RFC 4028
session timer, :class:`~brisvox.gateway.sip.session_timers.SessionTimers`, on the loop).
Beside them: :class:`~brisvox.gateway.sip.authenticator.SipAuthenticator`
(``[sip] auth``: every new INVITE is judged in :meth:`SipUserAgent.on_invite`
before the dialog layer sees it), the trunk registrations
(:class:`~brisvox.gateway.sip.registration.TrunkRegistrar`, started with the
listener, removed on drain and shutdown) and, held by each client that sends
a request, :class:`~brisvox.gateway.sip.client_auth.ClientAuth` (a 401/407
answered once per challenge). Where the next pieces go: another transport
(TCP, TLS) below the seam, in the transaction layer, which then also says
the Via's transport (written ``UDP`` today by the dialer, the registrar and
:meth:`~brisvox.wire.sip_dialog.Dialog.request`).

Routing here: an INVITE, an ACK, a CANCEL of a live INVITE and BYE/INFO/NOTIFY/UPDATE
in a dialog of ours go to the dialog layer; OPTIONS is answered here, 200, or 503 "Draining" (Retry-After
30) / "Full" (Retry-After 10) whenever a new INVITE would be refused now (the
call host's admission rule,
:meth:`~brisvox.gateway.core.host.CallHost.refusal`), so a dispatcher in
front (Kamailio) stops sending calls; every other request never gets here
(the transaction layer answered it: other known methods 405, unknown ones
501, no such dialog or INVITE 481). A leg's hang-up goes to the dialer while the outbound INVITE is
unanswered, else to the dialog layer; its transfer to the dialog layer.
Behaviour in detail: docs/PROTOCOL.md.

Invariants (each part states its own):

* Built inside the event loop that runs it (the core builds its listeners
  in its start); every part shares that loop and one set of counters.
* Stopping reports every unanswered dial ``gateway stopped``, closes every
  leg's RTP socket, then the SIP socket and its timer.
* Per call, everything buffered is bounded: jitter buffer slots, pending
  client transactions (:data:`~brisvox.gateway.sip.dialogs.MAX_CLIENT_TX`),
  marks and DTMF (core), and the call's rings; the server transaction
  table holds at most ``[sip] max_transactions``, at most
  ``max_transactions_per_source`` of them one source's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from brisvox.gateway.config import SipConfig
from brisvox.gateway.core.calls import Call
from brisvox.gateway.core.host import CallHost
from brisvox.gateway.sip.authenticator import AuthDecision, SipAuthenticator
from brisvox.gateway.sip.counters import SipCounters
from brisvox.gateway.sip.dialogs import SipDialogs
from brisvox.gateway.sip.guard import IN_DIALOG, SipGuard
from brisvox.gateway.sip.outbound import Done, SipDialer
from brisvox.gateway.sip.registration import TrunkRegistrar
from brisvox.gateway.sip.rtp import Addr, RtpPorts, SipCall, SipContext
from brisvox.gateway.sip.transactions import SipTransactions
from brisvox.wire.sip_message import SipMessage, new_tag
from brisvox.wire.sip_transaction import ServerInvite, ServerNonInvite

__all__ = ["SipUserAgent"]

log = logging.getLogger("brisvox.gateway.sip")

# OPTIONS while a new call would be refused: the reason phrase and Retry-After (s) per refusal
UNAVAILABLE = {"draining": ("Draining", "30"), "full": ("Full", "10")}


class SipUserAgent:
    """The SIP endpoint (see the module docstring)."""

    def __init__(self, call_host: CallHost, cfg: SipConfig) -> None:
        self.call_host = call_host
        self.cfg = cfg
        loop = asyncio.get_event_loop()
        self.counters = SipCounters(log)
        self.guard = SipGuard(cfg.allow, cfg.invite_rate, cfg.options_rate, cfg.other_rate, cfg.refusal_rate)
        self.transactions = SipTransactions(cfg, self.guard, self.counters, self, loop)
        self.rtp_ports = RtpPorts(cfg)
        ctx = SipContext(cfg, call_host, self.counters, loop, self.guard.allowed, self)
        self.dialogs = SipDialogs(ctx, self.transactions, self.rtp_ports)
        self.dialer = SipDialer(ctx, self.transactions, self.dialogs, self.rtp_ports)
        self.auth = SipAuthenticator(cfg)
        self.registrar = TrunkRegistrar(cfg, self.transactions, self.counters, loop)
        self.port = 0  # the UDP listener's, once started

    # -- the listener ------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        host, port = await self.transactions.start()
        self.port = port
        self.registrar.start(self.cfg.advertised_host, port)  # [[sip.trunks]] with register = true
        return host, port

    def reload(self, cfg: SipConfig) -> dict[str, str]:
        """Apply a reloaded ``[sip]``: its ``[[sip.trunks]]`` take effect now (registered again,
        added, changed or removed: :meth:`TrunkRegistrar.reload`; new inbound calls are matched
        and dials placed with them); every other key keeps its running value until the next
        start. Raises ConfigError when the new trunks do not fit the running listeners."""
        merged = dataclasses.replace(self.cfg, trunks=cfg.trunks)  # validated again: a trunk's transport needs its listener
        self.cfg = self.dialogs.cfg = self.dialer.cfg = merged
        return self.registrar.reload(merged, self.cfg.advertised_host, self.port)

    def drain(self) -> None:
        """Remove the trunk registrations (their registrars stop routing calls here)."""
        self.call_host.spawn(self.registrar.stop())

    async def shutdown(self) -> None:
        await self.registrar.stop()  # REGISTER Expires: 0, a bounded wait for the answers
        self.stop()

    def stop(self) -> None:
        self.registrar.close()
        self.dialer.close()
        self.dialogs.close()
        self.transactions.close()

    def stats(self) -> dict[str, Any]:
        out = self.counters.snapshot()
        out.update(self.dialogs.stats())
        out.update(self.transactions.stats())
        out["rtp_ports_in_use"] = len(self.rtp_ports.in_use)
        out.update(self.registrar.stats())
        out.update(self.counters.suppressed())
        return out

    def dial(self, target: str, agent: str, done: Done, ring_timeout_s: float = 0.0, trunk: str = "",
             params: dict[str, str] | None = None, admitted: Callable[[Call], None] | None = None) -> None:
        """Call ``target`` (through ``trunk``, a ``[[sip.trunks]]`` name) with the call parameters
        ``params``; ``done(data, "")`` with the call id once answered, else ``done(None, why)``;
        ``admitted(call)`` once the call is admitted."""
        self.dialer.dial(target, agent, done, ring_timeout_s, trunk, params, admitted)

    # -- the transaction user (requests up from the transaction layer) -----------------------

    def on_invite(self, req: SipMessage, addr: Addr, tx: ServerInvite) -> None:
        """A new INVITE passes ``[sip] auth`` (:class:`SipAuthenticator`) before the dialog layer
        sees it; a re-INVITE (To tag) is the dialog's and is not challenged."""
        if req.to_tag or not self.auth.enabled:
            self.dialogs.on_invite(req, addr, tx)
            return
        caller = self.transactions.caller_of(req, addr[0])
        ours = f'realm="{self.cfg.auth_realm}"'
        creds = next((v for v in req.get_all("authorization") if ours in v), None)
        d = self.auth.judge(creds, req.uri, addr[0], caller, self.transactions.loop.time())
        self.counters.count(f"sip_auth_{d.reason}")
        if d.action == "pass":
            self.dialogs.on_invite(req, addr, tx, d.user)
        else:
            self._refuse_auth(req, caller, tx, d)

    def _refuse_auth(self, req: SipMessage, caller: str, tx: ServerInvite, d: AuthDecision) -> None:
        """401 with a fresh challenge, or 403 past the failure limits; one bounded log line for a
        failure (a first INVITE without credentials and a stale nonce are protocol steps)."""
        if d.reason not in ("no_credentials", "stale"):
            self.counters.log_limit(f"sip_auth_{d.reason}", "SIP INVITE from %s refused: digest %s%s", caller,
                                    d.reason, f" (user {d.user!r})" if d.user else "", level=logging.INFO)
        if d.action == "forbid":
            self.transactions.respond(tx, req, 403, to_tag=new_tag())
        else:
            self.transactions.respond(tx, req, 401, to_tag=new_tag(),
                                      extra=[("www-authenticate", c) for c in d.challenges])

    def on_ack(self, req: SipMessage, addr: Addr) -> bool:
        return self.dialogs.on_ack(req, addr)

    def in_dialog(self, req: SipMessage) -> bool:
        return self.dialogs._dialog_for(req) is not None

    def on_request(self, req: SipMessage, tx: ServerNonInvite) -> None:
        """CANCEL of a live INVITE, OPTIONS, or BYE/INFO/NOTIFY/UPDATE in a dialog of ours: every other
        request was answered statelessly below (:func:`~brisvox.gateway.sip.guard.stateless_refusal`)."""
        method = req.method
        if method == "CANCEL":
            self.dialogs.on_cancel(req, tx, self.transactions.invite_for(req))
        elif method == "OPTIONS":
            self._on_options(req, tx)
        elif method in IN_DIALOG:
            self.dialogs.on_in_dialog(req, tx)
        else:  # not reached: the transaction layer refuses it statelessly
            self.transactions.respond(tx, req, 405)

    def _on_options(self, req: SipMessage, tx: ServerNonInvite) -> None:
        refusal = self.call_host.refusal()  # the rule admission applies, nothing taken
        extra = [("accept", "application/sdp"), ("supported", "replaces, timer")]
        if refusal:
            self.counters.count(f"sip_options_{refusal}")
            reason, after = UNAVAILABLE.get(refusal, ("", "10"))
            self.transactions.respond(tx, req, 503, reason, extra=[*extra, ("retry-after", after)])
        else:
            self.transactions.respond(tx, req, 200, extra=extra)

    # -- the legs' signalling ----------------------------------------------------------------

    def hangup(self, leg: SipCall, reason: str) -> None:
        """Our side ends the call (agent Hangup, shutdown, RTP timeout, transfer done)."""
        if leg.ended:
            return
        if leg.state == "outgoing":  # our INVITE is unanswered: CANCEL it
            self.dialer.cancel(leg, reason)
        else:
            self.dialogs.hangup(leg, reason)

    def refer(self, leg: SipCall, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        self.dialogs.refer(leg, target, done, summary)
