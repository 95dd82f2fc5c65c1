"""Who may open a WebSocket media stream, against the real gateway process.

* a listener on a non-loopback address without the routed protocols'
  credentials refuses to start, naming the key (before it binds anything);
* Origin: a foreign one is refused (403, ``ws_refused_origin``), a listed one
  is let in; requests without one (Twilio, server-side clients) are not affected;
* native: a valid signed token is accepted and fixes the call's parameters;
  an expired one, one for another agent and a missing one are refused (401,
  counted); the static secret still works for server-side clients;
* Twilio: a missing or bad ``X-Twilio-Signature`` is refused (403);
* an agent the route does not list is refused (404, ``ws_refused_agent``);
* per source: handshakes beyond ``handshakes_per_s`` get 429, connections
  beyond ``max_connections_per_source`` get 503, both counted;
* an agent's hang-up whose reason is 200 non-ASCII characters closes the
  stream (1000, the reason cut to 123 bytes at a character boundary) and the
  call leaves the gateway's table (both sides done), on both protocols.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from brisvox.gateway.ws.auth import mint_token
from brisvox.wire import native, twilio
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc

pytestmark = pytest.mark.system

SECRET = "s3cret"
ROUTES = [{"path": "/twilio", "protocol": "twilio", "agent": "default", "agents": ["sales"]},
          {"path": "/ws", "protocol": "native", "agent": "default", "agents": ["sales"]}]
SECURE = {"native_secret": SECRET, "twilio_auth_token": "tok", "public_url": "wss://example.com",
          "allowed_origins": ["https://app.example.com"], "routes": ROUTES}
LONG = "é" * 200  # 400 bytes of UTF-8: three times what a close frame holds


async def status(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    try:
        async with connect(f"ws://127.0.0.1:{port}{path}", additional_headers=headers or {}):
            return 101
    except InvalidStatus as e:
        return e.response.status_code


def signed(path: str) -> dict[str, str]:
    return {"X-Twilio-Signature": twilio.signature("tok", "wss://example.com" + path)}


def test_a_public_listener_without_credentials_refuses_to_start(short_tmp):
    with pytest.raises(RuntimeError, match=r"websocket\.native_secret"):
        with GatewayProc(short_tmp, websocket={"host": "0.0.0.0"}):
            pass
    with pytest.raises(RuntimeError, match=r"websocket\.twilio_auth_token"):
        with GatewayProc(short_tmp, websocket={"host": "0.0.0.0", "native_secret": SECRET}):
            pass


def test_origin_tokens_signature_and_agent_lists(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     websocket=SECURE) as gw:
        port = gw.ws_port
        def sales() -> str:  # a token is single-use: a new one per connection
            return mint_token(SECRET, "sales", 60, {"tier": "gold"})

        expired = mint_token(SECRET, "sales", 60, now=time.time() - 120)

        async def main() -> list[int]:
            return [
                await status(port, f"/ws/sales?token={sales()}"),
                await status(port, "/ws/sales", {"Authorization": f"Bearer {sales()}"}),
                await status(port, f"/ws/sales?token={expired}"),
                await status(port, f"/ws?token={sales()}"),  # the token names another agent
                await status(port, "/ws/sales"),
                await status(port, f"/ws/sales?token={SECRET}"),  # the static secret: server-side clients
                await status(port, f"/ws/other?token={SECRET}"),  # not on the route's list
                await status(port, f"/ws/sales?token={sales()}", {"Origin": "https://evil.example"}),
                await status(port, f"/ws/sales?token={sales()}", {"Origin": "https://app.example.com"}),
                await status(port, "/twilio"),
                await status(port, "/twilio", {"X-Twilio-Signature": "bad"}),
                await status(port, "/twilio", signed("/twilio")),
                await status(port, "/twilio/sales", signed("/twilio/sales")),
                await status(port, "/twilio/other", signed("/twilio/other")),
            ]

        assert asyncio.run(main()) == [101, 101, 401, 401, 401, 101, 404, 403, 101, 403, 403, 101, 101, 404]
        s = gw.stats()
        assert s["ws_refused_token_expired"] == 1 and s["ws_refused_token_agent"] == 1
        assert s["ws_refused_auth"] == 1 and s["ws_refused_signature"] == 2
        assert s["ws_refused_origin"] == 1 and s["ws_refused_agent"] == 2

        async def call_with_token() -> None:
            async with connect(f"ws://127.0.0.1:{port}/ws/sales?token={sales()}") as ws:
                await ws.send(native.NativeStream(16000, {"tier": "free", "x": "y"}).start())
                msg = native.server_message(orjson.loads(await ws.recv()))
                assert msg.event == "started" and msg.agent == "sales"
                start = await asyncio.to_thread(agent.wait_for, F.CallStart,
                                                lambda f: f.call_id == msg.call_id, 5.0)
                assert start.params == {"tier": "gold"}  # the token's, not the client's

        asyncio.run(call_with_token())
    assert gw.leaked == []


async def _active(gw: GatewayProc, call_id: str) -> None:
    deadline = time.monotonic() + 5.0
    while (await asyncio.to_thread(gw.command, "calls")).get(call_id, {}).get("state") != "active":
        assert time.monotonic() < deadline, "the call did not become active"
        await asyncio.sleep(0.01)


async def _released(gw: GatewayProc, call_id: str) -> None:
    """Both sides are done (the agent's Hangup and the transport's end): the call left the table."""
    deadline = time.monotonic() + 5.0
    while call_id in await asyncio.to_thread(gw.command, "calls"):
        assert time.monotonic() < deadline, "the hang-up did not complete"
        await asyncio.sleep(0.02)


async def _closed(ws: Any) -> tuple[int | None, str, list[Any]]:
    got = []
    try:
        async with asyncio.timeout(5):
            async for m in ws:
                got.append(m)
    except ConnectionClosed:
        pass
    return ws.close_code, ws.close_reason or "", got


def test_a_hangup_with_a_long_non_ascii_reason_closes_and_completes(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     websocket=SECURE) as gw:
        port = gw.ws_port

        async def native_call() -> tuple[int | None, str, list[Any], str]:
            async with connect(f"ws://127.0.0.1:{port}/ws?token={SECRET}") as ws:
                await ws.send(native.NativeStream(16000).start())
                started = native.server_message(orjson.loads(await ws.recv()))
                await _active(gw, started.call_id)
                agent.send(F.Hangup(call_id=started.call_id, reason=LONG))
                return (*await _closed(ws), started.call_id)

        async def twilio_call() -> tuple[int | None, str, list[Any], str]:
            stream = twilio.TwilioStream(stream_sid="MZsecurity0001", call_sid="CAsec1")
            async with connect(f"ws://127.0.0.1:{port}/twilio", additional_headers=signed("/twilio")) as ws:
                await ws.send(stream.connected())
                n = len(agent.of(F.CallStart))
                await ws.send(stream.start())
                start = await asyncio.to_thread(agent.wait_for, F.CallStart,
                                                lambda f: f in agent.of(F.CallStart)[n:], 5.0)
                await _active(gw, start.call_id)
                agent.send(F.Hangup(call_id=start.call_id, reason="日本語の理由" * 40))
                return (*await _closed(ws), start.call_id)

        code, reason, got, cid = asyncio.run(native_call())
        assert code == 1000 and reason == "é" * 61, (code, reason)
        stops = [native.server_message(orjson.loads(m)) for m in got if isinstance(m, str)]
        assert any(m.event == "stop" and m.reason == LONG for m in stops)  # the message keeps it whole
        asyncio.run(_released(gw, cid))

        code, reason, _, cid = asyncio.run(twilio_call())
        assert code == 1000 and reason == ("日本語の理由" * 40)[:41] and len(reason.encode()) == 123
        asyncio.run(_released(gw, cid))
        assert gw.stats().get("ws_session_errors", 0) == 0
    assert gw.leaked == []


def test_per_source_handshake_rate_and_connection_cap(short_tmp):
    ws_cfg = {"handshakes_per_s": 5, "max_connections_per_source": 3}
    with GatewayProc(short_tmp, inbox=True, websocket=ws_cfg) as gw:
        port = gw.ws_port

        async def cap() -> int:
            held = [await connect(f"ws://127.0.0.1:{port}/ws") for _ in range(3)]
            try:
                return await status(port, "/ws")
            finally:
                for ws in held:
                    await ws.close()

        async def burst() -> list[int]:
            return [await status(port, "/ws") for _ in range(8)]

        assert asyncio.run(cap()) == 503
        time.sleep(1.2)  # the moving window forgets the handshakes above
        codes = asyncio.run(burst())
        assert codes[:5] == [101] * 5 and set(codes[5:]) == {429}, codes
        time.sleep(1.2)
        assert asyncio.run(status(port, "/ws")) == 101  # the limit lifts with the window
        s = gw.stats()
        assert s["ws_refused_connections"] == 1 and s["ws_refused_rate"] == 3
    assert gw.leaked == []
