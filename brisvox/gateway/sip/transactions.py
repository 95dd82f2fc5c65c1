"""The SIP transaction layer (RFC 3261 section 17 over UDP): the socket, transactions, timers, limits.

Owns :class:`SipTransactions`, the transport-facing half of the SIP user
agent (:class:`~brisvox.gateway.sip.ua.SipUserAgent`): the UDP endpoint,
every datagram's allow-list check and parse (malformed ones answered 400 or
513 statelessly), the server and client transaction tables (the state
machines are :mod:`brisvox.wire.sip_transaction`) and their one timer, the
rate limits and the table bound that refuse a new request before it costs
a transaction, and matching responses to client transactions. Above it is
the transaction user (:class:`TransactionUser`, the user agent), which gets
each new request with its server transaction; the call-facing side (the
dialog layer, the dialer) sees it only as :class:`TransactionLayer`, and it
knows nothing of calls or dialogs (the seam: the user agent's docstring).

Invariants:

* Sources outside ``[sip] allow`` are dropped before parsing and counted
  (``sip_refused_allowlist``).
* A malformed datagram costs one parse, a counter and at most one log line
  per kind per minute (no traceback); it never reaches the transaction
  user. Answerable ones get 400 (513 when over ``max_message_bytes``),
  statelessly, counted ``sip_refused_malformed`` / ``sip_refused_too_large``.
* An exception while the transaction user handles one message is counted
  (``sip_internal_errors``) and logged bounded, with its type and place
  instead of a traceback; it ends nothing else.
* A retransmitted request is absorbed by its live transaction (the last
  response again) and never reaches the transaction user twice; an ACK
  goes to the transaction user first (a 2xx's ACK is end to end), then,
  unclaimed, to the INVITE transaction of the same branch (a non-2xx's).
* Admission of a new request (not ACK, not a retransmission), in this
  order, each refusal answered statelessly (no transaction, no call) and
  counted ``sip_refused_<reason>`` (:class:`~brisvox.gateway.sip.guard.Refusal`):
  its source over the rate limit of its kind
  (:func:`~brisvox.gateway.sip.guard.rate_kind`: ``invite_rate``,
  ``options_rate``, ``other_rate``) 503 ``rate_limit``; the RFC 3261
  stateless answers (:func:`~brisvox.gateway.sip.guard.stateless_refusal`:
  501, 483, 481, 405 -- a retransmission gets the same answer again); the
  table at ``max_transactions`` 503 ``tx_table_full``; its source holding
  its share of the table (``[sip] max_transactions_per_source``,
  :class:`~brisvox.gateway.sip.guard.TransactionShares`) 503
  ``tx_source_full``. A 503 past the source's ``refusal_rate`` is not sent
  (``sip_refused_flood`` instead). Only then a server transaction is made.
* The per-source limits key on the caller's address
  (:meth:`SipTransactions.caller_host`): the packet's source, or, when that
  source is one of ``[sip] trusted_proxies``, the caller the proxy's Vias
  name (:func:`brisvox.gateway.proxies.via_client`); from any other source a
  Via is never believed.
* Responses go where RFC 3261 18.2.2 (with RFC 3581 ``rport``) says: to the
  sender of the request, a trusted proxy included (its Via is the top one).
* Every transaction timer is on the loop clock, and the layer has ONE pending
  loop timer for all transactions (a heap of deadlines; a stale heap entry
  is skipped, not removed).
* A finished transaction is forgotten at once (tables and callbacks), so
  the tables hold only live transactions.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import socket
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from brisvox.gateway.config import SipConfig
from brisvox.gateway.proxies import FORWARDED, MALFORMED, TrustedProxies, via_client
from brisvox.gateway.sip.counters import SipCounters
from brisvox.gateway.sip.guard import (
    Refusal,
    SipGuard,
    TransactionShares,
    rate_kind,
    stateless_refusal,
)
from brisvox.gateway.sip.streams import SipStreams, StreamConn
from brisvox.wire.sip_dialog import make_response
from brisvox.wire.sip_message import SipMessage, SipParseError, parse, parse_name_addr, parse_uri
from brisvox.wire.sip_stream import FramingError
from brisvox.wire.sip_transaction import (
    Action,
    Addr,
    ClientInvite,
    ClientNonInvite,
    Retransmit2xx,
    Send,
    ServerInvite,
    ServerNonInvite,
    TimedOut,
    Timers,
    Transaction,
)

log = logging.getLogger("brisvox.gateway.sip")

_COUNTED = {"INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "NOTIFY", "REFER", "UPDATE"}
Callback = Callable[[Action], None]


class TransactionUser(Protocol):
    """What the transaction layer hands up: new requests, each with its server transaction."""

    def on_invite(self, req: SipMessage, addr: Addr, tx: ServerInvite) -> None: ...

    def on_request(self, req: SipMessage, tx: ServerNonInvite) -> None:
        """A new non-INVITE request (not ACK): answer it in ``tx``."""

    def on_ack(self, req: SipMessage, addr: Addr) -> bool:
        """An ACK: True when it was a dialog's (a 2xx's); else it is the non-2xx's of its INVITE."""

    def in_dialog(self, req: SipMessage) -> bool:
        """Whether a dialog of ours matches the request's Call-ID and To tag (nothing taken)."""


