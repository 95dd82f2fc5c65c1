"""A flow through the whole daemon, driven by the caller's keypad: native WebSocket, Twilio Media Streams, SIP (RFC 4733).

brisvoxd serves an agent file with a ``[flow]`` (menu -> book -> bye) made of scripted
stand-ins (no model, no key): the agent greets, the menu node's pre-action says the
options, the caller presses 1 and #, the keypad entry moves the flow to the booking node
before the model answers, the scripted model books (the example's SideEffect
``book_table``), its success moves the flow to the goodbye node, whose answer is followed
by its post-action ``end_call``: the daemon hangs the call up itself. Judged from the call
record written at the hang-up: the turns, the booking run once, the nodes' prompts in
order, the end reason.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from bench.harness.daemon import Daemon, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.client.native import NativeTransport
from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
AGENT = f"""name = "flowdemo"
system_prompt = "The bistro's line."
greeting = "Hello."
tool_modules = ["{ROOT / 'examples' / 'booking_tools.py'}:tools"]
tools = ["book_table", "end_call"]

[flow]
start = "menu"
role = "You are the line of Brisvox Bistro."

[flow.nodes.menu]
task = "Offer the menu."
pre_actions = [{{ say = "Press 1 to book a table." }}]
on_keypad = {{ "1" = "book" }}

[flow.nodes.book]
task = "Book the table."
tools = ["book_table"]
next_on = {{ book_table = "bye" }}

[flow.nodes.bye]
task = "Say goodbye."
post_actions = [{{ end_call = true }}]

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
  {{ reply = "Booking a table for two.", tools = [{{ name = "book_table", arguments = {{ name = "{{digits}}", date = "2026-12-24", time = "19:00", people = 2 }} }}] }},
  {{ reply = "You are booked: {{r[0][booking]}}. Goodbye." }},
]

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 400

[dtmf]
text = "[keypad] {{digits}}"
"""


@pytest.fixture(scope="module")
def daemon():
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bvf", dir="/tmp"))
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "flowdemo.toml").write_text(AGENT.replace('name = "{digits}"', 'name = "Ada"'))
    extra = f"""
[gateway]
echo_use_workers = false

[sip]
port = 0
rtp_port_min = 47400
rtp_port_max = 47500

[websocket]
port = 0

[smart_turn]
enabled = false

[agents]
providers = "definitions"
default_agent = "flowdemo"
agents_dir = "{agents}"
smart_turn = false

[calls]
path = "{tmp / 'records'}"
"""
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(90)
        eps = d.child(snap, "gateway-0")["endpoints"]
        yield d, tmp, int(eps["websocket"].rsplit(":", 1)[1]), int(eps["sip"].rsplit(":", 1)[1])
    finally:
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def flow_call(t) -> dict:  # noqa: ANN001
    """Silence, 1 and # after the greeting, silence until the daemon hangs up (at most 12 s)."""
    ended = asyncio.Event()
    await t.open(BotEvents(on_end=lambda reason, now: ended.set()))
    frame = np.zeros(t.rate // 50, np.int16)
    t0 = time.monotonic()
    n = 0
    try:
        while n * 0.02 < 12.0 and not ended.is_set():
            if n == 150:  # 3 s in: the greeting and the menu line played
                await t.send_dtmf("1#")
            try:
                await t.send_audio(frame)
            except Exception:  # noqa: BLE001 - the daemon hung up: the call is over
                break
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
    finally:
        await t.close()
    return {"seconds": time.monotonic() - t0, "hung_up": ended.is_set()}


@pytest.mark.parametrize("kind", ["native", "twilio", "sip"])
def test_a_keypad_driven_flow_books_once_and_ends_the_call_itself(daemon, kind):
    d, tmp, ws, sip = daemon
    t = {"native": lambda: NativeTransport(f"ws://127.0.0.1:{ws}/ws", rate=8000),
         "twilio": lambda: TwilioTransport(f"ws://127.0.0.1:{ws}/twilio"),
         "sip": lambda: SipTransport(f"sip:flowdemo@127.0.0.1:{sip}")}[kind]()
    before = {r["call_id"] for r in read_records(tmp / "records")}
    res = asyncio.run(flow_call(t))

    def mine() -> list[dict]:
        return [r for r in read_records(tmp / "records") if r["call_id"] not in before]

    d.wait_for(lambda s: bool(mine()), 20, f"the call record of the {kind} call")
    rec = mine()[0]
    users = [m["content"] for m in rec["conversation"] if m["role"] == "user"]
    said = [m["text"] for m in rec["conversation"] if m["role"] == "assistant" and m.get("text")]
    assert users == ["[keypad] 1"]
    assert said[:2] == ["Hello.", "Press 1 to book a table."]
    assert said[-1].startswith("You are booked: BK-") and said[-1].endswith("Goodbye.")
    booked = [x for x in rec["tools"] if x["name"] == "book_table"]
    assert len(booked) == 1 and booked[0]["outcome"] == "ok"
    ended = [x for x in rec["tools"] if x["name"] == "end_call"]
    assert not ended  # the flow's post-action ran the built-in itself, not the model
    assert rec["conversation"][0]["content"].endswith("Say goodbye.")  # the goodbye node's prompt is message 0
    assert res["hung_up"] and res["seconds"] < 11.5, "the daemon did not hang the call up after the goodbye"
