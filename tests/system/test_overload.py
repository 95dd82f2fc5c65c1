"""Overload: a real daemon flooded with twice its ``[gateway] max_calls`` at once.

The daemon (gateway, one worker, one agent process; scripted providers, the
real Silero VAD) runs with a small explicit ``max_calls`` (:data:`LIMIT`), so
the test stays cheap on a loaded 2-core CI machine. First :data:`SOLO_CALLS`
solo calls, one after the other, measure the baseline turn latency; then
``2 * LIMIT`` native WebSocket calls start at once. Checks, from outside the daemon:

* exactly ``LIMIT`` calls are admitted (``started``) and served: each hears
  the bot answer its one question;
* every other call is refused cleanly: closed with 1013 and a reason, never
  started, and the gateway counts exactly that many ``calls_refused_full``;
* the admitted calls' turn latency stays within :data:`MARGIN_MS` of the solo
  calls' (p95 of the ``LIMIT`` admitted <= solo p95 + MARGIN_MS: generous,
  since CI machines are noisy; a saturated daemon misses it by seconds);
* nothing leaks: the gateway's table is empty, every admitted call ended in the
  agent, and no call ring of the instance is left in ``/dev/shm``.

Turn latency = the caller's last loud frame sent -> the first non-silent bot
frame received (both ``time.monotonic()`` in this process). The daemon is
killed (process group) and its segments removed even when a check fails.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest
import soundfile as sf
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bench.harness.call_daemon import SPEECH
from bench.harness.daemon import Daemon, write_config, ws_port
from brisvox.sim.ws_caller import RATE, TTS_RATE
from brisvox.wire.native import NativeStream, server_message
from ipc.ring import SHM_DIR

pytestmark = pytest.mark.system

LIMIT = 6
SOLO_CALLS = 2
MARGIN_MS = 300.0
FRAME = RATE // 50
ANSWER_TIMEOUT_S = 10.0


def daemon_config(tmp, script) -> object:
    return write_config(tmp, workers=1, agents=1, extra=f"""
[gateway]
max_calls = {LIMIT}
max_calls_per_source = {LIMIT}  # every call comes from 127.0.0.1
echo_use_workers = false
tts_rate = {TTS_RATE}

[sip]
enabled = false

[websocket]
port = 0
handshakes_per_s = 0  # the flood comes from one loopback address at once
trust_loopback = true

[smart_turn]
enabled = false

[agents]
providers = "scripted"
script = "{script}"
smart_turn = false
lead_margin_ms = 0
max_calls = 64

