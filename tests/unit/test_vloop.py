"""Virtual time: advances only when idle, jumps to the next timer, detects deadlock."""

from __future__ import annotations

import asyncio

import pytest

from brisvox.clock import CLOCK
from brisvox.sim.vloop import VirtualDeadlock


def test_parallel_sleeps_take_the_longest(vrun):
    async def main():
        t0 = CLOCK.now()
        await asyncio.gather(CLOCK.sleep(0.1), CLOCK.sleep(0.1))
        return CLOCK.now() - t0

    assert vrun(main) == pytest.approx(0.1, abs=1e-9)


def test_hour_runs_instantly_and_timeouts_fire(vrun):
    async def main():
        with pytest.raises(TimeoutError):
            async with CLOCK.timeout(5):
                await CLOCK.sleep(3600)
        await CLOCK.sleep_until(CLOCK.now() + 3600)
        return CLOCK.now()

    assert vrun(main) == pytest.approx(3605)


def test_time_stands_still_while_tasks_run(vrun):
    async def main():
        t0 = CLOCK.now()
        for _ in range(1000):
            await asyncio.sleep(0)
        return CLOCK.now() - t0

    assert vrun(main) == 0


def test_deadlock_is_reported(vrun):
    async def main():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(VirtualDeadlock):
        vrun(main)