class TransactionLayer(Protocol):
    """What the call-facing side (dialogs, the dialer) may ask of the transaction layer."""

    @property
    def started(self) -> bool: ...

    @property
    def via_host(self) -> str:
        """``host:port`` for the Via of a request we send."""

    @property
    def contact(self) -> str:
        """Our Contact (name-addr)."""

    def via_host_for(self, transport: str) -> str:
        """``host:port`` for the Via of a request we send over ``transport`` (UDP, TCP, TLS)."""
        ...

    @property
    def stream_transports(self) -> tuple[str, ...]:
        """The stream transports we listen on ("TCP", "TLS"): the ones a dialog may use."""
        ...

    def stream_ping(self, transport: str, addr: Addr) -> Any:
        """An RFC 5626 keepalive ping on the connection to ``addr``: a token, or None (no connection)."""
        ...

    def stream_ponged(self, token: Any) -> bool:
        """Whether that ping was answered on a connection still open."""
        ...

    def contact_for(self, transport: str) -> str:
        """Our Contact for a dialog over ``transport``."""
        ...

    def respond(self, tx: ServerInvite | ServerNonInvite, req: SipMessage, status: int, reason: str = "",
                **kw: Any) -> None: ...

    def accept(self, tx: ServerInvite, req: SipMessage, cb: Callback, **kw: Any) -> Retransmit2xx:
        """Answer ``tx`` 200 and retransmit that until :meth:`acked` (``cb`` gets the TimedOut)."""

    def acked(self, retx: Retransmit2xx) -> None: ...

    def caller_of(self, req: SipMessage, src: str) -> str:
        """The caller's address behind a trusted proxy (the per-source key), else ``src``; counts nothing."""
        ...

    def watch(self, tx: Transaction, cb: Callback) -> None:
        """Hand ``tx``'s events (Deliver, TimedOut) to ``cb`` from now on."""

    def request(self, req: SipMessage, hop: Addr, cb: Callback) -> None:
        """Send a non-INVITE request in a new client transaction; ``cb`` gets its events."""

    def invite(self, req: SipMessage, dest: Addr, cb: Callback) -> ClientInvite:
        """Send an INVITE in a new client transaction; ``cb`` gets every response, Timer B."""

    def send(self, data: bytes, addr: Addr, transport: str = "UDP") -> None:
        """One message outside any transaction (the ACK of a 2xx), over ``transport``."""

    def arrived_over(self, tx: Transaction) -> str:
        """The transport a server transaction's request came over ("UDP", "TCP", "TLS"): the
        connection's own, never what the request's Via claims."""
        ...


def timeout_counter(counters: SipCounters, name: str) -> Callback:
    """A transaction callback that only counts ``name`` when the transaction times out."""

    def on_action(a: Action) -> None:
        if isinstance(a, TimedOut):
            counters.count(name)

    return on_action


