"""Malformed WebSocket input, admission and auth against the real gateway process:
each bad connection gets the protocol's error (native) or, before its call
exists, a close with a reason (Twilio), is counted, and a good call on the same
gateway keeps echoing. During a live call a malformed message is counted and
dropped (the fault budget); with ``hangup_on_error`` the first one closes the
call as it did without a budget."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from brisvox.wire import native, twilio
from brisvox.wire.g711 import PCMU
from tests.system.gateway_harness import GatewayProc

pytestmark = pytest.mark.system

SID = "MZ0000000000000000000000000000000f"
START = twilio.TwilioStream(stream_sid=SID, call_sid="CA1", account_sid="AC1").start()
assert "audio/x-mulaw" in START


BAD_BASE64 = f'{{"event":"media","streamSid":"{SID}","media":{{"payload":"@@@not base64"}}}}'


def media(payload: bytes) -> str:
    """A good media message (the minimal shape, as a bot sends it; the gateway takes it too)."""
    return twilio.BotStream(SID).media(payload).decode()


async def closed_with(ws) -> tuple[int | None, str]:
    try:
        async with asyncio.timeout(5):
            async for _ in ws:
                pass
    except ConnectionClosed:
        pass
    return ws.close_code, ws.close_reason or ""


async def twilio_bad(port: int, *msgs: str | bytes) -> tuple[int | None, str]:
    ws = await connect(f"ws://127.0.0.1:{port}/twilio", max_size=None)
    try:
        for m in msgs:
            try:
                await ws.send(m)
            except ConnectionClosed:
                break  # the server closed while a 10 MB frame was still going out
        return await closed_with(ws)
    finally:
        # the client library can trip over its own transport when the server
        # aborted mid-send; the verdict above is what the test is about
        with contextlib.suppress(Exception):
            await ws.close()


async def native_errors(port: int, *msgs: str | bytes, start: bool = True) -> list[native.ServerMessage]:
    out = []
    async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
        if start:
            await ws.send(native.NativeStream(16000).start())
            d = native.server_message(orjson.loads(await ws.recv()))
            assert d.event == "started" and d.rate == 16000
        for m in msgs:
            await ws.send(m)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and len(out) < len(msgs):
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    m = await ws.recv()
            except TimeoutError:
                break
            if isinstance(m, str):
                out.append(native.server_message(orjson.loads(m)))
    return out


def test_malformed_websocket_messages_are_refused_and_isolated(short_tmp):
    with GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 100}) as gw:
        port = gw.ws_port

        async def main():
            # a good Twilio call streams during all of it
            tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(8000 * 3) / 8000)).astype(np.int16)
            enc = PCMU.encode(tone).tobytes()
            good_rx = 0
            async with connect(f"ws://127.0.0.1:{port}/twilio") as good:
                await good.send(START)

                async def rx():
                    nonlocal good_rx
                    async for m in good:
                        if twilio.bot_event(orjson.loads(m))[0] == "media":
                            good_rx += 1

                task = asyncio.create_task(rx())

                async def stream():
                    t0 = time.monotonic()
                    for i in range(len(enc) // 160):
                        await good.send(media(enc[i * 160:(i + 1) * 160]))
                        await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))

                streamer = asyncio.create_task(stream())
                results = {
                    "bad_json": await twilio_bad(port, "{not json"),
                    "not_object": await twilio_bad(port, "[1,2]"),
                    "media_before_start": await twilio_bad(port, media(b"\xff" * 160)),
                    "binary": await twilio_bad(port, b"\x00\x01"),
                    "huge": await twilio_bad(port, "x" * (10 * 1024 * 1024)),
                    "bad_format": await twilio_bad(port, START.replace("audio/x-mulaw", "audio/l16")),
                }
                errors = await native_errors(port, "{bad", '{"event":"nope"}', b"\x01\x02\x03",
                                             native.NativeStream.dtmf("Z"))
                before = await native_errors(port, b"\x00\x00" * 160, start=False)
                # during a live call, malformed messages are counted and dropped, and an
                # unknown Twilio event is counted and ignored: that connection stays up
                async with connect(f"ws://127.0.0.1:{port}/twilio") as ws:
                    await ws.send(START)
                    await ws.send(BAD_BASE64)
                    await ws.send(b"\x00\x01")
                    await ws.send('{"event":"future_event"}')
                    await ws.send(media(b"\xff" * 160))
                    await asyncio.sleep(0.2)
                    assert ws.close_code is None
                # an unknown path is refused at the handshake
                with pytest.raises(InvalidStatus) as e404:
                    async with connect(f"ws://127.0.0.1:{port}/nowhere"):
                        pass
                await streamer
                await asyncio.sleep(0.3)
                task.cancel()
            return results, errors, before, good_rx, e404.value.response.status_code

        results, errors, before, good_rx, status404 = asyncio.run(main())
        assert results["bad_json"][0] == 1007 and results["not_object"][0] == 1007
        assert results["media_before_start"] == (1008, "media before start")
        assert results["binary"][0] == 1003
        assert results["huge"][0] == 1009
        assert results["bad_format"][0] == 1003
        assert [m.event for m in errors + before] == ["error"] * 5
        assert [m.code for m in errors] == ["bad_json", "unknown_event", "odd_frame", "bad_dtmf"]
        assert [m.code for m in before] == ["media_before_start"]
        assert status404 == 404
        # the good call echoed its 3 s all along (plus the 100 ms delay)
        assert good_rx >= 150
        s = gw.stats()
        for kind in ("bad_json", "bad_message", "media_before_start", "bad_base64", "binary_frame",
                     "bad_media_format", "unknown_event", "odd_frame", "bad_dtmf"):
            assert s[f"ws_malformed_{kind}"] >= 1, kind
        assert s["calls_active"] == 0 or time.sleep(0.5) or gw.stats()["calls_active"] == 0
    assert gw.leaked == []


def test_hangup_on_error_closes_a_live_call_on_its_first_malformed_message(short_tmp):
    with GatewayProc(short_tmp, inbox=True, websocket={"hangup_on_error": True}) as gw:
        port = gw.ws_port

        async def native_bad_json() -> tuple[list[str], int | None, str]:
            codes = []
            async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
                await ws.send(native.NativeStream(8000).start())
                assert native.server_message(orjson.loads(await ws.recv())).event == "started"
                await ws.send("{bad")
                try:
                    async with asyncio.timeout(5):
                        async for m in ws:
                            if isinstance(m, str):
                                codes.append(native.server_message(orjson.loads(m)).code)
                except ConnectionClosed:
                    pass
                return codes, ws.close_code, ws.close_reason or ""

        async def main():
            bad_base64 = await twilio_bad(port, START, BAD_BASE64)
            binary = await twilio_bad(port, START, b"\x00\x01")
            nat = await native_bad_json()
            # an unknown Twilio event is not malformed: ignored even so
            async with connect(f"ws://127.0.0.1:{port}/twilio") as ws:
                await ws.send(START)
                await ws.send('{"event":"future_event"}')
                await asyncio.sleep(0.2)
                unknown_open = ws.close_code is None
            return bad_base64, binary, nat, unknown_open

        bad_base64, binary, nat, unknown_open = asyncio.run(main())
        assert bad_base64 == (1007, "invalid base64 payload")
        assert binary == (1003, "Twilio media streams use text messages")
        assert nat == (["bad_json"], 1007, "invalid JSON")
        assert unknown_open
        s = gw.stats()
        assert s["ws_malformed_bad_base64"] == 1 and s["ws_malformed_binary_frame"] == 1
        assert s["ws_malformed_bad_json"] == 1 and s["call_malformed_total"] == 4
    assert gw.leaked == []


def test_admission_refuses_beyond_max_calls_on_both_transports(short_tmp):
    with GatewayProc(short_tmp, inbox=True, gateway={"max_calls": 2}) as gw:

        async def main():
            a = await connect(f"ws://127.0.0.1:{gw.ws_port}/ws")
            b = await connect(f"ws://127.0.0.1:{gw.ws_port}/twilio")
            await a.send(native.NativeStream(8000).start())
            await b.send(START)
            await asyncio.sleep(0.3)
            c = await connect(f"ws://127.0.0.1:{gw.ws_port}/ws")
            await c.send(native.NativeStream(8000).start())
            code_c = await closed_with(c)
            d = await connect(f"ws://127.0.0.1:{gw.ws_port}/twilio")
            await d.send(START)
            code_d = await closed_with(d)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(2)
                s.bind(("127.0.0.1", 0))
                lp = s.getsockname()[1]
                inv = (f"INVITE sip:echo@127.0.0.1:{gw.sip_port} SIP/2.0\r\n"
                       f"Via: SIP/2.0/UDP 127.0.0.1:{lp};branch=z9hG4bKadm1;rport\r\n"
                       "From: <sip:t@127.0.0.1>;tag=1\r\nTo: <sip:echo@127.0.0.1>\r\nCall-ID: adm1@t\r\n"
                       "CSeq: 1 INVITE\r\nContent-Type: application/sdp\r\n")
                sdp_body = ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                            "m=audio 4000 RTP/AVP 0\r\n")
                s.sendto((inv + f"Content-Length: {len(sdp_body)}\r\n\r\n" + sdp_body).encode(),
                         ("127.0.0.1", gw.sip_port))
                codes = []
                while True:
                    resp = s.recv(65535)
                    codes.append(int(resp.split(b" ")[1]))
                    if codes[-1] >= 200:
                        break
            await a.close()
            await b.close()
            return code_c, code_d, codes

        code_c, code_d, codes = asyncio.run(main())
        assert code_c[0] == 1013 and code_d[0] == 1013
        assert codes[-1] == 503
        s = gw.stats()
        assert s["calls_refused_full"] == 3
    assert gw.leaked == []


def test_auth_native_secret_and_twilio_signature(short_tmp):
    ws_cfg = {"native_secret": "s3cret", "twilio_auth_token": "tok", "public_url": "wss://example.com"}
    with GatewayProc(short_tmp, inbox=True, websocket=ws_cfg) as gw:

        async def status(path: str, headers: dict | None = None) -> int:
            try:
                async with connect(f"ws://127.0.0.1:{gw.ws_port}{path}", additional_headers=headers or {}):
                    return 101
            except InvalidStatus as e:
                return e.response.status_code

        async def main():
            sig = twilio.signature("tok", "wss://example.com/twilio")
            return [
                await status("/ws"),
                await status("/ws?token=wrong"),
                await status("/ws?token=s3cret"),
                await status("/ws", {"Authorization": "Bearer s3cret"}),
                await status("/twilio"),
                await status("/twilio", {"X-Twilio-Signature": "bad"}),
                await status("/twilio", {"X-Twilio-Signature": sig}),
            ]

        assert asyncio.run(main()) == [401, 401, 101, 101, 403, 403, 101]
        s = gw.stats()
        assert s["ws_refused_auth"] == 2 and s["ws_refused_signature"] == 2
