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
from ipc.frames import WorkerTick
from ipc.worker_client import AttachError, WorkerClient
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
                if c.calls["a"].worker == 1 and any(e.get("reason") == "worker_lost" for _, e in events):
                    break
            assert c.calls["a"].worker == 1
            assert "a" not in p.workers[0].calls  # detached from the old worker first
            stops = [e for _, e in events if e["kind"] == "stop"]
            assert len(stops) == 1 and stops[0]["reason"] == "worker_lost"
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
            assert [e.get("reason") for _, e in events if e["kind"] == "stop"] == ["worker_lost"]
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


def test_ticks_from_a_worker_that_does_not_own_the_call_are_ignored(env):
    inst, rings, pool = env
    p = pool(1)
    events: list = []

    async def go():
        c = await _client(p, [0], events)
        try:
            rings("a")
            await c.attach("a", inst, 8000, 16000)
            c._on_tick(WorkerTick(worker=7, seq=1, positions={"a": 999_999},
                                  events=[{"call_id": "a", "kind": "start", "pos": 1, "ns": 0}], sent_ns=0))
            assert events == [] and c.calls["a"].in16_pos != 999_999 and c.counters["stale_ticks"] == 1
        finally:
            await _close(c)

    run(go())
