"""Twilio call control and the TwiML webhook against the real gateway process.

A loopback stand-in for Twilio's REST API (:mod:`tests.system.twilio_api_fake`:
it checks Basic auth, the account and call path and the form, as Twilio
would) and a fake agent process drive a Twilio Media Streams call:

* an agent Transfer is ONE calls update whose ``Twiml`` dials the target, and
  its 200 comes back as TransferResult ok; a call the API answers 404 gets
  TransferResult failed naming the 404;
* an agent Hangup closes the stream and completes the call (``Status=completed``);
* ``POST /twiml`` with Twilio's signature answers the TwiML naming the
  stream URL (the agent of ``agent=``); unsigned, badly signed, or for an
  agent the route does not admit, it is refused (403, 404) and counted.
"""

from __future__ import annotations

import asyncio
import re
import time
from urllib.parse import urlencode

import httpx
import pytest
from websockets.asyncio.client import connect

from brisvox.wire import twilio
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc
from tests.system.twilio_api_fake import ACCOUNT, TOKEN, FakeTwilioApi

pytestmark = [pytest.mark.system, pytest.mark.timeout(90)]

PUBLIC = "wss://gw.example.com"
ROUTES = [{"path": "/twilio", "protocol": "twilio", "agent": "default", "agents": ["sales"]}]


def until(pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


async def call(gw: GatewayProc, agent: FakeAgent, call_sid: str):  # type: ignore[no-untyped-def]
    """A signed Twilio stream of ``call_sid``: (websocket, the gateway's call id)."""
    stream = twilio.TwilioStream(stream_sid="MZ" + call_sid, call_sid=call_sid, account_sid=ACCOUNT)
    sig = twilio.signature(TOKEN, PUBLIC + "/twilio")
    ws = await connect(f"ws://127.0.0.1:{gw.ws_port}/twilio", additional_headers={"X-Twilio-Signature": sig})
    seen = len(agent.of(F.CallStart))
    await ws.send(stream.connected())
    await ws.send(stream.start())
    start = await asyncio.to_thread(agent.wait_for, F.CallStart, lambda f: f in agent.of(F.CallStart)[seen:])
    return ws, start.call_id


def test_transfer_and_hangup_through_the_rest_api(short_tmp):
    with FakeTwilioApi() as api, FakeAgent(short_tmp) as agent, GatewayProc(
            short_tmp, peers={"agent-0": agent.endpoint}, inbox=True,
            websocket={"routes": ROUTES, "public_url": PUBLIC, **api.config()}) as gw:
        api.status["CAgone"] = 404

        async def go() -> None:
            # a transfer: one calls update dialing the target, its 200 is the result
            ws, cid = await call(gw, agent, "CAtransfer1")
            agent.send(F.Transfer(call_id=cid, target="+14155550100"))
            res = await asyncio.to_thread(agent.wait_for, F.TransferResult, lambda f: f.call_id == cid)
            assert res.ok and res.detail == "Twilio API 200", res
            (req,) = api.of("CAtransfer1")
            assert req.authorized and req.path == f"/2010-04-01/Accounts/{ACCOUNT}/Calls/CAtransfer1.json"
            assert req.content_type == "application/x-www-form-urlencoded"
            assert req.fields == {"Twiml": ["<Response><Dial><Number>+14155550100</Number></Dial></Response>"]}
            agent.send(F.Hangup(call_id=cid, reason="transferred, goodbye"))  # a transferred call is Twilio's
            await asyncio.wait_for(ws.wait_closed(), 5)
            await asyncio.sleep(0.3)
            assert len(api.of("CAtransfer1")) == 1
            # a bad target never reaches the API
            ws, cid = await call(gw, agent, "CAbadtarget")
            agent.send(F.Transfer(call_id=cid, target="sip:<evil>"))
            res = await asyncio.to_thread(agent.wait_for, F.TransferResult, lambda f: f.call_id == cid)
            assert not res.ok and res.detail.startswith("invalid target") and not api.of("CAbadtarget")
            # the API's 404: a failed TransferResult naming it
            ws2, cid2 = await call(gw, agent, "CAgone")
            agent.send(F.Transfer(call_id=cid2, target="sip:operator@example.com"))
            res = await asyncio.to_thread(agent.wait_for, F.TransferResult, lambda f: f.call_id == cid2)
            assert not res.ok and res.detail.startswith("Twilio API 404 (code 20404)"), res
            assert len(api.of("CAgone")) == 1  # a 4xx is not retried
            await ws2.close()
            # the agent's hang-up: the stream closes, then the call is completed at Twilio
            agent.send(F.Hangup(call_id=cid, reason="end_call"))
            await asyncio.wait_for(ws.wait_closed(), 5)
            assert ws.close_code == 1000
            assert await asyncio.to_thread(until, lambda: bool(api.of("CAbadtarget")))
            (req,) = api.of("CAbadtarget")
            assert req.authorized and req.fields == {"Status": ["completed"]}

        asyncio.run(go())
        # the API saw the hang-up before the gateway read its answer and counted it
        assert until(lambda: gw.stats().get("twilio_api_hangup_ok") == 1)
        st = gw.stats()
        assert st["twilio_api_transfer_ok"] == 1 and st["twilio_api_transfer_failed"] == 1
        assert st["twilio_api_hangup_ok"] == 1 and st["transfers_ok"] == 1 and st["transfers_failed"] == 2


def test_webhook_answers_signed_posts(short_tmp):
    with GatewayProc(short_tmp, inbox=True, websocket={"routes": ROUTES, "public_url": PUBLIC,
                                                       "twilio_auth_token": TOKEN, "twiml_path": "/twiml"}) as gw:
        form = {"AccountSid": ACCOUNT, "CallSid": "CAhook", "From": "+14155550100", "To": "+14155550199",
                "CallStatus": "ringing", "Direction": "inbound"}

        def post(query: str, sig: str | None, body: dict[str, str] = form) -> httpx.Response:
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
            if sig is not None:
                headers["X-Twilio-Signature"] = sig
            return httpx.post(f"http://127.0.0.1:{gw.ws_port}/twiml{query}", content=urlencode(body),
                              headers=headers, timeout=5)

        good = twilio.signature(TOKEN, "https://gw.example.com/twiml?agent=sales", form)
        r = post("?agent=sales", good)
        assert r.status_code == 200 and r.headers["content-type"] == "text/xml"
        assert re.fullmatch(r'<\?xml version="1.0" encoding="UTF-8"\?><Response><Connect>'
                            r'<Stream url="wss://gw.example.com/twilio/sales">'
                            r'<Parameter name="From" value="\+14155550100"/><Parameter name="To" value="\+14155550199"/>'
                            r'<Parameter name="brisvox_stream_token" value="[A-Za-z0-9_-]{43}"/>'
                            "</Stream></Connect></Response>", r.text), r.text
        assert post("", None).status_code == 403
        assert post("?agent=sales", good, {**form, "From": "+19995550100"}).status_code == 403
        assert post("", good).status_code == 403  # signed for another URL
        other = twilio.signature(TOKEN, "https://gw.example.com/twiml?agent=other", form)
        assert post("?agent=other", other).status_code == 404
        st = gw.stats()
        assert st["ws_twiml"] == 5 and st["ws_twiml_ok"] == 1
        assert st["ws_refused_twiml_signature"] == 3 and st["ws_refused_twiml_agent"] == 1
        r = httpx.get(f"http://127.0.0.1:{gw.ws_port}/healthz", timeout=5)  # the listener still serves
        assert r.status_code == 200
