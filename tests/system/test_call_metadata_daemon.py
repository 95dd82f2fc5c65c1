"""Call metadata through the whole daemon: the caller's number and the call's parameters, given
by each transport, reach a local tool's ``ctx.call_info`` and the call record.

brisvoxd runs one gateway, one inference worker and one agent process serving an agent file
of scripted stand-ins (no model, no key) with one local tool, ``whoami`` (a tool module next
to the agent file), that answers what its context says of the call. Each call, from the
client transports of ``brisvox.client``, presses 1 and #; the scripted model calls
``whoami`` and speaks its answer. Over native WebSocket (``start.params``), Twilio Media
Streams (``customParameters`` with TwiML's From/To) and SIP (the From user). Checks, from the
record written at hang-up: its ``call`` section (numbers, parameters, never the secret one),
the tool's result (what the tool saw) and the answer built from it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

from bench.harness.daemon import Daemon, agents_config, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.client.native import NativeTransport
from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport

pytestmark = pytest.mark.system

AGENT = """name = "whoami"
system_prompt = "Scripted agent that says who calls (no language model)."
tool_modules = ["whoami_tool.py:tools"]
tools = ["whoami"]

[stt]
provider = "scripted_stt"

[llm]
provider = "scripted"
[llm.options]
fallback = "Please use the keypad."
first_token_ms = 100
[[llm.options.rules]]
match = "^\\\\[keypad\\\\] 1$"
steps = [
  { reply = "Let me see.", tools = [{ name = "whoami", arguments = {} }] },
  { reply = "You are {r[0][caller]} calling {r[0][called]}." },
]

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 300

[dtmf]
terminator = "#"
text = "[keypad] {digits}"
"""

TOOL = '''"""whoami: what the tool context says of the call (never a secret's value)."""
from brisvox.agent.tool_engine.registry import ToolKind, ToolSpec


async def whoami(args, ctx):
    info = ctx.call_info
    return {"caller": info.caller, "called": info.called, "transport": info.transport,
            "params": sorted(info.params), "ids": sorted(info.transport_ids)}


def tools():
    return [(ToolSpec("whoami", "Who is calling.", {"type": "object"}, ToolKind.READ_ONLY), whoami)]
'''

SECRET_VALUE = "hunter2-never-recorded"
# (transport, caller, called, the parameters the record keeps, the tool's view of the ids)
CALLS = [
    ("native", "+15550101", "sales", {"caller": "+15550101", "called": "sales", "tier": "gold"}, []),
    ("twilio", "+15550102", "+15550199", {"From": "+15550102", "To": "+15550199", "customer": "42"},
     ["accountSid", "callSid", "streamSid"]),
    ("sip", "+15550103", "whoami", None, ["sip_call_id"]),
]


@pytest.fixture(scope="module")
def daemon():
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bvm", dir="/tmp"))  # short: the daemon's socket paths
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "whoami.toml").write_text(AGENT)
    (agents / "whoami_tool.py").write_text(TOOL)
    extra = agents_config(agents, tmp / "records", default_agent="whoami",
                          sip="port = 0\nrtp_port_min = 47600\nrtp_port_max = 47700")
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(90)
        eps = d.child(snap, "gateway-0")["endpoints"]
        yield d, tmp, int(eps["websocket"].rsplit(":", 1)[1]), int(eps["sip"].rsplit(":", 1)[1])
    finally:
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)


def transport(kind: str, ws: int, sip: int, caller: str, called: str):  # noqa: ANN201
    if kind == "native":
        return NativeTransport(f"ws://127.0.0.1:{ws}/ws", rate=8000, params={
            "caller": caller, "called": called, "tier": "gold", "auth_token": SECRET_VALUE})
    if kind == "twilio":
        return TwilioTransport(f"ws://127.0.0.1:{ws}/twilio", {
            "From": caller, "To": called, "customer": "42", "api_key": SECRET_VALUE})
    return SipTransport(f"sip:{called}@127.0.0.1:{sip}", from_user=caller)


async def press_one(t) -> None:  # noqa: ANN001
    await t.open(BotEvents())
    frame = np.zeros(t.rate // 50, np.int16)
    t0 = time.monotonic()
    n = 0
    try:
        while n * 0.02 < 4.0:
            if n == 25:
                await t.send_dtmf("1#")
            await t.send_audio(frame)
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
    finally:
        await t.close()


@pytest.mark.parametrize(("kind", "caller", "called", "kept", "ids"), CALLS, ids=[c[0] for c in CALLS])
def test_the_caller_and_the_parameters_reach_the_tool_and_the_record(daemon, kind, caller, called, kept, ids):
    d, tmp, ws, sip = daemon
    t = transport(kind, ws, sip, caller, called)
    asyncio.run(press_one(t))

    def mine() -> list[dict]:
        return [r for r in read_records(tmp / "records") if r.get("call", {}).get("caller") == caller]

    d.wait_for(lambda s: bool(mine()), 20, f"the call record of the {kind} call")
    rec = mine()[0]
    if kind == "sip":
        kept = {"from": f"sip:{caller}@127.0.0.1", "to": t.request_uri}
    assert rec["transport"] == kind
    assert rec["call"] == {"caller": caller, "called": called, "params": kept}
    assert SECRET_VALUE not in str(rec)
    tool = [m for m in rec["conversation"] if m["role"] == "tool"]
    assert len(tool) == 1, rec["conversation"]
    saw = json.loads(tool[0]["content"])
    secret = {"native": ["auth_token"], "twilio": ["api_key"], "sip": []}[kind]
    assert saw == {"caller": caller, "called": called, "transport": kind,
                   "params": sorted([*kept, *secret]), "ids": ids}
    answers = [m["text"] for m in rec["conversation"] if m["role"] == "assistant" and m.get("text")]
    assert answers[-1] == f"You are {caller} calling {called}."
