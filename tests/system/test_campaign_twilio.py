"""A campaign dialled through Twilio (``campaign start --via twilio``) by a real daemon, each row's real outcome.

The loopback stand-in for Twilio's REST API (:mod:`tests.system.twilio_api_fake`, its
``status_callbacks`` on) takes each calls create and POSTs the call's progress, signed as
Twilio signs it, to the ``StatusCallback`` the gateway named: two callees answer (ringing,
in-progress, then the call placed as Twilio does: the webhook's TwiML, the Media Stream, the
agent; then completed), two are busy, two never pick up (ringing, then no-answer). The runner
(``python -m brisvox.outbound.campaign run``) dials the six rows once each through the daemon's
gateway (``dial`` with ``via = "twilio"`` and ``await_answer``). Checked: every row ends with
its callee's outcome (answered, busy, no_answer), an answered attempt names its call
``twilio:<CallSid>``, the row's variable reached the answered call's stream, every callback was
accepted, and a callback without a valid signature is refused 403 and counted.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import httpx
import pytest

from bench.harness.daemon import Daemon, agents_config, cli, write_config
from ipc.bus import endpoint, request_sync
from ipc.frames import Command
from tests.system.gateway_harness import free_port
from tests.system.test_campaign_kill import AGENT, q, runner
from tests.system.test_webhooks_daemon import wait
from tests.system.twilio_api_fake import FakeTwilioApi

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]  # outcomes only, no wall-clock judgment: parallel pass

FROM = "+4930999000"
CALLEES = {"+4930100001": "answered", "+4930100002": "busy", "+4930100003": "no-answer",
           "+4930100004": "answered", "+4930100005": "busy", "+4930100006": "no-answer"}
OUTCOME = {"answered": "answered", "busy": "busy", "no-answer": "no_answer"}


def test_a_campaign_via_twilio_records_each_callees_real_outcome():
    tmp = Path(tempfile.mkdtemp(prefix="bvt", dir="/tmp"))
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "reminder.toml").write_text(AGENT)
    port = free_port(socket.SOCK_STREAM)
    public = f"ws://127.0.0.1:{port}"  # the stream's (Twilio signs the wss/ws URL); the webhooks' is http
    hooks = f"http://127.0.0.1:{port}"
    procs = []
    with FakeTwilioApi() as api:
        api.status_callbacks, api.place_calls, api.place_seconds, api.ring_s = True, True, 2.0, 0.3
        api.callee.update(CALLEES)
        tw = api.config()
        ws = (f'public_url = "{public}"\ntwiml_path = "/twiml"\ntwilio_from = "{FROM}"\ntwiml_requests_per_s = 0\n'
              f'twilio_account_sid = "{tw["twilio_account_sid"]}"\ntwilio_auth_token = "{tw["twilio_auth_token"]}"\n'
              f'twilio_api_base = "{tw["twilio_api_base"]}"\ntwilio_api_timeout_s = 2.0\n'
              'routes = [{ path = "/twilio", protocol = "twilio", agent = "reminder" }]\n')
        extra = agents_config(agents, tmp / "records", default_agent="reminder", websocket=ws)
        extra = extra.replace("[websocket]\nport = 0\n", f"[websocket]\nport = {port}\n", 1)
        cfg = write_config(tmp, workers=1, agents=1, extra=extra)
        d = Daemon(tmp, config=cfg, real_roles=True)
        db = tmp / "campaigns.sqlite3"
        rlog = tmp / "runner.log"
        try:
            d.start()
            d.wait_ready(60)
            src = tmp / "leads.csv"
            src.write_text("number,first_name\n" + "".join(f"{n},Name{i}\n" for i, n in enumerate(CALLEES)))
            r = cli("campaign", "start", str(src), "--agent", "reminder", "--config", str(cfg), "--db", str(db),
                    "--var", "first_name", "--via", "twilio", "--timezone", "UTC", "--hours", "00:00-24:00",
                    "--days", "all", "--rate", "5", "--max-concurrent", "6", "--max-attempts", "1",
                    "--ring-timeout", "10", env=d.env)
            assert r.returncode == 0, r.stderr
            procs.append(runner(db, d.run_dir, d.env, rlog, cfg))
            wait(lambda: q(db, "SELECT count(*) FROM rows WHERE state = 'done'")[0][0] == len(CALLEES), 60,
                 "every row done", lambda: (q(db, "SELECT number, state, outcome FROM rows"),
                                            rlog.read_text()[-2000:], api.callbacks))
            rows = dict(q(db, "SELECT number, outcome FROM rows"))
            assert rows == {n: OUTCOME[k] for n, k in CALLEES.items()}, (rows, q(db, "SELECT * FROM attempts"))
            attempts = q(db, "SELECT r.number, a.n, a.outcome, a.detail, a.call_id FROM attempts a "
                             "JOIN rows r ON r.id = a.row_id")
            assert len(attempts) == len(CALLEES) and all(a[1] == 1 for a in attempts), attempts
            details = {a[0]: a[3] for a in attempts}
            assert {details[n] for n, k in CALLEES.items() if k == "busy"} == {"busy"}
            assert {details[n] for n, k in CALLEES.items() if k == "no-answer"} == {"no answer"}
            answered = {a[0]: a[4] for a in attempts if a[2] == "answered"}
            assert all(c.startswith("twilio:CA") for c in answered.values()), answered
            # every create asked for the callbacks; Twilio's every callback was taken (200)
            creates = api.creates()
            assert len(creates) == len(CALLEES)
            for c in creates:
                assert c.fields["StatusCallback"] == [f"{hooks}/twiml/status"], c.fields
                assert c.fields["StatusCallbackEvent"] == ["initiated", "ringing", "answered", "completed"]
                assert c.fields["Timeout"] == ["10"]
            assert api.callbacks and all(code == 200 for _, _, code in api.callbacks), api.callbacks
            # the answered calls ran through the webhook and the stream, the row's variable with them
            wait(lambda: all(api.placed[c.removeprefix("twilio:")].done for c in answered.values()), 30,
                 "the answered calls to end", lambda: api.placed)
            names = {f"Name{i}" for i, (n, k) in enumerate(CALLEES.items()) if k == "answered"}
            got = set()
            for number, call in answered.items():
                placed = api.placed[call.removeprefix("twilio:")]
                assert placed.webhook_status == 200 and not placed.error, placed
                assert placed.params.get("direction") == "outbound" and placed.params.get("To") == number
                got.add(placed.params.get("first_name"))
            assert got == names, [api.placed[c.removeprefix("twilio:")].params for c in answered.values()]
            # a status callback that is not Twilio's (unsigned, or signed with another token) is refused
            sid = next(iter(answered.values())).removeprefix("twilio:")
            form = {"AccountSid": tw["twilio_account_sid"], "CallSid": sid, "CallStatus": "busy"}
            for sig in (None, "bm90IHR3aWxpbydz"):
                headers = {"Content-Type": "application/x-www-form-urlencoded",
                           **({"X-Twilio-Signature": sig} if sig else {})}
                resp = httpx.post(f"{hooks}/twiml/status", data=form, headers=headers, timeout=5.0)
                assert resp.status_code == 403, resp.text
            stats = request_sync(endpoint(d.run_dir, "gateway-0"), Command(name="stats"), 5.0).data or {}
            assert stats["ws_refused_twilio_status_signature"] == 2, stats
            assert stats["twilio_dial_answered"] == 2 and stats["twilio_dial_busy"] == 2
            assert stats["twilio_dial_no_answer"] == 2
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            d.close()
    shutil.rmtree(tmp, ignore_errors=True)
