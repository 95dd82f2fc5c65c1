"""The SIP user agent's socket and transactions: timers, responses, client requests.

Owns :class:`SipTransactions`, the base of the SIP user agent
(:class:`~brisvox.gateway.sip.ua.SipUserAgent`): the UDP socket, the source
allow-list, the server and client transaction tables (the state machines are
:mod:`brisvox.wire.sip_transaction`) and their timers, sending a response in
its transaction (:meth:`SipTransactions._respond`), starting a client
request (:meth:`SipTransactions._client_request`) and matching responses to
it, the dialog table and the counters.

Invariants:

* Every transaction timer is on the loop clock, and the UA has ONE pending
  loop timer for all transactions (a heap of deadlines; a stale heap entry
  is skipped, not removed).
* A finished transaction is forgotten at once (tables and callbacks), so
  the tables hold only live transactions; per dialog at most
  ``MAX_CLIENT_TX`` client transactions are pending.
* Responses go where RFC 3261 18.2.2 (with RFC 3581 ``rport``) says: to the
  sender of the request, a trusted proxy included (its Via is the top one).
* The per-source limits key on the caller's address
  (:meth:`SipTransactions.caller_host`): the packet's source, or, when that
  source is one of ``[sip] trusted_proxies``, the caller the proxy's Vias
  name (:func:`brisvox.gateway.proxies.via_client`); from any other source a
  Via is never believed.
* The server transaction table holds at most ``[sip] max_transactions``; a
  new request beyond it, or over its source's rate limit
  (:class:`~brisvox.gateway.sip.guard.SipGuard`), is answered 503 with
  Retry-After statelessly (:meth:`SipTransactions._stateless`: no
  transaction, no call) and counted (``sip_refused_<reason>``).
"""

from __future__ import annotations

import asyncio
import heapq
import ipaddress
import itertools
import logging
import socket
from collections.abc import Callable
from typing import Any

from brisvox.gateway.config import SipConfig
from brisvox.gateway.core.host import CallHost
from brisvox.gateway.sip.guard import SipGuard
from brisvox.gateway.sip.rtp import Addr, RtpPorts, SipCall
from brisvox.gateway.proxies import FORWARDED, MALFORMED, TrustedProxies, via_client
from brisvox.wire.sip_dialog import make_response
from brisvox.wire.sip_message import SipMessage
from brisvox.wire.sip_transaction import (
    Action,
    ClientInvite,
    ClientNonInvite,
    Deliver,
    Send,
    ServerInvite,
    ServerNonInvite,
    TimedOut,
    Timers,
    Transaction,
)

MAX_CLIENT_TX = 8
log = logging.getLogger("brisvox.gateway.sip")


