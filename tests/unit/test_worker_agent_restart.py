"""A restarted agent process keeps its identity (``agent-0``) but not its incarnation:
the worker retires the dead incarnation's calls at once.

* On the worker's attached calls and dispatch (no sockets): a second incarnation's
  SubscriberHello (or AttachCall) detaches every call the first attached and
  unmaps its rings (which the gateway already unlinked: they would otherwise
  stay mapped as deleted segments); the same incarnation's hello again (a
  reconnect) keeps them; another identity's calls are untouched.
* Over real sockets: a WorkerClient that vanishes without detaching, then a new
  client under the same identity; the worker drops the old calls as soon as
  the new client links, with no call of its own and long before the orphan
  timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
import zmq.asyncio

from ipc.frames import AttachCall, Attached, SubscriberHello
from ipc.worker_client import WorkerClient
from tests.unit.test_worker_client import Pool
from tests.unit.test_worker_core import EnergyBatch
from workers.config import SmartTurnConfig, VadConfig, WorkersConfig
from workers.core import Worker, WorkerModels
from workers.harness import KINDS, close_rings, create_call_rings


def mapped(names: set[str]) -> set[str]:
    """Which of these /dev/shm segments this process still maps."""
    with open("/proc/self/maps") as f:
        text = f.read()
    return {n for n in names if f"/dev/shm/{n}" in text}


def ring_names(inst: str, call_id: str) -> set[str]:
    from ipc.ring import ring_name

    return {ring_name(inst, call_id, k) for k in KINDS}


@pytest.fixture
def table(shm_clean):
    """A loaded worker (energy VAD) without sockets, and the gateway's side of the rings."""
    w = Worker(0, "ipc:///nonexistent", WorkerModels(silero=Path("x"), smart_turn=None),
               WorkersConfig(max_calls=8), VadConfig(), SmartTurnConfig(enabled=False),
               silero_factory=lambda p, cap, th: EnergyBatch(cap))
    w.load()
    made: dict[str, dict] = {}

    def attach(call_id: str, sub: str, inc: str) -> None:
        made[call_id] = create_call_rings(shm_clean, call_id, 8000, 16000, seconds=1.0)
        r = w.attached.attach(AttachCall(call_id=call_id, subscriber=sub, instance=shm_clean, call_rate=8000,
                                tts_rate=16000, incarnation=inc))
        assert isinstance(r, Attached), r

    def gateway_release(call_id: str) -> None:
        close_rings(made.pop(call_id))  # unlink + unmap the gateway's own view

    yield w, attach, gateway_release, shm_clean
    w.close()
    for rings in made.values():
        close_rings(rings)


def test_a_new_incarnations_hello_retires_the_old_ones_calls_and_unmaps_their_rings(table, caplog):
    w, attach, release, inst = table
    attach("a1", "agent-0", "inc-1")
    attach("a2", "agent-0", "inc-1")
    attach("b1", "agent-1", "other")
    old = ring_names(inst, "a1") | ring_names(inst, "a2")
    for c in ("a1", "a2", "b1"):
        release(c)  # the gateway ended the calls (the agent died) and unlinked the rings
    assert mapped(old) == old  # only the worker maps them now: deleted segments, still mapped
    assert w.dispatch.handle(b"agent-0", SubscriberHello(incarnation="inc-1")) is None  # a reconnect
    assert set(w.calls) == {"a1", "a2", "b1"}
    with caplog.at_level(logging.WARNING, logger="brisvox.workers"):
        w.dispatch.handle(b"agent-0", SubscriberHello(incarnation="inc-2"))  # the restarted process
    assert set(w.calls) == {"b1"} and set(w.attached.by_sub) == {"agent-1"}
    assert mapped(old) == set()
    assert mapped(ring_names(inst, "b1")) == ring_names(inst, "b1")  # other agents untouched
    assert len(w.attached.free_slots) == 7
    assert (w.stats.retired_calls, w.stats.retirements) == (2, 1)
    lines = [r.getMessage() for r in caplog.records if "previous incarnation" in r.getMessage()]
    assert len(lines) == 1 and "detached the 2 calls" in lines[0] and "agent-0" in lines[0]
    assert w.report_stats()["calls_by_subscriber"] == {"agent-1": 1}
    w.dispatch.handle(b"agent-0", SubscriberHello(incarnation="inc-2"))  # nothing left to retire
    w.dispatch.handle(b"agent-1", SubscriberHello(incarnation=""))  # says nothing: retires nothing
    assert set(w.calls) == {"b1"} and w.stats.retirements == 1


