"""Inboxes, lanes, drops, back-pressure, DropStale and guarded sends."""

from __future__ import annotations

import asyncio

import numpy as np

from brisvox.agent.pipeline.stage.base import EpochWatch, Inbox, Stage, TaskOwner
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    BotEnded,
    BotStarted,
    Interrupt,
    LlmText,
    Stop,
    UserStartedSpeaking,
    Wake,
)
from brisvox.clock import CLOCK
from brisvox.sim.vloop import run_virtual


def audio(i: int) -> AudioFrame:
    return AudioFrame(i * 320, np.zeros(320, dtype=np.int16))


def test_system_lane_overtakes_data_and_lossy_drops_oldest():
    async def main():
        ib = Inbox("x", 2, lossy=True)
        for i in range(4):
            ib.put_nowait(audio(i))
        ib.put_nowait(UserStartedSpeaking(0.0, 0))
        assert ib.dropped == 2
        f = await ib.get()
        assert isinstance(f, UserStartedSpeaking)
        assert [(await ib.get()).pos for _ in range(2)] == [640, 960]

    run_virtual(main)


def test_end_of_speech_signals_are_never_dropped_by_a_full_upstream_lane():
    """BotStarted / BotEnded past the upstream lane's cap (32) are queued, in order, and counted
    as over the cap; a Wake (a helper's verdict) past the cap is dropped and counted."""

    async def main():
        ib = Inbox("turn", 8, sys_cap=32)
        sent = []
        for e in range(1, 41):
            sent += [BotStarted(e, float(e)), BotEnded(e, "mark"), BotEnded(e, "silent")]
        assert all(ib.put_nowait(f) for f in sent)
        assert not ib.put_nowait(Wake("verdict", (1, 0.9)))
        assert ib.up_dropped == 1 and ib.up_over == len(sent) - 32
        got = [await ib.get() for _ in range(len(sent))]
        assert got == sent and len(ib) == 0
        assert ib.put_nowait(Wake("verdict", (2, 0.9)))  # room again: a Wake is taken
        st = ib.stats()
        assert st["up_dropped"] == 1 and st["up_over"] == 88

    run_virtual(main)


def test_stop_and_interrupt_are_taken_by_a_full_system_lane():
    async def main():
        ib = Inbox("x", 8, sys_cap=2)
        assert ib.put_nowait(UserStartedSpeaking(0.0, 0)) and ib.put_nowait(UserStartedSpeaking(0.1, 0))
        assert not ib.put_nowait(UserStartedSpeaking(0.2, 0)) and ib.sys_dropped == 1
        assert ib.put_nowait(Interrupt(3, 2, 0.3)) and ib.put_nowait(Stop())
        assert ib.sys_over == 2 and len(ib) == 4

    run_virtual(main)


def test_lossless_lane_refuses_nowait_and_back_pressures_put():
    async def main():
        ib = Inbox("x", 1)
        assert ib.put_nowait(audio(0))
        assert not ib.put_nowait(audio(1)) and ib.dropped == 1
        t = asyncio.ensure_future(ib.put(audio(2)))
        await asyncio.sleep(0.01)
        assert not t.done()
        await ib.get()
        await asyncio.sleep(0)
        assert t.done()

    run_virtual(main)


class Rec(Stage):
    DROP_STALE = True

    def __init__(self, *a):
        super().__init__(*a)
        self.seen = []

    async def process(self, frame):
        self.seen.append(frame)


def test_drop_stale_and_guarded_send():
    async def main():
        tasks = TaskOwner("t")
        watch = EpochWatch()
        call = CallContext.detached("t", clock=CLOCK, watch=watch, tasks=tasks)
        rec = Rec(call, None, Inbox("rec", 8))
        src = Stage(call, None, Inbox("src", 8))
        src.pipe(rec)
        rec.start()
        rec.inbox.put_nowait(LlmText(2, 0, "new"))
        rec.inbox.put_nowait(LlmText(1, 0, "stale"))
        rec.inbox.put_nowait(Interrupt(3, 2, 0.0))
        await asyncio.sleep(0.01)
        # the Interrupt overtakes both queued texts, which are then stale
        assert [type(f).__name__ for f in rec.seen] == ["Interrupt"] and rec.stale_dropped == 2
        rec.inbox.put_nowait(LlmText(3, 0, "current"))
        await asyncio.sleep(0.01)
        assert rec.seen[-1].text == "current"
        watch.bump(5)
        assert not await src.guarded_send(LlmText(4, 0, "late"))
        assert src.stale_dropped == 1
        rec.inbox.put_nowait(Stop())
        await asyncio.sleep(0.01)
        assert rec.stopped
        assert await tasks.close() == 0 and tasks.live() == 0

    run_virtual(main)
