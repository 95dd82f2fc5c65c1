"""Outbound calls in process: the Twilio calls create (request, retries, outcome), the gateway's
refusals of a Twilio dial (each naming the missing key), ``[websocket] twilio_from``, and the
agent service's ``dial`` command (parsing, the ``[agent_link]`` gate, the ack, the port's request)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from brisvox.agent.link import messages as m
from brisvox.agent.link.client import AgentLink
from brisvox.agent.link.config import LinkConfig, check_link
from brisvox.agent.tool_engine.builtin import LinkTelephony
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.config.errors import ConfigError
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.control import twilio_rest
from brisvox.gateway.control.twilio_dial import dial_twilio, refusal, webhook_url
from brisvox.gateway.control.twilio_rest import TwilioApi, call_request, create_fields
from ipc import frames as F
from tests.unit.test_twilio_control import ACCOUNT, answering, api_with

ROUTES = (WsRoute("/twilio", "twilio", "default", ("sales",)),)


def test_the_calls_create_request_is_what_twilio_documents():
    url, headers, body = call_request("https://api.twilio.com/", ACCOUNT, "tok", None,
                                      create_fields("+4930123456", "+4930999", "https://gw.example.com/twiml", 25))
    assert url == f"https://api.twilio.com/2010-04-01/Accounts/{ACCOUNT}/Calls.json"
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert parse_qs(body.decode()) == {"To": ["+4930123456"], "From": ["+4930999"],
                                       "Url": ["https://gw.example.com/twiml"], "Method": ["POST"], "Timeout": ["25"]}
    assert "Timeout" not in create_fields("+1", "+2", "u")  # Twilio's default (60 s)
    assert create_fields("+1", "+2", "u", 9999)["Timeout"] == "600"
    cb = create_fields("+1", "+2", "u", status_callback="https://x/cb")
    assert (cb["StatusCallback"], cb["StatusCallbackMethod"]) == ("https://x/cb", "POST")
    assert "MachineDetection" not in cb  # no answering-machine detection asked for


def test_a_create_is_retried_only_when_it_never_reached_twilio(monkeypatch):
    monkeypatch.setattr(twilio_rest, "RETRY_DELAY_S", 0.0)
    seen: list[httpx.Request] = []

    answers = answering(seen, lambda s: httpx.Response(201, json={"sid": "CA" + "1" * 32, "status": "queued"})
                        if s == 201 else httpx.Response(s, json={"code": 21211, "message": "Invalid 'To' Phone Number"}))

    async def go() -> None:
        out = await api_with(answers(201)).create_call("+4930123456", "+4930999", "https://gw/twiml")
        assert out.ok and out.data == {"sid": "CA" + "1" * 32, "status": "queued"} and len(seen) == 1
        assert seen[0].url.path == f"/2010-04-01/Accounts/{ACCOUNT}/Calls.json"
        seen.clear()
        out = await api_with(answers(400)).create_call("+1", "+2", "u")
        assert out.detail == "Twilio API 400 (code 21211): Invalid 'To' Phone Number" and len(seen) == 1
        seen.clear()
        out = await api_with(answers(503, 201)).create_call("+1", "+2", "u")
        assert not out.ok and len(seen) == 1  # a 5xx may have created the call: never twice
        seen.clear()
        api = api_with(answers(httpx.ConnectError("refused"), 201))
        assert (await api.create_call("+1", "+2", "u")).ok and len(seen) == 2
        assert api.counters == {"twilio_api_retries": 1, "twilio_api_create_ok": 1}

    asyncio.run(go())


def cfg(**kw: Any) -> SimpleNamespace:
    base = {"twilio_from": "+4930999", "public_url": "wss://gw.example.com", "twiml_path": "/twiml", "routes": ROUTES,
            "twilio_stream_token_ttl_s": 30.0, "twilio_stream_tokens_max": 16, "twiml_requests_per_s": 0}
    return SimpleNamespace(**{**base, **kw})


def ws_server(handler: Callable[[httpx.Request], httpx.Response], counters: dict[str, int],
              **kw: Any) -> SimpleNamespace:
    """What dial_twilio uses of the WebSocket server: its config, REST client, counters, webhook."""
    from brisvox.gateway.control.twiml import Webhook

    server = SimpleNamespace(cfg=cfg(**kw), twilio_api=api_with(handler),
                             count=lambda k: counters.__setitem__(k, counters.get(k, 0) + 1))
    server.webhook = Webhook(server)  # type: ignore[arg-type]
    return server


def test_a_twilio_dial_is_refused_naming_what_is_missing():
    api = TwilioApi(ACCOUNT, "tok")
    assert refusal(cfg(), None, "+4930123456", "")[1].endswith("set [websocket] twilio_account_sid")
    assert refusal(cfg(twilio_from=""), api, "+4930123456", "")[1].endswith("set [websocket] twilio_from")
    assert refusal(cfg(public_url=""), api, "+4930123456", "")[1].endswith("set [websocket] public_url")
    assert refusal(cfg(twiml_path=""), api, "+4930123456", "")[1].endswith("set [websocket] twiml_path")
    for bad in ("4930123456", "+0123", "sip:a b", "tel:+49", "+49" + "1" * 20):
        assert refusal(cfg(), api, bad, "")[0] == "invalid_target", bad
    assert refusal(cfg(), api, "+4930123456", "other") == ("agent", "no twilio route admits agent 'other'")
    assert refusal(cfg(routes=()), api, "+4930123456", "")[0] == "agent"
    assert refusal(cfg(), api, "+4930123456", "sales") == ("", "")
    assert refusal(cfg(), api, "sip:alice@example.com", "") == ("", "")
    assert webhook_url(cfg(), "") == "https://gw.example.com/twiml"
    assert webhook_url(cfg(), "default") == "https://gw.example.com/twiml"
    assert webhook_url(cfg(), "sales") == "https://gw.example.com/twiml?agent=sales"
    assert webhook_url(cfg(public_url="ws://127.0.0.1:8765"), "") == "http://127.0.0.1:8765/twiml"


def test_dial_twilio_reports_the_call_sid_once_twilio_queued_it():
    sid = "CA" + "2" * 32
    bodies: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(req.content)
        return httpx.Response(201, json={"sid": sid, "status": "queued"})

    async def go() -> list[tuple[Any, str]]:
        counters: dict[str, int] = {}
        server = ws_server(handler, counters)
        tasks: list[asyncio.Task[Any]] = []
        host = SimpleNamespace(refusal=lambda: "", spawn=lambda c: tasks.append(asyncio.ensure_future(c)))
        out: list[tuple[Any, str]] = []
        dial_twilio(server, host, " +4930123456 ", "sales", 20, lambda d, e: out.append((d, e)))
        await asyncio.gather(*tasks)
        host.refusal = lambda: "full"
        dial_twilio(server, host, "+4930123456", "", 0, lambda d, e: out.append((d, e)))
        assert counters == {"twilio_dial_attempts": 2, "twilio_dial_queued": 1, "twilio_dial_refused_full": 1}
        return out

    out = asyncio.run(go())
    assert out[0] == ({"via": "twilio", "call_sid": sid, "status": "queued", "target": "+4930123456",
                       "agent": "sales", "from": "+4930999"}, "")
    assert out[1] == (None, "refused: full") and len(bodies) == 1
    form = parse_qs(bodies[0].decode())
    assert form["Url"] == ["https://gw.example.com/twiml?agent=sales"]
    # the call's progress is POSTed to the webhook's status path, signed as the webhook is
    assert form["StatusCallback"] == ["https://gw.example.com/twiml/status"] and form["StatusCallbackMethod"] == ["POST"]
    assert form["StatusCallbackEvent"] == ["initiated", "ringing", "answered", "completed"]


def test_twilio_from_must_be_e164():
    assert WebSocketConfig.from_section({"twilio_from": "+4930999"}).twilio_from == "+4930999"
    for bad in ("4930999", "+0301", "+49 30 999", "+1234567890123456"):
        with pytest.raises(ConfigError, match="twilio_from"):
            WebSocketConfig.from_section({"twilio_from": bad})


# -- the agent service's dial -------------------------------------------------------------


def test_the_dial_command_parses_and_its_ack_carries_what_it_made():
    c = m.parse(json.dumps({"type": "command", "id": "k5", "name": "dial", "target": "+4930123456",
                            "agent": "callback", "via": "twilio"}))
    assert c == m.Command("k5", "dial", target="+4930123456", agent="callback", via="twilio")
    assert json.loads(m.ack("k5", True, via="twilio", call_sid="CA1")) == {
        "type": "command.ack", "id": "k5", "ok": True, "via": "twilio", "call_sid": "CA1"}
    with pytest.raises(m.BadFrame):
        m.parse(json.dumps({"type": "command", "id": "k6", "name": "dial", "target": "+49", "agent": 3}))


def test_dial_targets_gate_what_a_service_may_dial():
    off = LinkConfig.from_table({"url": "ws://h/x", "secret_env": "S", "dial_targets": ["+4930*"]})
    assert not off.allow_dial and not off.may_dial("+4930123")  # allow_dial is false by default
    on = LinkConfig.from_table({"url": "ws://h/x", "secret_env": "S", "allow_dial": True,
                                "dial_targets": ["+4930*", "sip:callee@127.0.0.1:5070"]})
    assert on.may_dial("+4930123") and on.may_dial("sip:callee@127.0.0.1:5070")
    assert not on.may_dial("+49900123") and not on.may_dial("sip:callee@127.0.0.1:5071") and not on.may_dial("")
    assert not LinkConfig.from_table({"url": "ws://h/x", "secret_env": "S", "allow_dial": True}).may_dial("+49")
    env = {"S": "v"}
    assert [p[1] for p in check_link({"url": "ws://h/x", "secret_env": "S", "allow_dial": True}, env)] == ["dial_targets"]
    assert [p[1] for p in check_link({"url": "ws://h/x", "secret_env": "S", "allow_dial": True,
                                      "dial_targets": ["+*"]}, env)] == ["dial_targets"]


class FakeTelephony:
    def __init__(self, answer: tuple[bool, dict[str, Any], str], hold: float = 0.0) -> None:
        self.answer, self.hold = answer, hold
        self.asked: list[tuple[str, str, str, float]] = []
        self.trunks: list[str] = []

    async def dial(self, target: str, agent: str, via: str, timeout: float,  # noqa: ASYNC109
                   trunk: str = "") -> tuple[bool, dict[str, Any], str]:
        self.asked.append((target, agent, via, timeout))
        self.trunks.append(trunk)
        await asyncio.sleep(self.hold)
        return self.answer


def _acks(table: dict[str, Any], tel: FakeTelephony, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        link = AgentLink(LinkConfig.from_table({"url": "ws://h/x", "secret_env": "S", **table}), "k", session="s",
                         call={}, registry=ToolRegistry(), telephony=tel)
        link.actor = SimpleNamespace(hung_up=False)
        sent: list[dict[str, Any]] = []
        def send_soon(text: str) -> bool:
            sent.append(json.loads(text))
            return True

        link._send_soon = send_soon  # type: ignore[method-assign]
        for f in frames:
            link.on_frame(json.dumps({"type": "command", "name": "dial", **f}))
        for _ in range(50):
            await asyncio.sleep(0.01)
        link.tasks.cancel()
        return sent

    return asyncio.run(go())


def test_a_dial_command_is_gated_then_acked_with_the_new_call():
    tel = FakeTelephony((True, {"call_id": "c42", "agent": "x", "ringing_at_ms": 110, "progress_at_ms": None,
                                "answered_at_ms": 2500}, ""))
    acks = _acks({}, tel, [{"id": "k1", "target": "+4930123"}])
    assert acks == [{"type": "command.ack", "id": "k1", "ok": False,
                     "error": "not allowed: [agent_link] allow_dial and dial_targets"}] and not tel.asked
    allowed = {"allow_dial": True, "dial_targets": ["+4930*"]}
    acks = _acks(allowed, tel, [{"id": "k2", "target": "+49900"}, {"id": "k3", "target": "+4930123", "via": "fax"},
                                {"id": "k4", "target": "+4930123", "agent": "callback"}])
    assert [(a["id"], a["ok"], a.get("error", "")) for a in acks] == [
        ("k2", False, "not a dial target ([agent_link] dial_targets)"), ("k3", False, "via must be sip or twilio"),
        ("k4", True, "")]
    assert acks[2] == {"type": "command.ack", "id": "k4", "ok": True, "via": "sip", "call_id": "c42",
                       "ringing_at_ms": 110, "answered_at_ms": 2500}  # the dial's times; one never reached is left out
    assert tel.asked == [("+4930123", "callback", "sip", 100.0)]
    slow = FakeTelephony((False, {"reason": "busy"}, "busy"), hold=0.2)
    acks = _acks(allowed, slow, [{"id": "k5", "target": "+4930123", "via": "twilio"},
                                 {"id": "k6", "target": "+4930124"}])
    assert [(a["id"], a["ok"], a.get("error")) for a in acks] == [("k6", False, "a dial is in progress"),
                                                                  ("k5", False, "busy")]
    assert slow.asked == [("+4930123", "", "twilio", 20.0)]
    # a [[sip.trunks]] entry to dial through: passed on over SIP, refused with twilio
    trunked = FakeTelephony((True, {"call_id": "c43"}, ""))
    acks = _acks(allowed, trunked, [{"id": "k7", "target": "+4930125", "trunk": "carrier"},
                                    {"id": "k8", "target": "+4930126", "trunk": "carrier", "via": "twilio"}])
    assert sorted((a["id"], a["ok"], a.get("error", "")) for a in acks) == [
        ("k7", True, ""), ("k8", False, "a trunk is dialled via sip")]  # the refusal is acked at once
    assert trunked.trunks == ["carrier"]


def test_the_telephony_port_asks_the_gateway_and_bounds_the_wait():
    asked: list[tuple[Any, float]] = []

    async def answered(frame: Any, wait: float) -> Any:
        asked.append((frame, wait))
        return F.CommandReply(ok=True, data={"call_id": "c1"})

    async def silent(frame: Any, wait: float) -> Any:
        raise TimeoutError

    async def go() -> None:
        tel = LinkTelephony("c0", lambda f: None, request=answered)
        assert await tel.dial("+4930123", "a", "sip", 5.0) == (True, {"call_id": "c1"}, "")
        assert asked[0][0] == F.Command(name="dial", args={"target": "+4930123", "agent": "a", "via": "sip"})
        assert asked[0][1] == 5.0
        ok, _, why = await LinkTelephony("c0", lambda f: None, request=silent).dial("+4930123", "", "sip", 1.0)
        assert not ok and "did not answer" in why
        assert (await LinkTelephony("c0", lambda f: None).dial("+4930123", "", "sip", 1.0))[0] is False

    asyncio.run(go())


def test_calls_show_finds_a_record_by_its_call_sid(tmp_path, capsys):
    from brisvox.cli.brisvox import main

    rows = [{"call_id": "c1", "started": "2026-01-01T00:00:00Z", "transport_ids": {"callSid": "CA9"}},
            {"call_id": "c2", "started": "2026-01-01T00:00:01Z", "transport_ids": {"sip_call_id": "x@y"}}]
    f = tmp_path / "calls.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["calls", "--path", str(f), "show", "CA9"]) == 0
    assert json.loads(capsys.readouterr().out)["call_id"] == "c1"
    assert main(["calls", "--path", str(f), "show", "CA8"]) == 1


def test_brisvoxd_dial_prints_the_dials_times():
    from brisvox.cli.brisvoxd import dial_times

    assert dial_times({"ringing_at_ms": 120, "progress_at_ms": 260, "answered_at_ms": 3100}) == \
        "ringing 120 ms, early media 260 ms, answered 3100 ms after the INVITE"
    assert dial_times({"ringing_at_ms": None, "answered_at_ms": 900}) == \
        "ringing -, early media -, answered 900 ms after the INVITE"
