"""Webhooks through the whole daemon: a flaky receiver, then a daemon killed with rows undelivered.

brisvoxd runs one gateway, one worker, one agent process (an agent file of scripted
stand-ins) and, because ``[[webhooks]]`` is configured, its outbound child. The receiver is a
real HTTP server on loopback (this process) that records every request (a receiver down for
half a campaign, then flaky, is tests/system/test_campaign_kill.py's; this test is what that
one does not cover: a daemon's kill, a tool call, the record, the metrics):

1. it answers 500 to a seeded 35% of the requests while two calls run: every event of the
   calls is delivered (some more than once: each retry carries the same id);
2. it is down for a third call, whose events are committed to the outbox; the daemon is
   then SIGKILLed (the whole process group) with them undelivered;
3. a new daemon on the same state dir, with the receiver flaky again, resends them.

Checks: after deduplication by event id, each call has exactly one ``call.started``,
``call.answered``, ``tool.called`` (the scripted model presses a key) and ``call.ended`` (12
events, every row of the outbox delivered, none given up); every request's
``Brisvox-Signature`` verifies (the Python SDK's ``verify_webhook``) and a repeated id always
carries the same body; ``call.ended`` holds the call record (the caller's transcript);
``/metrics`` has the outbound child ready and the delivery counters.
"""

from __future__ import annotations

import asyncio
import http.server
import random
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import soundfile as sf

from bench.harness.call_daemon import SPEECH
from bench.harness.daemon import Daemon, agents_config, write_config, ws_port
from brisvox.sim.ws_caller import FRAME, RATE
from brisvox.wire.native import NativeStream, server_message
from tests.system.gateway_harness import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
from brisvox_agent import verify_webhook  # noqa: E402

pytestmark = pytest.mark.system
SECRET = "whsec_system_test"

AGENT = """name = "hooked"
system_prompt = "Scripted agent whose calls send webhooks (no language model)."
tools = ["send_dtmf"]

[stt]
provider = "scripted_stt"
[stt.options]
text = "what time do you close"

[llm]
provider = "scripted"
[llm.options]
fallback = "We close at nine."
first_token_ms = 50
[[llm.options.rules]]
match = "close"
steps = [{ tools = [{ name = "send_dtmf", arguments = { digits = "1" } }] }, { reply = "We close at nine." }]

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 600
"""


class Receiver:
    """The operator's endpoint: down (nothing listens) or up, answering 500 to ``fail`` of the requests."""

    def __init__(self, port: int, seed: int = 7) -> None:
        self.port = port
        self.rng = random.Random(seed)
        self.fail = 0.0
        self.lock = threading.Lock()
        self.requests: list[tuple[dict[str, str], bytes, int]] = []  # (headers, body, status answered)
        self.server: http.server.ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def up(self, fail: float) -> None:
        rx = self
        self.fail = fail

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with rx.lock:
                    code = 500 if rx.rng.random() < rx.fail else 200
                    rx.requests.append(({k.lower(): v for k, v in self.headers.items()}, body, code))
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def accepted(self) -> dict[str, dict[str, Any]]:
        """Event id -> the event, of every request answered 2xx (the receiver's dedup)."""
        with self.lock:
            return {orjson.loads(b)["id"]: orjson.loads(b) for _, b, code in self.requests if code == 200}


async def short_call(port: int, speech: np.ndarray) -> str:
    """One native call: the recorded question, the bot's answer heard, hang up."""
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/ws/default", max_size=2**20) as ws:
        stream = NativeStream(RATE)
        await ws.send(stream.start())
        started = server_message(orjson.loads(await ws.recv()))
        assert started.event == "started", started
        heard = asyncio.Event()

        async def rx() -> None:
            async for m in ws:
                if isinstance(m, bytes) and np.any(np.frombuffer(m, dtype="<i2")):
                    heard.set()

        task = asyncio.create_task(rx())
        silence = np.zeros(FRAME, dtype="<i2")
        frames = [silence] * 10 + [speech[i:i + FRAME] for i in range(0, len(speech) - FRAME + 1, FRAME)]
        deadline = time.monotonic() + 30
        nxt = time.monotonic()
        while time.monotonic() < deadline and not (heard.is_set() and not frames):
            await ws.send((frames.pop(0) if frames else silence).astype("<i2").tobytes())
            nxt += 0.02
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        assert heard.is_set(), "the bot's answer never arrived"
        await ws.send(stream.stop())
        try:
            async with asyncio.timeout(3.0):
                await task
        except (TimeoutError, Exception):
            task.cancel()
        return str(started.call_id)


def calls(port: int, n: int) -> list[str]:
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == RATE

    async def run() -> list[str]:
        return list(await asyncio.gather(*(short_call(port, speech) for _ in range(n))))

    return asyncio.run(run())


def outbox_rows(state: Path) -> list[dict[str, Any]]:
    path = state / "webhooks.sqlite3"
    if not path.exists():
        return []
    db = sqlite3.connect(path, timeout=5)
    try:
        cur = db.execute("SELECT event_id, type, attempts, delivered_at, gave_up_at FROM deliveries")
        return [dict(zip(("event_id", "type", "attempts", "delivered_at", "gave_up_at"), r, strict=True))
                for r in cur.fetchall()]
    except sqlite3.OperationalError:  # the table is not made yet
        return []
    finally:
        db.close()


def wait(pred: Any, timeout: float, what: str, detail: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f": {detail()}" if detail is not None else ""))


