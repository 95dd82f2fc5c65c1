"""Twilio's status callbacks: the CallStatus mapping, the table of created calls, the signed
``<twiml_path>/status`` endpoint, a dial that awaits the callee's answer, and the campaign side
(``via`` stored with a campaign, the awaited dial's answers classified)."""

from __future__ import annotations

import asyncio
import sqlite3
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from brisvox.cli import dial_request
from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.control import twilio_dial
from brisvox.gateway.control.twilio_dial import dial_twilio
from brisvox.gateway.control.twilio_status import CallStatuses, status_path, verdict
from brisvox.gateway.control.twiml import webhook_of
from brisvox.gateway.transports import TRANSPORTS
from brisvox.outbound.campaign.outcomes import ANSWERED, BUSY, FAILED, NO_ANSWER, REFUSED, classify
from brisvox.outbound.campaign.scheduler import Settings
from tests.unit.test_outbound_dial import ws_server
from tests.unit.test_twilio_control import ACCOUNT, DOC_SIGNATURE, TWIML_ROUTES, exchange, post

SID = "CA" + "5" * 32


def test_every_call_status_maps_to_one_verdict():
    assert verdict("in-progress") == (True, "") and verdict("completed") == (True, "")
    assert verdict("busy") == (False, "busy") and verdict("no-answer") == (False, "no answer")
    assert verdict("failed") == (False, "failed") and verdict("canceled") == (False, "canceled")
    for undecided in ("queued", "initiated", "ringing", "answered", "", "IN-PROGRESS"):
        assert verdict(undecided) is None, undecided
    # the gateway's answers, as a campaign records them (the SIP dial's words)
    assert [classify(False, verdict(s)[1]) for s in ("busy", "no-answer", "failed", "canceled")] == [  # type: ignore[index]
        BUSY, NO_ANSWER, FAILED, FAILED]
    assert classify(True, "") == ANSWERED
    for refusal in ("a Twilio dial needs a caller id: set [websocket] twilio_from", "no twilio route admits agent 'x'",
                    "invalid target (an E.164 number or a sip: URI)", "params: 'to' is set by the gateway",
                    "the WebSocket listener is not enabled", "refused: full"):
        assert classify(False, refusal) == REFUSED, refusal
    assert classify(False, "Twilio API 400 (code 21211): Invalid 'To' Phone Number") == FAILED
    assert status_path("/twiml") == "/twiml/status" == status_path("/twiml/")
    assert dial_request.NO_STATUS == twilio_dial.NO_STATUS  # the client knows the gateway's words


def test_the_table_keeps_the_first_decisive_status_bounded_and_expiring():
    now = [0.0]
    counted: list[str] = []
    t = CallStatuses(max_calls=3, ttl_s=10.0, count=counted.append, clock=lambda: now[0])
    assert t.record("CA1", "ringing") and t.get("CA1").ringing_at == 0.0  # type: ignore[union-attr]
    assert not t.record("CA1", "picked-up") and counted == ["twilio_status_unknown"]
    assert t.record("CA1", "in-progress") and t.record("CA1", "completed")
    e = t.get("CA1")
    assert e is not None and (e.decided, e.final) == ("in-progress", "completed")
    assert t.record("CA1", "busy") and t.get("CA1").decided == "in-progress"  # type: ignore[union-attr]
    for sid in ("CA2", "CA3", "CA4"):
        t.record(sid, "queued")
    assert len(t) == 3 and t.get("CA1") is None and counted[-1] == "twilio_status_evicted"  # the oldest went
    now[0] = 10.5
    assert t.get("CA2") is None and len(t) == 0  # expired


def test_a_waiter_is_told_the_first_decisive_status_or_none_at_its_timeout():
    async def go() -> None:
        t = CallStatuses(max_calls=2)
        t.record("CA1", "busy")
        assert await t.wait("CA1", 1.0) == "busy"  # already decided (a callback before the create's answer)
        w = asyncio.ensure_future(t.wait("CA2", 2.0))
        await asyncio.sleep(0)
        t.record("CA2", "ringing")
        await asyncio.sleep(0.01)
        assert not w.done()
        t.record("CA2", "no-answer")
        t.record("CA2", "completed")
        assert await w == "no-answer"
        assert await t.wait("CA3", 0.05) is None  # nothing came
        a, b = (asyncio.ensure_future(t.wait(s, 1.0)) for s in ("CA4", "CA5"))
        await asyncio.sleep(0)
        assert await t.wait("CA6", 1.0) is None  # every waiter slot taken
        t.record("CA4", "in-progress")
        t.record("CA5", "failed")
        assert (await a, await b) == ("in-progress", "failed")

    asyncio.run(go())


