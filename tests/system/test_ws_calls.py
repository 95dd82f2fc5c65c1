"""Every call ends, and credentials are credentials, against the real gateway process:

* a native call that sends ``start`` and then nothing is closed 1000 "media timeout" at
  ``[websocket] media_timeout_s``, and the agent's ``CallEnd`` says so;
* ``[gateway] max_call_s`` ends a WebSocket call (1000 "max call duration") and a SIP call
  (the gateway's BYE), each counted;
* one source holding its share of the calls (``max_calls_per_source``) gets 1013 while
  another source still gets a call;
* a signed token is let in once (a replay is 401) and one whose lifetime exceeds
  ``max_token_ttl_s`` is refused (401);
* ``native_secret`` applies on loopback: without ``trust_loopback`` an unconfigured route
  refuses (403) and the playground mints only for the holder of the secret;
* a playground token is refused on ``/ws`` (401) and opens only the playground's route.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import time
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from brisvox.gateway.ws.auth import mint_token
from brisvox.wire import native
from brisvox.wire.sip_message import parse
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc
from tests.system.test_ws_security import status

pytestmark = pytest.mark.system

SECRET = "s3cret-calls"
ROUTES = [{"path": "/ws", "protocol": "native", "agent": "default", "agents": ["sales"]}]


async def closed(ws: Any, timeout: float) -> tuple[int | None, str, list[Any]]:
    got = []
    try:
        async with asyncio.timeout(timeout):
            async for m in ws:
                got.append(m)
    except ConnectionClosed:
        pass
    return ws.close_code, ws.close_reason or "", got


async def silent_call(port: int, path: str = "/ws", timeout: float = 6.0,
                      local: str = "127.0.0.1") -> tuple[int | None, str, float, str]:
    """A native call that sends start, then nothing: (close code, reason, seconds to the close, call id)."""
    async with connect(f"ws://127.0.0.1:{port}{path}", local_addr=(local, 0)) as ws:
        await ws.send(native.NativeStream(16000).start())
        msg = native.server_message(orjson.loads(await ws.recv()))
        assert msg.event == "started", msg
        t0 = time.monotonic()
        code, reason, _ = await closed(ws, timeout)
        return code, reason, time.monotonic() - t0, msg.call_id


def test_a_silent_call_is_closed_at_the_media_timeout(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     websocket={"media_timeout_s": 1.5}) as gw:
        code, reason, took, call_id = asyncio.run(silent_call(gw.ws_port))
        assert (code, reason) == (1000, "media timeout")
        assert 1.4 <= took <= 3.5, took
        end = agent.wait_for(F.CallEnd, lambda f: f.call_id == call_id, 3.0)
        assert end.reason == "media timeout"  # what the agent records as the call's end
        assert gw.stats()["calls_media_timeout"] == 1
    assert gw.leaked == []


def test_max_call_s_ends_a_websocket_call_and_a_sip_call(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     gateway={"max_call_s": 1.5},
                                                     websocket={"media_timeout_s": 0}) as gw:
        code, reason, took, call_id = asyncio.run(silent_call(gw.ws_port))
        assert (code, reason) == (1000, "max call duration") and took <= 3.5, (code, reason, took)
        assert agent.wait_for(F.CallEnd, lambda f: f.call_id == call_id, 3.0).reason == "max call duration"

        bye, took = sip_call_until_bye(gw.sip_port, timeout=6.0)
        assert bye is not None, "no BYE from the gateway"
        assert 1.0 <= took <= 3.5, took
        assert "max call duration" in (bye.get("reason") or ""), bye.get("reason")
        assert gw.stats()["calls_max_duration"] == 2
    assert gw.leaked == []


def invite(gw_port: int, host: str, port: int, call_id: str, tag: str, branch: str, sdp: bytes) -> bytes:
    """An INVITE for the gateway's default agent from ``host:port`` with ``sdp``."""
    head = (f"INVITE sip:default@127.0.0.1:{gw_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {host}:{port};branch={branch};rport\r\n"
            f"From: <sip:peer@{host}>;tag={tag}\r\nTo: <sip:default@127.0.0.1>\r\n"
            f"Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:peer@{host}:{port}>\r\n"
            f"Max-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n")
    return head.encode() + sdp


