"""The subscriber-side client against in-process workers (real sockets, real rings, energy VAD):
failover on refusal, graceful moves off a stopping worker, a local stop when no worker is left,
late workers from Topology pushes, stale ticks ignored."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq.asyncio

from ipc.bus import endpoint
from ipc.frames import LlmJobDelta, OutUtterance, Ping, TtsJobAudio, WorkerTick
from ipc.tick_events import SpeechStart, SpeechStop, to_wire
from ipc.worker_client import READY_WAIT_S, AttachError, WorkerClient
from tests.unit.test_worker_core import EnergyBatch
from workers.config import SmartTurnConfig, VadConfig, WorkersConfig
from workers.core import Worker, WorkerModels
from workers.harness import close_rings, create_call_rings


class Pool:
    def __init__(self, tmp: Path, n: int, max_calls: int = 8) -> None:
        self.tmp = tmp
        self.workers: dict[int, Worker] = {}
        self.threads: dict[int, tuple[threading.Thread, threading.Event]] = {}
        for i in range(n):
            self.start(i, max_calls)

    def ep(self, i: int) -> str:
        return endpoint(self.tmp, f"w{i}")

    def start(self, i: int, max_calls: int = 8) -> None:
        w = Worker(i, self.ep(i), WorkerModels(silero=Path("x"), smart_turn=None),
                   WorkersConfig(max_calls=max_calls), VadConfig(min_speech_ms=64),
                   SmartTurnConfig(enabled=False), silero_factory=lambda p, c, t: EnergyBatch(c))
        w.load()
        w.bind()
        stop = threading.Event()
        t = threading.Thread(target=w.run, args=(stop,), daemon=True)
        t.start()
        self.workers[i] = w
        self.threads[i] = (t, stop)

    def stop(self, i: int) -> None:
        t, ev = self.threads.pop(i)
        ev.set()
        t.join(5)
        self.workers.pop(i).close()

    def close(self) -> None:
        for i in list(self.threads):
            self.stop(i)


@pytest.fixture
def env(short_tmp, shm_clean):
    made: dict[str, dict] = {}
    pools: list[Pool] = []

    def rings(call_id: str) -> dict:
        made[call_id] = create_call_rings(shm_clean, call_id, 8000, 16000, seconds=4.0)
        return made[call_id]

    def pool(n: int, **kw) -> Pool:
        p = Pool(short_tmp, n, **kw)
        pools.append(p)
        return p

    yield shm_clean, rings, pool
    for p in pools:
        p.close()
    for r in made.values():
        close_rings(r)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def _client(pool: Pool, ids: list[int], events: list | None = None, **kw) -> WorkerClient:
    ctx = zmq.asyncio.Context()
    c = WorkerClient(ctx, "agent-0", {i: pool.ep(i) for i in ids},
                     on_event=(lambda cid, ev: events.append((cid, ev))) if events is not None else None, **kw)
    c._test_ctx = ctx  # type: ignore[attr-defined]
    await c.start()
    return c


async def _close(c: WorkerClient) -> None:
    await c.close()
    c._test_ctx.term()  # type: ignore[attr-defined]


def loud(n: int) -> np.ndarray:
    return np.random.default_rng(0).normal(0, 3000, n).astype(np.int16)


def test_attach_spreads_calls_and_falls_over_when_a_worker_is_full(env):
    inst, rings, pool = env
    p = pool(2, max_calls=2)

    async def go():
        c = await _client(p, [0, 1])
        try:
            with pytest.raises(AttachError, match="bad_ring"):  # about the call: not retried elsewhere
                await c.attach("nope", inst, 8000, 16000)
            for i in range(4):
                rings(f"c{i}")
                await c.attach(f"c{i}", inst, 8000, 16000, worker=0)
            assert sorted(len(w.calls) for w in c.workers.values()) == [2, 2]
            rings("c4")
            with pytest.raises(AttachError, match="full"):
                await c.attach("c4", inst, 8000, 16000)
            assert "c4" not in c.calls and "nope" not in c.calls
        finally:
            await _close(c)

    run(go())


def test_a_stopping_worker_hands_its_calls_over_without_two_writers(env):
    inst, rings, pool = env
    p = pool(2)
    events: list = []

    async def go():
        c = await _client(p, [0, 1], events)
        try:
            r = rings("a")
            await c.attach("a", inst, 8000, 16000, worker=0)
            r["in"].write(loud(4000))
            for _ in range(50):
                await asyncio.sleep(0.02)
                if c.calls["a"].speaking_since >= 0:
                    break
            assert c.calls["a"].speaking_since >= 0
            c.on_topology([{"role": "worker", "index": 0, "state": "stopping"}])
            for _ in range(100):
                await asyncio.sleep(0.02)
                if c.calls["a"].worker == 1 and any(getattr(e, "reason", "") == "worker_lost" for _, e in events):
                    break
            assert c.calls["a"].worker == 1
            assert "a" not in p.workers[0].calls  # detached from the old worker first
            stops = [e for _, e in events if isinstance(e, SpeechStop)]
            assert len(stops) == 1 and stops[0].reason == "worker_lost"
        finally:
            await _close(c)

    run(go())


def test_a_stopping_worker_with_nowhere_to_hand_over_keeps_serving_its_calls(env):
    """A drain of the whole daemon shows every worker ``stopping``: detaching the calls then
    (there is no other worker) would leave them without a VAD for the rest of the drain."""
    inst, rings, pool = env
    p = pool(1)
    events: list = []

    async def go():
        c = await _client(p, [0], events)
        try:
            rings("a")
            await c.attach("a", inst, 8000, 16000, worker=0)
            c.on_topology([{"role": "worker", "index": 0, "state": "stopping"}])
            await asyncio.sleep(0.3)
            assert c.calls["a"].worker == 0 and "a" in p.workers[0].calls
            assert not [e for _, e in events if getattr(e, "reason", "") == "worker_lost"]
            assert c.ready_workers() == []  # and no new call goes there
        finally:
            await _close(c)

    run(go())


def test_with_no_worker_left_the_client_closes_speech_itself_and_waits(env):
    inst, rings, pool = env
    p = pool(1)
    events: list = []

    async def go():
        c = await _client(p, [0], events)
        try:
            r = rings("a")
            await c.attach("a", inst, 8000, 16000)
            r["in"].write(loud(4000))
            for _ in range(50):
                await asyncio.sleep(0.02)
                if c.calls["a"].speaking_since >= 0:
                    break
            p.stop(0)
            c.on_topology([{"role": "worker", "index": 0, "state": "exited"}])
            await asyncio.sleep(0.1)
            assert [e.reason for _, e in events if isinstance(e, SpeechStop)] == ["worker_lost"]
            assert c.calls["a"].worker == -1 and c.counters["local_stops"] == 1
            p.start(0)  # the supervisor restarted it
            c.on_topology([{"role": "worker", "index": 0, "state": "ready"}])
            for _ in range(100):
                await asyncio.sleep(0.02)
                if c.calls["a"].worker == 0 and "a" in p.workers[0].calls:
                    break
            assert c.calls["a"].worker == 0 and "a" in p.workers[0].calls
        finally:
            await _close(c)

    run(go())


def test_a_worker_first_seen_in_a_topology_push_is_linked(env):
    inst, rings, pool = env
    p = pool(2)

    async def go():
        c = await _client(p, [0], endpoint_for=p.ep)
        try:
            c.on_topology([{"role": "worker", "index": 1, "state": "ready"}])
            await asyncio.sleep(0.05)
            assert c.ready_workers() == [0, 1]
            rings("a")
            rings("b")
            await c.attach("a", inst, 8000, 16000)
            await c.attach("b", inst, 8000, 16000)
            assert {c.calls["a"].worker, c.calls["b"].worker} == {0, 1}
        finally:
            await _close(c)

    run(go())


@pytest.mark.serial  # attached within the 0.5 s ready wait
def test_an_attach_with_no_worker_ready_waits_a_moment_for_one(env):
    """The gateway and this process learn of a worker's ``ready`` from two Topology pushes: a
    call the gateway sends at once must not be refused because this one's push is a moment late."""
    inst, rings, pool = env
    p = pool(1)

    async def go():
        c = await _client(p, [], endpoint_for=p.ep)
        try:
            rings("a")
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, c.on_topology, [{"role": "worker", "index": 0, "state": "ready"}])
            t0 = loop.time()
            link = await c.attach("a", inst, 8000, 16000, worker=0)
            assert link.worker == 0 and 0.05 < loop.time() - t0 < READY_WAIT_S
            rings("b")
            c.workers[0].ready = False  # none ready, none coming: refused after the wait
            t0 = loop.time()
            with pytest.raises(AttachError, match="no ready worker"):
                await c.attach("b", inst, 8000, 16000)
            assert loop.time() - t0 >= READY_WAIT_S * 0.9 and "b" not in c.calls
        finally:
            await _close(c)

    run(go())