def status_form(call_status: str, sid: str = SID, account: str = ACCOUNT) -> dict[str, str]:
    return {"AccountSid": account, "ApiVersion": "2010-04-01", "CallSid": sid, "CallStatus": call_status,
            "Direction": "outbound-api", "From": "+4930999", "To": "+4930123456",
            "CallbackSource": "call-progress-events", "SequenceNumber": "0"}


def test_status_callbacks_are_taken_only_signed_as_the_webhook_is():
    from brisvox.gateway.ws.server import WebSocketServer

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        cfg = WebSocketConfig.from_section({"twiml_path": "/twiml", "twilio_auth_token": "tok", "handshakes_per_s": 0,
                                            "twiml_requests_per_s": 0, "twilio_account_sid": ACCOUNT,
                                            "public_url": "https://gw.example.com", "routes": TWIML_ROUTES})
        server = WebSocketServer(None, cfg, TRANSPORTS)  # type: ignore[arg-type]
        hook = webhook_of(server)
        assert hook is not None
        out = exchange(server, post("/twiml/status", status_form("ringing")), chunk=9)
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\n"), out  # no body
        assert hook.statuses.get(SID).final == "ringing"  # type: ignore[union-attr]
        refused = {
            "unsigned": post("/twiml/status", status_form("busy"), signature=None),
            "bad": post("/twiml/status", status_form("busy"), signature=DOC_SIGNATURE),
            "other token": post("/twiml/status", status_form("busy"), token="not-tok"),
            "tampered": post("/twiml/status", status_form("queued")).replace(b"=queued", b"=failed"),
            "signed for the webhook's path": post("/twiml", status_form("busy")).replace(
                b"POST /twiml HTTP", b"POST /twiml/status HTTP"),
        }
        for what, req in refused.items():
            assert exchange(server, req).startswith(b"HTTP/1.1 403 Forbidden"), what
        c = server.counters
        assert c["ws_refused_twilio_status_signature"] == 5 and "ws_refused_twiml_signature" not in c
        assert hook.statuses.get(SID).decided == ""  # type: ignore[union-attr]  # none of them counted
        other = status_form("busy", account="AC" + "f" * 32)
        assert exchange(server, post("/twiml/status", other)).startswith(b"HTTP/1.1 403")
        assert c["ws_refused_twilio_status_account"] == 1
        assert exchange(server, post("/twiml/status", status_form("picked-up"))).startswith(b"HTTP/1.1 400")
        assert c["ws_refused_twilio_status_form"] == 1
        assert exchange(server, post("/twiml/status", status_form("busy"))).startswith(b"HTTP/1.1 200")
        assert hook.statuses.get(SID).decided == "busy"  # type: ignore[union-attr]
        assert c["ws_twilio_status"] == 9 and c["ws_twilio_status_ok"] == 2
        # the TwiML fetch of a call this gateway placed is its answer; the dial's params ride along
        hook.statuses.carry("CA77", {"first_name": "Ada"})
        fetch = {"AccountSid": ACCOUNT, "CallSid": "CA77", "From": "+4930999", "To": "+4930123456",
                 "Direction": "outbound-api"}
        body = exchange(server, post("/twiml", fetch)).partition(b"\r\n\r\n")[2]
        assert b'<Parameter name="first_name" value="Ada"/>' in body and b'name="direction" value="outbound"' in body
        assert hook.statuses.get("CA77").decided == "in-progress"  # type: ignore[union-attr]
        inbound = {**fetch, "CallSid": "CA78", "Direction": "inbound"}
        hook.statuses.carry("CA78", {"first_name": "Eve"})
        assert b"Eve" not in exchange(server, post("/twiml", inbound))  # only an outbound call gets them
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def run_dial(statuses: list[tuple[float, str]], ring: int = 20, params: dict[str, str] | None = None,
             await_answer: bool = True) -> tuple[Any, dict[str, int], list[bytes]]:
    """One dial_twilio against a REST client that answers 201; ``statuses`` recorded at their delays."""
    bodies: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(req.content)
        return httpx.Response(201, json={"sid": SID, "status": "queued"})

    async def go() -> tuple[Any, dict[str, int]]:
        counters: dict[str, int] = {}
        server = ws_server(handler, counters)
        tasks: list[asyncio.Task[Any]] = []
        host = SimpleNamespace(refusal=lambda: "", spawn=lambda c: tasks.append(asyncio.ensure_future(c)))
        out: list[tuple[Any, str]] = []
        dial_twilio(server, host, "+4930123456", "", ring, lambda d, e: out.append((d, e)), params, await_answer)
        for delay, status in statuses:
            await asyncio.sleep(delay)
            server.webhook.statuses.record(SID, status)
        await asyncio.gather(*tasks)
        assert len(out) == 1  # reported exactly once
        return out[0], counters

    got, counters = asyncio.run(go())
    return got, counters, bodies