def test_an_attach_from_a_new_incarnation_retires_too_and_the_same_one_keeps_its_calls(table):
    w, attach, release, inst = table
    attach("a1", "agent-0", "inc-1")
    attach("a2", "agent-0", "inc-1")  # same incarnation: a1 stays
    assert set(w.calls) == {"a1", "a2"}
    attach("a3", "agent-0", "inc-2")  # its hello was lost: the attach says it
    assert set(w.calls) == {"a3"} and w.calls["a3"].incarnation == "inc-2"
    assert w.stats.retired_calls == 2
    attach("a4", "agent-0", "")  # a subscriber that does not say retires nothing
    assert set(w.calls) == {"a3", "a4"}


async def _client(ep: str, incarnation: str | None = None) -> WorkerClient:
    c = WorkerClient(zmq.asyncio.Context(), "agent-0", {0: ep}, incarnation=incarnation)
    await c.start()
    return c


async def _vanish(c: WorkerClient) -> None:
    """The process dies: its sockets close, nothing is detached."""
    await c.close()
    c.ctx.term()


async def _wait(pred, timeout: float) -> float:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "timed out"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


@pytest.mark.serial  # the calls retired within 1.5 s
@pytest.mark.parametrize("same", [False, True], ids=["restarted", "reconnected"])
def test_over_sockets_a_new_client_of_the_identity_retires_the_vanished_ones_calls(short_tmp, shm_clean, same):
    pool = Pool(short_tmp, 1)
    made = {c: create_call_rings(shm_clean, c, 8000, 16000, seconds=1.0) for c in ("x1", "x2")}
    w = pool.workers[0]

    async def go() -> None:
        first = await _client(pool.ep(0), "fixed" if same else None)
        for c in made:
            await first.attach(c, shm_clean, 8000, 16000)
        assert len(w.calls) == 2
        await _vanish(first)
        second = await _client(pool.ep(0), "fixed" if same else None)
        try:
            if same:  # a reconnect of the same incarnation: its calls stay
                await asyncio.sleep(0.3)
                assert len(w.calls) == 2 and w.stats.retired_calls == 0
            else:
                took = await _wait(lambda: not w.calls, 2.0)
                assert took < 1.5 and w.stats.retired_calls == 2 and w.stats.orphan_detaches == 0
                assert second.counters["hellos"] >= 1 and second.counters["hello_failed"] == 0
        finally:
            await _vanish(second)

    try:
        asyncio.run(asyncio.wait_for(go(), 20))
    finally:
        pool.close()
        for rings in made.values():
            close_rings(rings)


def test_a_lost_hello_is_said_again_when_the_worker_ticks_calls_the_client_does_not_have(short_tmp, shm_clean):
    pool = Pool(short_tmp, 1)
    rings = create_call_rings(shm_clean, "y1", 8000, 16000, seconds=1.0)
    w = pool.workers[0]

    async def go() -> None:
        first = await _client(pool.ep(0))
        await first.attach("y1", shm_clean, 8000, 16000)
        await _vanish(first)
        second = WorkerClient(zmq.asyncio.Context(), "agent-0", {0: pool.ep(0)})
        second._hello = lambda link: None  # type: ignore[method-assign]  # the first hello is lost
        await second.start()
        try:
            await asyncio.sleep(0.3)
            assert "y1" in w.calls  # nobody said anything yet
            del second._hello  # hellos work again: the worker's keepalive ticks prompt one
            await _wait(lambda: not w.calls, 3.0)
            assert w.stats.retired_calls == 1
        finally:
            await _vanish(second)

    try:
        asyncio.run(asyncio.wait_for(go(), 20))
    finally:
        pool.close()
        close_rings(rings)