def test_ticks_from_a_worker_that_does_not_own_the_call_are_ignored(env):
    inst, rings, pool = env
    p = pool(1)
    events: list = []

    async def go():
        c = await _client(p, [0], events)
        try:
            rings("a")
            await c.attach("a", inst, 8000, 16000)
            start = to_wire(SpeechStart(call_id="a", pos=1, at=512, ns=0))
            c._on_tick(WorkerTick(worker=7, seq=1, positions={"a": 999_999}, events=[start], sent_ns=0))
            assert events == [] and c.calls["a"].in16_pos != 999_999 and c.counters["stale_ticks"] == 1
        finally:
            await _close(c)

    run(go())


def test_tick_events_reach_the_owner_typed_and_a_bad_one_is_counted_and_dropped(env):
    inst, rings, pool = env
    p = pool(1)
    events: list = []

    async def go():
        c = await _client(p, [0], events)
        try:
            rings("a")
            await c.attach("a", inst, 8000, 16000)
            start = SpeechStart(call_id="a", pos=100, at=612, ns=5)
            stop = SpeechStop(call_id="a", pos=900, at=4000, ns=6, reason="gap")
            bad = {"call_id": "a", "kind": "start", "pos": "100", "at": 612, "ns": 5}
            c._on_tick(WorkerTick(worker=0, seq=1, positions={}, events=[to_wire(start), bad], sent_ns=0))
            assert events == [("a", start)] and c.calls["a"].speaking_since == 100
            assert c.counters["bad_events"] == 1
            c._on_tick(WorkerTick(worker=0, seq=2, positions={}, events=[to_wire(stop)], sent_ns=0))
            assert events[-1] == ("a", stop) and c.calls["a"].speaking_since == -1
        finally:
            await _close(c)

    run(go())


def test_the_worker_client_routes_job_frames_and_counts_unexpected_ones(caplog):
    got: list = []
    c = WorkerClient(None, "agent-0", {}, on_out_utterance=got.append, on_job_frame=got.append)  # type: ignore[arg-type]
    frames = [OutUtterance(call_id="a", utterance=1, epoch=1, out_pos=0),
              LlmJobDelta(call_id="a", job=1, seq=0, text="hi"),
              TtsJobAudio(call_id="a", job=2, ring="r", rate=16000, start_pos=0, end_pos=10)]
    for f in frames:
        c._on_frame(f)
    assert got == frames
    c._on_frame(Ping(seq=1, sent_ns=0))
    c._on_frame(Ping(seq=2, sent_ns=0))
    assert got == frames and c.counters["unexpected_type"] == 2
    assert sum("unexpected ping frame" in r.message for r in caplog.records) == 1
