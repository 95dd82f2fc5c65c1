"""Outbound calls through Twilio (``dial`` with ``via = "twilio"``) against the real gateway process.

The loopback stand-in for Twilio's REST API (:mod:`tests.system.twilio_api_fake`) checks the
calls create as Twilio would (Basic auth, the account path, ``To``/``From``/``Url``) and then
places the call as Twilio does once the callee answers: the signed webhook POST to the
``Url`` the gateway gave it, then the ``<Connect><Stream>`` of the TwiML as a Media Stream
carrying the new CallSid. The gateway runs it like any inbound Twilio call (the echo agent
here: the callee hears its own tone back); the dial itself answers at Twilio's 201 with the
CallSid. A bad target, an agent no route admits and Twilio's 400 are refused with the reason.
"""

from __future__ import annotations

import socket
import time

import pytest

from ipc import frames as F
from ipc.bus import request_sync
from tests.system.gateway_harness import GatewayProc, free_port
from tests.system.twilio_api_fake import ACCOUNT, FakeTwilioApi

pytestmark = [pytest.mark.system, pytest.mark.timeout(90)]

ROUTES = [{"path": "/twilio", "protocol": "twilio", "agent": "echo", "agents": ["sales"]}]
FROM = "+4930999000"


def dial(gw: GatewayProc, target: str, agent: str = "", ring: float = 0) -> F.CommandReply:
    reply = request_sync(gw.inbox, F.Command(name="dial", args={"target": target, "agent": agent, "via": "twilio",
                                                                "ring_timeout_s": ring}), 15)
    assert isinstance(reply, F.CommandReply)
    return reply


def test_dial_via_twilio_creates_the_call_and_it_runs_through_the_webhook_and_stream(short_tmp):
    port = free_port(socket.SOCK_STREAM)
    public = f"ws://127.0.0.1:{port}"
    with FakeTwilioApi() as api, GatewayProc(short_tmp, inbox=True, websocket={
            "port": port, "routes": ROUTES, "public_url": public, "twiml_path": "/twiml", "twilio_from": FROM,
            **api.config()}) as gw:
        api.place_calls = True
        api.place_seconds = 4.0
        reply = dial(gw, "+4930123456", ring=25)
        assert reply.ok, (reply.error, gw.stderr())
        data = reply.data or {}
        sid = data["call_sid"]
        assert sid.startswith("CA") and data["status"] == "queued" and data["via"] == "twilio"
        (create,) = api.creates()
        assert create.authorized and create.path == f"/2010-04-01/Accounts/{ACCOUNT}/Calls.json"
        assert create.fields == {"To": ["+4930123456"], "From": [FROM], "Url": [f"http://127.0.0.1:{port}/twiml"],
                                 "Method": ["POST"], "Timeout": ["25"],
                                 # the call's progress, POSTed back signed (twilio_status; the fake sends
                                 # none unless asked: status_callbacks)
                                 "StatusCallback": [f"http://127.0.0.1:{port}/twiml/status"],
                                 "StatusCallbackMethod": ["POST"],
                                 "StatusCallbackEvent": ["initiated", "ringing", "answered", "completed"]}
        # Twilio fetches the webhook once answered, then opens the stream: the call runs
        deadline = time.monotonic() + 3
        live: dict = {}
        while time.monotonic() < deadline and not live:
            live = {k: c for k, c in gw.command("calls").items() if c["ids"].get("callSid") == sid}
            time.sleep(0.05)
        assert live, (api.placed.get(sid), gw.stderr())
        (call,) = live.values()
        assert call["transport"] == "twilio" and call["agent"] == "echo"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not api.placed[sid].done:
            time.sleep(0.1)
        placed = api.placed[sid]
        assert placed.done and not placed.error, placed
        assert placed.webhook_status == 200 and placed.stream_url == f"{public}/twilio"
        token = placed.params.pop("brisvox_stream_token", "")  # the stream's one-time token, passed back in start
        assert placed.params == {"From": FROM, "To": "+4930123456", "direction": "outbound"} and len(token) == 43
        assert placed.loud_samples > 2000, placed  # the callee heard the agent (its tone echoed back)
        st = gw.stats()
        assert st["twilio_dial_queued"] == 1 and st["twilio_api_create_ok"] == 1 and st["ws_twiml_ok"] == 1

        # refused before any request: a bad target, an agent no route admits
        assert dial(gw, "0900-premium").error.startswith("invalid target")
        assert dial(gw, "+4930123456", agent="other").error == "no twilio route admits agent 'other'"
        # Twilio's 400: its code and message
        api.create_status["+15005550001"] = 400
        r = dial(gw, "+15005550001", agent="sales")
        assert not r.ok and r.error.startswith("Twilio API 400 (code 21211): Invalid 'To' Phone Number"), r
        (last,) = api.creates()[1:]
        assert last.fields["Url"] == [f"http://127.0.0.1:{port}/twiml?agent=sales"]
        st = gw.stats()
        assert st["twilio_dial_refused_invalid_target"] == 1 and st["twilio_dial_refused_agent"] == 1
        assert st["twilio_dial_failed"] == 1 and len(api.creates()) == 2


def test_dial_via_twilio_without_the_keys_names_the_missing_one(short_tmp):
    with FakeTwilioApi() as api, GatewayProc(short_tmp, inbox=True, websocket={"routes": ROUTES}) as gw:
        assert dial(gw, "+4930123456").error.endswith("set [websocket] twilio_account_sid")
    with FakeTwilioApi() as api, GatewayProc(short_tmp, inbox=True, websocket={"routes": ROUTES,
                                                                               **api.config()}) as gw:
        assert dial(gw, "+4930123456").error.endswith("set [websocket] twilio_from")
        assert not api.requests
        r = request_sync(gw.inbox, F.Command(name="dial", args={"target": "+49301", "via": "carrier-pigeon"}), 5)
        assert isinstance(r, F.CommandReply) and r.error == "via must be sip or twilio"
