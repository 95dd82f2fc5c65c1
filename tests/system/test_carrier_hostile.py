"""Hostile carrier input and Twilio streams not tied to their call, against the real gateway process.

* a sample rate of ``"²"`` (``str.isdigit()`` is true, ``int()`` raises) in the ``start`` of a
  Telnyx, Plivo or Exotel stream, or in Exotel's ``?sample-rate=``, closes that stream with
  1007 and a reason, counted, and the gateway logs no traceback (it closed them 1011 with one);
* ``POST /twiml`` with a repeated Content-Type or Host header or ``Content-Length: ²`` gets
  400 (it got no answer and a traceback each); a source beyond ``twiml_requests_per_s`` gets 429;
* a Twilio stream without the one-time token the webhook put in its TwiML, with a token used
  before, claiming another callSid than the one the webhook bound, or naming a foreign
  accountSid is closed 1008 before any call exists; the stream that carries its token is a
  call whose hang-up completes the callSid bound at the webhook (and no other).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from urllib.parse import urlencode
from xml.etree import ElementTree

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from brisvox.wire import exotel, plivo, telnyx, twilio
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc
from tests.system.test_gateway_twilio_control import until
from tests.system.twilio_api_fake import ACCOUNT, TOKEN, FakeTwilioApi

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SUP = "\u00b2"
SECRET = "carrier-secret"
PUBLIC = "wss://gw.example.com"
CARRIER_ROUTES = [{"path": "/telnyx", "protocol": "telnyx", "agent": "default"},
                  {"path": "/plivo", "protocol": "plivo", "agent": "default"},
                  {"path": "/exotel", "protocol": "exotel", "agent": "default"}]
TWILIO_ROUTES = [{"path": "/twilio", "protocol": "twilio", "agent": "default"}]
TOKEN_PARAM = "brisvox_stream_token"  # brisvox.wire.twilio.TOKEN_PARAM, spelled out (the old tree has none)


async def closed_by(url: str, messages: list[str], headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(close code, reason) the gateway closes a stream with after ``messages``."""
    async with connect(url, additional_headers=headers or {}) as ws:
        for m in messages:
            await ws.send(m)
        try:
            async with asyncio.timeout(5):
                while True:
                    await ws.recv()
        except ConnectionClosed:
            pass
        return ws.close_code or 0, ws.close_reason or ""


def with_rate(start: str, path: tuple[str, ...], value: Any) -> str:
    msg = orjson.loads(start)
    obj = msg
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return orjson.dumps(msg).decode()


def test_a_superscript_sample_rate_is_a_typed_close_without_a_traceback(short_tmp):
    with GatewayProc(short_tmp, inbox=True, websocket={
            "routes": CARRIER_ROUTES, "start_timeout_s": 3.0, "native_secret": SECRET, "plivo_auth_token": SECRET,
            "public_url": PUBLIC}) as gw:
        base = f"ws://127.0.0.1:{gw.ws_port}"
        nonce = "12345"
        creds = {"telnyx": {telnyx.AUTH_HEADER: SECRET},
                 "plivo": {"X-Plivo-Signature-V3-Nonce": nonce,
                           "X-Plivo-Signature-V3": plivo.signature(SECRET, PUBLIC + "/plivo", nonce)},
                 "exotel": {"Authorization": exotel.basic_header("exotel", SECRET)}}
        cases = {
            "telnyx": (f"{base}/telnyx", with_rate(telnyx.TelnyxStream().start(), ("start", "media_format",
                                                                                   "sample_rate"), SUP)),
            "plivo": (f"{base}/plivo", with_rate(plivo.PlivoStream().start(), ("start", "mediaFormat", "sampleRate"),
                                                 SUP)),
            "exotel": (f"{base}/exotel", with_rate(exotel.ExotelStream().start(), ("start", "media_format",
                                                                                   "sample_rate"), SUP)),
            "exotel ?sample-rate=": (f"{base}/exotel?sample-rate=%C2%B2", with_rate(
                exotel.ExotelStream().start(), ("start", "media_format"), None)),
        }

        async def go() -> dict[str, tuple[int, str]]:
            return {what: await closed_by(url, [msg], creds[what.split()[0]]) for what, (url, msg) in cases.items()}

        closes = asyncio.run(go())
        for what, (code, reason) in closes.items():
            assert code == 1007 and "not a number" in reason, (what, code, reason)
        st = gw.stats()
        assert st.get("ws_malformed_bad_start") == 4 and not st.get("ws_session_errors"), st
        assert "Traceback" not in gw.stderr() and "1011" not in gw.stderr()


def raw_post(port: int, head: str, body: bytes = b"") -> bytes:
    """One raw request on its own connection: what the gateway answers ("" for nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(head.encode("utf-8") + b"\r\n\r\n" + body)
        out = b""
        try:
            while chunk := s.recv(4096):
                out += chunk
        except TimeoutError:
            pass
        return out


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


FORM = {"AccountSid": ACCOUNT, "CallSid": "CAbound", "From": "+14155550100", "To": "+14155550199",
        "CallStatus": "ringing", "Direction": "inbound"}


def webhook(port: int, form: dict[str, str]) -> str:
    """A signed webhook POST as Twilio makes it: the token of the TwiML's stream."""
    sig = twilio.signature(TOKEN, "https://gw.example.com/twiml", form)
    r = httpx.post(f"http://127.0.0.1:{port}/twiml", content=urlencode(form), timeout=5,
                   headers={"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": sig})
    assert r.status_code == 200, r.text
    stream = ElementTree.fromstring(r.text).find("./Connect/Stream")
    assert stream is not None
    params = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    assert params.get("From") == form["From"] and params.get(TOKEN_PARAM)
    return str(params[TOKEN_PARAM])


