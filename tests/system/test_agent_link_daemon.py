"""The agent link through the whole daemon: a REAL agent service process over loopback.

brisvoxd serves agent files with ``[agent_link]`` (scripted STT/LLM/TTS, no key); the agent
service is ``tests/system/agent_service.py``, a small websockets server speaking
docs/AGENT_PROTOCOL.md directly (no SDK), one behaviour per URL path, logging every frame
it receives. The caller is the native WebSocket client; the keypad drives the scripted
model (``[keypad] N`` turns), a recorded question is the caller talking over a booking.
Judged from the call record and the service's log.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.harness.daemon import Daemon, agents_config, write_config, ws_port
from brisvox.agent.host.call_record import read_records
from brisvox.client.native import NativeTransport
from brisvox.client.transport import BotEvents
from tests.system import gateway_harness

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).with_name("agent_service.py")
SECRET = "s3cret-for-tests"
RULES = r"""
[[llm.options.rules]]
match = "^\\[keypad\\] 1$"
steps = [
  { reply = "Checking.", tools = [{ name = "lookup", arguments = {} }] },
  { reply = "Booking.", tools = [{ name = "book_table", arguments = { name = "Ada" } }] },
  { reply = "Done." },
]
[[llm.options.rules]]
match = "^\\[keypad\\] 2$"
steps = [{ reply = "Looking.", tools = [{ name = "slow_lookup", arguments = {} }] }, { reply = "Sorry." }]
[[llm.options.rules]]
match = "^\\[keypad\\] 3$"
steps = [{ reply = "Trying.", tools = [{ name = "never", arguments = {} }] }, { reply = "Hm." }]
[[llm.options.rules]]
match = "^\\[keypad\\] 5$"
steps = [{ reply = "Booking.", tools = [{ name = "book_table", arguments = { name = "Ada" } }] }, { reply = "Ok." }]
"""


def agent(name: str, port: int, path: str, secret_env: str = "AGENT_SECRET", tools: str = "[]") -> str:
    return f"""name = "{name}"
system_prompt = "Scripted agent with an agent service."
greeting = "Hello."
tools = {tools}

[agent_link]
url = "ws://127.0.0.1:{port}{path}"
secret_env = "{secret_env}"
required = true
side_effect_wait = 4

[stt]
provider = "scripted_stt"
[stt.options]
text = "are you still there"

