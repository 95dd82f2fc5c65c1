"""Inbox.get parks on a bare future (one getter, the stage task) and its deadline is a loop timer.

A put wakes the parked getter; a deadline returns None at that virtual instant
(or at once when already past); a frame put before the deadline is returned
with no wait past it; a cancelled getter leaves the inbox usable.
"""

from __future__ import annotations

import asyncio

import numpy as np

from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.pipeline_frames import AudioFrame, Stop
from brisvox.sim.vloop import run_virtual


def _audio(i: int) -> AudioFrame:
    return AudioFrame(i * 320, np.zeros(320, dtype=np.int16))


def test_a_put_wakes_the_parked_getter_and_a_deadline_returns_none():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ib = Inbox("x", 4)
        t0 = loop.time()
        assert await ib.get(t0 + 0.5) is None
        assert abs(loop.time() - t0 - 0.5) < 1e-9
        assert await ib.get(t0) is None and abs(loop.time() - t0 - 0.5) < 1e-9  # past: at once

        async def later() -> None:
            await asyncio.sleep(0.2)
            ib.put_nowait(_audio(1))
            ib.put_nowait(Stop())

        task = asyncio.create_task(later())
        t1 = loop.time()
        f = await ib.get(t1 + 1.0)
        assert isinstance(f, Stop) and abs(loop.time() - t1 - 0.2) < 1e-9  # system lane first
        assert (await ib.get()).pos == 320
        await task
        # nothing queued, no deadline: parked until the next put
        waiter = asyncio.create_task(ib.get())
        await asyncio.sleep(3.0)
        assert not waiter.done()
        ib.put_nowait(_audio(2))
        assert (await waiter).pos == 640

    run_virtual(main)


def test_a_cancelled_getter_leaves_the_inbox_usable():
    async def main() -> None:
        ib = Inbox("x", 4)
        waiter = asyncio.create_task(ib.get(asyncio.get_running_loop().time() + 5.0))
        await asyncio.sleep(0.1)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        ib.put_nowait(_audio(3))
        assert (await ib.get()).pos == 960

    run_virtual(main)
