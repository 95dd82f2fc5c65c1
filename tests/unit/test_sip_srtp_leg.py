"""SRTP in the SIP gateway (brisvox/gateway/sip/rtp.py, dialogs.py) on a real gateway core: rings,
the built-in echo, real RTP sockets, the SIP socket's sends captured. The signalling here is UDP,
so the calls that carry keys set ``srtp_allow_insecure_signalling`` (the TLS rule itself is
checked with real TLS in tests/system/test_sip_srtp.py).

* SDES over UDP is refused 488 without the override, answered with it (our own key, the offer's
  tag and suite, RTP/SAVP mirrored, the suite in transport_ids); a best-effort offer over UDP
  is answered plain; ``srtp = "required"`` refuses a plain offer and needs a TLS listener;
* inbound SRTP reaches the call; garbage, a replay, a truncated packet, a wrong key and plain
  RTP are dropped and counted (in total and per call), logged once per kind, and the call
  goes on; outbound audio and RFC 4733 events leave protected;
* a re-INVITE keeping the peer's key keeps the replay window; a new key re-keys the inbound
  context only (our key stays); a new suite gives both sides new keys;
* a late offer (INVITE without SDP) gets our offer with one line per suite; the ACK's answer
  picks the line whose key we then send with;
* the contexts are freed when the call ends.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import struct
import weakref
from typing import Any

import numpy as np
import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import SipConfig
from brisvox.wire import sdp, srtp
from brisvox.wire.sip_message import SipMessage
from tests.unit.test_sip_admission_props import sdp_body, settle, started
from tests.unit.test_sip_destinations import PEER, answered, finals, request

S80, S32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"
MEDIA = ("127.0.0.1", 4000)  # the offer's RTP address: the latch
LAB = {"invite_rate": (), "refresh_rate": (), "srtp": "optional", "srtp_allow_insecure_signalling": True}  # refresh_rate: the tests re-INVITE back to back


def savp_body(*lines: srtp.Crypto | str, proto: str = "RTP/SAVP", extra: str = "") -> bytes:
    attrs = "".join(f"a=crypto:{c.value() if isinstance(c, srtp.Crypto) else c}\r\n" for c in lines)
    return sdp_body(extra=attrs + extra).replace(b"RTP/AVP", proto.encode())


def their_answer(ok: SipMessage) -> srtp.Crypto:
    [m] = sdp.parse(ok.body).media
    assert len(m.crypto) == 1
    return srtp.parse_crypto(m.crypto[0])


def rtp_packet(seq: int, payload: bytes = b"\xff" * 160, ssrc: int = 0x5151, pt: int = 0) -> bytes:
    return struct.pack("!BBHII", 0x80, pt, seq & 0xFFFF, seq * 160, ssrc) + payload


class Capture:
    """Stands in for a leg's RTP transport: records what is sent; closes the real one."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.sent: list[tuple[bytes, Any]] = []

    def sendto(self, data: Any, addr: Any) -> None:
        self.sent.append((bytes(data), addr))

    def close(self) -> None:
        self.real.close()


def test_sdes_over_udp_is_refused_unless_overridden_and_best_effort_is_answered_plain():
    mine = srtp.new_crypto(7, S32)

    async def run() -> None:
        core, ua, wire = await started({"invite_rate": (), "srtp": "optional"})
        try:
            ua.transactions.datagram_received(request("INVITE", body=savp_body(mine)), PEER)
            await asyncio.sleep(0.05)
            [(resp, _)] = finals(wire)
            assert resp.status == 488 and "TLS" in resp.get("warning")
            assert base64.b64encode(mine.key).decode() not in resp.get("warning")
            st = ua.stats()
            assert st["sip_refused_srtp_insecure_signalling"] == 1 and st["sip_invite_488"] == 1
            assert len(core.table) == 0 and core.table.admitted == 0
            wire.sent.clear()
            ok, leg = await answered(ua, wire, core, body=savp_body(mine, proto="RTP/AVP"))
            assert leg.srtp is None and sdp.parse(ok.body).media[0].crypto == []  # taken plain
            assert "srtp" not in leg.call.transport_ids
        finally:
            await core.stop()
        core, ua, wire = await started(LAB)
        try:
            ok, leg = await answered(ua, wire, core, body=savp_body("1 AES_256_CM_HMAC_SHA1_80 inline:x", mine))
            [m] = sdp.parse(ok.body).media
            assert m.proto == "RTP/SAVP"
            ours = their_answer(ok)
            assert (ours.tag, ours.suite) == (7, S32) and ours.key != mine.key
            assert leg.srtp is not None and leg.call.transport_ids["srtp"] == S32
            assert ua.stats()["sip_srtp_sessions"] == 1
        finally:
            await core.stop()

    asyncio.run(run())


