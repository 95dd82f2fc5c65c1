"""Outbound calls on a real gateway core (rings in /dev/shm, the echo agent, real RTP sockets;
the SIP socket's sends are captured, the callee's responses fed in):

* answered: INVITE with our SDP offer, 180, 200 -> ACK to the 200's Contact (again for a
  retransmitted 200), the call admitted as ``sip`` and started (the echo agent), the dial
  reports the call id; the callee's BYE ends and releases it;
* 486 -> ACKed in its transaction, reported ``busy``, nothing left;
* the ring timeout -> CANCEL (only once a provisional came), 487 -> ``no answer``;
* a hang-up before any provisional waits for it to CANCEL; a refused dial takes nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core.gateway_core import GatewayCore
from brisvox.gateway.transports import assemble
from brisvox.wire import sdp
from brisvox.wire.sip_dialog import make_response
from brisvox.wire.sip_message import SipMessage, parse
from tests.unit.test_sip_admission_props import Wire, sdp_body, segments, settle

_seq = itertools.count(1)
CALLEE = ("127.0.0.1", 5099)


async def started(**sip: Any) -> tuple[GatewayCore, Any, Wire]:
    lo = 44000 + (os.getpid() * 19 + next(_seq) * 227) % 16000 & ~1
    settings = GatewaySettings(
        GatewayConfig(echo_use_workers=False, max_calls=4),
        SipConfig(port=0, rtp_port_min=lo, rtp_port_max=lo + 200, **sip),
        WebSocketConfig(enabled=False))
    core = assemble(settings, instance=f"sd{os.getpid()}x{next(_seq)}")
    await core.start()
    ua = core.listeners["sip"]
    wire = Wire()
    ua.transactions.transport = wire
    return core, ua, wire


def sent(wire: Wire, method: str) -> list[tuple[SipMessage, Any]]:
    return [(parse(d), a) for d, a in wire.sent if d.startswith(method.encode() + b" ")]


def answer(ua: Any, inv: SipMessage, status: int, **kw: Any) -> None:
    ua.transactions.datagram_received(make_response(inv, status, to_tag="callee1", **kw).serialize(), CALLEE)


class Result:
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, Any] | None, str]] = []

    def __call__(self, data: dict[str, Any] | None, error: str) -> None:
        self.got.append((data, error))


def test_answered_dial_acks_starts_the_agent_and_the_callees_bye_ends_it():
    async def run() -> None:
        core, ua, wire = await started()
        res = Result()
        try:
            ua.dial(f"sip:bob@{CALLEE[0]}:{CALLEE[1]}", "echo", res)
            assert await settle(lambda: bool(sent(wire, "INVITE")))
            (inv, to), = sent(wire, "INVITE")
            assert to == CALLEE and inv.uri == "sip:bob@127.0.0.1:5099"
            offer = sdp.parse(inv.body)
            assert offer.media[0].port in ua.rtp_ports.in_use
            assert len(core.table) == 1 and res.got == []
            answer(ua, inv, 180)
            body = sdp_body(port="4002")
            answer(ua, inv, 200, contact="<sip:bob@127.0.0.1:5098>", body=body, content_type="application/sdp")
            assert await settle(lambda: bool(res.got))
            data, error = res.got[0]
            assert error == "" and data is not None and data["codec"] == "PCMU"
            (ack, ack_to), = sent(wire, "ACK")
            assert ack_to == ("127.0.0.1", 5098) and ack.cseq == (inv.cseq[0], "ACK") and ack.to_tag == "callee1"
            call = core.table.get(data["call_id"])
            assert call is not None and call.transport == "sip" and call.state == "active"
            assert call.called == "bob" and call.params["direction"] == "outbound"
            answer(ua, inv, 200, contact="<sip:bob@127.0.0.1:5098>", body=body, content_type="application/sdp")
            assert len(sent(wire, "ACK")) == 2  # a retransmitted 200: the same ACK again
            assert len(res.got) == 1
            bye = (f"BYE sip:brisvox@127.0.0.1:{ua.transactions.port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5098;branch=z9hG4bKb1\r\n"
                   f"From: <sip:bob@127.0.0.1:5099>;tag=callee1\r\nTo: {inv.get('from')}\r\n"
                   f"Call-ID: {inv.call_id}\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n").encode()
            ua.transactions.datagram_received(bye, ("127.0.0.1", 5098))
            assert await settle(lambda: len(core.table) == 0)
            assert ua.stats()["sip_dial_answered"] == 1 and ua.stats()["rtp_ports_in_use"] == 0
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_busy_is_acked_reported_and_leaves_nothing():
    async def run() -> None:
        core, ua, wire = await started()
        res = Result()
        try:
            ua.dial("sip:bob@127.0.0.1:5099", "echo", res)
            assert await settle(lambda: bool(sent(wire, "INVITE")))
            (inv, _), = sent(wire, "INVITE")
            answer(ua, inv, 486)
            assert res.got == [(None, "busy")]
            (ack, to), = sent(wire, "ACK")
            assert to == CALLEE and ack.top_via.branch == inv.top_via.branch
            assert await settle(lambda: len(core.table) == 0)
            st = ua.stats()
            assert st["sip_dial_failed_busy"] == 1 and st["rtp_ports_in_use"] == 0 and st["sip_dialogs"] == 0
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_ring_timeout_cancels_after_the_provisional_and_reports_no_answer():
    async def run() -> None:
        core, ua, wire = await started()
        res = Result()
        try:
            ua.dial("sip:bob@127.0.0.1:5099", "echo", res, ring_timeout_s=0.2)
            assert await settle(lambda: bool(sent(wire, "INVITE")))
            (inv, _), = sent(wire, "INVITE")
            await asyncio.sleep(0.3)
            assert sent(wire, "CANCEL") == []  # no provisional yet: CANCEL must wait (RFC 3261 9.1)
            answer(ua, inv, 180)
            (cancel, to), = sent(wire, "CANCEL")
            assert to == CALLEE and cancel.cseq == (inv.cseq[0], "CANCEL")
            assert cancel.top_via.branch == inv.top_via.branch
            ua.transactions.datagram_received(make_response(cancel, 200).serialize(), CALLEE)
            answer(ua, inv, 487)
            assert res.got == [(None, "no answer")]
            assert await settle(lambda: len(core.table) == 0)
            assert ua.stats()["sip_dial_cancel_sent"] == 1
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_refused_dials_take_nothing():
    async def run() -> None:
        core, ua, wire = await started(trunk="127.0.0.1:5070")
        res = Result()
        try:
            ua.dial("sip:bob@192.0.2.1:5060", "echo", res)  # trunk set: sent to the trunk
            assert await settle(lambda: bool(sent(wire, "INVITE")))
            (inv, to), = sent(wire, "INVITE")
            assert to == ("127.0.0.1", 5070) and inv.uri == "sip:bob@192.0.2.1:5060"
            core.hangup(next(iter(core.table.calls.values())), "test over")
            answer(ua, inv, 100)
            assert len(sent(wire, "CANCEL")) == 1
            answer(ua, inv, 487)
            assert res.got[-1] == (None, "test over")
            core.drain()
            ua.dial("+15550100", "echo", res)
            assert res.got[-1][1] == "refused: draining"
            assert core.table.admitted == 1 and len(core.table) == 0
        finally:
            await core.stop()

    asyncio.run(run())
