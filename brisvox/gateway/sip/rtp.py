"""SIP calls' RTP sessions: the call leg of a SIP call, its RTP socket, and RTP port allocation.

Owns :class:`SipCall` (the :class:`~brisvox.gateway.core.leg.TransportLeg` of one
SIP call: the negotiated codec, RTP in through the jitter buffer into the
core's :meth:`~brisvox.gateway.core.host.CallHost.audio_in`, RFC 4733 DTMF both
ways, RTP out for the pacer, the RTP timeout), :class:`RtpProtocol` (the
call's RTP socket), :class:`RtpPorts` (which even port of ``[sip]
rtp_port_min..rtp_port_max`` the next call gets) and :class:`SipContext`
(what a leg is given: the config, the call host, the counters, the loop, the
allow-list and its :class:`LegSignalling`). The signalling around the leg
(dialog, transactions) is :mod:`brisvox.gateway.sip.dialogs` and
:mod:`brisvox.gateway.sip.outbound`; a leg reaches it only through
:class:`LegSignalling` (hang up, transfer).

Invariants:

* RTP from a source outside ``[sip] allow`` is dropped before parsing, a
  malformed packet costs one parse and two counters; neither touches
  another call. The jitter buffer holds at most ``max_buffered_packets``.
* Strict RTP (``[sip] rtp_latch``): a call takes RTP from one source only,
  its latch; a packet from any other address or port is dropped before
  parsing and counted (``rtp_foreign_dropped``, per call and in total).
  ``"sdp"``: the latch is the connection address and port of the last SDP
  that named one (a hold's ``0.0.0.0`` keeps the previous one); nothing is
  taken before an SDP named one. ``"first"`` (NAT): the first source after
  the answer whose IP address is the signalling source's (the address the
  dialog's INVITE came from, or the one we dialled; the port may differ
  behind a NAT), which also becomes where our RTP goes; it never moves after
  that (a later SDP does not re-arm it). A packet from another IP before the
  latch is dropped (``rtp_latch_refused``), as are packets before the answer
  (``rtp_early_dropped``) but a dialled call's early media (a 18x SDP): a latch
  taken from it is taken again after the 200 when the 200's SDP names another
  address. Residual risk: whoever can send from the
  signalling IP (spoof it, or share it behind the same NAT) can still race
  the caller's first packet.
* Destinations (:meth:`SipContext.destination`): every address we send to
  (an in-dialog request's next hop, RTP) is inside ``[sip] allow``; with
  ``[sip] nat = "signalling_source"`` an address outside is replaced by the
  signalling source (its IP; a SIP hop its port too), else the dialog
  layer refuses the message that named it (403 / 488). A leg's RTP remote
  is always such an address or its latch.
* A call held (``a=inactive``/``sendonly``, ``c=0.0.0.0``) is exempt from the
  RTP timeout but not from ``[sip] hold_timeout_s``: held longer than that
  (counted from the SDP that put it on hold) it is hung up, ``"hold
  timeout"`` (``sip_hold_timeouts``).
* Outbound RTP is built in one reused buffer per call (header + payload, no
  allocation per frame); a frame beyond that buffer is refused.
* SRTP (``[sip] srtp``, :mod:`brisvox.wire.srtp`): a call whose negotiation
  chose a crypto line has one :class:`~brisvox.wire.srtp.SrtpSession` (our
  key out, the peer's in). Every inbound packet is unprotected before it is
  parsed (after the allow-list and latch checks); one refused (a wrong key,
  forged, replayed, truncated, plain RTP) is dropped and counted
  (``sip_srtp_<reason>``, the call's ``srtp_dropped``) with one bounded log
  line per reason, and the call goes on. With ``rtp_latch = "first"`` only a
  packet that authenticated takes the latch. Every outbound packet, audio and
  RFC 4733 events alike, is protected in place of the plain send; a packet
  libsrtp refuses to protect is not sent (``sip_srtp_protect_failed``).
  Our key is fresh per call (:func:`~brisvox.wire.srtp.new_crypto`) and kept
  across re-INVITEs that keep the suite; a peer's new key re-keys the
  inbound context only, the same key keeps its state (replay window, ROC).
  The session is closed with the call's RTP socket
  (:meth:`RtpPorts.close`): nothing is held after the call ends. The call's
  ``transport_ids`` name the suite (``srtp``) while SRTP is on.
* A leg sends audio only while answered or confirmed, with a negotiated
  codec and a remote address (``can_send``): never during a dialled call's early
  media, never while held; a Clear or a Pause ends the
  talkspurt (the next packet carries the marker bit).
* RTP ports are even (RTCP would take the odd one above) and handed out in
  random order (a uniformly random free port, ``secrets.SystemRandom``), so
  a call's port cannot be guessed from the previous one; a port is in at
  most one call's hands: it returns to the free list only when that call's
  socket is closed, and a port another process holds is skipped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from brisvox.gateway.config import SipConfig
from brisvox.gateway.core.calls import Call
from brisvox.gateway.core.host import CallHost
from brisvox.gateway.core.leg import TransportLeg
from brisvox.gateway.sip.counters import SipCounters
from brisvox.gateway.sip.jitter import JitterBuffer
from brisvox.wire import dtmf, rtp, sdp, srtp
from brisvox.wire.g711 import BY_PT, CODECS, G711
from brisvox.wire.sip_dialog import Dialog
from brisvox.wire.sip_digest import DigestCredentials
from brisvox.wire.sip_message import SipMessage
from brisvox.wire.sip_transaction import Retransmit2xx, ServerInvite

Addr = tuple[str, int]
RATE = 8000
FRAME = 160


class LegSignalling(Protocol):
    """What a leg asks of the signalling (the user agent routes it to the dialog or the dialer)."""

    def hangup(self, leg: SipCall, reason: str) -> None: ...

    def refer(self, leg: SipCall, target: str, done: Callable[[bool, str], None], summary: str = "") -> None: ...


@dataclass(frozen=True, slots=True)
class SipContext:
    """What every part of one user agent shares, fixed when it is built."""

    cfg: SipConfig
    call_host: CallHost
    counters: SipCounters
    loop: asyncio.AbstractEventLoop
    allowed: Callable[[str], bool]  # the [sip] allow check (SipGuard.allowed)
    signalling: LegSignalling

    def destination(self, addr: Addr, source: Addr, *, media: bool = False) -> Addr | None:
        """Where something a message named as ``addr`` may be sent: ``addr`` inside ``[sip]
        allow``; else, with ``[sip] nat = "signalling_source"``, the signalling ``source``
        (for ``media``: its IP with ``addr``'s port); else None (refuse: see the module docstring)."""
        if self.allowed(addr[0]):
            return addr
        if self.cfg.nat == "signalling_source":
            return (source[0], addr[1]) if media else source
        return None


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
        self.leg.ctx.counters.count("rtp_socket_errors")


class SipCall(TransportLeg):
    """One SIP call: dialog, INVITE transaction, RTP in/out. The call leg of the core."""

    transport = "sip"
    marks_by_echo = False

    def __init__(self, ctx: SipContext, call: Call, invite: SipMessage, tx: ServerInvite | None,
                 dialog: Dialog, offer: sdp.SessionDescription | None, neg: sdp.Negotiated | None,
                 secure_signalling: bool = False) -> None:
        self.ctx = ctx
        # the dialog's signalling is TLS (SDES keys may cross it: sdp.SrtpPolicy)
        self.secure_signalling = secure_signalling
        self.srtp: srtp.SrtpSession | None = None
        self.offered: tuple[srtp.Crypto, ...] | None = None  # our offer's a=crypto lines, until its answer
        self.call_host = ctx.call_host
        self.call = call
        self.invite = invite
        self.invite_tx: ServerInvite | None = tx
        self.dialog = dialog
        self.offer = offer
        self.neg = neg
        self.codec: G711 | None = CODECS[neg.codec] if neg else None
        # incoming -> answered -> confirmed -> ended; an outbound call: outgoing -> confirmed -> ended
        self.state = "incoming"
        self.sdp_session = secrets.randbelow(1 << 31)
        self.sdp_version = 1
        self.rtp: RtpProtocol | None = None
        self.rtp_port = 0
        self.remote: Addr | None = (neg.remote_host, neg.remote_port) if neg and neg.we_send else None
        self.latch_first = ctx.cfg.rtp_latch == "first"
        self.latch: Addr | None = None  # the one source RTP is taken from
        self.held_since: float | None = None  # loop time of the SDP that put the call on hold
        self.early_media = False  # a dialled call plays a 18x's SDP before its 200
        if neg is not None:
            self._relatch(neg)
            self._note_hold(neg)
            self._srtp_for(neg)
        self.ok_retx: Retransmit2xx | None = None
        self.jb = JitterFor(ctx.cfg)
        self.dtmf_rx = dtmf.EventReceiver()
        self.dtmf_tx = dtmf.EventSender(max_queue=ctx.call_host.settings.gateway.max_dtmf_queue)
        self.sender = rtp.RtpSender()
        self._buf = bytearray(12 + 4096)
        self._payload = np.frombuffer(self._buf, dtype=np.uint8, offset=12)
        self.last_rx = 0.0
        self.client_tx = 0
        # a trunk's credentials: our in-dialog requests answer its 401/407 (sip/client_auth.py)
        self.auth_creds: DigestCredentials | None = None
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
        self._relatch(neg)
        self._note_hold(neg)
        self._srtp_for(neg)
        if neg.we_send:
            self.remote = self.latch if self.latch_first and self.latch is not None else \
                (neg.remote_host, neg.remote_port)
        else:
            self.remote = None
            self.sender.end_spurt()

    def start_early_media(self, neg: sdp.Negotiated) -> None:
        """A dialled call's 18x SDP: its RTP is taken (the leg still sends nothing)."""
        self.early_media = True
        self.apply_negotiation(neg)

    def end_early_media(self, neg: sdp.Negotiated) -> None:
        """The 200's answer ``neg`` applied; a ``"first"`` latch taken from early media is
        taken again after the answer when the answer names another address."""
        early = self.neg if self.early_media else None
        self.early_media = False
        if self.latch_first and early is not None and \
                (early.remote_host, early.remote_port) != (neg.remote_host, neg.remote_port):
            self.latch = None
        self.apply_negotiation(neg)

    def _relatch(self, neg: sdp.Negotiated) -> None:
        """The latch after an SDP (see the module invariants): ``"sdp"`` takes its address;
        ``"first"`` ignores it (the first packet from the signalling IP latches, for good)."""
        if self.latch_first or neg.remote_host in ("0.0.0.0", "::") or not neg.remote_port:
            return  # hold: the previous latch stands
        self.latch = (neg.remote_host, neg.remote_port)

    def _note_hold(self, neg: sdp.Negotiated) -> None:
        """Start the hold clock when an SDP puts the call on hold, stop it when one takes it off."""
        if not neg.on_hold:
            self.held_since = None
        elif self.held_since is None:
            self.held_since = self.ctx.loop.time()

    def _srtp_for(self, neg: sdp.Negotiated) -> None:
        """The SRTP session after a negotiation (see the module invariants): none for a plain
        stream; for an SRTP one our line (the offered one the answer chose, or when we answer
        our key of that suite, kept when we had one, else fresh) and the peer's."""
        remote = neg.crypto
        cur = self.srtp
        offered = self.offered
        if not self.early_media:  # an 18x's answer may be followed by the 200's, to the same offer
            self.offered = None
        count = self.ctx.counters.count
        if remote is None:
            if cur is not None:
                cur.close()
                self.srtp = None
                count("sip_srtp_downgrades")
            self.call.transport_ids.pop("srtp", None)
            return
        mine = next((c for c in offered or () if (c.tag, c.suite) == (remote.tag, remote.suite)), None)
        if mine is not None:  # the answer to our offer chose this line of ours
            local = mine
        elif cur is not None and cur.local.suite == remote.suite:
            local = srtp.Crypto(remote.tag, remote.suite, cur.local.key)
        else:
            local = srtp.new_crypto(remote.tag, remote.suite)
        if cur is not None and local.same_key(cur.local):
            cur.local = local
            if cur.rekey_inbound(remote):
                count("sip_srtp_rekeyed")
        else:
            if cur is not None:
                cur.close()
            self.srtp = srtp.SrtpSession(local, remote)
            count("sip_srtp_sessions")
        self.record_srtp()

    def record_srtp(self) -> None:
        """Name the SRTP suite in the call's ``transport_ids`` (none: plain RTP)."""
        if self.srtp is not None:
            self.call.transport_ids["srtp"] = self.srtp.suite
        else:
            self.call.transport_ids.pop("srtp", None)

    def offer_crypto(self) -> tuple[tuple[srtp.Crypto, ...], str]:
        """The a=crypto lines and profile of an offer of ours (remembered until its answer):
        none and ``RTP/AVP`` when ``[sip] srtp`` is off or the keys may not cross this signalling;
        else one line per suite (our current key for the suite in use), ``RTP/SAVP`` when SRTP is
        required, ``RTP/AVP`` (best effort) when optional."""
        policy = self.ctx.cfg.srtp_policy
        if policy.mode == "off" or not policy.keys_allowed(self.secure_signalling):
            self.offered = ()
            return (), "RTP/AVP"
        cur = self.srtp
        if cur is None:
            lines = srtp.offer_cryptos()
        else:
            other = next(s for s in srtp.OFFER_ORDER if s != cur.suite)
            lines = (srtp.Crypto(1, cur.suite, cur.local.key), srtp.new_crypto(2, other))
        self.offered = lines
        return lines, ("RTP/SAVP" if policy.mode == "required" else "RTP/AVP")

    def offer_sdp(self) -> bytes:
        """Our offer (a late-offer INVITE's 200, a re-INVITE without SDP, a dial)."""
        cfg = self.ctx.cfg
        crypto, proto = self.offer_crypto()
        return sdp.build(host=cfg.advertised_host, port=self.rtp_port, session_id=self.sdp_session,
                         version=self.sdp_version, neg=None, codecs=cfg.codecs, crypto=crypto, proto=proto)

    def answer_sdp(self) -> bytes:
        """Our answer to the peer's offer (our offer when the INVITE had none)."""
        if self.neg is None or self.offer is None:
            return self.offer_sdp()
        cfg = self.ctx.cfg
        crypto = (self.srtp.local,) if self.srtp is not None and self.neg.secure else ()
        return sdp.build(host=cfg.advertised_host, port=self.rtp_port, session_id=self.sdp_session,
                         version=self.sdp_version, neg=self.neg, offer=self.offer, codecs=cfg.codecs,
                         crypto=crypto)

    # -- RTP in ------------------------------------------------------------------

    def on_rtp(self, data: bytes, addr: Addr) -> None:
        ctx = self.ctx
        count = ctx.counters.count
        if not ctx.allowed(addr[0]):
            count("rtp_refused_allowlist")
            return
        if self.ended:
            return
        src = (addr[0], addr[1])
        latch = self.latch
        wire_len = len(data)
        session = self.srtp
        if latch is None and self.latch_first:
            if self.state not in ("answered", "confirmed") and not self.early_media:
                count("rtp_early_dropped")
                return
            if addr[0] != self.dialog.source[0]:  # only the signalling peer's IP may take the latch
                count("rtp_latch_refused")
                count("rtp_foreign_dropped")
                self.call.stats.rtp_foreign_dropped += 1
                ctx.counters.log_limit("rtp_latch_refused", "RTP for call %s from %s:%s dropped (not the "
                                       "signalling source %s)", self.call.call_id, addr[0], addr[1],
                                       self.dialog.source[0], level=logging.WARNING)
                return
            if session is not None:  # only a packet that authenticated takes the latch
                plain = self._unprotect(session, data, addr)
                if plain is None:
                    return
                data, session = plain, None
            self.latch = latch = src
            if self.remote is not None:
                self.remote = src  # symmetric RTP: answer where the caller sends from
        if src != latch:
            count("rtp_foreign_dropped")
            self.call.stats.rtp_foreign_dropped += 1
            ctx.counters.log_limit("rtp_foreign", "RTP for call %s from %s:%s dropped (latched to %s)",
                                   self.call.call_id, addr[0], addr[1], latch, level=logging.WARNING)
            return
        if session is not None:
            plain = self._unprotect(session, data, addr)
            if plain is None:
                return
            data = plain
        self._rtp_in(data, wire_len, addr)

    def _unprotect(self, session: srtp.SrtpSession, data: bytes, addr: Addr) -> bytes | None:
        """The RTP packet inside an SRTP one; None when refused (counted, logged bounded)."""
        try:
            return session.unprotect(data)
        except srtp.SrtpDrop as e:
            counters = self.ctx.counters
            counters.count(f"sip_srtp_{e.reason}")
            self.call.stats.srtp_dropped += 1
            counters.log_limit(f"sip_srtp_{e.reason}", "SRTP packet for call %s from %s:%s dropped: %s",
                               self.call.call_id, addr[0], addr[1], e.reason, level=logging.INFO)
            return None

    def _rtp_in(self, data: bytes, wire_len: int, addr: Addr) -> None:
        ctx = self.ctx
        try:
            pkt = rtp.parse(data)
        except rtp.RtpError as e:
            ctx.counters.count("rtp_malformed")
            ctx.counters.log_limit("rtp_malformed", "malformed RTP for call %s from %s: %s",
                                   self.call.call_id, addr[0], e, level=logging.INFO)
            self.call_host.protocol_error(self.call, "")
            return
        self.call_host.packet_in(self.call, wire_len)
        now = ctx.loop.time()
        self.last_rx = now
        out = self.jb.push(pkt, now)
        if out:
            self._play(out)

    def _play(self, out: list[tuple[int, rtp.RtpPacket]]) -> None:
        neg = self.neg
        call = self.call
        host = self.call_host
        for gap, pkt in out:
            pt = pkt.payload_type
            if neg is not None and pt == neg.payload_type:
                codec = self.codec
                assert codec is not None
                host.audio_in(call, codec.decode(pkt.payload), RATE, -1, gap)
            elif neg is not None and pt == neg.dtmf_pt:
                ev = self.dtmf_rx.on_packet(pkt.timestamp, pkt.payload)
                if ev is not None:
                    host.dtmf_in(call, ev.digit, ev.duration_ms)
            elif pt in BY_PT:  # the peer switched to the other G.711 law it offered
                host.audio_in(call, BY_PT[pt].decode(pkt.payload), RATE, -1, gap)
            elif pt != 13:  # 13 = comfort noise: nothing to play
                self.ctx.counters.count("rtp_unexpected_payload_type")

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
        s = self.srtp
        if s is None:
            rtp_t.transport.sendto(memoryview(self._buf)[: 12 + n], self.remote)
        elif not self._send_srtp(s, bytes(memoryview(self._buf)[: 12 + n]), rtp_t.transport, self.remote):
            return False
        self.call.stats.packets_out += 1
        return True

    def _send_srtp(self, s: srtp.SrtpSession, packet: bytes, transport: asyncio.DatagramTransport,
                   remote: Addr) -> bool:
        try:
            transport.sendto(s.protect(packet), remote)
        except srtp.SrtpDrop:
            self.ctx.counters.count("sip_srtp_protect_failed")
            self.ctx.counters.log_limit("sip_srtp_protect_failed", "SRTP protect failed for call %s",
                                        self.call.call_id, level=logging.WARNING)
            return False
        return True

    def end_spurt(self) -> None:
        self.sender.end_spurt()

    def send_clear(self) -> None:
        self.sender.end_spurt()  # stop RTP audio now; the next audio starts a new talkspurt

    def send_dtmf(self, digits: str) -> int:
        if self.neg is None or self.neg.dtmf_pt < 0:
            self.ctx.counters.count("dtmf_out_unsupported")
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
            s = self.srtp
            if s is None:
                rtp_t.transport.sendto(hdr + payload, self.remote)
            elif not self._send_srtp(s, hdr + payload, rtp_t.transport, self.remote):
                return True
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
            timeout = self.ctx.cfg.rtp_timeout_s
            if timeout and self.state == "confirmed" and self.neg is not None and not self.neg.on_hold \
                    and self.last_rx and now - self.last_rx > timeout:
                self.ctx.counters.count("rtp_timeouts")
                self.call_host.hangup(self.call, "rtp timeout")
            hold = self.ctx.cfg.hold_timeout_s
            if hold and self.held_since is not None and self.state == "confirmed" and now - self.held_since > hold:
                self.held_since = None  # once
                self.ctx.counters.count("sip_hold_timeouts")
                self.call_host.hangup(self.call, "hold timeout")

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
        self.ctx.signalling.hangup(self, reason)

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        self.ctx.signalling.refer(self, target, done, summary)


def _same(proto: RtpProtocol) -> RtpProtocol:
    return proto


def JitterFor(cfg: SipConfig) -> JitterBuffer:
    return JitterBuffer(depth=cfg.max_buffered_packets, max_wait=cfg.jitter_ms / 1000.0,
                        max_gap=RATE, clock_rate=RATE)



class RtpPorts:
    """The RTP port allocator of the SIP user agent (see the module docstring)."""

    def __init__(self, cfg: SipConfig) -> None:
        self.cfg = cfg
        lo = cfg.rtp_port_min + (cfg.rtp_port_min & 1)
        self._free: list[int] = list(range(lo, cfg.rtp_port_max, 2))  # p and p+1 within the range
        self._rng = secrets.SystemRandom()
        self._rng.shuffle(self._free)
        self.in_use: set[int] = set()

    def _take(self) -> int:
        """A uniformly random free port, removed from the free list (O(1))."""
        free = self._free
        i = self._rng.randrange(len(free))
        free[i], free[-1] = free[-1], free[i]
        return free.pop()

    async def open(self, leg: SipCall, loop: asyncio.AbstractEventLoop) -> None:
        """Bind a random free even port of the range for ``leg`` (OSError: none free)."""
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        busy: list[int] = []  # held by another process now: back to the free list afterwards
        try:
            for _ in range(min(len(self._free), 64)):
                port = self._take()
                sock = socket.socket(family, socket.SOCK_DGRAM)
                try:
                    sock.bind((self.cfg.host, port))
                except OSError:
                    sock.close()
                    busy.append(port)
                    continue
                sock.setblocking(False)
                self.in_use.add(port)
                proto = RtpProtocol(leg)
                try:
                    await loop.create_datagram_endpoint(functools.partial(_same, proto), sock=sock)
                except BaseException:
                    sock.close()
                    self.in_use.discard(port)
                    self._free.append(port)
                    raise
                leg.rtp = proto
                leg.rtp_port = port
                return
        finally:
            self._free.extend(busy)
        raise OSError("no free RTP port in range")

    def close(self, leg: SipCall) -> None:
        """Close ``leg``'s RTP socket, drop its SRTP session and give its port back (idempotent)."""
        if leg.rtp is not None and leg.rtp.transport is not None:
            leg.rtp.transport.close()
        leg.rtp = None
        if leg.srtp is not None:
            leg.srtp.close()
            leg.srtp = None
        leg.offered = None
        port = leg.rtp_port
        if port in self.in_use:
            self.in_use.discard(port)
            self._free.append(port)