def test_srtp_required_refuses_a_plain_offer_and_needs_a_tls_listener():
    async def run() -> None:
        core, ua, wire = await started({**LAB, "srtp": "required"})
        try:
            ua.transactions.datagram_received(request("INVITE"), PEER)
            await asyncio.sleep(0.05)
            assert [m.status for m, _ in finals(wire)] == [488]
            assert ua.stats()["sip_refused_srtp_required"] == 1 and core.table.admitted == 0
        finally:
            await core.stop()

    asyncio.run(run())
    with pytest.raises(ConfigError, match="TLS"):
        SipConfig.from_section({"srtp": "required"})
    assert SipConfig.from_section({"srtp": "optional"}).srtp_policy == sdp.SrtpPolicy("optional")
    with pytest.raises(ConfigError):
        SipConfig.from_section({"srtp": "mandatory"})


def test_inbound_srtp_reaches_the_call_and_bad_packets_are_dropped_and_counted():
    peer = srtp.new_crypto(1, S80)

    async def run() -> None:
        core, ua, wire = await started(LAB)
        try:
            ok, leg = await answered(ua, wire, core, body=savp_body(peer))
            ours = their_answer(ok)
            me = srtp.SrtpSession(peer, ours)  # the caller's side: its key out, ours in
            first = me.protect(rtp_packet(1))
            leg.on_rtp(first, MEDIA)
            assert leg.call.stats.packets_in == 1
            stranger = srtp.SrtpSession(srtp.new_crypto(1, S80), srtp.new_crypto(1, S80))
            lines_before = ua.counters.log_limit.lines
            bad = [first] * 20  # replays
            bad += [stranger.protect(rtp_packet(s)) for s in range(2, 22)]  # a wrong key
            bad += [me.protect(rtp_packet(s))[:15] for s in range(22, 42)]  # truncated
            bad += [rtp_packet(s) for s in range(42, 62)]  # plain RTP on an SRTP call
            bad += [bytes([0x80]) + bytes(range(200)) for _ in range(20)]  # garbage
            for data in bad:
                leg.on_rtp(data, MEDIA)
            st = ua.stats()
            assert st["sip_srtp_replayed"] >= 20 and st["sip_srtp_malformed"] >= 20
            assert st["sip_srtp_auth_failed"] >= 20
            total = sum(st.get(f"sip_srtp_{r}", 0) for r in srtp.DROP_REASONS)
            assert total == len(bad) == leg.call.stats.srtp_dropped
            assert ua.counters.log_limit.lines - lines_before <= len(srtp.DROP_REASONS)  # one line a kind
            assert leg.call.stats.packets_in == 1 and "rtp_malformed" not in st
            leg.on_rtp(me.protect(rtp_packet(62)), MEDIA)  # the call goes on
            assert leg.call.stats.packets_in == 2 and not leg.ended
        finally:
            await core.stop()

    asyncio.run(run())


def test_outbound_audio_and_dtmf_leave_protected():
    peer = srtp.new_crypto(1, S80)

    async def run() -> None:
        core, ua, wire = await started(LAB)
        try:
            ok, leg = await answered(ua, wire, core, body=savp_body(peer))
            me = srtp.SrtpSession(peer, their_answer(ok))
            assert leg.rtp is not None
            cap = Capture(leg.rtp.transport)
            leg.rtp.transport = cap  # type: ignore[assignment]
            tone = (6000 * np.sin(np.arange(160) / 3)).astype(np.int16)
            assert leg.send_audio(tone, 0.0)
            [(data, addr)] = cap.sent
            assert addr == MEDIA and len(data) == 12 + 160 + 10
            plain = me.unprotect(data)
            assert plain[12:] == bytes(leg.codec.encode(tone)) and data[12:172] != plain[12:]
            leg.send_dtmf("5")
            now = 0.02
            while leg.tick_dtmf(now):
                now += 0.02
            events = [me.unprotect(d) for d, _ in cap.sent[1:]]
            assert events and all(e[1] & 0x7F == leg.neg.dtmf_pt and e[12] == 5 for e in events)
        finally:
            await core.stop()

    asyncio.run(run())


