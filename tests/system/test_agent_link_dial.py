"""The agent service's ``dial`` command through the whole daemon, on loopback.

A caller talks to the ``dialer`` agent (native WebSocket); its agent service
(``tests/system/agent_service.py``, path ``/dial``) sends ``dial`` commands into the call:

* to SIPp as the callee (``sip:callee@127.0.0.1:<port>``, in ``dial_targets``): the gateway
  places the INVITE, SIPp answers, the ``callee`` agent runs the new call, and the ack
  carries its call id (SIPp hangs up later; the call leaves a record of its own);
* to a number outside ``dial_targets``: refused, nothing dialled;
* through Twilio (``via = "twilio"``) to ``+4930123456``: the ack carries the CallSid Twilio's
  loopback stand-in made; the stand-in then places the call (webhook, Media Stream), the
  callee hears the ``callee`` agent's greeting, and that call's record carries the CallSid.

The ``nodial`` agent (``allow_dial`` false, the default) gets every dial refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from bench.harness.daemon import Daemon, write_config
from brisvox.agent.host.call_record import read_records
from tests.system import gateway_harness
from tests.system.gateway_harness import have, rtp_range
from tests.system.test_agent_link_daemon import SECRET, call, frames, free_port, start_service
from tests.system.test_sip_outbound import Media, answered_then_bye, run_callee
from tests.system.twilio_api_fake import FakeTwilioApi

pytestmark = [pytest.mark.system, pytest.mark.timeout(180),
              pytest.mark.skipif(not have("sipp"), reason="needs sipp (sip-tester)")]

FROM = "+4930999000"


def agent_file(name: str, link: str = "") -> str:
    return f"""name = "{name}"
system_prompt = "Scripted agent."
greeting = "Hello, this is brisvox calling."
{link}
[stt]
provider = "scripted_stt"
[stt.options]
text = "hello"

[llm]
provider = "scripted"
[llm.options]
fallback = "I see."

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 600
"""


def link_table(port: int, allow: bool, targets: list[str]) -> str:
    return f"""
[agent_link]
url = "ws://127.0.0.1:{port}/dial"
secret_env = "AGENT_SECRET"
required = true
allow_dial = {str(allow).lower()}
dial_targets = {json.dumps(targets)}
"""


def test_a_service_dials_sip_and_twilio_and_is_refused_outside_its_targets():
    tmp = Path(tempfile.mkdtemp(prefix="bvd", dir="/tmp"))
    svc_port, ws_port, callee_port = free_port(), free_port(), gateway_harness.free_port()
    sip_target = f"sip:callee@127.0.0.1:{callee_port}"
    log = tmp / "service.jsonl"
    dials = [{"id": "k5", "target": sip_target, "agent": "callee", "via": "sip"},
             {"id": "k6", "target": "+49900123456", "agent": "callee"},
             {"id": "k7", "target": "+4930123456", "agent": "callee", "via": "twilio"}]
    os.environ["AGENT_SERVICE_DIAL"] = json.dumps(dials)  # the service process inherits it
    svc = start_service(svc_port, log)
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "dialer.toml").write_text(agent_file("dialer", link_table(svc_port, True, [sip_target, "+4930*"])))
    (agents / "nodial.toml").write_text(agent_file("nodial", link_table(svc_port, False, [sip_target])))
    (agents / "callee.toml").write_text(agent_file("callee"))
    lo, hi = rtp_range(200)
    media = Media()
    callee = run_callee(tmp, answered_then_bye(media.port, 4000), callee_port, timeout=60)
    with FakeTwilioApi() as api:
        api.place_calls, api.place_seconds, api.place_tone = True, 5.0, False
        tw = api.config()
        extra = f"""
[gateway]
echo_use_workers = false

[websocket]
port = {ws_port}
trust_loopback = true
public_url = "ws://127.0.0.1:{ws_port}"
twiml_path = "/twiml"
twilio_from = "{FROM}"
twilio_account_sid = "{tw['twilio_account_sid']}"
twilio_auth_token = "{tw['twilio_auth_token']}"
twilio_api_base = "{tw['twilio_api_base']}"
[[websocket.routes]]
path = "/ws"
protocol = "native"
agent = "dialer"
agents = ["dialer", "nodial"]
[[websocket.routes]]
path = "/twilio"
protocol = "twilio"
agent = "callee"

