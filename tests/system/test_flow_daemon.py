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

from bench.harness.daemon import Daemon, agents_config, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.client.native import NativeTransport
from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
AGENT = """name = "flowdemo"
system_prompt = "The bistro's line."
greeting = "Hello."
tool_modules = ["slow_booking.py:tools"]
tools = ["book_table", "end_call"]

[flow]
start = "menu"
role = "You are the line of Brisvox Bistro."

[flow.nodes.menu]
task = "Offer the menu."
pre_actions = [{ say = "Press 1 to book a table." }]
on_keypad = { "1" = "book" }

[flow.nodes.book]
task = "Book the table."
tools = ["book_table"]
next_on = { book_table = "bye" }

[flow.nodes.bye]
task = "Say goodbye."
post_actions = [{ end_call = true }]

[stt]
provider = "scripted_stt"
[stt.options]
text = "are you still there"

[llm]
provider = "scripted"
[llm.options]
fallback = "Please use the keypad."
first_token_ms = 100
[[llm.options.rules]]
match = "^\\\\[keypad\\\\] 1$"
steps = [
  { reply = "Booking a table for two.", tools = [{ name = "book_table", arguments = { name = "{digits}", date = "2026-12-24", time = "19:00", people = 2 } }] },
  { reply = "You are booked: {r[0][booking]}. Goodbye." },
]

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 400

[dtmf]
text = "[keypad] {digits}"
"""


SLOW_BOOKING = '''"""book_table for the flow e2e: 4 s (a caller's whole sentence fits in it), every body run counted in
bodies.txt (next to this file)."""
import asyncio
from pathlib import Path

from brisvox.agent.tool_engine.registry import ToolKind, ToolSpec

BODIES = Path(__file__).with_name("bodies.txt")
SCHEMA = {"type": "object", "required": ["name", "people"],
          "properties": {"name": {"type": "string"}, "date": {"type": "string"}, "time": {"type": "string"},
                         "people": {"type": "integer"}}}


async def book_table(args, ctx):
    with BODIES.open("a") as f:
        f.write(ctx.session + " " + ctx.call + "\\n")
    await asyncio.sleep(4.0)
    return {"booking": "BK-7", "name": args["name"]}


def tools():
    return [(ToolSpec("book_table", "Book a table.", SCHEMA, ToolKind.SIDE_EFFECT, timeout=8.0), book_table)]
'''


@pytest.fixture(scope="module")
def daemon():
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bvf", dir="/tmp"))
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "flowdemo.toml").write_text(AGENT.replace('name = "{digits}"', 'name = "Ada"'))
    (agents / "slow_booking.py").write_text(SLOW_BOOKING)
    extra = agents_config(agents, tmp / "records", default_agent="flowdemo",
                          sip="port = 0\nrtp_port_min = 47400\nrtp_port_max = 47500")
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(90)
        eps = d.child(snap, "gateway-0")["endpoints"]
        yield d, tmp, int(eps["websocket"].rsplit(":", 1)[1]), int(eps["sip"].rsplit(":", 1)[1])
    finally:
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def flow_call(t, speech: np.ndarray | None = None) -> dict:  # noqa: ANN001
    """Silence, 1 and # after the greeting, silence until the daemon hangs up (at most 12 s);
    with ``speech``: the caller talks (a recorded question) while the booking runs."""
    ended = asyncio.Event()
    await t.open(BotEvents(on_end=lambda reason, now: ended.set()))
    frame = np.zeros(t.rate // 50, np.int16)
    t0 = time.monotonic()
    n = 0
    try:
        while n * 0.02 < 12.0 and not ended.is_set():
            if n == 150:  # 3 s in: the greeting and the menu line played
                await t.send_dtmf("1#")
            out = frame
            if speech is not None and 190 <= n < 190 + len(speech) // len(frame):  # from 3.8 s: the booking runs
                i = (n - 190) * len(frame)
                out = speech[i:i + len(frame)]
            try:
                await t.send_audio(out)
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
    assert bodies(tmp, rec["call_id"]) == 1
    ended = [x for x in rec["tools"] if x["name"] == "end_call"]
    assert not ended  # the flow's post-action ran the built-in itself, not the model
    assert rec["conversation"][0]["content"].endswith("Say goodbye.")  # the goodbye node's prompt is message 0
    assert res["hung_up"] and res["seconds"] < 11.5, "the daemon did not hang the call up after the goodbye"


def bodies(tmp: Path, call_id: str) -> int:
    f = tmp / "agents" / "bodies.txt"
    return sum(1 for line in f.read_text().splitlines() if line.split()[0] == call_id) if f.exists() else 0


@pytest.mark.parametrize("kind", ["twilio", "sip"])
def test_the_caller_talking_during_the_booking_runs_it_once_and_its_result_reaches_the_model(daemon, kind):
    import soundfile as sf

    d, tmp, ws, sip = daemon
    speech, rate = sf.read(ROOT / "tests" / "fixtures" / "generated" / "turn_complete.8k.wav", dtype="int16")
    assert rate == 8000
    t = TwilioTransport(f"ws://127.0.0.1:{ws}/twilio") if kind == "twilio" else \
        SipTransport(f"sip:flowdemo@127.0.0.1:{sip}")
    before = {r["call_id"] for r in read_records(tmp / "records")}
    asyncio.run(flow_call(t, speech))

    def mine() -> list[dict]:
        return [r for r in read_records(tmp / "records") if r["call_id"] not in before]

    d.wait_for(lambda s: bool(mine()), 20, f"the call record of the {kind} call")
    rec = mine()[0]
    users = [m["content"] for m in rec["conversation"] if m["role"] == "user"]
    assert users[0] == "[keypad] 1" and "are you still there" in users[1:]
    assert bodies(tmp, rec["call_id"]) == 1  # the booking ran once although its turn was cut
    notes = [m["content"] for m in rec["conversation"] if m["role"] == "system" and "BK-7" in m.get("content", "")]
    assert len(notes) == 1, (rec["conversation"], rec["tools"])  # its outcome reached the model once, as a late note
    assert [x["outcome"] for x in rec["tools"] if x["name"] == "book_table"] == ["interrupted"]
