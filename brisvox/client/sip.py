"""A small SIP user agent client (UDP) for ``brisvox call``: one outgoing call with RTP and DTMF.

Owns the caller's side of one SIP dialog: INVITE with our SDP offer
(PCMU/PCMA + telephone-event), retransmitted on T1 doubling to T2 until a
response; ACK for the 2xx (sent again for every retransmitted 2xx); the
answer's codec and RTP address; RTP both ways (20 ms G.711 packets out,
marker on the first packet of a talkspurt; packets in decoded as they
arrive); RFC 4733 DTMF out (the caller's audio pauses while an event plays)
or, with ``dtmf_info``, each key as an INFO (``application/dtmf-relay`` or
``application/dtmf``, one at a time, its final response awaited), and DTMF
in (digits the agent pressed); BYE both ways. Everything SIP, SDP, RTP
and DTMF is the code the gateway uses too (``brisvox.wire.sip_message``,
``sip_dialog``, ``sip_transaction``, ``sdp``, ``rtp``, ``dtmf``, ``g711``);
this module only drives it from the client's side.

Invariants: every wait has a bound (nothing at all from the server within
``response_timeout``, a socket error, or no final response within
``answer_timeout`` -> :class:`TransportError`, no CANCEL sent; our
BYE's transaction gives up after 64*T1, and ``close`` waits at most
``CLOSE_TIMEOUT_S`` for it); a request from the server other than BYE is
answered (200 for OPTIONS/NOTIFY/INFO, 405 otherwise) and never ends the
call; ``on_end`` is reported once.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import time
from typing import Any

import numpy as np

from brisvox.client.transport import CLOSE_TIMEOUT_S, BotEvents, TransportError
from brisvox.wire import dtmf, rtp, sdp
from brisvox.wire.g711 import BY_PT, CODECS, G711
from brisvox.wire.sip_dialog import Dialog, make_response
from brisvox.wire.sip_message import (
    SipMessage,
    SipParseError,
    new_branch,
    new_call_id,
    new_tag,
    parse,
    parse_name_addr,
    parse_uri,
)
from brisvox.wire.sip_transaction import ClientNonInvite, Deliver, Send, TimedOut, Timers

RATE = 8000
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY"  # what this caller answers (an UPDATE: 405)
FRAME = 160
USER = "brisvox-call"

Addr = tuple[str, int]


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Any, on_error: Any = None) -> None:
        self.on_datagram = on_datagram
        self.on_error = on_error
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        self.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:  # a socket error while sending
        if self.on_error is not None:
            self.on_error(exc)


def parse_target(target: str, agent: str = "") -> tuple[str, Addr]:
    """``sip:user@host:port`` (or ``host:port``) -> (request URI, server address)."""
    uri_s = target if target.startswith(("sip:", "sips:")) else f"sip:{target}"
    try:
        uri = parse_uri(uri_s)
    except ValueError as e:
        raise TransportError(str(e)) from None
    user = agent or uri.user or "default"
    host = uri.host or "127.0.0.1"
    port = uri.port or 5060
    return f"sip:{user}@{host}:{port}", (host, port)


class SipTransport:
    """See :class:`~brisvox.client.transport.CallTransport`."""

    rate = RATE

    def __init__(self, target: str, agent: str = "", *, local_host: str = "127.0.0.1", sip_port: int = 0,
                 rtp_port: int = 0, codecs: tuple[str, ...] = ("PCMU", "PCMA"), answer_timeout: float = 30.0,
                 response_timeout: float = 5.0, timers: Timers | None = None, dtmf_info: str = "",
                 from_user: str = USER) -> None:
        if dtmf_info not in ("", "dtmf-relay", "dtmf"):
            raise ValueError(f"dtmf_info: '', 'dtmf-relay' or 'dtmf', not {dtmf_info!r}")
        if not re.fullmatch(r"[A-Za-z0-9+._*-]{1,64}", from_user):
            raise ValueError(f"from_user: 1 to 64 of A-Z a-z 0-9 + . _ * -, not {from_user!r}")
        self.from_user = from_user  # the user part of our From: the caller's number the server sees
        self.dtmf_info = dtmf_info  # "": RFC 4733 events; else each key as an INFO of that body
        self.request_uri, self.server = parse_target(target, agent)
        self.local_host = local_host
        self.sip_port = sip_port
        self.rtp_port = rtp_port
        self.codecs = codecs
        self.answer_timeout = answer_timeout
        self.response_timeout = response_timeout
        self.timers = timers or Timers()
        self.call_id = ""
        self.sip_call_id = new_call_id(local_host)
        self.ids = {"sip_call_id": self.sip_call_id}
        self.local_tag = new_tag()
        self.sip: _Udp | None = None
        self.rtp: _Udp | None = None
        self.dialog: Dialog | None = None
        self.neg: sdp.Negotiated | None = None
        self.codec: G711 | None = None
        self.remote_rtp: Addr | None = None
        self.sender = rtp.RtpSender(RATE)
        self.dtmf_tx = dtmf.EventSender()
        self.dtmf_rx = dtmf.EventReceiver()
        self.status = 0  # final status of the INVITE
        self.counters = {"rtp_in": 0, "rtp_out": 0, "rtp_malformed": 0, "sip_malformed": 0,
                         "invite_sent": 0, "ack_sent": 0, "dtmf_packets": 0, "sip_socket_errors": 0,
                         "info_sent": 0, "info_ok": 0}
        self._events = BotEvents()
        self._invite: SipMessage | None = None
        self._final: asyncio.Future[SipMessage] | None = None
        self._ack: bytes = b""
        self._bye_tx: ClientNonInvite | None = None
        self._bye_done: asyncio.Event | None = None
        self._info_tx: tuple[ClientNonInvite, asyncio.Event] | None = None  # the INFO key awaiting its answer
        self._ended = False
        self._timer: asyncio.Task[None] | None = None
        self._got_provisional = False

    # -- addresses -------------------------------------------------------------
    @property
    def _via(self) -> str:
        assert self.sip is not None and self.sip.transport is not None
        host, port = self.sip.transport.get_extra_info("sockname")[:2]
        return f"{host}:{port}"

    @property
    def _contact(self) -> str:
        return f"<sip:{USER}@{self._via}>"

    def _send(self, data: bytes, addr: Addr | None = None) -> None:
        if self.sip is not None and self.sip.transport is not None:
            self.sip.transport.sendto(data, addr or self.server)

    # -- call setup ----------------------------------------------------------------
    async def open(self, events: BotEvents) -> None:
        loop = asyncio.get_running_loop()
        self._events = events
        _, self.sip = await loop.create_datagram_endpoint(lambda: _Udp(self._on_sip, self._on_sip_error),
                                                          local_addr=(self.local_host, self.sip_port),
                                                          family=socket.AF_INET)
        _, self.rtp = await loop.create_datagram_endpoint(lambda: _Udp(self._on_rtp),
                                                          local_addr=(self.local_host, self.rtp_port),
                                                          family=socket.AF_INET)
        assert self.rtp.transport is not None
        rtp_port = self.rtp.transport.get_extra_info("sockname")[1]
        offer = sdp.build(host=self.local_host, port=rtp_port, session_id=secrets.randbelow(1 << 31), version=1,
                          neg=None, codecs=self.codecs, dtmf_pt=101)
        inv = SipMessage(method="INVITE", uri=self.request_uri)
        h = inv.headers
        h.append(("via", f"SIP/2.0/UDP {self._via};branch={new_branch()};rport"))
        h.append(("max-forwards", "70"))
        h.append(("from", f"<sip:{self.from_user}@{self.local_host}>;tag={self.local_tag}"))
        h.append(("to", f"<{self.request_uri}>"))
        h.append(("call-id", self.sip_call_id))
        h.append(("cseq", "1 INVITE"))
        h.append(("contact", self._contact))
        h.append(("user-agent", "brisvox-call"))
        h.append(("content-type", "application/sdp"))
        inv.body = offer
        self._invite = inv
        self._final = loop.create_future()
        data = inv.serialize()
        t1, t2 = self.timers.t1, self.timers.t2
        interval = t1
        provisional = False
        started = time.monotonic()
        deadline = started + self.answer_timeout
        self._send(data)
        self.counters["invite_sent"] += 1
        try:
            while True:
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    raise TransportError(f"no answer from {self.server[0]}:{self.server[1]} "
                                         f"within {self.answer_timeout:g}s")
                if not self._got_provisional and now - started >= self.response_timeout:
                    raise TransportError(f"no SIP server answers at {self.server[0]}:{self.server[1]} "
                                         f"(nothing within {self.response_timeout:g}s)")
                try:
                    resp = await asyncio.wait_for(asyncio.shield(self._final), min(interval, left))
                    break
                except TimeoutError:
                    if not provisional and self._got_provisional:
                        provisional = True
                    if not provisional:  # Timer A: retransmit until a provisional response
                        self._send(data)
                        self.counters["invite_sent"] += 1
                        interval = min(2 * interval, t2)
                    else:
                        interval = t2
                except OSError as e:
                    raise TransportError(f"no SIP server at {self.server[0]}:{self.server[1]} "
                                         f"({e.strerror or type(e).__name__})") from None
        except BaseException:
            await self._close_sockets()
            raise
        self.status = resp.status
        if resp.status >= 300:
            self._send(self._non2xx_ack(resp))
            await self._close_sockets()
            raise TransportError(f"the call was refused: {resp.status} {resp.reason}")
        try:
            self._establish(resp)
        except (ValueError, sdp.SdpError) as e:
            await self._close_sockets()
            raise TransportError(f"bad 200 OK: {e}") from None
        self._timer = asyncio.create_task(self._timers())

    def _establish(self, resp: SipMessage) -> None:
        answer = sdp.parse(resp.body)
        neg = sdp.negotiate(answer, self.codecs)
        self.neg = neg
        self.codec = CODECS[neg.codec]
        self.remote_rtp = (neg.remote_host, neg.remote_port) if neg.remote_port > 0 else None
        contact = resp.get("contact")
        target = parse_name_addr(contact).uri if contact else self.request_uri
        self.dialog = Dialog(
            call_id=self.sip_call_id,
            local_tag=self.local_tag,
            remote_tag=resp.to_tag,
            local_uri=f"sip:{self.from_user}@{self.local_host}",
            remote_uri=self.request_uri,
            remote_target=target,
            route_set=list(reversed(resp.get_all("record-route"))),
            local_contact=self._contact,
            source=self.server,
            local_cseq=1,
            state="confirmed",
        )
        ack = self.dialog.request("ACK", self._via, cseq=1)
        self._ack = ack.serialize()
        self._send(self._ack, self.dialog.next_hop())
        self.counters["ack_sent"] += 1

    def _non2xx_ack(self, resp: SipMessage) -> bytes:
        """ACK for a failure response: same branch and To tag (RFC 3261 17.1.1.3)."""
        assert self._invite is not None
        inv = self._invite
        ack = SipMessage(method="ACK", uri=inv.uri)
        ack.headers = [("via", inv.get("via")), ("max-forwards", "70"), ("from", inv.get("from")),
                       ("to", resp.get("to")), ("call-id", inv.call_id), ("cseq", "1 ACK")]
        return ack.serialize()

    # -- SIP in -------------------------------------------------------------------------
    def _on_sip_error(self, exc: Exception) -> None:
        if self._final is not None and not self._final.done() and isinstance(exc, OSError):
            self._final.set_exception(exc)
        self.counters["sip_socket_errors"] += 1

    def _on_sip(self, data: bytes, addr: Addr) -> None:
        try:
            msg = parse(data)
        except SipParseError:
            self.counters["sip_malformed"] += 1
            return
        if msg.call_id != self.sip_call_id:
            return
        if msg.is_request:
            self._on_request(msg, addr)
            return
        num, method = msg.cseq
        if method == "INVITE":
            if msg.status < 200:
                self._got_provisional = True
            elif self._final is not None and not self._final.done():
                self._final.set_result(msg)
            elif 200 <= msg.status < 300 and self._ack:  # a retransmitted 2xx: ACK again
                self._send(self._ack, self.dialog.next_hop() if self.dialog else self.server)
                self.counters["ack_sent"] += 1
        elif method == "BYE" and self._bye_tx is not None:
            self._perform(self._bye_tx.on_response(msg, time.monotonic()))
        elif method == "INFO" and self._info_tx is not None:
            tx, done = self._info_tx
            if msg.status >= 200 and not done.is_set():
                self.counters["info_ok"] += int(msg.status < 300)
            self._perform(tx.on_response(msg, time.monotonic()), done)

    def _on_request(self, req: SipMessage, addr: Addr) -> None:
        via = req.top_via
        reply_to = (via.params.get("received") or addr[0], int(via.params.get("rport") or 0) or via.port or addr[1])
        if req.method == "BYE":
            self._send(make_response(req, 200, server="brisvox-call", allow=ALLOW).serialize(), reply_to)
            self._end("the server hung up (BYE)")
        elif req.method == "ACK":
            return
        elif req.method in ("OPTIONS", "NOTIFY", "INFO"):
            self._send(make_response(req, 200, server="brisvox-call", allow=ALLOW).serialize(), reply_to)
        else:
            self._send(make_response(req, 405, server="brisvox-call", allow=ALLOW).serialize(), reply_to)

    def _end(self, reason: str) -> None:
        if not self._ended:
            self._ended = True
            self._events.on_end(reason, time.monotonic())

    # -- RTP ------------------------------------------------------------------------------
    def _on_rtp(self, data: bytes, addr: Addr) -> None:
        if self._ended or self.neg is None:
            return
        try:
            pkt = rtp.parse(data)
        except rtp.RtpError:
            self.counters["rtp_malformed"] += 1
            return
        now = time.monotonic()
        self.counters["rtp_in"] += 1
        pt = pkt.payload_type
        if pt == self.neg.dtmf_pt:
            ev = self.dtmf_rx.on_packet(pkt.timestamp, pkt.payload)
            if ev is not None:
                self._events.on_dtmf(ev.digit, now)
        elif pt in BY_PT:
            self._events.on_audio(BY_PT[pt].decode(pkt.payload), now)

    async def send_audio(self, pcm: np.ndarray) -> None:
        r = self.rtp
        if self._ended or r is None or r.transport is None or self.remote_rtp is None or self.codec is None:
            return
        now = time.monotonic()
        if self.dtmf_tx.active and self.neg is not None and self.neg.dtmf_pt >= 0:
            got = self.dtmf_tx.next_packet(self.sender.timestamp_at(now))
            if got is not None:
                payload, marker, ts = got
                r.transport.sendto(self.sender.event_header(self.neg.dtmf_pt, marker, ts) + payload,
                                   self.remote_rtp)
                self.counters["dtmf_packets"] += 1
            return  # the caller's audio pauses while a digit plays
        samples = np.ascontiguousarray(pcm, dtype=np.int16)
        hdr = self.sender.next_header(self.codec.payload_type, len(samples), now)
        r.transport.sendto(hdr + self.codec.encode(samples).tobytes(), self.remote_rtp)
        self.counters["rtp_out"] += 1

    async def send_dtmf(self, digits: str) -> None:
        if self.dtmf_info:
            for d in digits:
                await self._info(d)
            return
        if self.neg is None or self.neg.dtmf_pt < 0:
            raise TransportError("the server did not accept telephone-event (RFC 4733) in its answer")
        self.dtmf_tx.add(digits)

    async def _info(self, digit: str) -> None:
        """One key as an INFO request; returns at its final response (or the transaction's
        timeout, 64*T1), so the next key's CSeq never overtakes it."""
        if self.dialog is None or self._ended:
            return
        kind = self.dtmf_info
        body = f"Signal={digit}\r\nDuration=160\r\n" if kind == "dtmf-relay" else digit
        req = self.dialog.request("INFO", self._via, body=body.encode(), content_type=f"application/{kind}")
        tx = ClientNonInvite(("INFO", req.top_via.branch), self.dialog.next_hop(), self.timers, req)
        done = asyncio.Event()
        self._info_tx = (tx, done)
        self.counters["info_sent"] += 1
        self._perform(tx.start(time.monotonic()), done)
        try:
            await done.wait()
        finally:
            self._info_tx = None

    # -- teardown -------------------------------------------------------------------------
    def _perform(self, actions: list[Any], done: asyncio.Event | None = None) -> None:
        """Run a client transaction's actions; ``done`` (default: the BYE's) is set at its end."""
        done = done if done is not None else self._bye_done
        for a in actions:
            if isinstance(a, Send):
                self._send(a.data, a.addr)
            elif isinstance(a, (Deliver, TimedOut)) and done is not None:
                if isinstance(a, TimedOut) or a.msg.status >= 200:
                    done.set()

    async def _timers(self) -> None:
        while True:
            tx = self._bye_tx
            if tx is not None and tx.deadline is not None and time.monotonic() >= tx.deadline:
                self._perform(tx.on_timer(time.monotonic()))
            info = self._info_tx
            if info is not None and info[0].deadline is not None and time.monotonic() >= info[0].deadline:
                self._perform(info[0].on_timer(time.monotonic()), info[1])
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if not self._ended and self.dialog is not None:
            self._ended = True
            bye = self.dialog.request("BYE", self._via)
            tx = ClientNonInvite(("BYE", bye.top_via.branch), self.dialog.next_hop(), self.timers, bye)
            self._bye_tx = tx
            self._bye_done = asyncio.Event()
            self._perform(tx.start(time.monotonic()))
            try:
                await asyncio.wait_for(self._bye_done.wait(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                pass
        self._ended = True
        await self._close_sockets()

    async def _close_sockets(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None
        for u in (self.sip, self.rtp):
            if u is not None and u.transport is not None:
                u.transport.close()
