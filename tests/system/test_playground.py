"""The browser playground in a real headless Chromium, against a real brisvoxd.

The daemon serves the ``scripted`` agent (local Whisper and Piper on the worker,
the rule LLM) on a native route; its WebSocket listener is on loopback, so the
playground is on by default. Chromium (Debian's package) loads
``/playground``, picks the agent, connects and talks through a fake microphone
that plays a recorded question once (``--use-file-for-fake-audio-capture=...%noloop``).
The page must show the call connected, the caller's line transcribed, a turn's
latencies, and must have played bot audio; a screenshot of it is kept
(``playground.png`` in the test's tmp dir, pytest keeps the last runs; also copied to
``$BRISVOX_TEST_ARTIFACTS`` when set). Then it hangs up.

The bad input: the playground's WebSocket without a token, with a bad one, with one for
another agent, from a foreign Origin or a foreign Host; the token endpoint from a foreign
Origin, without one, for an agent no route serves. And a plain native client with
``"events": true`` that says goodbye gets the ``tool_call`` of ``end_call`` (its name and
outcome, not its arguments). Everything on loopback; the daemon,
the browser, their /dev/shm segments and the profile are removed even when a test fails.
Skipped (with the reason) only when Chromium is not installed.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import soundfile as sf
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from bench.harness.daemon import Daemon, agents_config, write_config, ws_port
from brisvox.agent.host.call_record import read_records
from tests.system.chromium import BINARY, Chromium

pytestmark = [pytest.mark.system, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
SPEECH = ROOT / "tests" / "fixtures" / "generated" / "turn_complete.16k.wav"  # "Can you tell me what time ..."
FALLBACK = "I am a scripted demo. Say: repeat after me, or press one, or goodbye."  # the agent's answer
AUDIO_FLAGS = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
               "--autoplay-policy=no-user-gesture-required")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int, Path]]:
    tmp = Path(tmp_path_factory.mktemp("pgd"))
    extra = agents_config(ROOT / "configs" / "agents", tmp / "records", smart_turn=True, websocket="""