class SipTransactions(asyncio.DatagramProtocol):
    """Socket, transactions and timers of the SIP user agent (see the module docstring)."""

    def __init__(self, call_host: CallHost, cfg: SipConfig) -> None:
        self.call_host = call_host
        self.cfg = cfg
        self.loop = asyncio.get_event_loop()
        self.timers = Timers(cfg.t1_ms / 1000, cfg.t2_ms / 1000, cfg.t4_ms / 1000)
        self.transport: asyncio.DatagramTransport | None = None
        self.nets = [ipaddress.ip_network(n, strict=False) for n in cfg.allow]
        self._allowed_cache: dict[str, bool] = {}
        self.proxies = TrustedProxies(cfg.trusted_proxies)
        self.server_tx: dict[tuple, Transaction] = {}
        self.client_tx: dict[tuple, ClientNonInvite | ClientInvite] = {}
        self._tx_cb: dict[int, Callable[[Action], None]] = {}
        self.dialogs: dict[tuple[str, str], SipCall] = {}
        self.by_call_id: dict[str, SipCall] = {}
        self._heap: list[tuple[float, int, Transaction]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.rtp_ports = RtpPorts(cfg)
        self.guard = SipGuard(cfg.invite_rate, cfg.options_rate, log)
        self.rtp_family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        self.counters: dict[str, int] = {}
        self.host = cfg.host
        self.port = cfg.port


    # -- setup -----------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        self.loop = asyncio.get_running_loop()
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
        return self.host, self.port

    async def shutdown(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for leg in list(self.by_call_id.values()):
            self.rtp_ports.close(leg)
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def allowed(self, host: str) -> bool:
        ok = self._allowed_cache.get(host)
        if ok is None:
            try:
                ip = ipaddress.ip_address(host)
                ok = any(ip in n for n in self.nets)
            except ValueError:
                ok = False
            if len(self._allowed_cache) < 4096:
                self._allowed_cache[host] = ok
        return ok

    def caller_host(self, req: SipMessage, src: str) -> str:
        """The caller's address, the key of the per-source limits: ``src`` (the packet's
        source), unless ``src`` is a trusted proxy and its Vias name the caller (counted
        ``sip_proxied_requests``; a Via that names no IP address: ``src``, counted
        ``sip_proxied_bad_via``)."""
        if not self.proxies:
            return src
        host, how = via_client(self.proxies, src, req.get_all("via"))
        if how == FORWARDED:
            self.count("sip_proxied_requests")
        elif how == MALFORMED:
            self.count("sip_proxied_bad_via")
            self.guard.log_limit("sip_proxied_bad_via", "SIP %s from trusted proxy %s: no caller address "
                                 "in its Vias, limited as the proxy's own", req.method, src, level=logging.INFO)
        return host

    @property
    def via_host(self) -> str:
        return f"{self.cfg.advertised_host}:{self.port}"

    @property
    def contact(self) -> str:
        return f"<sip:brisvox@{self.cfg.advertised_host}:{self.port}>"

    # -- timers and actions ------------------------------------------------------------

    def _track(self, tx: Transaction, cb: Callable[[Action], None] | None = None) -> None:
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
        for a in actions:
            if isinstance(a, Send):
                self._send(a.data, a.addr)
            else:
                cb = self._tx_cb.get(id(tx))
                if cb is not None:
                    cb(a)

    def _forget(self, tx: Transaction) -> None:
        self._tx_cb.pop(id(tx), None)
        if isinstance(tx, (ClientNonInvite, ClientInvite)):
            if self.client_tx.get(tx.key) is tx:
                del self.client_tx[tx.key]
        elif self.server_tx.get(tx.key) is tx:
            del self.server_tx[tx.key]

    def _send(self, data: bytes, addr: Addr) -> None:
        if self.transport is not None:
            self.transport.sendto(data, addr)

    def error_received(self, exc: Exception) -> None:
        self.count("sip_socket_errors")

    def _reply_addr(self, req: SipMessage, src: Addr) -> Addr:
        """18.2.2 with RFC 3581: answer where the request came from when rport is asked or the
        sent-by is not an address we can use; else to sent-by."""
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

    def _respond(self, tx: ServerInvite | ServerNonInvite, req: SipMessage, status: int, reason: str = "",
                 **kw: Any) -> None:
        resp = make_response(req, status, reason, server=self.cfg.user_agent, **kw)
        self._perform(tx, tx.respond(resp, self.loop.time()))
        self._schedule(tx)
        if tx.done:
            self._forget(tx)

    def _stateless(self, req: SipMessage, status: int, addr: Addr, reason: str = "",
                   extra: list[tuple[str, str]] | None = None) -> None:
        """A response outside any transaction (refusals that must cost no state)."""
        self._send(make_response(req, status, reason, server=self.cfg.user_agent, extra=extra).serialize(), addr)

    def refuse(self, reason: str, detail: str, *args: object) -> None:
        """Count ``sip_refused_<reason>`` and log it, bounded (one line per reason per minute)."""
        self.count(f"sip_refused_{reason}")
        self.guard.log_limit(f"sip_refused_{reason}", f"SIP refused ({reason}): {detail}", *args,
                             level=logging.INFO)

    def _dialog_for(self, req: SipMessage) -> SipCall | None:
        tag = req.to_tag
        if not tag:
            return None
        return self.dialogs.get((req.call_id, tag))

    # -- client transactions ---------------------------------------------------------------

    def _client_request(self, leg: SipCall | None, req: SipMessage, cb: Callable[[Action], None],
                        addr: Addr | None = None) -> None:
        via = req.top_via
        key = (via.branch, req.method)
        hop = addr or (leg.dialog.next_hop() if leg else ("127.0.0.1", 5060))
        tx = ClientNonInvite(key, hop, self.timers, req)
        self.client_tx[key] = tx
        if leg is not None:
            leg.client_tx += 1

        def wrapped(a: Action) -> None:
            if leg is not None and (isinstance(a, TimedOut) or (isinstance(a, Deliver) and a.msg.status >= 200)):
                leg.client_tx = max(0, leg.client_tx - 1)
            cb(a)

        self._tx_cb[id(tx)] = wrapped
        self._perform(tx, tx.start(self.loop.time()))
        self._schedule(tx)

    def _on_response(self, resp: SipMessage, addr: Addr) -> None:
        try:
            via = resp.top_via
            _, method = resp.cseq
        except ValueError:
            self.count("sip_malformed_response")
            return
        tx = self.client_tx.get((via.branch, method))
        if tx is None:
            self.count("sip_stray_responses")
            return
        self._perform(tx, tx.on_response(resp, self.loop.time()))
        self._schedule(tx)

    # -- stats -----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out["sip_dialogs"] = len(self.dialogs)
        out["sip_server_transactions"] = len(self.server_tx)
        out["sip_client_transactions"] = len(self.client_tx)
        out["rtp_ports_in_use"] = len(self.rtp_ports.in_use)
        for site, n in self.guard.suppressed().items():
            out[f"log_suppressed_{site}"] = n
        return out
