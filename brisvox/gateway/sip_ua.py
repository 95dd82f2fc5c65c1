"""The SIP user agent (server side, UDP): transactions, dialogs, calls and their RTP.

Owns the SIP socket, the transaction tables and their timers (one heap, one
loop timer), the dialogs, and one :class:`SipCall` leg per call with its RTP
socket, jitter buffer, DTMF in both directions and REFER transfer.

Behaviour (details in docs/PROTOCOL.md): INVITE with an SDP offer (or none:
we offer in the 200 and take the answer from the ACK) -> 100, optional 180,
200 with the answer; 488 when no PCMU/PCMA; 503 when full or draining; 420 for
a required extension; re-INVITE (hold/unhold, new address) answered with the
mirrored direction; BYE both ways; CANCEL -> 200 + 487; OPTIONS -> 200 (503
while draining); INFO dtmf-relay; NOTIFY for our REFER; other known methods
405, unknown ones 501; malformed requests 400 when they can be answered, else
dropped. All of it counted.

Invariants:

* Sources outside ``[sip] allow`` are dropped before parsing (SIP and RTP)
  and counted.
* A malformed datagram costs one parse and a counter; it never touches
  another call. Per call, everything buffered is bounded: jitter buffer
  slots, pending client transactions (``MAX_CLIENT_TX``), marks and DTMF
  (core), and the call's rings.
* Every transaction timer and every RTP timeout is on the loop clock; the
  UA has one pending loop timer for all transactions.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import ipaddress
import itertools
import logging
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from brisvox.gateway.calls import AdmissionError, Call
from brisvox.gateway.config import SipConfig
from brisvox.gateway.jitter import JitterBuffer
from brisvox.wire import dtmf, rtp, sdp
from brisvox.wire.g711 import BY_PT, CODECS, G711
from brisvox.wire.sip_dialog import Dialog, make_response
from brisvox.wire.sip_message import (
    SipMessage,
    SipParseError,
    new_tag,
    parse,
    parse_name_addr,
    parse_uri,
)
from brisvox.wire.sip_transaction import (
    Action,
    ClientNonInvite,
    Deliver,
    Retransmit2xx,
    Send,
    ServerInvite,
    ServerNonInvite,
    TimedOut,
    Timers,
    Transaction,
)

if TYPE_CHECKING:
    from brisvox.gateway.core import GatewayCore

log = logging.getLogger("brisvox.gateway.sip")

Addr = tuple[str, int]
KNOWN_METHODS = {"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "UPDATE", "PRACK", "REFER"}
MAX_CLIENT_TX = 8
RATE = 8000
FRAME = 160


class RtpProtocol(asyncio.DatagramProtocol):
    __slots__ = ("leg", "transport")

    def __init__(self, leg: SipCall) -> None:
        self.leg = leg
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        self.leg.on_rtp(data, addr)

    def error_received(self, exc: Exception) -> None:
        self.leg.ua.count("rtp_socket_errors")


class SipCall:
    """One SIP call: dialog, INVITE transaction, RTP in/out. The call leg of the core."""

    transport = "sip"
    marks_by_echo = False

    def __init__(self, ua: SipUserAgent, call: Call, invite: SipMessage, tx: ServerInvite,
                 dialog: Dialog, offer: sdp.SessionDescription | None, neg: sdp.Negotiated | None) -> None:
        self.ua = ua
        self.core = ua.core
        self.call = call
        self.invite = invite
        self.invite_tx: ServerInvite | None = tx
        self.dialog = dialog
        self.offer = offer
        self.neg = neg
        self.codec: G711 | None = CODECS[neg.codec] if neg else None
        self.state = "incoming"  # incoming -> answered -> confirmed -> ended
        self.sdp_session = secrets.randbelow(1 << 31)
        self.sdp_version = 1
        self.rtp: RtpProtocol | None = None
        self.rtp_port = 0
        self.remote: Addr | None = (neg.remote_host, neg.remote_port) if neg and neg.we_send else None
        self.ok_retx: Retransmit2xx | None = None
        self.jb = JitterFor(ua.cfg)
        self.dtmf_rx = dtmf.EventReceiver()
        self.dtmf_tx = dtmf.EventSender(max_queue=ua.core.cfg.max_dtmf_queue)
        self.sender = rtp.RtpSender()
        self._buf = bytearray(12 + 4096)
        self._payload = np.frombuffer(self._buf, dtype=np.uint8, offset=12)
        self.last_rx = 0.0
        self.client_tx = 0
        self.bye_after_ack = False
        self.transfer_done: Callable[[bool, str], None] | None = None
        self._polls = 0
        self.ended = False

    # -- leg: state -----------------------------------------------------------

    @property
    def can_send(self) -> bool:
        return self.remote is not None and self.state in ("answered", "confirmed") and self.codec is not None

    def apply_negotiation(self, neg: sdp.Negotiated) -> None:
        self.neg = neg
        self.codec = CODECS[neg.codec]
        self.remote = (neg.remote_host, neg.remote_port) if neg.we_send else None
        if not neg.we_send:
            self.sender.end_spurt()

    def answer_sdp(self) -> bytes:
        return sdp.build(host=self.ua.cfg.advertised_host, port=self.rtp_port, session_id=self.sdp_session,
                         version=self.sdp_version, neg=self.neg, offer=self.offer, codecs=self.ua.cfg.codecs)

    # -- RTP in ------------------------------------------------------------------

    def on_rtp(self, data: bytes, addr: Addr) -> None:
        ua = self.ua
        if not ua.allowed(addr[0]):
            ua.count("rtp_refused_allowlist")
            return
        if self.ended:
            return
        try:
            pkt = rtp.parse(data)
        except rtp.RtpError:
            ua.count("rtp_malformed")
            self.call.stats.malformed += 1
            return
        st = self.call.stats
        st.packets_in += 1
        st.bytes_in += len(data)
        now = ua.loop.time()
        self.last_rx = now
        out = self.jb.push(pkt, now)
        if out:
            self._play(out)

    def _play(self, out: list[tuple[int, rtp.RtpPacket]]) -> None:
        neg = self.neg
        ring = self.call.in_ring
        st = self.call.stats
        for gap, pkt in out:
            pt = pkt.payload_type
            if neg is not None and pt == neg.payload_type:
                codec = self.codec
                assert codec is not None
                if gap:
                    ring.write_silence(gap)
                ring.write(codec.decode(pkt.payload))
                st.samples_in += len(pkt.payload) + gap
            elif neg is not None and pt == neg.dtmf_pt:
                ev = self.dtmf_rx.on_packet(pkt.timestamp, pkt.payload)
                if ev is not None:
                    self.core.dtmf_in(self.call, ev.digit, ev.duration_ms)
            elif pt in BY_PT:  # the peer switched to the other G.711 law it offered
                if gap:
                    ring.write_silence(gap)
                ring.write(BY_PT[pt].decode(pkt.payload))
                st.samples_in += len(pkt.payload) + gap
            elif pt != 13:  # 13 = comfort noise: nothing to play
                self.ua.count("rtp_unexpected_payload_type")

    # -- leg: out (called by the pacer) ------------------------------------------

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        rtp_t = self.rtp
        codec = self.codec
        if rtp_t is None or rtp_t.transport is None or self.remote is None or codec is None:
            return False
        n = len(samples)
        if n > 4096:
            return False
        self._buf[:12] = self.sender.next_header(codec.payload_type, n, now)
        codec.encode(samples, out=self._payload[:n])
        rtp_t.transport.sendto(memoryview(self._buf)[: 12 + n], self.remote)
        self.call.stats.packets_out += 1
        return True

    def end_spurt(self) -> None:
        self.sender.end_spurt()

    def send_clear(self) -> None:
        self.sender.end_spurt()  # stop RTP audio now; the next audio starts a new talkspurt

    def send_mark(self, name: str) -> None:  # SIP peers do not echo marks
        pass

    def send_dtmf(self, digits: str) -> int:
        if self.neg is None or self.neg.dtmf_pt < 0:
            self.ua.count("dtmf_out_unsupported")
            return len(digits)
        return self.dtmf_tx.add(digits)

    def tick_dtmf(self, now: float) -> bool:
        tx = self.dtmf_tx
        if not tx.active:
            return False
        rtp_t = self.rtp
        if rtp_t is None or rtp_t.transport is None or self.remote is None or self.neg is None:
            tx.queue.clear()
            return False
        got = tx.next_packet(self.sender.timestamp_at(now))
        if got is not None:
            payload, marker, ts = got
            hdr = self.sender.event_header(self.neg.dtmf_pt, marker, ts)
            rtp_t.transport.sendto(hdr + payload, self.remote)
            self.call.stats.packets_out += 1
        return True

    def poll(self, now: float) -> None:
        if self.jb.held:
            out = self.jb.poll(now)
            if out:
                self._play(out)
        self._polls += 1
        if self._polls % 25 == 0:
            self.sync_stats()
            timeout = self.ua.cfg.rtp_timeout_s
            if timeout and self.state == "confirmed" and self.neg is not None and not self.neg.on_hold \
                    and self.last_rx and now - self.last_rx > timeout:
                self.ua.count("rtp_timeouts")
                self.core.hangup(self.call, "rtp timeout")

    def sync_stats(self) -> None:
        js = self.jb.stats
        st = self.call.stats
        st.lost = js.lost
        st.late_packets = js.late
        st.reordered = js.reordered
        st.duplicates = js.duplicate
        st.ssrc_changes = js.ssrc_changes
        st.jitter_ms = js.jitter_samples / 8.0

    # -- leg: control --------------------------------------------------------------

    def hangup(self, reason: str) -> None:
        self.ua.hangup(self, reason)

    def transfer(self, target: str, done: Callable[[bool, str], None]) -> None:
        self.ua.refer(self, target, done)


def _same(proto: RtpProtocol) -> RtpProtocol:
    return proto


def JitterFor(cfg: SipConfig) -> JitterBuffer:
    return JitterBuffer(depth=cfg.max_buffered_packets, max_wait=cfg.jitter_ms / 1000.0,
                        max_gap=RATE, clock_rate=RATE)


class SipUserAgent(asyncio.DatagramProtocol):
    """The SIP endpoint (see module docstring)."""

    def __init__(self, core: GatewayCore, cfg: SipConfig) -> None:
        self.core = core
        self.cfg = cfg
        self.loop = asyncio.get_event_loop()
        self.timers = Timers(cfg.t1_ms / 1000, cfg.t2_ms / 1000, cfg.t4_ms / 1000)
        self.transport: asyncio.DatagramTransport | None = None
        self.nets = [ipaddress.ip_network(n, strict=False) for n in cfg.allow]
        self._allowed_cache: dict[str, bool] = {}
        self.server_tx: dict[tuple, Transaction] = {}
        self.client_tx: dict[tuple, ClientNonInvite] = {}
        self._tx_cb: dict[int, Callable[[Action], None]] = {}
        self.dialogs: dict[tuple[str, str], SipCall] = {}
        self.by_call_id: dict[str, SipCall] = {}
        self._heap: list[tuple[float, int, Transaction]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._rtp_next = cfg.rtp_port_min + (cfg.rtp_port_min & 1)
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

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for leg in list(self.by_call_id.values()):
            self._close_rtp(leg)
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
        if isinstance(tx, ClientNonInvite):
            self.client_tx.pop(tx.key, None)
        elif self.server_tx.get(tx.key) is tx:
            del self.server_tx[tx.key]

    def _send(self, data: bytes, addr: Addr) -> None:
        if self.transport is not None:
            self.transport.sendto(data, addr)

    # -- receive ---------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        if not self.allowed(addr[0]):
            self.count("sip_refused_allowlist")
            return
        if not data.strip():
            return  # CRLF keep-alive
        try:
            msg = parse(data, self.cfg.max_message_bytes)
        except SipParseError as e:
            self.count(f"sip_malformed_{e.kind}")
            if e.can_reply and e.msg is not None and e.msg.method != "ACK":
                status = 513 if e.kind == "oversized" else 400
                self._send(make_response(e.msg, status, e.detail[:60] if status == 400 else "",
                                         server=self.cfg.user_agent).serialize(), self._reply_addr(e.msg, addr))
            return
        try:
            if msg.is_request:
                self.count(f"sip_requests_{msg.method if msg.method in _COUNTED else 'other'}")
                self._on_request(msg, addr)
            else:
                self._on_response(msg, addr)
        except Exception:
            log.exception("SIP %s from %s failed", msg.method or msg.status, addr)
            self.count("sip_internal_errors")

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
            self._respond(tx, req, 503 if self.core.table.draining else 200,
                          extra=[("accept", "application/sdp"), ("supported", "replaces")]
                          + ([("retry-after", "30")] if self.core.table.draining else []))
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

    def _dialog_for(self, req: SipMessage) -> SipCall | None:
        tag = req.to_tag
        if not tag:
            return None
        return self.dialogs.get((req.call_id, tag))

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
        if self.core.table.draining:
            self.core.table.refused["draining"] = self.core.table.refused.get("draining", 0) + 1
            self._respond(tx, req, 503, extra=[("retry-after", "30")])
            return
        require = req.get("require")
        if require:
            self._respond(tx, req, 420, extra=[("unsupported", require)])
            return
        offer: sdp.SessionDescription | None = None
        neg: sdp.Negotiated | None = None
        if req.body:
            ctype = req.get("content-type").split(";")[0].strip().lower()
            if ctype != "application/sdp":
                self._respond(tx, req, 415, extra=[("accept", "application/sdp")])
                return
            try:
                offer = sdp.parse(req.body)
                neg = sdp.negotiate(offer, self.cfg.codecs)
            except sdp.SdpError as e:
                self.count("sip_invite_488")
                self._respond(tx, req, 488, extra=[("warning", f'305 brisvox "{str(e)[:60]}"')])
                return
        if req.call_id in self.by_call_id:
            self._respond(tx, req, 482)
            return
        agent = self._agent_for(req)
        try:
            call = self.core.admit("sip", agent, RATE)
        except AdmissionError as e:
            self.count(f"sip_invite_503_{e.reason}")
            self._respond(tx, req, 503, extra=[("retry-after", "10")])
            return
        dialog = Dialog.from_invite(req, new_tag(), self.contact, addr)
        leg = SipCall(self, call, req, tx, dialog, offer, neg)
        call.transport_ids = {"sip_call_id": req.call_id[:128]}
        try:
            call.params = {"from": parse_name_addr(req.get("from")).uri[:256],
                           "to": parse_name_addr(req.get("to")).uri[:256]}
        except ValueError:
            pass
        self.dialogs[(dialog.call_id, dialog.local_tag)] = leg
        self.by_call_id[dialog.call_id] = leg
        self._track(tx, functools.partial(self._invite_tx_event, leg))
        self.core.spawn(self._setup(leg))

    async def _setup(self, leg: SipCall) -> None:
        """Open the call's RTP socket, then start the agent side (answer in _call_ready)."""
        try:
            await self._open_rtp(leg)
        except OSError as e:
            log.error("no RTP port for %s: %s", leg.call.call_id, e)
            self.count("rtp_no_port")
            tx = leg.invite_tx
            if tx is not None and tx.state == "proceeding":
                self._respond(tx, leg.invite, 503, to_tag=leg.dialog.local_tag, extra=[("retry-after", "10")])
            leg.call.agent_done = True
            self._end_leg(leg, "no rtp port")
            return
        if leg.ended:  # cancelled while we opened the socket
            self._close_rtp(leg)
            leg.call.agent_done = True
            self.core._maybe_release(leg.call)
            return
        self.core.start_call(leg.call, leg, functools.partial(self._call_ready, leg))

    def _agent_for(self, req: SipMessage) -> str:
        try:
            user = parse_uri(req.uri).user
        except ValueError:
            user = ""
        return self.cfg.users.get(user, self.cfg.default_agent)

    async def _open_rtp(self, leg: SipCall) -> None:
        lo, hi = self.cfg.rtp_port_min, self.cfg.rtp_port_max
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        for _ in range(max(2, (hi - lo) // 2)):
            port = self._rtp_next
            self._rtp_next += 2
            if self._rtp_next > hi - 1:
                self._rtp_next = lo + (lo & 1)
            sock = socket.socket(family, socket.SOCK_DGRAM)
            try:
                sock.bind((self.cfg.host, port))
            except OSError:
                sock.close()
                continue
            sock.setblocking(False)
            proto = RtpProtocol(leg)
            await self.loop.create_datagram_endpoint(functools.partial(_same, proto), sock=sock)
            leg.rtp = proto
            leg.rtp_port = port
            return
        raise OSError("no free RTP port in range")

    def _close_rtp(self, leg: SipCall) -> None:
        if leg.rtp is not None and leg.rtp.transport is not None:
            leg.rtp.transport.close()
        leg.rtp = None

    def _call_ready(self, leg: SipCall, ok: bool, why: str) -> None:
        tx = leg.invite_tx
        if tx is None or tx.state != "proceeding" or leg.ended:
            return
        if not ok:
            self._respond(tx, leg.invite, 503, why[:60] or "Service Unavailable", to_tag=leg.dialog.local_tag,
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
            leg.state = "confirmed"  # 13.3.1.4: give up and end the session with a BYE
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
                        leg.apply_negotiation(sdp.negotiate(ans, self.cfg.codecs))
                    except sdp.SdpError:
                        self.count("sip_bad_ack_sdp")
                        self._end_leg(leg, "bad sdp in ack", send_bye=True)
                        return
                if leg.bye_after_ack:
                    self._end_leg(leg, "hangup", send_bye=True)
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
                neg = sdp.negotiate(offer, self.cfg.codecs)
            except sdp.SdpError as e:
                self._respond(tx, req, 488, extra=[("warning", f'305 brisvox "{str(e)[:60]}"')])
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

    # -- in-dialog requests ------------------------------------------------------------------------

    def _on_info(self, leg: SipCall, req: SipMessage, tx: ServerNonInvite) -> None:
        ctype = req.get("content-type").split(";")[0].strip().lower()
        if ctype == "application/dtmf-relay":
            digit, dur = "", 0
            for line in req.body.decode("utf-8", "replace").splitlines():
                k, _, v = line.partition("=")
                if k.strip().lower() == "signal":
                    digit = v.strip()[:1].upper()
                elif k.strip().lower() == "duration" and v.strip().isdigit():
                    dur = int(v.strip())
            if digit and digit in dtmf.DIGITS:
                self.core.dtmf_in(leg.call, digit, dur)
            else:
                self._respond(tx, req, 400, "Bad dtmf-relay body")
                return
        self._respond(tx, req, 200)

    def _on_notify(self, leg: SipCall, req: SipMessage, tx: ServerNonInvite) -> None:
        self._respond(tx, req, 200)
        if not req.get("event").lower().startswith("refer"):
            return
        frag = req.body.decode("utf-8", "replace").strip().split("\r\n")[0].split("\n")[0]
        parts = frag.split(" ", 2)
        if len(parts) >= 2 and parts[0] == "SIP/2.0" and parts[1].isdigit():
            status = int(parts[1])
            if status >= 200:
                self.count("sip_refer_notify_final")
                if status < 300:
                    self.core.hangup(leg.call, "transferred")
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
        if ":" not in target.split("@")[0] and not target.startswith(("sip:", "sips:", "tel:")):
            host = leg.dialog.next_hop()[0]
            target = f"sip:{target}@{host}"
        if any(c in target for c in "\r\n<>"):
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

    # -- ending -------------------------------------------------------------------------------------

    def hangup(self, leg: SipCall, reason: str) -> None:
        """Our side ends the call (agent Hangup, shutdown, RTP timeout, transfer done)."""
        if leg.ended:
            return
        tx = leg.invite_tx
        if leg.state == "incoming" and tx is not None and tx.state == "proceeding":
            self._respond(tx, leg.invite, 480, "Temporarily Unavailable", to_tag=leg.dialog.local_tag)
            self._end_leg(leg, reason, send_bye=False)
        elif leg.state == "answered" and leg.ok_retx is not None and not leg.ok_retx.done:
            leg.bye_after_ack = True  # 15: the UAS sends BYE only once the ACK came (or timed out)
            self.core.transport_ended(leg.call, reason)
        else:
            self._end_leg(leg, reason, send_bye=True)

    def _end_leg(self, leg: SipCall, reason: str, send_bye: bool = False) -> None:
        if send_bye and leg.state in ("answered", "confirmed") and not leg.ended:
            req = leg.dialog.request("BYE", self.via_host,
                                     extra=[("reason", f'Q.850;cause=16;text="{reason[:40]}"')])
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
        self._close_rtp(leg)
        self.dialogs.pop((leg.dialog.call_id, leg.dialog.local_tag), None)
        self.by_call_id.pop(leg.dialog.call_id, None)
        self.core.transport_ended(leg.call, reason)

    def _bye_result(self, a: Action) -> None:
        if isinstance(a, TimedOut):
            self.count("sip_bye_timeouts")

    # -- stats -----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out["sip_dialogs"] = len(self.dialogs)
        out["sip_server_transactions"] = len(self.server_tx)
        out["sip_client_transactions"] = len(self.client_tx)
        return out


_COUNTED = {"INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "NOTIFY", "REFER"}