[calls]
path = "{tmp / 'records'}"
""")


async def call(port: int, speech: np.ndarray) -> dict:
    """One call: speak the question, wait for the bot's first audio, hang up. Returns
    ``{"started": bool, "latency_ms", "close": (code, reason)}``."""
    out: dict = {"started": False, "latency_ms": None, "close": None}
    loud = np.flatnonzero(np.abs(speech.astype(np.int32)) > 300)
    last_loud_frame = (int(loud[-1]) if len(loud) else len(speech) - 1) // FRAME
    frames = [speech[i:i + FRAME] for i in range(0, len(speech) - FRAME + 1, FRAME)]
    silence = np.zeros(FRAME, dtype="<i2").tobytes()
    async with connect(f"ws://127.0.0.1:{port}/ws/default", max_size=2**20) as ws:
        stream = NativeStream(RATE)
        await ws.send(stream.start())
        try:
            first = server_message(orjson.loads(await asyncio.wait_for(ws.recv(), 10.0)))
        except ConnectionClosed as e:
            out["close"] = (e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else "")
            return out
        assert first.event == "started", first
        out["started"] = True
        state: dict = {"speech_end": None, "first_audio": None}

        async def rx() -> None:
            async for m in ws:
                if isinstance(m, bytes) and state["speech_end"] is not None and state["first_audio"] is None:
                    if np.any(np.frombuffer(m, dtype="<i2")):
                        state["first_audio"] = time.monotonic()

        task = asyncio.create_task(rx())
        queue = [silence] * 10 + [f.astype("<i2").tobytes() for f in frames]
        end_index = 10 + last_loud_frame
        next_t = time.monotonic()
        deadline = next_t + len(queue) * 0.02 + ANSWER_TIMEOUT_S
        i = 0
        while time.monotonic() < deadline and state["first_audio"] is None:
            await ws.send(queue[i] if i < len(queue) else silence)
            if i == end_index:
                state["speech_end"] = time.monotonic()
            i += 1
            next_t += 0.02
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
        for _ in range(10):  # a little more audio after the answer started, then hang up
            await ws.send(silence)
            await asyncio.sleep(0.02)
        await ws.send(stream.stop())
        try:
            async with asyncio.timeout(2.0):
                await task
        except (TimeoutError, ConnectionClosed):
            task.cancel()
        if state["first_audio"] is not None:
            out["latency_ms"] = (state["first_audio"] - state["speech_end"]) * 1000.0
    return out


@pytest.mark.serial  # turn latency p95 against a solo baseline
def test_flood_of_twice_max_calls_admits_exactly_the_limit_in_time_and_refuses_the_rest(short_tmp):
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == RATE
    script = short_tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": ["what time do you close"], "bot": ["We close at ten tonight."]}))
    d = Daemon(short_tmp, config=daemon_config(short_tmp, script), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(60)
        port = ws_port(d.child(snap, "gateway-0"))

        solos = []
        for _ in range(SOLO_CALLS):  # one after the other: the baseline of an idle daemon
            r = asyncio.run(call(port, speech))
            assert r["started"] and r["latency_ms"] is not None, r
            solos.append(r["latency_ms"])
            d.wait_for(lambda s: d.child(s, "gateway-0")["stats"]["calls_active"] == 0, 10, "the solo call released")
        solo_p95 = float(np.percentile(solos, 95))

        async def flood() -> list[dict]:
            return await asyncio.gather(*(call(port, speech) for _ in range(2 * LIMIT)))

        results = asyncio.run(flood())
        admitted = [r for r in results if r["started"]]
        refused = [r for r in results if not r["started"]]
        assert len(admitted) == LIMIT, results
        assert len(refused) == LIMIT, results
        for r in refused:
            code, reason = r["close"]
            assert code == 1013 and reason, r
        lat = sorted(r["latency_ms"] for r in admitted if r["latency_ms"] is not None)
        assert len(lat) == LIMIT, f"some admitted calls heard no answer: {admitted}"
        p95 = float(np.percentile(lat, 95))
        print(f"solo {[round(x) for x in solos]} ms; {LIMIT} admitted: p95 {p95:.0f} ms {[round(x) for x in lat]}; "
              f"refused: {sorted({r['close'] for r in refused})}")
        assert p95 <= solo_p95 + MARGIN_MS, (
            f"admitted calls' turn latency p95 {p95:.0f} ms > solo p95 {solo_p95:.0f} ms + {MARGIN_MS:.0f}: {lat}")

        def drained(s: dict) -> bool:
            gw = d.child(s, "gateway-0")["stats"]
            ag = d.child(s, "agent-0")["stats"]
            return gw["calls_active"] == 0 and ag.get("calls_ended", 0) == ag.get("calls_started", 0) == LIMIT + SOLO_CALLS

        s = d.wait_for(drained, 15, "every admitted call released in the gateway and ended in the agent")
        gw = d.child(s, "gateway-0")["stats"]
        assert gw["calls_refused_full"] == LIMIT, gw
        assert gw["calls_admitted"] == gw["calls_released"] == LIMIT + SOLO_CALLS, gw
        assert not any(k.startswith("calls_refused_") and k != "calls_refused_full" and v for k, v in gw.items()), gw
        assert d.instance
        table = d.child(s, "gateway-0")["stats"]["call"]
        assert table == {}, table
        left = sorted(p.name for p in SHM_DIR.glob(f"brisvox.{d.instance}.c*"))  # call rings: <instance>.<call id>.*
        assert not left, f"call rings left in {SHM_DIR}: {left}"
    finally:
        d.close()
