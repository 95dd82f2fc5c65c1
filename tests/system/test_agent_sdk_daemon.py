"""The SDKs' booking services (Python and Node) as the agent service of a call through the whole daemon.

The real example processes, ``examples/python_agent/booking_agent.py`` (sdk/python) and
``examples/typescript_agent/booking_agent.mjs`` (sdk/typescript, built by ``make test``),
serve an ``[agent_link]`` agent whose scripted model checks availability (a remote
ReadOnly tool) and books (a remote SideEffect tool) when the caller presses 1; the same
caller booking again in a second call gets the existing booking back (the example keys
its store on the guest and slot). Judged from the call records.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
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
SECRET = "sdk-secret-for-tests"
NODE_DIST = ROOT / "sdk" / "typescript" / "dist"


def agent(port: int) -> str:
    return f"""name = "sdkbook"
system_prompt = "Scripted booking agent with a remote service."
greeting = "Hello."

[agent_link]
url = "ws://127.0.0.1:{port}/brisvox"
secret_env = "BRISVOX_AGENT_SECRET"
required = true

[stt]
provider = "scripted_stt"

[llm]
provider = "scripted"
[llm.options]
fallback = "I see."
first_token_ms = 100
[[llm.options.rules]]
match = "^\\\\[keypad\\\\] 1$"
steps = [
  {{ reply = "Checking.", tools = [{{ name = "check_availability", arguments = {{ date = "2026-12-24", time = "19:00", people = 2 }} }}] }},
  {{ reply = "Booking.", tools = [{{ name = "book_table", arguments = {{ name = "Ada", date = "2026-12-24", time = "19:00", people = 2 }} }}] }},
  {{ reply = "Booked {{r[0][booking]}}." }},
]

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 300

[dtmf]
text = "[keypad] {{digits}}"
"""


def free_port() -> int:
    """A TCP port for the SDK service (parallel-safe: :func:`gateway_harness.free_port`)."""
    return gateway_harness.free_port(socket.SOCK_STREAM)


def start(kind: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "BRISVOX_AGENT_SECRET": SECRET, "PYTHONPATH": f"{ROOT}:{ROOT / 'sdk' / 'python' / 'src'}"}
    if kind == "python":
        cmd = [sys.executable, "-m", "examples.python_agent.booking_agent", "--port", str(port),
               "--secret-env", "BRISVOX_AGENT_SECRET"]
    else:
        if shutil.which("node") is None or not NODE_DIST.exists():
            pytest.fail("the TypeScript SDK is not built: `make test` builds it (scripts/install-node.sh)")
        cmd = ["node", str(ROOT / "examples" / "typescript_agent" / "booking_agent.mjs"), "--port", str(port)]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return p
        except OSError:
            if p.poll() is not None:
                raise AssertionError(f"the {kind} service exited: {p.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.1)
    p.kill()
    raise AssertionError(f"the {kind} service did not listen on {port}")


@pytest.fixture(scope="module", params=["python", "node"])
def env(request):
    kind = request.param
    tmp = Path(tempfile.mkdtemp(prefix="bvs", dir="/tmp"))
    port = free_port()
    svc = start(kind, port)
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "sdkbook.toml").write_text(agent(port))
    extra = agents_config(agents, tmp / "records", default_agent="sdkbook")
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True,
               env={"BRISVOX_AGENT_SECRET": SECRET})
    try:
        d.start()
        snap = d.wait_ready(90)
        ws = ws_port(d.child(snap, "gateway-0"))
        yield {"d": d, "tmp": tmp, "ws": ws, "kind": kind}
    finally:
        d.close()
        svc.terminate()
        try:
            svc.wait(5)
        except subprocess.TimeoutExpired:
            svc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


async def keypad_call(url: str, seconds: float = 6.0) -> str:
    t = NativeTransport(url, rate=8000)
    await t.open(BotEvents())
    frame = np.zeros(160, np.int16)
    t0 = time.monotonic()
    try:
        for n in range(int(seconds / 0.02)):
            if n == 75:  # 1.5 s in: the greeting played
                await t.send_dtmf("1#")
            await t.send_audio(frame)
            await asyncio.sleep(max(0.0, t0 + (n + 1) * 0.02 - time.monotonic()))
    finally:
        await t.close()
    return str(t.call_id)


def record(env: dict, call_id: str) -> dict:
    env["d"].wait_for(lambda s: any(r["call_id"] == call_id for r in read_records(env["tmp"] / "records")), 20,
                      f"the record of {call_id}")
    return next(r for r in read_records(env["tmp"] / "records") if r["call_id"] == call_id)


def test_the_sdk_service_answers_a_remote_read_only_and_side_effect_tool_and_keeps_one_booking(env):
    url = f"ws://127.0.0.1:{env['ws']}/ws"
    first = record(env, asyncio.run(keypad_call(url)))
    tools = [(x["name"], x["outcome"]) for x in first["tools"]]
    assert tools == [("check_availability", "ok"), ("book_table", "ok")], (env["kind"], first["tools"])
    said = [m["text"] for m in first["conversation"] if m["role"] == "assistant" and m.get("text")]
    assert said[-1].startswith("Booked BK-")
    # a second call books the same guest and slot: the service's application key returns the existing booking
    second = record(env, asyncio.run(keypad_call(url)))
    said2 = [m["text"] for m in second["conversation"] if m["role"] == "assistant" and m.get("text")]
    assert said2[-1] == said[-1]
    tool_msgs = [m for m in second["conversation"] if m["role"] == "tool"]
    assert any("already_booked" in m.get("content", "") for m in tool_msgs)
