"""The SIP user agent against hostile INVITEs, on a real gateway core (rings in /dev/shm,
the echo agent, real RTP sockets; the SIP socket's sends are captured): a refused INVITE
takes nothing (no call, no ring, no port), a valid one right after is answered; rate
limits and the transaction table cap answer 503 statelessly; a BYE's Reason cannot
carry a header of its own; RTP ports are handed out at random and never twice."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core.gateway_core import GatewayCore
from brisvox.gateway.sip.rtp import RtpPorts
from brisvox.gateway.transports import assemble
from brisvox.wire import sdp
from brisvox.wire.sip_message import parse

_seq = itertools.count(1)
PEER = ("127.0.0.1", 5099)


def sdp_body(host: str = "127.0.0.1", port: str = "4000", extra: str = "", family: str = "IP4") -> bytes:
    return (f"v=0\r\no=- 1 1 IN {family} {host}\r\ns=-\r\nc=IN {family} {host}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\n{extra}").encode()


def invite(*, contact: str = "<sip:a@127.0.0.1:5099>", frm: str = "<sip:t@127.0.0.1>;tag=abc",
           cseq: str = "1 INVITE", body: bytes | None = None, extra: str = "", cl: str | None = None,
           call_id: str = "", mf: str = "70") -> bytes:
    n = next(_seq)
    body = sdp_body() if body is None else body
    head = (f"INVITE sip:echo@127.0.0.1 SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bK{n}x{os.getpid()};rport\r\n"
            f"From: {frm}\r\nTo: <sip:echo@127.0.0.1>\r\nCall-ID: {call_id or f'c{n}@t'}\r\nCSeq: {cseq}\r\n"
            f"Contact: {contact}\r\nMax-Forwards: {mf}\r\n{extra}Content-Type: application/sdp\r\n"
            f"Content-Length: {len(body) if cl is None else cl}\r\n\r\n")
    return head.encode("utf-8") + body


def hostile() -> list[bytes]:
    """The kinds of INVITE that used to be admitted, answered 200 or leak."""
    many_m = sdp_body() + b"m=audio 4002 RTP/AVP 0\r\n" * 9
    return [
        invite(contact="<sip:broken"),
        invite(contact="<mailto:x@y>"),
        invite(frm="<sip:broken;tag=1"),
        invite(frm="<sip:t@127.0.0.1>"),  # no tag
        invite(body=sdp_body(port="99999")),
        invite(body=sdp_body(port="4\u00b2")),
        invite(body=sdp_body(host="example.com")),
        invite(body=sdp_body(host="224.0.0.1")),
        invite(body=sdp_body(host="::1", family="IP6")),  # not our RTP socket's family
        invite(body=many_m),
        invite(body=sdp_body().replace(b"RTP/AVP 0 101", b"RTP/AVP 0 300")),
        invite(cseq="1\u00b2 INVITE"),
        invite(cseq="99999999999 INVITE"),
        invite(cl="1\u00b2"),
        invite(extra="Subject: a\rX-Injected: 1\r\n"),
        invite(mf="\u0661"),
        invite(body=b"x" * 20000),  # over max_message_bytes: 513
    ]


class Wire:
    """Stands in for the SIP socket's transport: records what the UA sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append((bytes(data), addr))

    def close(self) -> None:
        pass

    def statuses(self) -> list[int]:
        return [int(d[8:11]) for d, _ in self.sent if d.startswith(b"SIP/2.0 ")]


async def started(sip: dict[str, Any], **gw: Any) -> tuple[GatewayCore, Any, Wire]:
    lo = 42000 + (os.getpid() * 13 + next(_seq) * 211) % 18000 & ~1
    settings = GatewaySettings(
        # the calls all come from one address: the per-source call cap is not what these test
        GatewayConfig(**{"echo_use_workers": False, "max_calls": 8, "max_calls_per_source": 8, **gw}),
        SipConfig(port=0, rtp_port_min=lo, rtp_port_max=lo + 200, **sip),
        WebSocketConfig(enabled=False))
    core = assemble(settings, instance=f"sa{os.getpid()}x{next(_seq)}")
    await core.start()
    ua = core.listeners["sip"]
    wire = Wire()
    ua.transactions.transport = wire
    return core, ua, wire


def segments(core: GatewayCore) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"brisvox.{core.instance}.*"))