def gateway(short_tmp, api: FakeTwilioApi, agent: FakeAgent | None = None) -> GatewayProc:  # type: ignore[no-untyped-def]
    return GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint} if agent else None,
                       websocket={"routes": TWILIO_ROUTES, "public_url": PUBLIC, "twiml_path": "/twiml",
                                  "twiml_requests_per_s": 8, "start_timeout_s": 3.0, **api.config()})


def test_the_webhook_answers_a_bad_head_400_and_a_flood_429(short_tmp):
    with FakeTwilioApi() as api, gateway(short_tmp, api) as gw:
        port = gw.ws_port
        body = urlencode(FORM).encode()
        good = (f"POST /twiml HTTP/1.1\r\nHost: gw.example.com\r\nContent-Type: application/x-www-form-urlencoded"
                f"\r\nContent-Length: {len(body)}")
        bad_heads = [good.replace("Host:", "Content-Type: text/plain\r\nHost:"),
                     good.replace("Host:", "Host: evil.example.com\r\nHost:"),
                     good.replace(f"Content-Length: {len(body)}", f"Content-Length: {SUP}")]
        for head in bad_heads:
            answer = raw_post(port, head, body)
            assert status_of(answer) == 400, (head, answer)
        st = gw.stats()
        assert st.get("ws_refused_twiml_header") == 3, st
        # the webhook's own rate: beyond twiml_requests_per_s, 429 (bad heads count too)
        answers = [status_of(raw_post(port, bad_heads[0], body)) for _ in range(12)]
        assert 429 in answers and set(answers) <= {400, 429}, answers
        assert gw.stats().get("ws_refused_rate", 0) >= 1
        assert "Traceback" not in gw.stderr()


def test_a_twilio_stream_must_carry_the_token_of_its_call(short_tmp):
    with FakeTwilioApi() as api, FakeAgent(short_tmp) as agent, gateway(short_tmp, api, agent) as gw:
        port = gw.ws_port
        # the binding: a stream must carry the token the webhook issued for its call
        token = webhook(port, FORM)
        url = f"ws://127.0.0.1:{port}/twilio"
        sig = {"X-Twilio-Signature": twilio.signature(TOKEN, PUBLIC + "/twilio")}

        def stream(call_sid: str = "CAbound", account: str = ACCOUNT) -> twilio.TwilioStream:
            return twilio.TwilioStream(stream_sid="MZ" + call_sid, call_sid=call_sid, account_sid=account)

        async def refused() -> dict[str, tuple[int, str]]:
            s = stream()
            out = {"no token": await closed_by(url, [s.connected(), s.start({"From": "+1"})], sig),
                   "foreign account": await closed_by(url, [s.connected(), stream(account="AC" + "f" * 32).start(
                       {TOKEN_PARAM: webhook(port, {**FORM, "CallSid": "CAacct"})})], sig),
                   "foreign call": await closed_by(url, [s.connected(), stream("CAother").start(
                       {TOKEN_PARAM: webhook(port, {**FORM, "CallSid": "CAclaim"})})], sig)}
            return out

        closes = asyncio.run(refused())
        for what, (code, reason) in closes.items():
            assert code == 1008 and reason, (what, code, reason)
        assert not agent.of(F.CallStart)  # refused before any call existed

        async def bound_call() -> tuple[int, tuple[int, str]]:
            s = stream()
            ws = await connect(url, additional_headers=sig)
            await ws.send(s.connected())
            await ws.send(s.start({TOKEN_PARAM: token, "From": "+14155550100"}))
            start = await asyncio.to_thread(agent.wait_for, F.CallStart)
            assert TOKEN_PARAM not in (start.params or {})  # a credential never reaches the agent
            agent.send(F.Hangup(call_id=start.call_id, reason="end_call"))
            await asyncio.wait_for(ws.wait_closed(), 5)
            replay = await closed_by(url, [s.connected(), s.start({TOKEN_PARAM: token})], sig)
            return ws.close_code or 0, replay

        code, replay = asyncio.run(bound_call())
        assert code == 1000 and replay[0] == 1008, (code, replay)
        assert until(lambda: bool(api.of("CAbound")))
        (req,) = api.of("CAbound")
        assert req.fields == {"Status": ["completed"]}
        assert not api.of("CAother") and not api.of("CAclaim")  # REST acts on the bound callSid only
        st = gw.stats()
        for kind in ("no_stream_token", "foreign_account", "foreign_call", "replayed_stream_token"):
            assert st.get(f"ws_malformed_{kind}") == 1, (kind, st)
        assert "Traceback" not in gw.stderr()