[llm]
provider = "scripted"
[llm.options]
fallback = "I see."
first_token_ms = 100
{RULES}
[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 300

[dtmf]
terminator = "#"
text = "[keypad] {{digits}}"
"""


def free_port() -> int:
    """A TCP port for a service to listen on (parallel-safe: :func:`gateway_harness.free_port`)."""
    return gateway_harness.free_port(socket.SOCK_STREAM)


def start_service(port: int, log: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, str(SERVICE), str(port), SECRET, str(log)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def frames(log: Path, session: str | None = None) -> list[dict]:
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return [r["frame"] | {"_path": r["path"]} for r in rows if session is None or r["session"] == session]


@pytest.fixture(scope="module")
def env():
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bvl", dir="/tmp"))
    port, kport = free_port(), free_port()
    log, klog = tmp / "service.jsonl", tmp / "killed.jsonl"
    svc = start_service(port, log)
    agents = tmp / "agents"
    agents.mkdir()
    files = {"main": agent("main", port, "/main"), "narrow": agent("narrow", port, "/narrow"),
             "collide": agent("collide", port, "/collide", tools='["end_call"]'),
             "cmds": agent("cmds", port, "/cmds", tools='["end_call"]'),
             "badsecret": agent("badsecret", port, "/main", secret_env="WRONG_SECRET"),
             "killed": agent("killed", kport, "/main"), "drop": agent("drop", port, "/drop")}
    for n, text in files.items():
        (agents / f"{n}.toml").write_text(text)
    routes = f'routes = [{{ path = "/ws", protocol = "native", agent = "main", agents = {json.dumps(list(files))} }}]'
    extra = agents_config(agents, tmp / "records", default_agent="main", websocket=routes)
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True,
               env={"AGENT_SECRET": SECRET, "WRONG_SECRET": "not-the-secret"})
    try:
        d.start()
        snap = d.wait_ready(90)
        ws = ws_port(d.child(snap, "gateway-0"))
        yield {"d": d, "tmp": tmp, "ws": ws, "log": log, "klog": klog, "kport": kport}
    finally:
        d.close()
        svc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


async def call(url: str, digits: str = "", speech: np.ndarray | None = None, seconds: float = 10.0,
               on_tick=None) -> dict:  # noqa: ANN001
    ended = asyncio.Event()
    t = NativeTransport(url, rate=8000)
    await t.open(BotEvents(on_end=lambda reason, now: ended.set()))
    frame = np.zeros(160, np.int16)
    t0 = time.monotonic()
    n = 0
    try:
        while n * 0.02 < seconds and not ended.is_set():
            if n == 100 and digits:  # 2 s in: the greeting played
                await t.send_dtmf(digits)
            out = frame
            if speech is not None and 200 <= n < 200 + len(speech) // 160:  # 4 s in: the booking runs
                out = speech[(n - 200) * 160:(n - 199) * 160]
            if on_tick is not None:
                on_tick(n)
            try:
                await t.send_audio(out)
            except Exception:  # noqa: BLE001 - the daemon hung up
                break
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
    finally:
        await t.close()
    return {"seconds": time.monotonic() - t0, "hung_up": ended.is_set(), "call_id": t.call_id}


def record(env: dict, call_id: str) -> dict:
    env["d"].wait_for(lambda s: any(r["call_id"] == call_id for r in read_records(env["tmp"] / "records")), 20,
                      f"the record of {call_id}")
    return next(r for r in read_records(env["tmp"] / "records") if r["call_id"] == call_id)


def outcomes(rec: dict, name: str) -> list[str]:
    return [x["outcome"] for x in rec["tools"] if x["name"] == name]


def test_remote_read_only_and_side_effect_a_new_turn_during_the_booking_runs_it_once(env):
    import soundfile as sf

    speech, rate = sf.read(ROOT / "tests" / "fixtures" / "generated" / "turn_complete.8k.wav", dtype="int16")
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/main", "1#", speech, seconds=11.0))
    rec = record(env, res["call_id"])
    # the record is written when the call ends; the hangup event reaches the service's log on its own
    # way (the link's send queue, then the service): wait for it, then check that nothing follows it
    env["d"].wait_for(lambda s: any(f["type"] == "event" and f["name"] == "hangup"
                                    for f in frames(env["log"], res["call_id"])), 10, "the hangup event")
    got = frames(env["log"], res["call_id"])
    offer = got[0]
    assert offer["type"] == "session.offer" and offer["call"]["transport"] == "native" and not offer["resume"]
    ready = next(f for f in got if f["type"] == "session.ready")
    assert sorted(ready["tools"]) == ["book_table", "lookup", "never", "slow_lookup"] and ready["refused"] == []
    assert outcomes(rec, "lookup") == ["ok"]
    calls = [f for f in got if f["type"] == "tool.call" and f["name"] == "book_table"]
    assert len(calls) == 1 and len(calls[0]["idempotency_key"]) == 16  # the body ran once
    assert outcomes(rec, "book_table")[0] in ("interrupted", "timeout")
    notes = [m["content"] for m in rec["conversation"] if m["role"] == "system" and "BK-9" in m.get("content", "")]
    assert len(notes) == 1, json.dumps([rec["conversation"], rec["tools"]])  # the late result reached the model once
    events = [f for f in got if f["type"] == "event"]
    assert any(e["name"] == "user_turn" and e["text"] == "[keypad] 1" for e in events)
    assert any(e["name"] == "bot_turn" and "Hello." in e["text"] for e in events)
    assert any(e["name"] == "tool_outcome" and e["tool"] == "lookup" and e["outcome"] == "ok" for e in events)
    assert events[-1]["name"] == "hangup"


def test_a_remote_read_only_timeout_is_cancelled_and_its_late_result_refused(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/main", "2#", seconds=7.0))
    rec = record(env, res["call_id"])
    got = frames(env["log"], res["call_id"])
    assert outcomes(rec, "slow_lookup") == ["timeout"]
    cancel = [f for f in got if f["type"] == "tool.cancel"]
    assert len(cancel) == 1 and cancel[0]["reason"] == "timeout"
    assert [f["code"] for f in got if f["type"] == "error"] == ["late"]


def test_a_side_effect_that_never_answers_ends_unknown_after_the_wait(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/main", "3#", seconds=9.0))
    rec = record(env, res["call_id"])
    assert outcomes(rec, "never") == ["timeout"]  # the slot: answered at its 0.5 s timeout
    late = [m["content"] for m in rec["conversation"] if m["role"] == "system" and "unknown_outcome" in m.get("content", "")]
    assert len(late) == 1, rec["conversation"]  # after side_effect_wait (4 s): unknown, once
    assert len([f for f in frames(env["log"], res["call_id"]) if f["type"] == "tool.call"]) == 1  # never retried


def test_the_service_killed_mid_call_makes_the_outcome_unknown_and_ends_the_call_a_restarted_one_serves(env):
    svc = start_service(env["kport"], env["klog"])
    killed = []

    def tick(n: int) -> None:
        if not killed and any(f["type"] == "tool.call" and f["name"] == "book_table" for f in frames(env["klog"])):
            svc.kill()
            killed.append(n)

    try:
        res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/killed", "1#", seconds=11.0, on_tick=tick))
    finally:
        svc.kill()
    rec = record(env, res["call_id"])
    assert killed
    assert outcomes(rec, "book_table") == ["unknown_outcome"]
    assert res["hung_up"] and rec["end_reason"] == "agent_link_down"
    # the service restarted: the next call is served as if nothing had happened
    svc = start_service(env["kport"], env["klog"])
    try:
        res2 = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/killed", "1#", seconds=8.0))
    finally:
        svc.kill()
    rec2 = record(env, res2["call_id"])
    assert outcomes(rec2, "lookup") == ["ok"], rec2["tools"]  # the link is up again: the tools run
    assert outcomes(rec2, "book_table") == ["timeout"]  # its 3 s body outlives its 1.5 s slot ...
    notes = [m for m in rec2["conversation"] if m["role"] == "system" and "BK-9" in m.get("content", "")]
    assert len(notes) == 1 and rec2["end_reason"] != "agent_link_down"  # ... and its result came as a late note


def test_a_collision_with_an_agent_file_tool_is_refused_at_the_handshake(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/collide", seconds=2.0))
    ready = next(f for f in frames(env["log"], res["call_id"]) if f["type"] == "session.ready")
    assert ready["tools"] == ["lookup"]
    assert [r["name"] for r in ready["refused"]] == ["end_call"] and "agent file" in ready["refused"][0]["error"]
    assert frames(env["log"], res["call_id"])[0]["local_tools"] == ["end_call"]


def test_tools_set_narrows_a_call_of_a_narrowed_tool_answers_unknown_tool(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/narrow", "5#", seconds=6.0))
    rec = record(env, res["call_id"])
    got = frames(env["log"], res["call_id"])
    answers = [m["content"] for m in rec["conversation"] if m["role"] == "tool"]
    assert len(answers) == 1 and json.loads(answers[0])["error"] == "unknown_tool", answers
    assert not [f for f in got if f["type"] == "tool.call"]  # never ran
    assert [(f["code"], f["ref"]) for f in got if f["type"] == "error"] == [("invalid_tool", "tools.set")]


def test_say_and_end_call_commands(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/cmds", seconds=12.0))
    rec = record(env, res["call_id"])
    said = [m["text"] for m in rec["conversation"] if m["role"] == "assistant" and m.get("text")]
    assert said[:2] == ["Hello.", "One moment please."]
    acks = {f["id"]: f for f in frames(env["log"], res["call_id"]) if f["type"] == "command.ack"}
    assert acks["k1"]["ok"] and acks["k2"]["ok"] and not acks["k0"]["ok"]  # k0: a text over 1,000 characters
    assert res["hung_up"] and res["seconds"] < 10.0 and rec["end_reason"] == "done"


def test_a_bad_secret_refuses_the_call(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/badsecret", seconds=5.0))
    assert res["hung_up"] and res["seconds"] < 3.0  # the gateway's stop: agent unavailable (bad_agent)
    assert not [r for r in read_records(env["tmp"] / "records") if r["call_id"] == res["call_id"]]
    env["d"].wait_for(lambda s: any(f["type"] == "refused_401" and f["_path"] == "/main"
                                    for f in frames(env["log"])), 10, "the service's 401")


def test_a_dropped_link_is_redialled_with_resume_and_a_result_after_the_drop_is_refused(env):
    res = asyncio.run(call(f"ws://127.0.0.1:{env['ws']}/ws/drop", "1#", seconds=8.0))
    rec = record(env, res["call_id"])
    got = frames(env["log"], res["call_id"])
    offers = [f for f in got if f["type"] == "session.offer"]
    assert [o["resume"] for o in offers] == [False, True]  # re-dialled within the call, with resume
    assert outcomes(rec, "lookup") == ["ok"]
    assert outcomes(rec, "book_table") == ["unknown_outcome"]  # waiting when the link went down: never retried
    errors = [(f["code"], f.get("ref")) for f in got if f["type"] == "error"]
    assert errors and errors[0][0] in ("unknown_id", "late")  # the result sent after the drop is refused ...
    assert "BK-LATE" not in json.dumps(rec["conversation"])  # ... and never reaches the model
    assert rec["end_reason"] != "agent_link_down" and not res["hung_up"]  # the call went on
