"""Twilio call control and the TwiML webhook, in process: the TwiML rendering and escaping,
the POST signature (Twilio's documented algorithm and example), the REST request building,
the client's retry and error mapping (httpx's mock transport), and the [websocket] keys."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.control import twilio_rest
from brisvox.gateway.control.stream_tokens import Binding
from brisvox.gateway.control.twilio_rest import TwilioApi, call_request, dial_twiml
from brisvox.gateway.control.twiml import origin, render, stream_url, webhook_of
from brisvox.gateway.transports import TRANSPORTS
from brisvox.gateway.ws.auth import twilio_auth, twilio_signed
from brisvox.wire import twilio

ACCOUNT = "AC" + "0123456789abcdef" * 2

# Twilio's documented example (docs "Webhooks security"): this URL, these POST parameters and
# the auth token 12345 sign as 0/KCTR6DLpKmkAf8muzZqo1nDgQ=
DOC_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
DOC_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
              "From": "+12349013030", "To": "+18005551212"}
DOC_SIGNATURE = "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


def test_post_signature_matches_twilios_documented_example():
    assert twilio.signature("12345", DOC_URL, DOC_PARAMS) == DOC_SIGNATURE
    pairs = list(reversed(DOC_PARAMS.items()))  # the order sent does not matter: sorted by name
    assert twilio.signature("12345", DOC_URL, pairs) == DOC_SIGNATURE
    assert twilio_signed("12345", {"X-Twilio-Signature": DOC_SIGNATURE}, DOC_URL, pairs)
    assert not twilio_signed("12345", {"X-Twilio-Signature": DOC_SIGNATURE}, DOC_URL, pairs[1:])
    assert not twilio_signed("12346", {"X-Twilio-Signature": DOC_SIGNATURE}, DOC_URL, pairs)
    assert not twilio_signed("12345", {}, DOC_URL, pairs)
    assert not twilio_signed("12345", {"X-Twilio-Signature": DOC_SIGNATURE}, DOC_URL.replace("foo", "fo"), pairs)


def test_get_signature_shares_the_code():
    cfg = SimpleNamespace(twilio_auth_token="tok", public_url="wss://example.com")
    good = {"X-Twilio-Signature": twilio.signature("tok", "wss://example.com/twilio")}
    assert twilio_auth(cfg, None, "/twilio", good).__class__.__name__ == "Grant"
    assert twilio_auth(cfg, None, "/twilio/x", good).__class__.__name__ == "Refusal"


def test_dial_twiml_targets_and_escaping():
    assert dial_twiml("+14155550100") == "<Response><Dial><Number>+14155550100</Number></Dial></Response>"
    assert dial_twiml(" sip:alice@example.com;transport=tls ") == \
        "<Response><Dial><Sip>sip:alice@example.com;transport=tls</Sip></Dial></Response>"
    for bad in ("", "14155550100", "+0123", "+1234567890123456", "sip:a b", "sip:a<b>", "sip:a&b",
                'sip:"x"', "tel:+1415", "javascript:x", "sip:" + "a" * 300, "</Dial><Hangup/>"):
        assert dial_twiml(bad) is None, bad


def test_call_request_is_what_twilio_expects():
    url, headers, body = call_request("http://127.0.0.1:9/", ACCOUNT, "tok", "CA42",
                                      {"Twiml": dial_twiml("+14155550100") or ""})
    assert url == f"http://127.0.0.1:9/2010-04-01/Accounts/{ACCOUNT}/Calls/CA42.json"
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"{ACCOUNT}:tok".encode()).decode()
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert parse_qs(body.decode()) == {"Twiml": ["<Response><Dial><Number>+14155550100</Number></Dial></Response>"]}
    _, _, body = call_request("https://api.twilio.com", ACCOUNT, "tok", "CA42", {"Status": "completed"})
    assert body == b"Status=completed"
    for sid in ("CA/../x", "", "CA 1", "CA%2F"):
        with pytest.raises(ValueError):
            call_request("https://api.twilio.com", ACCOUNT, "tok", sid, {})


def api_with(handler) -> TwilioApi:  # type: ignore[no-untyped-def]
    api = TwilioApi(ACCOUNT, "tok", "http://twilio.test")
    api._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return api


def answering(seen: list[httpx.Request], respond: Callable[[int], httpx.Response]) -> Callable[..., Any]:
    """``answers(*statuses)``: a handler for :func:`api_with` that records each request in ``seen``
    and answers it with the next status (``respond(status)``; an exception is raised instead)."""
    def answers(*statuses: int | Exception) -> Callable[[httpx.Request], httpx.Response]:
        it = iter(statuses)

        def handler(req: httpx.Request) -> httpx.Response:
            seen.append(req)
            s = next(it)
            if isinstance(s, Exception):
                raise s
            return respond(s)
        return handler
    return answers


def test_client_outcomes_and_bounded_retries(monkeypatch):
    monkeypatch.setattr(twilio_rest, "RETRY_DELAY_S", 0.0)
    seen: list[httpx.Request] = []

    answers = answering(seen, lambda s: httpx.Response(
        404, json={"code": 20404, "message": "The requested resource was not found"}) if s == 404 else
        httpx.Response(s, json={"sid": "CA1", "status": "in-progress"}))

    async def go() -> None:
        out = await api_with(answers(200)).transfer("CA1", "+14155550100")
        assert out == twilio_rest.Outcome(True, "Twilio API 200")
        assert seen[-1].url.path == f"/2010-04-01/Accounts/{ACCOUNT}/Calls/CA1.json"
        assert parse_qs(seen[-1].content.decode())["Twiml"][0].startswith("<Response><Dial><Number>")
        seen.clear()
        out = await api_with(answers(404)).complete("CA1")
        assert out == twilio_rest.Outcome(False, "Twilio API 404 (code 20404): The requested resource was not found")
        assert len(seen) == 1  # a 4xx is final
        seen.clear()
        api = api_with(answers(503, 200))
        assert (await api.complete("CA1")).ok and len(seen) == 2
        assert api.counters == {"twilio_api_retries": 1, "twilio_api_hangup_ok": 1}
        seen.clear()
        out = await api_with(answers(httpx.ConnectError("refused"), httpx.ConnectError("refused"), 200)).complete("CA1")
        assert out == twilio_rest.Outcome(False, "Twilio API unreachable: ConnectError") and len(seen) == 2
        seen.clear()
        out = await api_with(answers(httpx.ReadTimeout("slow"))).complete("CA1")
        assert out == twilio_rest.Outcome(False, "Twilio API error: ReadTimeout") and len(seen) == 1
        seen.clear()
        out = await api_with(answers()).transfer("CA1", "not a number")
        assert not out.ok and out.detail.startswith("invalid target") and not seen

    asyncio.run(go())


def test_twiml_rendering_escapes_every_value():
    doc = render("wss://gw.example.com/twilio/sales", {"From": '+1"<&>\'', "To": "+14155550100"})
    assert doc.startswith(b'<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
                          b'<Stream url="wss://gw.example.com/twilio/sales">')
    assert b'<Parameter name="From" value="+1&quot;&lt;&amp;&gt;\'"/>' in doc
    assert doc.endswith(b'<Parameter name="To" value="+14155550100"/></Stream></Connect></Response>')
    import xml.etree.ElementTree as ET

    root = ET.fromstring(doc)
    assert root.find("Connect/Stream").get("url") == "wss://gw.example.com/twilio/sales"  # type: ignore[union-attr]


def test_stream_and_webhook_urls():
    routes = (WsRoute("/ws", "native", "default"), WsRoute("/twilio", "twilio", "default", ("sales",)))
    cfg = SimpleNamespace(public_url="https://gw.example.com", routes=routes)
    assert origin(cfg, "ignored", False) == "https://gw.example.com"
    assert stream_url(cfg, "ignored", "") == "wss://gw.example.com/twilio"
    assert stream_url(cfg, "ignored", "default") == "wss://gw.example.com/twilio"
    assert stream_url(cfg, "ignored", "sales") == "wss://gw.example.com/twilio/sales"
    assert stream_url(cfg, "ignored", "other") is None
    assert stream_url(cfg, "ignored", "../x") is None
    plain = SimpleNamespace(public_url="", routes=routes)
    assert origin(plain, "10.0.0.1:8765", False) == "https://10.0.0.1:8765"
    assert stream_url(plain, "10.0.0.1:8765", "") == "wss://10.0.0.1:8765/twilio"
    ws = SimpleNamespace(public_url="ws://127.0.0.1:1", routes=routes)
    assert (origin(ws, "", False), origin(ws, "", True)) == ("http://127.0.0.1:1", "ws://127.0.0.1:1")
    assert stream_url(SimpleNamespace(public_url="", routes=routes[:1]), "h", "") is None


def test_config_keys():
    cfg = WebSocketConfig.from_section({})
    assert (cfg.twilio_account_sid, cfg.twilio_api_base, cfg.twiml_path) == ("", "https://api.twilio.com", "")
    cfg = WebSocketConfig.from_section({"twilio_account_sid": ACCOUNT, "twilio_auth_token": "t",
                                        "twilio_api_base": "http://127.0.0.1:9", "twiml_path": "/twiml"})
    assert twilio_rest.from_config(cfg) is not None
    assert twilio_rest.from_config(WebSocketConfig.from_section({})) is None
    bad = [({"twilio_account_sid": "AC123"}, "twilio_account_sid"),
           ({"twilio_account_sid": ACCOUNT}, "twilio_auth_token"),
           ({"twilio_api_base": "ftp://x"}, "twilio_api_base"),
           ({"twilio_api_base": "https://api.twilio.com/2010-04-01"}, "twilio_api_base"),
           ({"twilio_api_timeout_s": 0}, "twilio_api_timeout_s"),
           ({"twiml_path": "twiml"}, "twiml_path"),
           ({"twiml_path": "/healthz"}, "twiml_path"),
           ({"twiml_path": "/twilio"}, "twiml_path")]
    for table, key in bad:
        with pytest.raises(ConfigError, match=rf"websocket\.{key}"):
            WebSocketConfig.from_section(table)


def test_twilio_offers_transfer():
    assert TRANSPORTS["twilio"].offers("transfer")


# -- the webhook through a server connection (in process) ---------------------------------

TWIML_ROUTES = [{"path": "/twilio", "protocol": "twilio", "agent": "default", "agents": ["sales"]}]
FORM = {"AccountSid": ACCOUNT, "CallSid": "CA9", "From": "+14155550100", "To": "+14155550199", "Direction": "inbound"}


def post(path: str, form: dict[str, str] | bytes, signature: str | None = "", ctype: str = "application/x-www-form-urlencoded",
         token: str = "tok") -> bytes:
    from urllib.parse import urlencode

    body = form if isinstance(form, bytes) else urlencode(form).encode()
    if signature == "":
        pairs = list(parse_qs(body.decode(), keep_blank_values=True).items())
        signature = twilio.signature(token, "https://gw.example.com" + path, [(k, v[0]) for k, v in pairs])
    head = f"POST {path} HTTP/1.1\r\nHost: 10.0.0.1:8765\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
    if signature is not None:
        head += f"X-Twilio-Signature: {signature}\r\n"
    return head.encode() + b"\r\n" + body


def exchange(server, data: bytes, chunk: int = 0) -> bytes:  # type: ignore[no-untyped-def]
    from brisvox.gateway.ws.server import WsConnection
    from tests.unit.test_gateway_ws_fastpath import Transport

    class Closing(Transport):
        closed = False

        def close(self) -> None:
            self.closed = True

    conn = WsConnection(server)
    t = Closing()
    conn.connection_made(t)  # type: ignore[arg-type]
    parts = [data[i:i + chunk] for i in range(0, len(data), chunk)] if chunk else [data]
    for p in parts:
        conn.data_received(p)
    conn.connection_lost(None)
    return bytes(t.out) if t.closed else b"(open) " + bytes(t.out)


def test_webhook_answers_signed_posts_and_refuses_the_rest():
    from brisvox.gateway.ws.server import WebSocketServer

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        cfg = WebSocketConfig.from_section({"twiml_path": "/twiml", "twilio_auth_token": "tok", "handshakes_per_s": 0,
                                            "twiml_requests_per_s": 0,
                                            "public_url": "https://gw.example.com", "routes": TWIML_ROUTES})
        server = WebSocketServer(None, cfg, TRANSPORTS)  # type: ignore[arg-type]
        out = exchange(server, post("/twiml?agent=sales", FORM), chunk=7)
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Type: text/xml" in head
        token = re.search(rb'name="brisvox_stream_token" value="([A-Za-z0-9_-]{43})"', body)
        assert token is not None, body  # the stream's one-time token, bound to CA9 for sales
        assert body == render("wss://gw.example.com/twilio/sales", {"From": FORM["From"], "To": FORM["To"]},
                              token.group(1).decode())
        binding = webhook_of(server).tokens.redeem(token.group(1).decode())  # type: ignore[union-attr]
        assert binding == Binding("CA9", ACCOUNT, "sales")
        assert re.search(
            rb'<Stream url="wss://gw.example.com/twilio"><Parameter name="From" value="\+14155550100"/>'
            rb'<Parameter name="To" value="\+14155550199"/><Parameter name="brisvox_stream_token" value="[^"]+"/>'
            rb"</Stream></Connect></Response>$", exchange(server, post("/twiml", FORM)))
        refused = {
            "unsigned": post("/twiml", FORM, signature=None),
            "bad": post("/twiml", FORM, signature=DOC_SIGNATURE),
            "other token": post("/twiml", FORM, token="not-tok"),
            "tampered": post("/twiml", FORM).replace(b"%2B14155550100", b"%2B14155550101"),
        }
        for what, req in refused.items():
            assert exchange(server, req).startswith(b"HTTP/1.1 403 Forbidden"), what
        assert server.counters["ws_refused_twiml_signature"] == 4
        assert exchange(server, post("/twiml?agent=other", FORM)).startswith(b"HTTP/1.1 404")
        assert server.counters["ws_refused_twiml_agent"] == 1
        assert exchange(server, post("/nope", FORM)).startswith(b"HTTP/1.1 404")
        assert exchange(server, post("/twiml", FORM, ctype="application/json")).startswith(b"HTTP/1.1 415")
        assert exchange(server, post("/twiml", b"x" * 20000)).startswith(b"HTTP/1.1 413")
        assert exchange(server, post("/twiml", FORM).replace(b"Content-Length", b"X-Length")).startswith(b"HTTP/1.1 411")
        assert exchange(server, b"POST /twiml HTTP/1.1\r\n" + b"X: y\r\n" * 2000).startswith(b"HTTP/1.1 431")
        assert exchange(server, post("/twiml", FORM)[:-3]).startswith(b"(open)")  # incomplete: the timeout drops it
        c = server.counters
        assert c["ws_twiml"] == 13 and c["ws_twiml_ok"] == 2
        assert c["ws_refused_twiml_type"] == 1 and c["ws_refused_twiml_size"] == 3
        # without twiml_path a POST is the library's (refused as a handshake with a body), as before
        plain = WebSocketServer(None, WebSocketConfig.from_section({"twilio_auth_token": "tok"}), TRANSPORTS)  # type: ignore[arg-type]
        assert b"200 OK" not in exchange(plain, post("/twiml", FORM))
        assert "ws_twiml" not in plain.counters and plain.counters["ws_refused_handshake"] == 1
    finally:
        asyncio.set_event_loop(None)
        loop.close()


# -- the leg: when the REST API is asked ------------------------------------------------------

class FakeApi:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[str, str]] = []

    async def transfer(self, call_sid: str, target: str) -> twilio_rest.Outcome:
        self.calls.append(("transfer", call_sid))
        await asyncio.sleep(0)
        return twilio_rest.Outcome(self.ok, "Twilio API 200" if self.ok else "Twilio API 404")

    async def complete(self, call_sid: str) -> twilio_rest.Outcome:
        self.calls.append(("complete", call_sid))
        return twilio_rest.Outcome(True, "Twilio API 200")


def leg(api: FakeApi | None, call_sid: str = "CA1"):  # type: ignore[no-untyped-def]
    from brisvox.gateway.carriers.twilio import TwilioSession
    from brisvox.gateway.config import GatewaySettings

    loop = asyncio.get_running_loop()
    host = SimpleNamespace(settings=GatewaySettings(), call_later=loop.call_later, spawn=loop.create_task,
                           transport_ended=lambda call, reason: setattr(call, "transport_done", True))
    conn = SimpleNamespace(server=SimpleNamespace(twilio_api=api), closed=False, closes=[])
    conn.close = lambda code, reason: conn.closes.append((code, reason))
    s = TwilioSession(host, conn, WsRoute("/twilio", "twilio", "default"))  # type: ignore[arg-type]
    s.call = SimpleNamespace(transport_ids={"callSid": call_sid} if call_sid else {},  # type: ignore[assignment]
                             transport_done=False)
    return s, conn


def test_leg_transfer_and_hangup_use_the_api_only_when_they_should():
    async def go() -> None:
        got: list[tuple[bool, str]] = []
        done = lambda ok, why: got.append((ok, why))  # noqa: E731
        s, _ = leg(None)
        s.transfer("+14155550100", done)
        assert got == [(False, s.transfer_reason)] and "twilio_account_sid" in s.transfer_reason
        s, _ = leg(FakeApi(), call_sid="")
        s.transfer("+14155550100", done)
        assert got[-1] == (False, "no callSid in the stream's start")
        # a transfer: one at a time; once done, no hang-up completes the call
        api = FakeApi()
        s, conn = leg(api)
        s.transfer("+14155550100", done)
        s.transfer("+14155550100", done)
        assert got[-1] == (False, "a transfer is in progress")
        await asyncio.sleep(0.01)
        assert got[-1] == (True, "Twilio API 200") and api.calls == [("transfer", "CA1")]
        s.hangup("end_call")
        await asyncio.sleep(0.01)
        assert api.calls == [("transfer", "CA1")] and conn.closes == [(1000, "end_call")]
        # a failed transfer leaves the call ours: the hang-up completes it
        api = FakeApi(ok=False)
        s, conn = leg(api)
        s.transfer("+14155550100", done)
        await asyncio.sleep(0.01)
        assert got[-1] == (False, "Twilio API 404")
        s.hangup("stage_failed: llm")
        await asyncio.sleep(0.01)
        assert api.calls == [("transfer", "CA1"), ("complete", "CA1")] and conn.closes == [(1011, "stage_failed: llm")]
        # shutdown (going away) and a stream already closed: no completion
        api = FakeApi()
        s, conn = leg(api)
        s.hangup("shutdown")
        s2, conn2 = leg(api)
        conn2.closed = True
        s2.hangup("end_call")
        await asyncio.sleep(0.01)
        assert api.calls == [] and conn.closes == [(1001, "shutdown")]

    asyncio.run(go())


def test_the_gateway_imports_httpx_only_for_a_rest_request():
    """httpx and its stack cost the gateway ~9 MB of PSS (idle daemon 208.9 -> 220.6 MB when it
    was imported at start): a gateway that never calls Twilio's API must not load it."""
    import subprocess
    import sys

    code = ("import sys, brisvox.gateway.process, brisvox.gateway.ws.server, brisvox.gateway.carriers.twilio; "
            "print('httpx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