handshakes_per_s = 0  # the bad-input tests open many connections at once
routes = [{ path = "/ws", protocol = "native", agent = "default", agents = ["scripted"] }]""")
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(120)
        port = ws_port(d.child(snap, "gateway-0"))
        yield d, port, tmp
    finally:
        d.close()


def _request(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request(method, path, headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _token(port: int, agent: str = "scripted") -> str:
    status, body = _request(port, "POST", f"/playground/token?agent={agent}",
                            {"Origin": f"http://127.0.0.1:{port}", "Content-Length": "0"})
    assert status == 200, body
    tok: str = orjson.loads(body)["token"]
    return tok


def _upgrade(port: int, path: str, origin: str | None = None, host: str | None = None) -> Any:
    """The status of the WebSocket upgrade (101: the ``started`` answer to a start)."""

    async def go() -> Any:
        headers = {"Host": host} if host else None
        try:
            async with asyncio.timeout(10):
                async with connect(f"ws://127.0.0.1:{port}{path}", origin=origin,  # type: ignore[arg-type]
                                   additional_headers=headers, proxy=None) as ws:
                    await ws.send('{"event":"start","rate":16000,"events":true}')
                    started = orjson.loads(await ws.recv())
                    await ws.send('{"event":"stop"}')
                    return 101, started
        except InvalidStatus as e:
            return e.response.status_code, e.response.body

    return asyncio.run(go())


def _wav(tmp: Path) -> Path:
    """The question once, after 1 s of silence (the page connects), then 8 s of silence."""
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == 16000
    pad = np.zeros(rate, dtype=np.int16)
    out = tmp / "caller.wav"
    sf.write(out, np.concatenate([pad, speech, pad.repeat(8)]), rate, subtype="PCM_16")
    return out


@pytest.mark.serial  # real-time browser audio into local Whisper: starved of CPU it hears nothing
@pytest.mark.skipif(not BINARY.exists(), reason=f"{BINARY} is not installed (apt-get install chromium)")
def test_a_call_from_the_browser_playground(daemon: tuple[Daemon, int, Path], tmp_path: Path) -> None:
    d, port, tmp = daemon
    wav = _wav(tmp_path)
    browser = Chromium(*AUDIO_FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop")
    try:
        browser.open(f"http://127.0.0.1:{port}/playground")
        browser.wait("window.playground && window.playground.state === 'ready'", 20, "the agent list")
        agents = browser.js("[...document.querySelectorAll('#agent option')].map(o => o.value)")
        assert agents == ["default", "scripted"]
        browser.js("document.getElementById('agent').value = 'scripted'; "
                   "document.getElementById('connect').click(); true")
        browser.wait("window.playground.state === 'connected'", 20, "the call to connect")
        call_id = browser.js("window.playground.call_id")
        assert call_id
        user = browser.wait("window.playground.transcript.filter(l => l.who === 'user').map(l => l.text)"
                            ".join(' ')", 60, "the caller's line, transcribed")
        assert "tell me" in user.lower(), user
        played = browser.wait("window.playground.bot_samples_played > 16000 && window.playground.bot_samples_played",
                              60, "a second of the bot's answer played")
        metrics = browser.wait("window.playground.metrics.length && window.playground.metrics", 20,
                               "the turn's latencies")
        assert metrics[0]["voice_to_voice_ms"] is not None and metrics[0]["voice_to_voice_ms"] > 0
        assert browser.js("window.playground.frames_sent") > 100  # 20 ms frames from the microphone
        assert browser.js("window.playground.rate") == 16000  # Chromium resamples the microphone itself
        bot = browser.wait("window.playground.transcript.filter(l => l.who === 'bot').map(l => l.text).join(' ')",
                           30, "the bot's answer, as heard, once it played whole")
        assert bot == FALLBACK
        browser.wait("document.querySelectorAll('#transcript p').length >= 2", 5, "both lines on the page")
        shot = browser.screenshot(tmp_path / "playground.png")
        assert shot.stat().st_size > 10_000
        if os.environ.get("BRISVOX_TEST_ARTIFACTS"):
            dest = Path(os.environ["BRISVOX_TEST_ARTIFACTS"])
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, dest / "playground.png")
        print(f"playground screenshot: {shot}; bot samples played: {played}")
        browser.js("document.getElementById('hangup').click(); true")
        browser.wait("window.playground.state === 'ended'", 15, "the hang-up")
        assert browser.js("window.playground.close_code") == 1000
    except BaseException:
        print(f"chromium log:\n{browser.log_text()[-3000:]}\ndaemon log:\n{d.logs()[-3000:]}")
        raise
    finally:
        browser.close()
    d.wait_for(lambda s: any(r["call_id"] == call_id for r in read_records(tmp / "records")), 30, "the call record")
    rec = next(r for r in read_records(tmp / "records") if r["call_id"] == call_id)
    assert rec["call"]["params"].get("source") == "playground"
    assert rec["stats"]["events"]["sent"] >= 2


def test_the_page_and_its_agents(daemon: tuple[Daemon, int, Path]) -> None:
    _, port, _ = daemon
    status, body = _request(port, "GET", "/playground", {})
    assert status == 200 and b"<title>brisvox playground</title>" in body
    status, body = _request(port, "GET", "/playground/agents", {})
    assert status == 200 and orjson.loads(body)["agents"] == ["default", "scripted"]
    assert _request(port, "GET", "/playground/nothing", {})[0] == 404
    assert _request(port, "GET", "/playground", {"Host": "attacker.example:8765"})[0] == 403  # DNS rebinding


def test_the_token_endpoint_refuses_foreign_origins(daemon: tuple[Daemon, int, Path]) -> None:
    _, port, _ = daemon
    own = f"http://127.0.0.1:{port}"
    post = "/playground/token?agent=scripted"
    assert _request(port, "POST", post, {"Origin": "http://attacker.example", "Content-Length": "0"})[0] == 403
    assert _request(port, "POST", post, {"Content-Length": "0"})[0] == 403  # no Origin: not the page
    assert _request(port, "POST", post, {"Origin": own, "Host": "attacker.example", "Content-Length": "0"})[0] == 403
    assert _request(port, "POST", "/playground/token?agent=sales", {"Origin": own, "Content-Length": "0"})[0] == 404
    assert _request(port, "POST", post, {"Origin": own, "Content-Length": "0"})[0] == 200


def test_the_playground_websocket_needs_a_valid_token_and_its_own_origin(daemon: tuple[Daemon, int, Path]) -> None:
    _, port, _ = daemon
    own = f"http://127.0.0.1:{port}"
    tok = _token(port)
    assert _upgrade(port, "/playground/ws/scripted", own)[0] == 401  # no token
    assert _upgrade(port, "/playground/ws/scripted?token=not-a-token", own)[0] == 401
    assert _upgrade(port, f"/playground/ws/scripted?token={tok[:-3]}AAA", own)[0] == 401  # a bad MAC
    assert _upgrade(port, f"/playground/ws/scripted?token={_token(port, 'default')}", own)[0] == 401  # other agent
    assert _upgrade(port, f"/playground/ws/scripted?token={tok}", "http://attacker.example")[0] == 403
    assert _upgrade(port, f"/playground/ws/scripted?token={tok}", own, host="attacker.example")[0] == 403
    assert _upgrade(port, f"/playground/ws/sales?token={tok}", own)[0] == 404
    status, started = _upgrade(port, f"/playground/ws/scripted?token={tok}", own)
    assert status == 101 and started["event"] == "started" and started["agent"] == "scripted"
    # the native route itself still refuses a browser's Origin (allowed_origins is empty)
    assert _upgrade(port, "/ws/scripted", own)[0] == 403


def test_a_native_client_with_events_sees_the_tool_call_and_never_its_arguments(
        daemon: tuple[Daemon, int, Path]) -> None:
    """No browser: the playground's route with ``"events": true`` from a plain client; the
    caller says goodbye, the scripted agent calls ``end_call`` (its rule) and hangs up."""
    from brisvox.client.speech import Voice, pad

    _, port, _ = daemon
    voice = Voice("auto")
    try:
        speech = pad(voice.synthesize("Goodbye.", 16000), 16000, 0.5, 4.0)
    finally:
        voice.close()

    async def call() -> tuple[list[dict[str, Any]], str]:
        events: list[dict[str, Any]] = []
        stop = ""
        async with asyncio.timeout(60):
            async with connect(f"ws://127.0.0.1:{port}/playground/ws/scripted?token={_token(port)}",
                               proxy=None) as ws:
                await ws.send('{"event":"start","rate":16000,"events":true}')

                async def rx() -> str:
                    async for m in ws:
                        if isinstance(m, str):
                            msg = orjson.loads(m)
                            if msg["event"] == "call_event":
                                events.append(msg)
                            elif msg["event"] == "stop":
                                return str(msg["reason"])
                    return ""

                task = asyncio.create_task(rx())
                for i in range(0, len(speech) - 319, 320):
                    if task.done():
                        break
                    await ws.send(speech[i:i + 320].astype("<i2").tobytes())
                    await asyncio.sleep(0.02)
                stop = await asyncio.wait_for(task, 30)
        return events, stop

    events, stop = asyncio.run(call())
    names = [e["name"] for e in events]
    assert "user_turn" in names and "goodbye" in next(e["text"] for e in events if e["name"] == "user_turn").lower()
    tool = next(e for e in events if e["name"] == "tool_call")
    assert tool == {"event": "call_event", "name": "tool_call", "epoch": tool["epoch"], "tool": "end_call",
                    "outcome": "ok"}  # the name and the outcome, never the arguments ("caller said goodbye")
    assert stop  # the agent hung up


def test_brisvox_call_events_prints_what_the_agent_heard_and_did(daemon: tuple[Daemon, int, Path]) -> None:
    """``brisvox call --events`` (the same call events, for a terminal): printed live, kept in --json."""
    import subprocess
    import sys

    _, port, _ = daemon
    r = subprocess.run([sys.executable, "-m", "brisvox.cli.brisvox", "call", f"ws://127.0.0.1:{port}/ws",
                        "--agent", "scripted", "--say", "Goodbye.", "--events", "--no-transcribe", "--json", "-",
                        "--max-duration", "40"], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert r.returncode in (0, 3), r.stderr  # 3: the agent hung up before a full answer was measured
    out = orjson.loads(r.stdout[r.stdout.index("{"):])
    names = [e["name"] for e in out["events"]]
    assert "user_turn" in names and {"name": "tool_call", "epoch": 1, "tool": "end_call", "outcome": "ok"} in [
        {k: e[k] for k in ("name", "epoch", "tool", "outcome") if k in e} for e in out["events"]]
    assert "[caller, turn 1] " in r.stderr and "[tool, turn 1] end_call -> ok" in r.stderr
    r = subprocess.run([sys.executable, "-m", "brisvox.cli.brisvox", "call", f"ws://127.0.0.1:{port}/twilio",
                        "--events"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "--events needs the native protocol (not twilio)" in r.stderr