def sip_call_until_bye(gw_port: int, timeout: float) -> tuple[Any, float]:
    """An INVITE answered and ACKed from 127.0.0.1, then silence (no RTP: rtp_timeout_s is
    longer): the first BYE the gateway sends, and the seconds from the ACK to it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", 0))
        rtp.bind(("127.0.0.1", 0))
        host, port = s.getsockname()
        sdp = (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
               f"m=audio {rtp.getsockname()[1]} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n").encode()
        call_id, tag = f"maxcall{time.monotonic_ns()}@127.0.0.1", "p1"
        s.sendto(invite(gw_port, host, port, call_id, tag, "z9hG4bKmax1", sdp), ("127.0.0.1", gw_port))
        s.settimeout(5.0)
        while True:
            ok = parse(s.recv(65535))
            if ok.status and ok.status >= 200:
                break
        assert ok.status == 200, ok.status
        ack = (f"ACK sip:default@127.0.0.1:{gw_port} SIP/2.0\r\n"
               f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bKmax2;rport\r\n"
               f"From: <sip:peer@{host}>;tag={tag}\r\nTo: {ok.get('to')}\r\n"
               f"Call-ID: {call_id}\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
        s.sendto(ack.encode(), ("127.0.0.1", gw_port))
        t0 = time.monotonic()
        s.settimeout(0.5)
        while time.monotonic() - t0 < timeout:
            try:
                msg = parse(s.recv(65535))
            except TimeoutError:
                continue
            if msg.method == "BYE":
                took = time.monotonic() - t0
                ok_bye = (f"SIP/2.0 200 OK\r\nVia: {msg.get('via')}\r\nFrom: {msg.get('from')}\r\n"
                          f"To: {msg.get('to')}\r\nCall-ID: {call_id}\r\nCSeq: {msg.get('cseq')}\r\n"
                          "Content-Length: 0\r\n\r\n")
                s.sendto(ok_bye.encode(), ("127.0.0.1", gw_port))
                return msg, took
        return None, timeout
    finally:
        s.close()
        rtp.close()


def test_one_source_is_capped_while_another_still_gets_a_call(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     gateway={"max_calls": 8, "max_calls_per_source": 2}) as gw:
        port = gw.ws_port

        async def main() -> tuple[list[str], int | None, str, str]:
            held = []
            for _ in range(2):
                ws = await connect(f"ws://127.0.0.1:{port}/ws", local_addr=("127.0.0.1", 0))
                await ws.send(native.NativeStream(16000).start())
                held.append(ws)
            events = [native.server_message(orjson.loads(await ws.recv())).event for ws in held]
            try:
                async with connect(f"ws://127.0.0.1:{port}/ws", local_addr=("127.0.0.1", 0)) as third:
                    await third.send(native.NativeStream(16000).start())
                    code, reason, _ = await closed(third, 3.0)
                async with connect(f"ws://127.0.0.1:{port}/ws", local_addr=("127.0.0.2", 0)) as other:
                    await other.send(native.NativeStream(16000).start())
                    started = native.server_message(orjson.loads(await other.recv())).event
            finally:
                for ws in held:
                    await ws.close()
            return events, code, reason, started

        events, code, reason, started = asyncio.run(main())
        assert events == ["started", "started"]
        assert (code, reason) == (1013, "too many calls from this address")
        assert started == "started"  # another address is not affected
        assert gw.stats()["calls_refused_source"] == 1
    assert gw.leaked == []


def test_a_replayed_token_and_one_with_too_long_a_lifetime_are_refused(short_tmp):
    ws_cfg = {"native_secret": SECRET, "routes": ROUTES, "max_token_ttl_s": 120}
    with GatewayProc(short_tmp, inbox=True, websocket=ws_cfg) as gw:
        port = gw.ws_port
        once = mint_token(SECRET, "sales", 60)
        long = mint_token(SECRET, "sales", 600)
        codes = asyncio.run(_statuses(port, [f"/ws/sales?token={once}", f"/ws/sales?token={once}",
                                             f"/ws/sales?token={long}", f"/ws/sales?token={SECRET}",
                                             f"/ws/sales?token={SECRET}"]))
        assert codes == [101, 401, 401, 101, 101]  # the static secret is not a token: it stays reusable
        s = gw.stats()
        assert s["ws_refused_token_replay"] == 1 and s["ws_refused_token_ttl"] == 1
    assert gw.leaked == []


async def _statuses(port: int, paths: list[str]) -> list[int]:
    return [await status(port, p) for p in paths]


def post_token(port: int, agent: str, bearer: str = "") -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        headers = {"Origin": f"http://127.0.0.1:{port}", "Content-Length": "0"}
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        conn.request("POST", f"/playground/token?agent={agent}", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, orjson.loads(body) if resp.status == 200 else {}
    finally:
        conn.close()


def test_native_secret_applies_on_loopback(short_tmp):
    untrusted = {"trust_loopback": False, "routes": ROUTES}
    with GatewayProc(short_tmp, inbox=True, websocket=untrusted) as gw:
        assert asyncio.run(status(gw.ws_port, "/ws")) == 403  # no credential configured: not open on loopback
        assert post_token(gw.ws_port, "default")[0] == 401  # nobody holds a credential: no token
        assert gw.stats()["ws_refused_unconfigured"] == 1
    with GatewayProc(short_tmp, inbox=True, websocket={**untrusted, "native_secret": SECRET}) as gw:
        assert asyncio.run(status(gw.ws_port, "/ws")) == 401
        assert post_token(gw.ws_port, "default")[0] == 401  # loading the page is not a credential
        assert post_token(gw.ws_port, "default", bearer=SECRET)[0] == 200
    assert gw.leaked == []


def test_a_playground_token_is_refused_on_ws(short_tmp):
    with GatewayProc(short_tmp, inbox=True, websocket={"native_secret": SECRET, "routes": ROUTES}) as gw:
        port = gw.ws_port
        got, answer = post_token(port, "default", bearer=SECRET)
        assert got == 200
        tok = answer["token"]
        codes = asyncio.run(_statuses(port, [f"/ws?token={tok}", f"/ws/default?token={tok}",
                                             f"{answer['path']}?token={tok}"]))
        assert codes == [401, 401, 101]  # only the playground's own route opens with it
        assert gw.stats()["ws_refused_token_route"] == 2
    assert gw.leaked == []


def sip_invite_status(gw_port: int, bind_ip: str) -> int:
    """The final status the gateway answers to one INVITE from ``bind_ip`` (never ACKed: the
    gateway keeps the call until its no-ACK timeout, longer than the test)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((bind_ip, 0))
        host, port = s.getsockname()
        sdp = (f"v=0\r\no=- 1 1 IN IP4 {host}\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
               f"m=audio {port + 1} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n").encode()
        call_id = f"cap{time.monotonic_ns()}@{host}"
        s.sendto(invite(gw_port, host, port, call_id, "c1", f"z9hG4bKcap{time.monotonic_ns()}", sdp),
                 ("127.0.0.1", gw_port))
        s.settimeout(5.0)
        while True:
            msg = parse(s.recv(65535))
            if msg.status and msg.status >= 200:
                return msg.status
    finally:
        s.close()



def test_one_sip_source_is_capped_while_another_still_gets_a_call(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     gateway={"max_calls": 8, "max_calls_per_source": 1}) as gw:
        first = sip_invite_status(gw.sip_port, "127.0.0.1")
        second = sip_invite_status(gw.sip_port, "127.0.0.1")
        other = sip_invite_status(gw.sip_port, "127.0.0.2")
        assert (first, second, other) == (200, 503, 200)
        assert gw.stats()["calls_refused_source"] == 1
