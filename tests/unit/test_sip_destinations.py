"""Where the SIP side sends, on a real gateway core (rings in /dev/shm, the echo agent, real RTP
sockets; the SIP socket's sends are captured):

* an INVITE whose Contact or Record-Route names an address outside ``[sip] allow`` is refused
  403, one whose SDP does 488; nothing admitted, nothing sent there; a re-INVITE moving the
  target or the media outside is refused the same way and the dialog keeps its target;
  responses go to the request's source whatever its Via says;
* ``[sip] nat = "signalling_source"``: the same INVITE is answered, its BYE goes to the
  INVITE's source and its RTP to the source's IP;
* an unknown Request-URI user is 404 unless ``[sip] default_agent`` names an agent;
* ``rtp_latch = "first"`` takes only the signalling IP and never moves;
* a held call ends at ``hold_timeout_s`` with a BYE whose Reason says so.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import SipConfig
from brisvox.gateway.sip.rtp import SipCall
from brisvox.wire import rtp
from brisvox.wire.sip_message import SipMessage, parse
from tests.unit.test_sip_admission_props import sdp_body, segments, settle, started

_seq = itertools.count(1)
PEER = ("127.0.0.1", 5099)
OUTSIDE = "127.0.0.5"
STRICT = {"invite_rate": (), "allow": ("127.0.0.1/32",)}


def request(method: str, *, user: str = "echo", contact: str = f"<sip:a@{PEER[0]}:{PEER[1]}>",
            via: str = f"{PEER[0]}:{PEER[1]}", body: bytes | None = None, extra: str = "",
            call_id: str = "", to_tag: str = "", cseq: int = 1) -> bytes:
    n = next(_seq)
    body = (sdp_body() if method == "INVITE" else b"") if body is None else body
    head = (f"{method} sip:{user}@127.0.0.1 SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {via};branch=z9hG4bK{n}d{os.getpid()}\r\n"
            f"From: <sip:t@127.0.0.1>;tag=abc\r\nTo: <sip:{user}@127.0.0.1>{';tag=' + to_tag if to_tag else ''}\r\n"
            f"Call-ID: {call_id or f'd{n}x{os.getpid()}@t'}\r\nCSeq: {cseq} {method}\r\n"
            f"Contact: {contact}\r\nMax-Forwards: 70\r\n{extra}"
            + ("Content-Type: application/sdp\r\n" if body else "")
            + f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def finals(wire: Any) -> list[tuple[SipMessage, Any]]:
    return [(parse(d), a) for d, a in wire.sent if d.startswith(b"SIP/2.0 ") and int(d[8:11]) >= 200]


async def answered(ua: Any, wire: Any, core: Any, **kw: Any) -> tuple[SipMessage, SipCall]:
    """An INVITE answered 200 and ACKed: (the 200, the call's leg)."""
    ua.transactions.datagram_received(request("INVITE", **kw), PEER)
    assert await settle(lambda: any(m.status == 200 for m, _ in finals(wire))), [m.status for m, _ in finals(wire)]
    ok = next(m for m, _ in finals(wire) if m.status == 200)
    ua.transactions.datagram_received(request("ACK", call_id=ok.call_id, to_tag=ok.to_tag), PEER)
    leg = next(iter(core.table.calls.values())).leg
    assert isinstance(leg, SipCall) and leg.state == "confirmed"
    return ok, leg


def test_an_invite_naming_an_address_outside_allow_is_refused_and_nothing_goes_there():
    async def run() -> None:
        core, ua, wire = await started(STRICT)
        try:
            for data in (request("INVITE", contact=f"<sip:a@{OUTSIDE}:5099>"),
                         request("INVITE", extra=f"Record-Route: <sip:{OUTSIDE};lr>\r\n")):
                ua.transactions.datagram_received(data, PEER)
            ua.transactions.datagram_received(request("INVITE", body=sdp_body(host=OUTSIDE)), PEER)
            await asyncio.sleep(0.1)
            assert [m.status for m, _ in finals(wire)] == [403, 403, 488]
            assert all(a == PEER for _, a in wire.sent) and not any(a[0] == OUTSIDE for _, a in wire.sent)
            assert len(core.table) == 0 and core.table.admitted == 0 and segments(core) == []
            st = ua.stats()
            assert st["sip_invite_403"] == 2 and st["sip_refused_destination"] == 2
            assert st["sip_invite_488"] == 1 and st["sip_refused_media_address"] == 1
            # a Via naming another host (no rport): the answer still goes to the request's source
            wire.sent.clear()
            ua.transactions.datagram_received(request("OPTIONS", via=f"{OUTSIDE}:5099"), PEER)
            assert [a for _, a in wire.sent] == [PEER]
        finally:
            await core.stop()

    asyncio.run(run())


def test_a_reinvite_cannot_move_the_target_or_the_media_outside_allow():
    async def run() -> None:
        core, ua, wire = await started(STRICT)
        try:
            ok, leg = await answered(ua, wire, core)
            target, remote = leg.dialog.remote_target, leg.remote
            for cseq, kw in ((2, {"contact": f"<sip:a@{OUTSIDE}:5099>"}), (3, {"body": sdp_body(host=OUTSIDE)})):
                wire.sent.clear()
                ua.transactions.datagram_received(request("INVITE", call_id=ok.call_id, to_tag=ok.to_tag,
                                                          cseq=cseq, **kw), PEER)
                assert [m.status for m, _ in finals(wire)] == [403 if cseq == 2 else 488]
            assert leg.dialog.remote_target == target and leg.remote == remote
            wire.sent.clear()
            core.hangup(leg.call, "done")
            assert [a for d, a in wire.sent if d.startswith(b"BYE ")] == [PEER]
        finally:
            await core.stop()

    asyncio.run(run())


def test_nat_signalling_source_sends_to_the_invites_source_instead():
    async def run() -> None:
        core, ua, wire = await started({**STRICT, "nat": "signalling_source"})
        try:
            ok, leg = await answered(ua, wire, core, contact=f"<sip:a@{OUTSIDE}:5070>",
                                     body=sdp_body(host="10.0.0.9", port="4000"))
            assert leg.remote == (PEER[0], 4000)  # the source's IP, the SDP's port
            wire.sent.clear()
            core.hangup(leg.call, "done")
            byes = [(parse(d), a) for d, a in wire.sent if d.startswith(b"BYE ")]
            assert [a for _, a in byes] == [PEER] and byes[0][0].uri == f"sip:a@{OUTSIDE}:5070"
        finally:
            await core.stop()

    asyncio.run(run())


def test_an_unknown_user_is_404_unless_a_default_agent_is_named():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": ()})
        try:
            ua.transactions.datagram_received(request("INVITE", user="svwar1234"), PEER)
            await asyncio.sleep(0.05)
            assert [m.status for m, _ in finals(wire)] == [404]
            assert len(core.table) == 0 and core.table.admitted == 0
            st = ua.stats()
            assert st["sip_invite_404"] == 1 and st["sip_refused_unknown_user"] == 1
        finally:
            await core.stop()
        core, ua, wire = await started({"invite_rate": (), "default_agent": "echo"})
        try:
            ua.transactions.datagram_received(request("INVITE", user="svwar1234"), PEER)
            assert await settle(lambda: any(m.status == 200 for m, _ in finals(wire)))
            assert next(iter(core.table.calls.values())).agent == "echo"
        finally:
            await core.stop()

    asyncio.run(run())


def test_the_first_latch_takes_only_the_signalling_ip_and_never_moves():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": (), "rtp_latch": "first"})
        try:
            ok, leg = await answered(ua, wire, core)
            sender = rtp.RtpSender()

            def packet() -> bytes:
                return bytes(sender.next_header(0, 160, 0.0)) + b"\xff" * 160

            leg.on_rtp(packet(), ("127.0.0.2", 4000))  # another host races the caller
            assert leg.latch is None
            leg.on_rtp(packet(), (PEER[0], 4444))  # the caller, behind a NAT: another port
            assert leg.latch == (PEER[0], 4444) and leg.remote == (PEER[0], 4444)
            leg.on_rtp(packet(), (PEER[0], 4446))
            # a re-INVITE naming a new address does not re-arm the latch
            ua.transactions.datagram_received(request("INVITE", call_id=ok.call_id, to_tag=ok.to_tag, cseq=2,
                                                      body=sdp_body(port="4600")), PEER)
            assert leg.latch == (PEER[0], 4444) and leg.remote == (PEER[0], 4444)
            st = ua.stats()
            assert st["rtp_latch_refused"] == 1 and st["rtp_foreign_dropped"] == 2
            assert leg.call.stats.packets_in == 1
        finally:
            await core.stop()

    asyncio.run(run())


def test_a_held_call_ends_at_hold_timeout_with_a_reason():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": (), "hold_timeout_s": 5.0})
        try:
            ok, leg = await answered(ua, wire, core)
            ua.transactions.datagram_received(request("INVITE", call_id=ok.call_id, to_tag=ok.to_tag, cseq=2,
                                                      body=sdp_body(extra="a=inactive\r\n")), PEER)
            assert leg.held_since is not None
            now = leg.held_since
            for _ in range(50):
                leg.poll(now + 4.0)
            assert not leg.ended
            wire.sent.clear()
            for _ in range(50):
                leg.poll(now + 5.5)
            byes = [parse(d) for d, _ in wire.sent if d.startswith(b"BYE ")]
            assert len(byes) == 1 and 'text="hold timeout"' in byes[0].get("reason")
            assert leg.call.end_reason == "hold timeout" and ua.stats()["sip_hold_timeouts"] == 1
        finally:
            await core.stop()

    asyncio.run(run())


def test_unhold_stops_the_hold_clock():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": (), "hold_timeout_s": 5.0, "rtp_timeout_s": 0})
        try:
            ok, leg = await answered(ua, wire, core)
            for cseq, extra in ((2, "a=sendonly\r\n"), (3, "a=sendrecv\r\n")):
                ua.transactions.datagram_received(request("INVITE", call_id=ok.call_id, to_tag=ok.to_tag,
                                                          cseq=cseq, body=sdp_body(extra=extra)), PEER)
                ack = request("ACK", call_id=ok.call_id, to_tag=ok.to_tag, cseq=cseq)
                ua.transactions.datagram_received(ack, PEER)
            assert leg.held_since is None
            for _ in range(50):
                leg.poll(asyncio.get_running_loop().time() + 100)
            assert not leg.ended
        finally:
            await core.stop()

    asyncio.run(run())


def test_the_config_keys():
    cfg = SipConfig.from_section({})
    assert cfg.default_agent == "" and cfg.nat == "strict" and cfg.hold_timeout_s == 3600.0
    assert SipConfig.from_section({"default_agent": "sales", "nat": "signalling_source",
                                   "hold_timeout_s": 0}).hold_timeout_s == 0
    for bad in ({"default_agent": "../x"}, {"nat": "loose"}, {"hold_timeout_s": -1}):
        with pytest.raises(ConfigError) as e:
            SipConfig.from_section(bad)
        assert e.value.key == f"sip.{next(iter(bad))}"
