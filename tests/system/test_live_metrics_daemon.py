"""The daemon's /metrics while calls run: turns show up as they end, and real-time calls
do not stall the agent's or the gateway's event loop.

The whole daemon (gateway, worker, agent process, scripted providers: the harness of
``test_call_daemon.py``, ``bench/harness/call_daemon.py``) on loopback:

* one WebSocket call of three turns: after each answer played, ``GET /metrics`` on the
  daemon's metrics port shows that turn in the turn-latency, LLM first-token and LLM
  round histograms while the call is still up (no call has ended);
* 20 simultaneous real-time calls (each with a barge-in, ``one_call``): the loop-stall
  probe of the agent process and of the gateway counts no stall over 50 ms of the loop's
  own making during them (``brisvox_loop_stalls_total{cause="loop"}`` before and after;
  ``cause="host"``, the thread waiting for a CPU on a host shared with other test runs,
  is reported, not judged), and every role has its probe series.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import orjson
import pytest
import soundfile as sf

from bench.harness.call_daemon import SPEECH, config
from bench.harness.daemon import Daemon, ws_port
from brisvox.sim.ws_caller import ANSWER, FRAME, RATE, SECOND, hang_up, one_call
from brisvox.wire.native import NativeStream, server_message
from tests.system.daemon_promparse import parse, value

pytestmark = pytest.mark.system

ANSWERS = ["Sure, we open at nine.", "Yes, there is parking.", "You are welcome, goodbye."]


def scrape(d: Daemon) -> dict:
    status, text = d.metrics_text()
    assert status == 200
    return parse(text)


def calls_ended(fams: dict) -> float:
    return sum(v for (_, _), v in fams["brisvox_calls_ended_total"]["samples"].items())


async def wait_metric(d: Daemon, measure: Callable[[dict], float], at_least: float, timeout: float) -> dict:
    """/metrics once ``measure`` of it reaches ``at_least`` (or the last scrape at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        fams = await asyncio.to_thread(scrape, d)
        if measure(fams) >= at_least or time.monotonic() > deadline:
            return fams
        await asyncio.sleep(0.2)


def turns(fams: dict) -> float:
    return value(fams, "brisvox_turn_latency_seconds_count")


async def three_turns(d: Daemon, port: int, speech: np.ndarray) -> list[dict]:
    """Speak, wait for the answer to play out, scrape /metrics; three times; then hang up."""
    from websockets.asyncio.client import connect

    seen: list[dict] = []
    silence = np.zeros(FRAME, dtype="<i2")
    frames = [speech[i: i + FRAME] for i in range(0, len(speech) - FRAME + 1, FRAME)]
    async with connect(f"ws://127.0.0.1:{port}/ws/default", max_size=2**20) as ws:
        stream = NativeStream(RATE)
        await ws.send(stream.start())
        started = server_message(orjson.loads(await ws.recv()))
        assert started.event == "started", started
        heard = {"loud": 0, "last": 0.0}

        async def rx() -> None:
            async for m in ws:
                if isinstance(m, bytes) and np.any(np.frombuffer(m, dtype="<i2")):
                    heard["loud"] += 1
                    heard["last"] = time.monotonic()

        async def send(queue: list[np.ndarray], until: float | None = None) -> None:
            """Real time, 20 ms a frame: the queue, then silence until ``until`` (monotonic)."""
            nxt = time.monotonic()
            while queue or (until is not None and time.monotonic() < until):
                await ws.send((queue.pop(0) if queue else silence).astype("<i2").tobytes())
                nxt += 0.02
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))

        task = asyncio.create_task(rx())
        await send([silence] * 25)
        for turn in range(1, 4):
            loud_before = heard["loud"]
            await send(list(frames))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # the answer starts, then plays out (1 s without audio)
                if heard["loud"] > loud_before and time.monotonic() - heard["last"] > 1.0:
                    break
                await send([], until=time.monotonic() + 0.2)
            assert heard["loud"] > loud_before, f"turn {turn}: no answer"
            # keep the line fed while /metrics catches up (the agent reports every 0.5 s)
            keep = asyncio.create_task(send([], until=time.monotonic() + 8))
            fams = await wait_metric(d, turns, turn, 8)
            keep.cancel()
            seen.append(fams)
        await hang_up(ws, stream, task)
    return seen


