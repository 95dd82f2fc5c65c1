"""Real worker processes: 50 calls on 2 workers, one worker killed with SIGKILL mid-speech.

The test plays the gateway (creates the rings, feeds caller audio in real
time from a separate process) and the supervisor (notices the death by pid
and tells the subscriber, as brisvoxd's Topology push does); the subscriber
is the production :class:`ipc.worker_client.WorkerClient`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from ipc.bus import endpoint
from ipc.ring import SHM_DIR
from ipc.worker_client import WorkerClient
from workers.harness import Feeder, WorkerProc, close_rings, create_call_rings

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
N_CALLS = 50
RATE = 8000


def _fixture(name: str):
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.load(name, RATE)


@pytest.mark.serial  # the calls move within 500 ms
def test_killing_a_worker_mid_speech_moves_its_calls_within_500ms(short_tmp, shm_clean):
    audio, entry = _fixture("vad_dialog")
    seg1 = entry["segments16"][0]  # first phrase, in16 positions
    inst = shm_clean
    eps = {i: endpoint(short_tmp, f"w{i}") for i in range(2)}
    procs = [WorkerProc(i, eps[i], max_calls=64) for i in range(2)]
    rings = {}
    feeder = None
    try:
        for p in procs:
            p.start()
        for i in range(N_CALLS):
            rings[f"call{i}"] = create_call_rings(inst, f"call{i}", RATE, 16000, seconds=8.0)
        result = asyncio.run(_scenario(inst, eps, procs, rings, audio, seg1, short_tmp))
        feeder = result.pop("feeder")
    finally:
        if feeder is not None:
            feeder.stop()
        for p in procs:
            p.stop()
        for r in rings.values():
            close_rings(r)
    pids = [p.pid for p in procs]
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "worker processes left behind"
    assert not (short_tmp / "w1.sock").exists(), "the stopped worker left its inbox socket"
    assert not list(SHM_DIR.glob(f"brisvox.{inst}.*"))

    moved, kept, t_kill = result["moved"], result["kept"], result["t_kill"]
    assert len(moved) == N_CALLS // 2 and len(kept) == N_CALLS // 2
    for call_id in moved:
        evs = result["events"][call_id]
        kinds = [(e.KIND, getattr(e, "reason", "")) for _, e in evs]
        # the speech that was in progress is closed once, by the synthesized stop
        assert kinds[0] == ("start", "") and kinds[1] == ("stop", "worker_lost"), (call_id, kinds)
        t_stop = evs[1][0]
        assert t_stop - t_kill < 0.5e9, f"{call_id}: stop {(t_stop - t_kill) / 1e6:.0f} ms after the kill"
        # VAD resumes on the new worker within 500 ms: its first tick, and a start for the ongoing speech
        t_first = result["first_tick"][call_id]
        assert t_first - t_kill < 0.5e9, f"{call_id}: first tick {(t_first - t_kill) / 1e6:.0f} ms after the kill"
        assert kinds[2] == ("start", ""), (call_id, kinds)
        assert evs[2][0] - t_kill < 0.5e9, f"{call_id}: VAD start {(evs[2][0] - t_kill) / 1e6:.0f} ms after the kill"
        # and the rest of the call is served normally: the phrase's stop near its true end, then phrase 2
        assert kinds[3] == ("stop", "")
        assert abs(evs[3][1].pos - seg1[1]) <= 512
        assert kinds[4:6] == [("start", ""), ("stop", "")]
        # the stop was dated where the old worker's in16 ended: inside the phrase
        assert seg1[0] < evs[1][1].pos < seg1[1]
    worst = {k: max((v[c] - t_kill) / 1e6 for c in moved) for k, v in (
        ("stop", {c: result["events"][c][1][0] for c in moved}),
        ("first tick", result["first_tick"]),
        ("start", {c: result["events"][c][2][0] for c in moved}))}
    print("after the kill, worst of 25 calls (ms):", {k: round(v, 1) for k, v in worst.items()})
    for call_id in kept:
        kinds = [e.KIND for _, e in result["events"][call_id]]
        assert kinds[:4] == ["start", "stop", "start", "stop"], (call_id, kinds)
        assert all(getattr(e, "reason", "") == "" for _, e in result["events"][call_id])


async def _scenario(inst, eps, procs, rings, audio, seg1, tmp):
    ctx = zmq.asyncio.Context()
    events: dict[str, list] = {c: [] for c in rings}
    first_tick: dict[str, int] = {}
    state = {"t_kill": 0, "moved": set()}

    def on_event(call_id, ev):
        events[call_id].append((time.monotonic_ns(), ev))

    def on_position(call_id, pos):
        if state["t_kill"] and call_id in state["moved"] and call_id not in first_tick:
            link = client.calls[call_id]
            if link.worker == 1:
                first_tick[call_id] = time.monotonic_ns()

    client = WorkerClient(ctx, "agent-0", eps, on_event=on_event, on_position=on_position)
    await client.start()
    try:
        for call_id in rings:
            await client.attach(call_id, inst, RATE, 16000)
        by_worker = {i: sorted(client.workers[i].calls) for i in (0, 1)}
        feeder = Feeder([r["in"].name for r in rings.values()], audio, RATE, seconds=8.0, workdir=tmp)
        feeder.start()
        # wait until every call is inside its first phrase, then kill worker 0
        kill_at = feeder.t0_ns + int((seg1[0] + (seg1[1] - seg1[0]) // 2) / 16000 * 1e9)
        await asyncio.sleep(max(0.0, (kill_at - time.monotonic_ns()) / 1e9))
        assert all(client.calls[c].speaking_since >= 0 for c in rings), "not every call was speaking"
        state["moved"] = set(by_worker[0])
        state["t_kill"] = time.monotonic_ns()
        os.kill(procs[0].pid, 9)
        # the supervisor's part: notice the death by pid and push it
        await asyncio.to_thread(procs[0].proc.wait, 5)
        await client.worker_lost(0)
        await asyncio.sleep(7.0)
        assert client.counters["reattaches"] == N_CALLS // 2
        return {"events": events, "first_tick": first_tick, "t_kill": state["t_kill"],
                "moved": by_worker[0], "kept": by_worker[1], "feeder": feeder}
    finally:
        await client.close()
        ctx.term()