def test_an_awaited_dial_answers_at_the_callees_answer_or_its_failure(monkeypatch):
    (data, error), counters, bodies = run_dial([(0.05, "ringing"), (0.05, "in-progress")])
    assert error == "" and data["call_sid"] == SID and data["status"] == "in-progress"
    assert data["answered_at_ms"] >= data["ringing_at_ms"] >= 0
    assert counters["twilio_dial_answered"] == 1 and counters["twilio_dial_queued"] == 1
    assert parse_qs(bodies[0].decode())["StatusCallback"] == ["https://gw.example.com/twiml/status"]
    for status, said in (("busy", "busy"), ("no-answer", "no answer"), ("failed", "failed"), ("canceled", "canceled")):
        (data, error), counters, _ = run_dial([(0.02, "ringing"), (0.02, status)])
        assert (data, error) == (None, said) and counters[f"twilio_dial_{status.replace('-', '_')}"] == 1
    # not awaited: Twilio's queued, as before
    (data, error), _, _ = run_dial([], await_answer=False)
    assert error == "" and data["status"] == "queued"
    # nothing decisive within the ring and the grace: the call may be up (the campaign: unknown)
    monkeypatch.setattr(twilio_dial, "STATUS_GRACE_S", 0.1)
    monkeypatch.setattr(twilio_dial, "TWILIO_DEFAULT_RING_S", 0)
    (data, error), counters, _ = run_dial([(0.01, "ringing")], ring=0)
    assert data is None and error.startswith(dial_request.NO_STATUS) and counters["twilio_dial_status_timeout"] == 1


def test_a_twilio_dials_params_wait_in_the_table_for_the_webhook():
    async def go() -> dict[str, str]:
        counters: dict[str, int] = {}
        server = ws_server(lambda r: httpx.Response(201, json={"sid": SID, "status": "queued"}), counters)
        tasks: list[asyncio.Task[Any]] = []
        host = SimpleNamespace(refusal=lambda: "", spawn=lambda c: tasks.append(asyncio.ensure_future(c)))
        dial_twilio(server, host, "+4930123456", "", 20, lambda d, e: None, {"first_name": "Ada"})
        await asyncio.gather(*tasks)
        return server.webhook.statuses.params(SID)

    assert asyncio.run(go()) == {"first_name": "Ada"}


def test_a_campaigns_via_is_stored_with_it_and_defaults_to_sip(tmp_path):
    from brisvox.outbound.campaign.store import CampaignStore

    s = Settings(via="twilio")
    assert Settings.from_json(s.to_json()).via == "twilio"
    old = s.to_json()
    del old["via"]  # a campaign stored before via existed
    assert Settings.from_json(old).via == "sip"
    with pytest.raises(ValueError, match="via"):
        Settings(via="carrier-pigeon")
    store = CampaignStore(tmp_path / "c.sqlite3")
    store.create("tw", "agent", "x.csv", s, [], 0.0)
    store.close()
    assert CampaignStore(tmp_path / "c.sqlite3").campaign("tw").settings.via == "twilio"  # type: ignore[union-attr]


def test_a_second_store_in_one_process_never_costs_the_first_its_commits(tmp_path):
    """The runner and its meter thread both open the store; a reader in another process closing
    its connection must not checkpoint and delete the WAL under them (CampaignStore's open_private)."""
    import subprocess
    import sys

    from brisvox.outbound.campaign.store import CampaignStore

    db = tmp_path / "c.sqlite3"
    first = CampaignStore(db)
    first.create("a", "agent", "x.csv", Settings(), [], 0.0)
    second = CampaignStore(db)  # the meter's
    second.campaigns()
    reader = f"import sqlite3; c = sqlite3.connect({str(db)!r}); c.execute('SELECT 1 FROM campaigns').fetchall(); c.close()"
    subprocess.run([sys.executable, "-c", reader], check=True, timeout=30)
    first.create("b", "agent", "x.csv", Settings(), [], 1.0)  # committed after the other process's close
    assert (db.parent / "c.sqlite3-wal").exists()
    names = [r[0] for r in sqlite3.connect(db).execute("SELECT name FROM campaigns ORDER BY id")]
    assert names == ["a", "b"]
    first.close()
    second.close()


def test_the_status_path_may_not_be_a_routes():
    from brisvox.config.errors import ConfigError

    with pytest.raises(ConfigError, match="twiml_path"):
        WebSocketConfig.from_section({"twiml_path": "/twiml", "routes": [
            {"path": "/twiml/status", "protocol": "twilio", "agent": "default"}]})
    assert WebSocketConfig.from_section({"twiml_path": "/twiml", "routes": TWIML_ROUTES}).twiml_path == "/twiml"
