"""The SIP user agent behind a dispatcher (Kamailio), on a real gateway core (rings in
/dev/shm, the echo agent, real RTP sockets; the SIP socket's sends are captured):

* OPTIONS is the dispatcher's health probe: 200 while a call would be admitted, 503
  "Full" (Retry-After 10) while the table is full, 503 "Draining" (Retry-After 30)
  while draining; asking takes and counts nothing of admission; a new INVITE while
  draining is 100 then 503 with Retry-After;
* from a ``[sip] trusted_proxies`` source the INVITE/OPTIONS rate limits key on the
  caller the proxy's second Via names (``received=``, else its host), answers still go
  to the proxy; from any other source a forged Via changes nothing; a Via naming no
  address is limited as the proxy's own;
* a dialog whose INVITE carried two Record-Route headers sends its BYE to the first
  route, with both as Route headers in order.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core.gateway_core import GatewayCore
from brisvox.gateway.transports import assemble
from brisvox.wire.sip_message import parse
from tests.unit.test_sip_admission_props import Wire, sdp_body, segments, settle

_seq = itertools.count(1)


def addr(net: int) -> str:
    """A loopback address no other test of this process uses (the rate windows are per process)."""
    n = next(_seq)
    return f"127.{net}.{(os.getpid() + n // 250) % 250}.{n % 250 + 1}"


def request(method: str, *, vias: list[str], extra: str = "", body: bytes = b"", to_tag: str = "",
            call_id: str = "", cseq: int = 1, contact: str = "<sip:a@127.0.0.1:5099>") -> bytes:
    n = next(_seq)
    head = f"{method} sip:echo@127.0.0.1 SIP/2.0\r\n"
    head += "".join(f"Via: {v}\r\n" for v in vias)
    head += (f"From: <sip:alice@127.0.0.1>;tag=f{n}\r\nTo: <sip:echo@127.0.0.1>{';tag=' + to_tag if to_tag else ''}\r\n"
             f"Call-ID: {call_id or f'px{n}x{os.getpid()}@t'}\r\nCSeq: {cseq} {method}\r\n"
             f"Contact: {contact}\r\nMax-Forwards: 69\r\n{extra}")
    if body:
        head += "Content-Type: application/sdp\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def via(host: str, port: int = 5060, params: str = "") -> str:
    return f"SIP/2.0/UDP {host}:{port};branch=z9hG4bK{next(_seq)}x{os.getpid()}{params}"


def proxied_invite(proxy: str, caller: str | None, *, extra: str = "", call_id: str = "") -> bytes:
    """An INVITE as Kamailio forwards it: its Via on top, the caller's under it (the caller
    claimed a private address; the proxy wrote where the packet really came from)."""
    vias = [via(proxy)]
    if caller is not None:
        vias.append(via("192.168.1.20", 5099, f";received={caller};rport=5099"))
    return request("INVITE", vias=vias, body=sdp_body(), extra=extra, call_id=call_id)


async def started(sip: dict[str, Any], max_calls: int = 8) -> tuple[GatewayCore, Any, Wire]:
    lo = 42000 + (os.getpid() * 17 + next(_seq) * 223) % 18000 & ~1
    settings = GatewaySettings(
        GatewayConfig(echo_use_workers=False, max_calls=max_calls),
        SipConfig(port=0, rtp_port_min=lo, rtp_port_max=lo + 200, **sip),
        WebSocketConfig(enabled=False))
    core = assemble(settings, instance=f"sp{os.getpid()}x{next(_seq)}")
    await core.start()
    ua = core.listeners["sip"]
    wire = Wire()
    ua.transactions.transport = wire
    return core, ua, wire


def finals(wire: Wire, method: str = "") -> list[Any]:
    """The final responses sent (to ``method`` only, if given: a 200 retransmitted until its
    ACK, or a BYE, must not count as an answer to the OPTIONS under test)."""
    out = [parse(d) for d, _ in wire.sent if d.startswith(b"SIP/2.0 ") and int(d[8:11]) >= 200]
    return [r for r in out if not method or r.cseq[1] == method]


def statuses_of(wire: Wire, call_id: str) -> list[int]:
    return [int(d[8:11]) for d, _ in wire.sent if d.startswith(b"SIP/2.0 ") and parse(d).call_id == call_id]


def test_options_is_503_full_then_draining_and_asking_takes_nothing():
    async def run() -> None:
        core, ua, wire = await started({"invite_rate": (), "options_rate": ()}, max_calls=1)
        src = (addr(3), 5060)
        try:
            def options() -> Any:
                wire.sent.clear()
                ua.transactions.datagram_received(request("OPTIONS", vias=[via(src[0])]), src)
                (resp,) = finals(wire, "OPTIONS")
                return resp

            assert options().status == 200
            ua.transactions.datagram_received(proxied_invite(src[0], None), src)
            assert await settle(lambda: len(core.table) == 1 and bool(finals(wire, "INVITE")))
            assert finals(wire, "INVITE")[0].status == 200
            for _ in range(3):
                full = options()
                assert (full.status, full.reason, full.get("retry-after")) == (503, "Full", "10")
                assert full.get("allow") and full.get("accept") == "application/sdp"
            assert core.refusal() == "full" and core.table.refused == {}  # asking counted no refusal
            assert ua.stats()["sip_options_full"] == 3
            call = next(iter(core.table.calls.values()))
            core.hangup(call, "test over")
            assert await settle(lambda: len(core.table) == 0)
            assert options().status == 200
            core.drain()
            draining = options()
            assert (draining.status, draining.reason, draining.get("retry-after")) == (503, "Draining", "30")
            assert ua.stats()["sip_options_draining"] == 1
            late = f"late{os.getpid()}@t"
            ua.transactions.datagram_received(proxied_invite(src[0], None, call_id=late), src)  # a new INVITE while draining
            assert statuses_of(wire, late) == [100, 503]
            refused = next(r for r in finals(wire, "INVITE") if r.call_id == late)
            assert refused.get("retry-after") == "30" and core.table.refused == {"draining": 1}
            assert len(core.table) == 0 and core.stats()["calls_refused_draining"] == 1
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_behind_a_trusted_proxy_the_rate_limits_key_on_the_caller_it_names():
    async def run() -> None:
        proxy, stranger = addr(4), addr(5)
        core, ua, wire = await started({"invite_rate": ("2/second",), "options_rate": ("2/second",),
                                        "trusted_proxies": (f"{proxy}/32",)})
        try:
            # six callers through one proxy: each has its own window
            callers = [addr(6) for _ in range(6)]
            for c in callers:
                ua.transactions.datagram_received(proxied_invite(proxy, c), (proxy, 5060))
            assert await settle(lambda: len(finals(wire, "INVITE")) == 6)
            assert [r.status for r in finals(wire, "INVITE")] == [200] * 6 and len(core.table) == 6
            assert {a for _, a in wire.sent} == {(proxy, 5060)}  # every answer goes back to the proxy
            assert ua.stats()["sip_proxied_requests"] == 6
            # one caller through the proxy: its own window, 2 a second
            wire.sent.clear()
            one = addr(6)
            for _ in range(4):
                ua.transactions.datagram_received(proxied_invite(proxy, one), (proxy, 5060))
            assert await settle(lambda: len(finals(wire, "INVITE")) == 4)
            assert len(core.table) == 8
            limited = [r for r in finals(wire, "INVITE") if r.status == 503]
            assert len(limited) == 2 and {r.reason for r in limited} == {"Rate Limited"}
            assert ua.stats()["sip_refused_rate_limit"] == 2
            # the proxy's own OPTIONS (one Via): the proxy's window, not a caller's
            wire.sent.clear()
            for _ in range(3):
                ua.transactions.datagram_received(request("OPTIONS", vias=[via(proxy)]), (proxy, 5060))
            # full (8 calls) twice, then over the proxy's own 2 a second
            assert [(r.status, r.reason) for r in finals(wire, "OPTIONS")] == [(503, "Full")] * 2 + [
                (503, "Rate Limited")]
            # a stranger forging a second Via per request: keyed on its own address all the same
            wire.sent.clear()
            for _ in range(3):
                forged = request("OPTIONS", vias=[via(stranger), via("10.0.0.1", 5060, f";received={addr(7)}")])
                ua.transactions.datagram_received(forged, (stranger, 5060))
            assert [r.reason for r in finals(wire, "OPTIONS")] == ["Full", "Full", "Rate Limited"]
            # a Via that names no address: the proxy's own window (already spent: limited)
            wire.sent.clear()
            bad = request("OPTIONS", vias=[via(proxy), via("10.0.0.1", 5060, ";received=nowhere")])
            ua.transactions.datagram_received(bad, (proxy, 5060))
            assert [r.reason for r in finals(wire, "OPTIONS")] == ["Rate Limited"]
            assert ua.stats()["sip_proxied_bad_via"] == 1
            assert ua.stats()["sip_proxied_requests"] == 6 + 4
            assert "sip_internal_errors" not in ua.stats()
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_two_record_routes_make_the_bye_go_to_the_first_with_both_routes():
    async def run() -> None:
        proxy = addr(8)
        # the first route is a destination: it must be inside [sip] allow (else the INVITE gets 403)
        core, ua, wire = await started({"invite_rate": (), "allow": ("127.0.0.0/8", "10.1.2.3/32")})
        routes = ["<sip:10.1.2.3:5080;lr;ftag=x>", "<sip:10.9.9.9;lr;r2=on>"]
        try:
            inv = proxied_invite(proxy, addr(9), call_id=f"rr{os.getpid()}@t",
                                 extra="".join(f"Record-Route: {r}\r\n" for r in routes))
            ua.transactions.datagram_received(inv, (proxy, 5060))
            assert await settle(lambda: any(r.status == 200 for r in finals(wire, "INVITE")))
            ok = next(r for r in finals(wire, "INVITE") if r.status == 200)
            assert ok.get_all("record-route") == routes
            ua.transactions.datagram_received(request("ACK", vias=[via(proxy)], to_tag=ok.to_tag, call_id=ok.call_id),
                                 (proxy, 5060))
            call = next(iter(core.table.calls.values()))
            wire.sent.clear()
            core.hangup(call, "done")
            byes = [(parse(d), a) for d, a in wire.sent if d.startswith(b"BYE ")]
            assert len(byes) == 1
            bye, hop = byes[0]
            assert hop == ("10.1.2.3", 5080)  # the first route, not the proxy's packet source
            assert bye.get_all("route") == routes
            assert bye.uri == "sip:a@127.0.0.1:5099"  # loose routing: the remote target stays the URI
        finally:
            await core.stop()

    asyncio.run(run())