[sip]
port = 0
rtp_port_min = {lo}
rtp_port_max = {hi}

[smart_turn]
enabled = false

[agents]
providers = "definitions"
default_agent = "dialer"
agents_dir = "{agents}"
smart_turn = false

[calls]
path = "{tmp / 'records'}"
"""
        d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True,
                   env={"AGENT_SECRET": SECRET})
        try:
            d.start()
            d.wait_ready(90)
            res = asyncio.run(call(f"ws://127.0.0.1:{ws_port}/ws/dialer", seconds=6.0))
            got = frames(log, res["call_id"])
            deadline = time.monotonic() + 20
            acks: dict[str, dict] = {}
            while time.monotonic() < deadline and len(acks) < 3:
                acks = {f["id"]: f for f in frames(log) if f["type"] == "command.ack"
                        and f["id"] in ("k5", "k6", "k7") and f["_path"] == "/dial"}
                time.sleep(0.2)
            got = frames(log, res["call_id"])
            acks = {f["id"]: f for f in got if f["type"] == "command.ack"}
            assert acks["k5"]["ok"] and acks["k5"]["via"] == "sip" and acks["k5"]["call_id"], acks
            assert acks["k6"] == {"type": "command.ack", "id": "k6", "ok": False, "_path": "/dial",
                                  "error": "not a dial target ([agent_link] dial_targets)"}
            assert acks["k7"]["ok"] and acks["k7"]["call_sid"].startswith("CA") and acks["k7"]["status"] == "queued"
            sid = acks["k7"]["call_sid"]
            (create,) = api.creates()
            assert create.fields["To"] == ["+4930123456"] and create.fields["From"] == [FROM]
            out, err = callee.communicate(timeout=40)
            assert callee.returncode == 0, (out[-2000:], err[-2000:])
            assert media.received > 20, "SIPp's side got no RTP from the dialled call"

            # the dialled calls ran the callee agent and left their records
            def rec_of(pred):  # noqa: ANN001, ANN202
                d.wait_for(lambda s: any(pred(r) for r in read_records(tmp / "records")), 30, "a record")
                return next(r for r in read_records(tmp / "records") if pred(r))

            sip_rec = rec_of(lambda r: r["call_id"] == acks["k5"]["call_id"])
            assert sip_rec["agent"] == "callee" and sip_rec["transport"] == "sip"
            assert sip_rec["call"]["params"].get("direction") == "outbound"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (sid in api.placed and api.placed[sid].done):
                time.sleep(0.1)
            placed = api.placed[sid]
            assert placed.done and not placed.error and placed.webhook_status == 200, placed
            assert placed.loud_samples > 1000 and placed.first_loud_s is not None, placed  # the greeting
            tw_rec = rec_of(lambda r: r["transport_ids"].get("callSid") == sid)
            assert tw_rec["agent"] == "callee" and tw_rec["transport"] == "twilio"
            assert tw_rec["call"]["params"].get("direction") == "outbound"
            assert [m["text"] for m in tw_rec["conversation"] if m["role"] == "assistant"][:1] == [
                "Hello, this is brisvox calling."]

            # allow_dial = false (the default): refused, nothing dialled
            res2 = asyncio.run(call(f"ws://127.0.0.1:{ws_port}/ws/nodial", seconds=4.0))
            acks2 = {f["id"]: f for f in frames(log, res2["call_id"]) if f["type"] == "command.ack"}
            assert {k: (a["ok"], a.get("error")) for k, a in acks2.items()} == {
                k: (False, "not allowed: [agent_link] allow_dial and dial_targets") for k in ("k5", "k6", "k7")}
            assert len(api.creates()) == 1
        finally:
            d.close()
            svc.kill()
            if callee.poll() is None:
                callee.kill()
            media.close()
            os.environ.pop("AGENT_SERVICE_DIAL", None)
            shutil.rmtree(tmp, ignore_errors=True)