def test_a_reinvite_keeping_the_key_keeps_state_and_a_new_key_rekeys_inbound_only():
    peer = srtp.new_crypto(1, S80)

    async def run() -> None:
        core, ua, wire = await started(LAB)
        try:
            ok, leg = await answered(ua, wire, core, body=savp_body(peer))
            ours = their_answer(ok)
            me = srtp.SrtpSession(peer, ours)
            first = me.protect(rtp_packet(1))
            leg.on_rtp(first, MEDIA)

            def reinvite(cseq: int, *lines: srtp.Crypto) -> SipMessage:
                wire.sent.clear()
                ua.transactions.datagram_received(request("INVITE", call_id=ok.call_id, to_tag=ok.to_tag,
                                                          cseq=cseq, body=savp_body(*lines)), PEER)
                [(resp, _)] = finals(wire)
                assert resp.status == 200
                ua.transactions.datagram_received(request("ACK", call_id=ok.call_id, to_tag=ok.to_tag,
                                                          cseq=cseq), PEER)
                return resp

            same = reinvite(2, srtp.Crypto(4, S80, peer.key))  # the same key under another tag
            answer = their_answer(same)
            assert answer.tag == 4 and answer.key == ours.key  # our key stays
            leg.on_rtp(first, MEDIA)
            assert ua.stats()["sip_srtp_replayed"] == 1  # the replay window survived
            assert "sip_srtp_rekeyed" not in ua.stats()
            new_peer = srtp.new_crypto(1, S80)
            rekeyed = reinvite(3, new_peer)
            assert their_answer(rekeyed).key == ours.key and ua.stats()["sip_srtp_rekeyed"] == 1
            leg.on_rtp(me.protect(rtp_packet(2)), MEDIA)  # the old key no longer verifies
            assert ua.stats()["sip_srtp_auth_failed"] == 1
            me2 = srtp.SrtpSession(new_peer, ours)
            n = leg.call.stats.packets_in
            leg.on_rtp(me2.protect(rtp_packet(3)), MEDIA)
            assert leg.call.stats.packets_in == n + 1
            other_suite = reinvite(4, srtp.new_crypto(1, S32))
            a32 = their_answer(other_suite)
            assert a32.suite == S32 and a32.key != ours.key and leg.call.transport_ids["srtp"] == S32
        finally:
            await core.stop()

    asyncio.run(run())


def test_a_late_offer_gets_our_lines_and_the_acks_answer_picks_one():
    async def run() -> None:
        core, ua, wire = await started(LAB)
        try:
            ua.transactions.datagram_received(request("INVITE", body=b""), PEER)
            assert await settle(lambda: any(m.status == 200 for m, _ in finals(wire)))
            ok = next(m for m, _ in finals(wire) if m.status == 200)
            [m] = sdp.parse(ok.body).media
            offered = [srtp.parse_crypto(c) for c in m.crypto]
            assert m.proto == "RTP/AVP" and [(c.tag, c.suite) for c in offered] == [(1, S80), (2, S32)]
            peer = srtp.new_crypto(2, S32)
            ack = request("ACK", call_id=ok.call_id, to_tag=ok.to_tag, body=savp_body(peer, proto="RTP/AVP"))
            ua.transactions.datagram_received(ack, PEER)
            leg = next(iter(core.table.calls.values())).leg
            assert leg.srtp is not None and leg.srtp.suite == S32 and leg.srtp.local.key == offered[1].key
            me = srtp.SrtpSession(peer, offered[1])
            leg.on_rtp(me.protect(rtp_packet(9)), MEDIA)
            assert leg.call.stats.packets_in == 1
        finally:
            await core.stop()

    asyncio.run(run())


def test_the_contexts_are_freed_when_the_call_ends():
    async def run() -> None:
        core, ua, wire = await started(LAB)
        try:
            ok, leg = await answered(ua, wire, core, body=savp_body(srtp.new_crypto(1, S80)))
            session = leg.srtp
            assert session is not None and ua.stats()["sip_srtp_sessions_open"] == 1
            contexts = [weakref.ref(session._tx), weakref.ref(session._rx)]  # libsrtp's, freed at gc
            core.hangup(leg.call, "done")
            assert await settle(lambda: leg.ended)
            assert leg.srtp is None and session.closed and ua.stats()["sip_srtp_sessions_open"] == 0
            gc.collect()
            assert all(ref() is None for ref in contexts)
        finally:
            await core.stop()

    asyncio.run(run())