def test_a_calls_turns_are_on_metrics_while_it_lasts(short_tmp):
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == RATE
    script = short_tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": ["when do you open", "is there parking", "thanks"], "bot": ANSWERS}))
    d = Daemon(short_tmp, config=config(short_tmp, script), real_roles=True)
    try:
        d.start()
        port = ws_port(d.child(d.wait_ready(60), "gateway-0"))
        seen = asyncio.run(three_turns(d, port, speech))
        for turn, fams in enumerate(seen, start=1):
            assert calls_ended(fams) == 0, "the call is still up"
            assert value(fams, "brisvox_turn_latency_seconds_count") == turn
            assert value(fams, "brisvox_llm_first_token_seconds_count") == turn  # one model round a turn
            assert value(fams, "brisvox_llm_round_seconds_count") == turn
            assert value(fams, "brisvox_tts_first_audio_seconds_count") == turn
            assert 0 < value(fams, "brisvox_turn_latency_seconds_sum") < 5 * turn
        after = asyncio.run(wait_metric(d, calls_ended, 1, 10))
        assert calls_ended(after) == 1
        assert value(after, "brisvox_turn_latency_seconds_count") == 3  # the hang-up counted none again
        assert value(after, "brisvox_llm_rounds_dropped_total") == 0
    finally:
        d.close()


def stall_lines(d: Daemon) -> list[str]:
    """The daemon's stall log lines (each with the stack of what its loop ran)."""
    return [ln for ln in d.logs().splitlines() if "event loop stalled" in ln]


def stalls(fams: dict, role: str, cause: str = "loop") -> float:
    return value(fams, "brisvox_loop_stalls_total", role=role, index="0", cause=cause)


# Not serial: it judges only the stalls the process's own code caused (cause="loop"); a stall
# where the loop's thread waited for a CPU is the host's (cause="host", the kernel's run_delay)
# and is printed, not judged, so a loaded host does not fail it.
def test_twenty_real_time_calls_cause_no_loop_stall_in_the_agent_or_the_gateway(short_tmp):
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == RATE
    script = short_tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": ["what time do you close", "wait a moment"], "bot": [ANSWER, SECOND]}))
    d = Daemon(short_tmp, config=config(short_tmp, script), real_roles=True)
    n_calls = 20
    try:
        d.start()
        port = ws_port(d.child(d.wait_ready(60), "gateway-0"))
        time.sleep(1.0)  # the boot's own work (the agent's gc freeze) is behind us
        before = scrape(d)
        for role in ("supervisor", "gateway", "agent", "worker"):  # every role runs its probe
            assert value(before, "brisvox_loop_lag_seconds_count", role=role, index="0") > 0, role

        async def all_calls() -> list[dict]:
            async def staggered(i: int) -> dict:
                await asyncio.sleep(i * 0.05)
                return await one_call(port, speech, seed=i)

            return await asyncio.gather(*(staggered(i) for i in range(n_calls)))

        results = asyncio.run(all_calls())
        assert all(r["first_audio"] is not None and r["clear_at"] is not None for r in results)
        after = asyncio.run(wait_metric(d, calls_ended, n_calls, 20))
        assert calls_ended(after) == n_calls
        seen = {role: {"max_lag_s": value(after, "brisvox_loop_lag_max_seconds", role=role, index="0"),
                       "host_stalls": stalls(after, role, "host") - stalls(before, role, "host")}
                for role in ("gateway", "agent")}
        print("loop probe over the calls:", seen)
        for role in ("gateway", "agent"):
            grew = value(after, "brisvox_loop_lag_seconds_count", role=role, index="0") - value(
                before, "brisvox_loop_lag_seconds_count", role=role, index="0")
            assert grew > 20 * 10, (role, grew)  # the probe ran through the calls (20 a second)
            assert stalls(after, role) - stalls(before, role) == 0, (role, seen, stall_lines(d))
    finally:
        d.close()