async def settle(pred: Any, timeout: float = 3.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def test_bad_invites_take_nothing_and_a_valid_one_after_is_answered():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": ()})
        try:
            bad = [m for _ in range(6) for m in hostile()]
            for data in bad:
                ua.transactions.datagram_received(data, PEER)
            await asyncio.sleep(0.2)
            finals = [s for s in wire.statuses() if s >= 200]
            assert len(finals) == len(bad), finals
            assert set(finals) <= {400, 488, 513}, sorted(set(finals))
            assert len(core.table) == 0 and core.table.admitted == 0
            assert segments(core) == [] and ua.rtp_ports.in_use == set()
            st = ua.stats()
            assert st["sip_refused_malformed"] and st["sip_refused_sdp"] and st["sip_refused_too_large"]
            assert "sip_internal_errors" not in st
            wire.sent.clear()
            ua.transactions.datagram_received(invite(), PEER)
            assert await settle(lambda: 200 in wire.statuses())
            assert len(core.table) == 1 and len(ua.rtp_ports.in_use) == 1
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_a_bye_reason_with_crlf_never_becomes_a_header():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": ()})
        try:
            ua.transactions.datagram_received(invite(call_id="esc@t"), PEER)
            assert await settle(lambda: 200 in wire.statuses())
            ok = next(parse(d) for d, _ in wire.sent if d.startswith(b"SIP/2.0 200"))
            ack = (f"ACK sip:brisvox@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bKack\r\n"
                   f"From: <sip:t@127.0.0.1>;tag=abc\r\nTo: {ok.get('to')}\r\nCall-ID: esc@t\r\n"
                   "CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n").encode()
            ua.transactions.datagram_received(ack, PEER)
            call = next(iter(core.table.calls.values()))
            evil = 'done"\r\nX-Evil: injected\r\n\r\nBYE sip:x SIP/2.0\x00' + "\u2028" + "z" * 300
            core.hangup(call, evil)
            byes = [d for d, _ in wire.sent if d.startswith(b"BYE ")]
            assert len(byes) == 1
            raw = byes[0]
            head = raw.split(b"\r\n\r\n", 1)[0]
            assert b"\x00" not in raw and b"\nX-Evil" not in raw and b"\nBYE " not in raw
            bye = parse(raw)
            assert bye.get("x-evil") == "" and len(bye.get_all("reason")) == 1
            reason = bye.get("reason")
            assert reason.startswith('Q.850;cause=16;text="done\\" X-Evil: injected BYE sip:x SIP/2.0')
            assert reason.endswith('"') and len(reason.encode()) <= len('Q.850;cause=16;text=""') + 128
            assert head.count(b"\r\n") == len(bye.headers)  # start line + one line per header
        finally:
            await core.stop()

    asyncio.run(run())


def test_rate_limits_and_the_transaction_cap_answer_503_before_any_state():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": ("3/second",), "options_rate": ("4/second",),
                                        "max_transactions": 16, "max_transactions_per_source": 16})
        src = f"127.0.{os.getpid() % 250}.{next(_seq) % 250 + 1}"
        try:
            for _ in range(8):
                ua.transactions.datagram_received(invite().replace(b"INVITE sip:echo", b"OPTIONS sip:echo")
                                     .replace(b"1 INVITE", b"1 OPTIONS"), (src, 5099))
            assert wire.statuses() == [200] * 4 + [503] * 4
            limited = parse(wire.sent[-1][0])
            assert 1 <= int(limited.get("retry-after")) <= 1
            assert ua.stats()["sip_refused_rate_limit"] == 4
            wire.sent.clear()
            for _ in range(5):
                ua.transactions.datagram_received(invite(), (src, 5099))
            assert await settle(lambda: wire.statuses().count(200) == 3)
            assert wire.statuses().count(503) == 2 and len(core.table) == 3
            # the table: 4 OPTIONS + 3 INVITEs live; fill it from other sources
            wire.sent.clear()
            for i in range(20):
                opt = invite().replace(b"INVITE sip:echo", b"OPTIONS sip:echo").replace(b"1 INVITE", b"1 OPTIONS")
                ua.transactions.datagram_received(opt, (f"127.1.{next(_seq) % 250}.{i + 1}", 5099))
            assert len(ua.transactions.server_tx) == 16
            assert ua.stats()["sip_refused_tx_table_full"] == 11
            assert wire.statuses().count(503) == 11
        finally:
            await core.stop()

    asyncio.run(run())


def test_rtp_ports_are_random_even_and_never_shared():
    cfg = SipConfig(rtp_port_min=50001, rtp_port_max=50041)
    ports = RtpPorts(cfg)
    assert sorted(ports._free) == list(range(50002, 50041, 2))
    order = [ports._take() for _ in range(20)]
    assert sorted(order) == list(range(50002, 50041, 2)) and order != sorted(order)
    assert not ports._free
    with pytest.raises(ValueError):
        ports._take()


def test_sdp_addresses_must_be_ip_literals():
    with pytest.raises(sdp.SdpError):
        sdp.parse(sdp_body(host="pbx.example.com"))
    neg = sdp.negotiate(sdp.parse(sdp_body(host="0:0:0:0:0:0:0:1", family="IP6")))
    assert neg.remote_host == "::1" and neg.remote_port == 4000
