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


def test_one_loop_timer_serves_a_deadline_kept_over_many_frames():
    """A stage that keeps one deadline over 50 frames arms one loop timer, not one per
    wait; a new deadline re-arms, no deadline disarms, and the kept timer still ends
    the wait at the deadline's virtual instant."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        real_call_at = loop.call_at

        def counting_call_at(when, cb, *args, **kw):  # the real loop timer; the inbox's counted
            if cb is not asyncio.futures._set_result_unless_cancelled:  # not asyncio.sleep's own
                armed.append(when)
            return real_call_at(when, cb, *args, **kw)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        ib = Inbox("x", 4)
        t0 = loop.time()
        deadline = t0 + 5.0

        async def frames() -> None:
            for i in range(50):
                await asyncio.sleep(0.02)
                ib.put_nowait(_audio(i))

        feeder = asyncio.create_task(frames())
        for i in range(50):
            f = await ib.get(deadline)
            assert f is not None and f.pos == i * 320
        await feeder
        assert armed == [deadline]  # one timer for the 50 waits
        assert await ib.get(deadline) is None  # ... and it still fires at the deadline
        assert abs(loop.time() - deadline) < 1e-9
        assert await ib.get(deadline) is None and len(armed) == 1  # past: at once, no timer
        t1 = loop.time()
        ib.put_nowait(_audio(99))
        assert (await ib.get(t1 + 1.0)).pos == 99 * 320  # queued: no timer at all
        assert len(armed) == 1
        waiter = asyncio.create_task(ib.get(t1 + 1.0))
        await asyncio.sleep(0.1)
        assert armed[-1] == t1 + 1.0
        ib.put_nowait(_audio(100))
        assert (await waiter).pos == 100 * 320
        waiter = asyncio.create_task(ib.get())  # no deadline: the armed timer is dropped
        await asyncio.sleep(2.0)
        assert not waiter.done()  # t1 + 1.0 passed: a kept timer would have woken it
        ib.put_nowait(_audio(101))
        assert (await waiter).pos == 101 * 320
        ib.cancel_timer()

    run_virtual(main)


def test_a_timer_that_fires_between_waits_wakes_nobody_and_the_next_get_sees_the_deadline():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ib = Inbox("x", 4)
        t0 = loop.time()
        waiter = asyncio.create_task(ib.get(t0 + 0.5))
        await asyncio.sleep(0.1)
        ib.put_nowait(_audio(1))
        assert (await waiter).pos == 320
        await asyncio.sleep(1.0)  # the kept timer fires now, with no getter parked
        assert await ib.get(t0 + 0.5) is None and abs(loop.time() - t0 - 1.1) < 1e-9
        ib.put_nowait(_audio(2))
        assert (await ib.get(t0 + 5.0)).pos == 640  # a later deadline: the frame, no stale wake

    run_virtual(main)