class SipTransactions(asyncio.DatagramProtocol):
    """The UDP endpoint, transactions and timers of the SIP user agent (see the module docstring)."""

    def __init__(self, cfg: SipConfig, guard: SipGuard, counters: SipCounters, tu: TransactionUser,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.guard = guard
        self.counters = counters
        self.tu = tu
        self.loop = loop
        self.timers = Timers(cfg.t1_ms / 1000, cfg.t2_ms / 1000, cfg.t4_ms / 1000)
        self.reliable_timers = Timers(cfg.t1_ms / 1000, cfg.t2_ms / 1000, cfg.t4_ms / 1000, reliable=True)
        # SIP over TCP/TLS ([[sip.listeners]]): whole messages come into the same intake
        self.streams = SipStreams(cfg, guard.allowed, counters, self._intake, self._stream_refused, loop)
        # transaction -> how its sends go: ("UDP", None), or a stream transport and the connection
        self._tx_flow: dict[int, tuple[str, StreamConn | None]] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.proxies = TrustedProxies(cfg.trusted_proxies)
        self.server_tx: dict[tuple, Transaction] = {}
        self.shares = TransactionShares(cfg.transactions_per_source)  # who holds server_tx
        self.client_tx: dict[tuple, ClientNonInvite | ClientInvite] = {}
        self._tx_cb: dict[int, Callback] = {}
        self._heap: list[tuple[float, int, Transaction]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.host = cfg.host
        self.port = cfg.port

    # -- setup -----------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        transport, _ = await self.loop.create_datagram_endpoint(lambda: self, local_addr=(self.cfg.host, self.cfg.port))
        self.transport = transport
        self.host, self.port = transport.get_extra_info("sockname")[:2]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, 1 << 20)
                except OSError:
                    pass
        if self.cfg.listeners:
            await self.streams.start()
        return self.host, self.port

    def close(self) -> None:
        self.streams.close()
        if self._timer is not None:
            self._timer.cancel()
        if self.transport is not None:
            self.transport.close()

    @property
    def started(self) -> bool:
        return self.transport is not None

    @property
    def via_host(self) -> str:
        return f"{self.cfg.advertised_host}:{self.port}"

    @property
    def contact(self) -> str:
        return f"<sip:brisvox@{self.cfg.advertised_host}:{self.port}>"

    @property
    def stream_transports(self) -> tuple[str, ...]:
        return tuple(self.streams.ports)

    def stream_ping(self, transport: str, addr: Addr) -> Any:
        """A CRLFCRLF keepalive on the connection to ``addr`` (a token, or None: no connection)."""
        return self.streams.ping(transport, addr)

    def stream_ponged(self, token: Any) -> bool:
        return self.streams.ponged(token)

    def via_host_for(self, transport: str) -> str:
        """``host:port`` for the Via of a request we send over ``transport`` ("UDP", "TCP", "TLS")."""
        port = self.streams.ports.get(transport, self.port) if transport != "UDP" else self.port
        return f"{self.cfg.advertised_host}:{port}"

    def contact_for(self, transport: str) -> str:
        """Our Contact for a dialog over ``transport`` (``;transport=tcp|tls`` on a stream)."""
        if transport == "UDP" or transport not in self.streams.ports:
            return self.contact
        return f"<sip:brisvox@{self.via_host_for(transport)};transport={transport.lower()}>"

    def stats(self) -> dict[str, int]:
        return {"sip_server_transactions": len(self.server_tx), "sip_client_transactions": len(self.client_tx),
                "sip_server_transaction_sources": self.shares.sources(), **self.streams.stats()}

    # -- receive ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def error_received(self, exc: Exception) -> None:
        self.counters.count("sip_socket_errors")

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        if not self.guard.allowed(addr[0]):
            self.counters.count("sip_refused_allowlist")
            self.counters.log_limit("sip_allowlist", "SIP from %s dropped: not in [sip] allow", addr[0],
                                    level=logging.INFO)
            return
        if not data.strip():
            return  # CRLF keep-alive
        self._intake(data, addr, "UDP", None)

    def _stream_refused(self, e: FramingError, conn: StreamConn) -> None:
        """A stream that cannot be framed: 513 / 400 when its head can be answered (then it closes)."""
        if not e.head:
            return
        try:
            msg: SipMessage | None = parse(e.head + b"\r\n", 1 << 16)
        except SipParseError as pe:  # the body the head announces is not there: its headers still are
            msg = pe.msg if pe.can_reply else None
        if msg is not None and msg.is_request and msg.method != "ACK":
            too_large = e.kind == "oversized"
            self.counters.count("sip_refused_too_large" if too_large else "sip_refused_malformed")
            self._stateless(msg, 513 if too_large else 400, conn.peer, "" if too_large else "Content-Length",
                            flow=(conn.name, conn))

    def _intake(self, data: bytes, addr: Addr, transport: str, conn: StreamConn | None) -> None:
        """One message from UDP (a datagram) or a stream (framed by :mod:`brisvox.gateway.sip.streams`)."""
        count = self.counters.count
        flow = (transport, conn)
        try:
            msg = parse(data, self.cfg.max_message_bytes)
        except SipParseError as e:
            count(f"sip_malformed_{e.kind}")
            self.counters.log_limit(f"sip_malformed_{e.kind}", "malformed SIP from %s: %s", addr[0],
                                    e.detail[:120], level=logging.INFO)
            if e.can_reply and e.msg is not None and e.msg.method != "ACK":
                too_large = e.kind == "oversized"
                count("sip_refused_too_large" if too_large else "sip_refused_malformed")
                self._stateless(e.msg, 513 if too_large else 400, self._reply_addr(e.msg, addr, conn),
                                "" if too_large else e.detail[:60], flow=flow)
            return
        try:
            if msg.is_request:
                count(f"sip_requests_{msg.method if msg.method in _COUNTED else 'other'}")
                if conn is not None:
                    self._alias(msg, conn)
                self._on_request(msg, addr, flow)
            else:
                self._on_response(msg, addr)
        except Exception as e:
            count("sip_internal_errors")
            frames = traceback.extract_tb(e.__traceback__)
            where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
            self.counters.log_limit("sip_internal", "SIP %s from %s failed: %s: %s (at %s)",
                                    msg.method or msg.status, addr[0], type(e).__name__, str(e)[:200], where,
                                    level=logging.ERROR)

    def _alias(self, req: SipMessage, conn: StreamConn) -> None:
        """A stream peer's Via sent-by and Contact address: requests to them reuse its connection."""
        try:
            via = req.top_via
            self.streams.alias(conn, (via.host, via.port or 5060))
            contact = req.get("contact")
            if contact:
                u = parse_uri(parse_name_addr(contact).uri)
                self.streams.alias(conn, (u.host, u.port or 5060))
        except ValueError:
            pass

    def _on_request(self, req: SipMessage, addr: Addr, flow: tuple[str, StreamConn | None] = ("UDP", None)) -> None:
        method = req.method
        if method == "ACK":
            if not self.tu.on_ack(req, addr):
                inv = self.invite_for(req)  # the ACK of a non-2xx final: same branch as the INVITE
                if inv is not None:
                    inv.on_ack(self.loop.time())
                    self._schedule(inv)
            return
        key = self._tx_key(req)
        old = self.server_tx.get(key)
        if old is not None:
            self.counters.count("sip_retransmissions_in")
            self._perform(old, old.on_retransmit(self.loop.time()))  # type: ignore[attr-defined]
            return
        reply_to = self._reply_addr(req, addr, flow[1])
        caller = self.caller_host(req, addr[0])  # behind a trusted proxy: the caller it names
        refusal = self._admission(req, caller)
        if refusal is not None:
            self._refuse(req, reply_to, caller, refusal, flow)
            return
        timers = self.timers if flow[1] is None else self.reliable_timers
        tx: ServerInvite | ServerNonInvite
        tx = ServerInvite(key, reply_to, timers) if method == "INVITE" else ServerNonInvite(key, reply_to, timers)
        if flow[1] is not None:
            self._tx_flow[id(tx)] = flow
        self.server_tx[key] = tx
        self.shares.take(key, caller)
        self._track(tx)
        if isinstance(tx, ServerInvite):
            self.tu.on_invite(req, addr, tx)
        else:
            self.tu.on_request(req, tx)

    def _admission(self, req: SipMessage, caller: str) -> Refusal | None:
        """Why a new request from ``caller`` gets no transaction (the order: the module docstring)."""
        method, to_tag = req.method, req.to_tag
        retry = self.guard.admit(rate_kind(method, to_tag), caller)
        if retry:
            return Refusal(503, "rate_limit", "Rate Limited", (("retry-after", str(retry)),))
        refusal = stateless_refusal(
            method, to_tag, bool(to_tag) and method != "CANCEL" and self.tu.in_dialog(req),
            method == "CANCEL" and self.invite_for(req) is not None, req.get("max-forwards") == "0")
        if refusal is not None:
            return refusal
        if len(self.server_tx) >= self.cfg.max_transactions:
            return Refusal(503, "tx_table_full", "", (("retry-after", "5"),))
        if self.shares.full(caller):
            return Refusal(503, "tx_source_full", "", (("retry-after", "5"),))
        return None

    def _refuse(self, req: SipMessage, reply_to: Addr, caller: str, refusal: Refusal,
                flow: tuple[str, StreamConn | None] = ("UDP", None)) -> None:
        """Answer ``refusal`` statelessly, counted and logged bounded; a 503 past the caller's
        ``refusal_rate`` is dropped instead (``sip_refused_flood``)."""
        if refusal.status == 503 and not self.guard.answer_refusal(caller):
            self.counters.refuse("flood", "%s from %s dropped unanswered (%s, past refusal_rate)",
                                 req.method, caller, refusal.reason)
            return
        self.counters.refuse(refusal.reason, "%s from %s answered %d (%d server transactions, %d of them its)",
                             req.method, caller, refusal.status, len(self.server_tx), self.shares.held(caller))
        self._stateless(req, refusal.status, reply_to, refusal.phrase, extra=list(refusal.extra), flow=flow)

    def _on_response(self, resp: SipMessage, addr: Addr) -> None:
        try:
            via = resp.top_via
            _, method = resp.cseq
        except ValueError:
            self.counters.count("sip_malformed_response")
            return
        tx = self.client_tx.get((via.branch, method))
        if tx is None:
            self.counters.count("sip_stray_responses")
            return
        self._perform(tx, tx.on_response(resp, self.loop.time()))
        self._schedule(tx)

    def caller_host(self, req: SipMessage, src: str) -> str:
        """The caller's address, the key of the per-source limits: ``src`` (the packet's
        source), unless ``src`` is a trusted proxy and its Vias name the caller (counted
        ``sip_proxied_requests``; a Via that names no IP address: ``src``, counted
        ``sip_proxied_bad_via``)."""
        if not self.proxies:
            return src
        host, how = via_client(self.proxies, src, req.get_all("via"))
        if how == FORWARDED:
            self.counters.count("sip_proxied_requests")
        elif how == MALFORMED:
            self.counters.count("sip_proxied_bad_via")
            self.counters.log_limit("sip_proxied_bad_via", "SIP %s from trusted proxy %s: no caller address "
                                    "in its Vias, limited as the proxy's own", req.method, src, level=logging.INFO)
        return host

    def caller_of(self, req: SipMessage, src: str) -> str:
        """What :meth:`caller_host` names, counting nothing (the dialog layer's per-source call
        cap asks again for a request the intake already counted)."""
        return via_client(self.proxies, src, req.get_all("via"))[0] if self.proxies else src

    def invite_for(self, req: SipMessage) -> ServerInvite | None:
        """The INVITE server transaction a CANCEL or an ACK names (its branch), if live."""
        tx = self.server_tx.get(self._tx_key(req, "INVITE"))
        return tx if isinstance(tx, ServerInvite) else None

    def _reply_addr(self, req: SipMessage, src: Addr, conn: StreamConn | None = None) -> Addr:
        """18.2.2 with RFC 3581: answer where the request came from when rport is asked or the
        sent-by is not an address we can use; else to sent-by. On a stream: the connection."""
        if conn is not None:
            return src
        try:
            via = req.top_via
        except ValueError:
            return src
        if "rport" in via.params or via.host != src[0]:
            return src
        return via.host, via.port or 5060

    def _tx_key(self, req: SipMessage, method: str | None = None) -> tuple:
        via = req.top_via
        m = method or req.method
        if m == "ACK":
            m = "INVITE"
        if via.branch.startswith("z9hG4bK"):
            return (via.branch, via.host, via.port, m)
        return (req.call_id, req.from_tag, req.cseq[0], via.host, via.port, m)

    # -- server side -------------------------------------------------------------------------

    def respond(self, tx: ServerInvite | ServerNonInvite, req: SipMessage, status: int, reason: str = "",
                **kw: Any) -> None:
        """Send a response in ``tx`` (retransmitted, absorbed and timed by it)."""
        resp = make_response(req, status, reason, server=self.cfg.user_agent, **kw)
        self._perform(tx, tx.respond(resp, self.loop.time()))
        self._schedule(tx)
        if tx.done:
            self._forget(tx)

    def accept(self, tx: ServerInvite, req: SipMessage, cb: Callback, **kw: Any) -> Retransmit2xx:
        """Answer ``tx`` 200 (``kw``: its headers and body) and retransmit the 200 as the UAS
        core does (13.3.1.4) until :meth:`acked`; ``cb`` gets its TimedOut (no ACK)."""
        resp = make_response(req, 200, server=self.cfg.user_agent, **kw)
        data = resp.serialize()
        now = self.loop.time()
        self._perform(tx, tx.respond(resp, now))
        self._schedule(tx)
        retx = Retransmit2xx(("2xx", req.call_id, req.cseq[0]), tx.addr, self.timers, data, now)
        if id(tx) in self._tx_flow:
            self._tx_flow[id(retx)] = self._tx_flow[id(tx)]
        self._track(retx, cb)
        return retx

    def acked(self, retx: Retransmit2xx) -> None:
        """Stop retransmitting a 2xx (its ACK came, or the dialog is over)."""
        retx.acked()
        self._forget(retx)

    def watch(self, tx: Transaction, cb: Callback) -> None:
        self._track(tx, cb)

    def _stateless(self, req: SipMessage, status: int, addr: Addr, reason: str = "",
                   extra: list[tuple[str, str]] | None = None,
                   flow: tuple[str, StreamConn | None] = ("UDP", None)) -> None:
        """A response outside any transaction (refusals that must cost no state)."""
        data = make_response(req, status, reason, server=self.cfg.user_agent, extra=extra).serialize()
        self._send_flow(data, addr, flow)

    # -- client side -------------------------------------------------------------------------

    def request(self, req: SipMessage, hop: Addr, cb: Callback) -> None:
        """A non-INVITE request over the transport its top Via names (a stream: the connection
        ``hop`` names, opened by the peer)."""
        transport = req.top_via.transport
        timers = self.timers if transport == "UDP" else self.reliable_timers
        tx = ClientNonInvite((req.top_via.branch, req.method), hop, timers, req)
        if transport != "UDP":
            self._tx_flow[id(tx)] = (transport, None)
        self._start_client(tx, cb)

    def invite(self, req: SipMessage, dest: Addr, cb: Callback) -> ClientInvite:
        transport = req.top_via.transport
        tx = ClientInvite((req.top_via.branch, "INVITE"), dest,
                          self.timers if transport == "UDP" else self.reliable_timers, req)
        if transport != "UDP":
            self._tx_flow[id(tx)] = (transport, None)
        self._start_client(tx, cb)
        return tx

    def _start_client(self, tx: ClientNonInvite | ClientInvite, cb: Callback) -> None:
        self.client_tx[tx.key] = tx
        self._tx_cb[id(tx)] = cb
        self._perform(tx, tx.start(self.loop.time()))
        self._schedule(tx)

    def send(self, data: bytes, addr: Addr, transport: str = "UDP") -> None:
        self._send_flow(data, addr, (transport, None))

    def arrived_over(self, tx: Transaction) -> str:
        flow = self._tx_flow.get(id(tx))
        return flow[1].name if flow is not None and flow[1] is not None else "UDP"

    def _send_flow(self, data: bytes, addr: Addr, flow: tuple[str, StreamConn | None]) -> None:
        if flow[0] != "UDP":
            self.streams.send(data, addr, flow[0], flow[1])
        elif self.transport is not None:
            self.transport.sendto(data, addr)

    # -- timers and actions ------------------------------------------------------------

    def _track(self, tx: Transaction, cb: Callback | None = None) -> None:
        if cb is not None:
            self._tx_cb[id(tx)] = cb
        self._schedule(tx)

    def _schedule(self, tx: Transaction) -> None:
        if tx.deadline is None:
            return
        heapq.heappush(self._heap, (tx.deadline, next(self._seq), tx))
        if self._timer is None or tx.deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = tx.deadline
            self._timer = self.loop.call_at(tx.deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self.loop.time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, _, tx = heapq.heappop(heap)
            if tx.deadline != deadline or tx.done:
                continue
            self._perform(tx, tx.on_timer(now))
            if tx.done:
                self._forget(tx)
            else:
                self._schedule(tx)
        if heap and self._timer is None:
            self._timer_at = heap[0][0]
            self._timer = self.loop.call_at(self._timer_at, self._on_timer)

    def _perform(self, tx: Transaction, actions: list[Action]) -> None:
        flow = self._tx_flow.get(id(tx), ("UDP", None))
        for a in actions:
            if isinstance(a, Send):
                self._send_flow(a.data, a.addr, flow)
            else:
                cb = self._tx_cb.get(id(tx))
                if cb is not None:
                    cb(a)

    def _forget(self, tx: Transaction) -> None:
        self._tx_cb.pop(id(tx), None)
        self._tx_flow.pop(id(tx), None)
        if isinstance(tx, (ClientNonInvite, ClientInvite)):
            if self.client_tx.get(tx.key) is tx:
                del self.client_tx[tx.key]
        elif self.server_tx.get(tx.key) is tx:
            del self.server_tx[tx.key]
            self.shares.release(tx.key)