def daemon(tmp: Path, port: int) -> Daemon:
    agents = tmp / "agents"
    agents.mkdir(exist_ok=True)
    (agents / "hooked.toml").write_text(AGENT)
    hooks = (f'\n[[webhooks]]\nurl = "http://127.0.0.1:{port}/hooks"\nsecret_env = "HOOK_SECRET"\n'
             'allow_private = true\ntimeout_s = 2.0\nretry_base_s = 0.2\nretry_cap_s = 1.0\n')
    extra = agents_config(agents, tmp / "records", default_agent="hooked") + hooks
    return Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True,
                  env={"HOOK_SECRET": SECRET})


def test_events_survive_a_down_receiver_random_500s_and_a_killed_daemon(short_tmp: Path) -> None:
    port = free_port(socket.SOCK_STREAM)
    rx = Receiver(port)
    state = short_tmp / "state"
    d = daemon(short_tmp, port)
    try:
        d.start()
        snap = d.wait_ready(90)
        assert d.child(snap, "outbound-0")["state"] == "ready"
        ws = ws_port(d.child(snap, "gateway-0"))
        # 1. flaky: two calls' events delivered
        rx.up(fail=0.35)
        first = calls(ws, 2)
        wait(lambda: len(rx.accepted()) == 8, 60, "eight events accepted")
        code, metrics = d.metrics_text()
        assert code == 200
        lines = metrics.splitlines()
        assert 'brisvox_children{role="outbound",state="ready"} 1' in lines
        assert any(ln.startswith('brisvox_webhook_deliveries_total{result="delivered"}') for ln in lines)
        # 2. down: a third call's events committed, then the daemon killed with them undelivered
        rx.down()
        third = calls(ws, 1)
        wait(lambda: len(outbox_rows(state)) == 12, 30, "the third call's events in the outbox")
    finally:
        d.close()
    pending = [r for r in outbox_rows(state) if r["delivered_at"] is None]
    assert len(pending) == 4, pending
    # 3. a new daemon on the same state dir resends them
    rx.up(fail=0.35)
    d2 = daemon(short_tmp, port)
    try:
        d2.start()
        d2.wait_ready(90)
        wait(lambda: len(rx.accepted()) == 12, 60, "the killed daemon's events resent")
        wait(lambda: all(r["delivered_at"] is not None for r in outbox_rows(state)), 20, "the outbox settled")
    finally:
        d2.close()
        rx.down()

    rows = outbox_rows(state)
    assert len(rows) == 12 and all(r["gave_up_at"] is None for r in rows)
    got = rx.accepted()
    assert set(got) == {r["event_id"] for r in rows}
    by_call: dict[str, list[str]] = {}
    for ev in got.values():
        by_call.setdefault(ev["data"]["call_id"], []).append(ev["type"])
    assert set(by_call) == set(first + third)
    for cid, types in by_call.items():
        assert sorted(types) == ["call.answered", "call.ended", "call.started", "tool.called"], (cid, types)
    bodies: dict[str, bytes] = {}
    for headers, body, _ in rx.requests:
        ev = verify_webhook(SECRET, headers.get("brisvox-signature"), body)  # every attempt is signed
        assert headers["brisvox-event-id"] == ev["id"] and headers["brisvox-event-type"] == ev["type"]
        assert bodies.setdefault(ev["id"], body) == body  # a retry resends the very same event
    assert sum(1 for *_, code in rx.requests if code == 500) >= 1  # the flaky phases did refuse some
    assert len(rx.requests) > 12  # so some events came more than once: the receiver's dedup was needed
    tools = [ev["data"] for ev in got.values() if ev["type"] == "tool.called"]
    assert {(t["tool"], t["outcome"]) for t in tools} == {("send_dtmf", "ok")}, tools
    ended = [ev for ev in got.values() if ev["type"] == "call.ended"]
    for ev in ended:
        rec = ev["data"]["record"]
        assert rec["call_id"] == ev["data"]["call_id"] and ev["data"]["recording"] is None
        assert any(m.get("role") == "user" and "close" in str(m.get("content", "")) for m in rec["conversation"]), rec


def test_check_and_start_refuse_private_or_plain_http_webhooks_naming_the_key(short_tmp: Path) -> None:
    from bench.harness.daemon import child_env, cli

    env = child_env(HOOK_SECRET=SECRET)
    agents = short_tmp / "agents"
    agents.mkdir()
    (agents / "hooked.toml").write_text(AGENT)
    base = agents_config(agents, short_tmp / "records", default_agent="hooked")

    def config(hook: str) -> Path:
        return write_config(short_tmp, workers=1, agents=1, extra=base + "\n[[webhooks]]\n" + hook
                            + '\nsecret_env = "HOOK_SECRET"\n')

    r = cli("check", str(config('url = "https://10.20.30.40/hooks"')), env=env)
    assert r.returncode == 2 and "webhooks[0].url: 10.20.30.40 resolves to 10.20.30.40" in r.stderr, r.stderr
    r = cli("start", "--foreground", "--config", str(config('url = "https://169.254.169.254/latest"')), env=env)
    assert r.returncode == 2 and "webhooks[0].url" in r.stderr and "not a public address" in r.stderr, r.stderr
    r = cli("check", str(config('url = "http://192.0.2.1/hooks"\nallow_private = true')), env=env)
    assert r.returncode == 2 and "http:// only to a loopback host" in r.stderr, r.stderr
    r = cli("check", str(config('url = "https://10.20.30.40/hooks"\nallow_private = true')), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    # an agent file's [[webhooks]]: the same refusal, naming the file, its line and the key
    (agents / "hooked.toml").write_text(AGENT + '\n[[webhooks]]\nurl = "https://127.0.0.1/x"\nsecret_env = "NOPE"\n')
    r = cli("check", str(agents / "hooked.toml"), env=env)
    assert r.returncode == 2 and "webhooks[0].url" in r.stdout and "resolves to 127.0.0.1" in r.stdout, r.stdout
    assert "NOPE is not set" in r.stdout  # the secret's source: a warning offline
