"""Memory back to the kernel once a role has no call: once per idle period, never while a
call is live, on the loop's clock (virtual here) or from the worker's tick thread."""

from __future__ import annotations

import asyncio

from brisvox.runtime import memory
from brisvox.runtime.memory import IdleTrim, ThreadIdleTrim, release_memory
from brisvox.sim.vloop import run_virtual


def test_release_memory_collects_and_trims() -> None:
    assert isinstance(release_memory(), bool)


def test_idle_trim_runs_once_per_idle_period_and_a_call_cancels_it(monkeypatch) -> None:
    ran: list[float] = []

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(memory, "release_memory", lambda: ran.append(loop.time()) or True)
        t = IdleTrim(delay_s=2.0)
        t0 = loop.time()
        t.note(0)
        t.note(0)  # still the same idle period
        await asyncio.sleep(1.0)
        t.note(1)  # a call came: nothing runs
        await asyncio.sleep(3.0)
        t.note(0)
        await asyncio.sleep(5.0)
        t.note(0)
        await asyncio.sleep(0.5)
        return [x - t0 for x in ran]

    assert run_virtual(main) == [6.0]  # 2 s after the second idle period began, once


def test_idle_trim_without_a_loop_does_nothing() -> None:
    IdleTrim().note(0)


def test_thread_idle_trim_once_per_idle_period(monkeypatch) -> None:
    ran: list[float] = []
    monkeypatch.setattr(memory, "release_memory", lambda: ran.append(1.0) or True)
    t = ThreadIdleTrim(delay_s=2.0)
    for now, calls in [(0.0, 3), (1.0, 0), (2.5, 0), (3.1, 0), (4.0, 0), (5.0, 1), (6.0, 0), (8.5, 0)]:
        t.poll(calls, now)
    assert t.runs == 2 and len(ran) == 2  # at 3.1 (idle since 1.0) and at 8.5 (idle since 6.0)
