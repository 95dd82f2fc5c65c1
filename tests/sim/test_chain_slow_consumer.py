"""A bidirectional stage chain with a slow consumer does not deadlock (the upstream rule).

Three real stages (:class:`~brisvox.agent.pipeline.stage.base.Stage`, lossless data inboxes
of 4, system and upstream lanes of 32), wired by
:func:`~brisvox.agent.pipeline.chain.assemble` with BotStarted and BotEnded routed back to
the first one, under a producer that pushes with back-pressure (as the pump does):

* the last stage is slow (5 ms per frame) and answers every frame upstream (and every
  100th with a burst of 40, past the upstream lane's cap);
* the first stage answers every upstream frame with one more data frame (awaited, so it
  blocks on the full chain exactly while upstream frames are owed to it);
* the middle stage sends upstream too.

Upstream frames are only ever ``put_nowait`` (through the call's UpstreamRouter), so
every frame in both directions is delivered, none is dropped, and the chain ends by
itself on Stop within a bound of virtual time. The control run replaces the upstream
push by an awaited put into the first stage's (bounded) data lane, the one thing the
rule forbids, and the same chain wedges: the bound is what the test enforces.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from brisvox.agent.host.actor import ActorConfig
from brisvox.agent.pipeline.call_config import QueueConfig
from brisvox.agent.pipeline.chain import CallParts, InboxShape, StageSpec, assemble
from brisvox.agent.pipeline.stage.base import Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    BotEnded,
    BotStarted,
    PipelineFrame,
    Stop,
)
from brisvox.sim.vloop import run_virtual

N = 1500  # frames the producer pushes
SLOW = 0.005  # the consumer's time per frame
BURST = 40  # upstream frames the consumer sends at once every 100 frames
BOUND = 60.0  # virtual seconds: (N data frames + N echoes) * SLOW is 15 s


def chunk(i: int) -> AudioFrame:
    return AudioFrame(i, np.zeros(4, dtype=np.int16))


@dataclass
class Tally:
    upstream_at_first: int = 0
    echoes_sent: int = 0
    at_last: int = 0
    awaited_upstream: bool = False  # the control: an awaited upstream push (forbidden)
    all_in: asyncio.Event = field(default_factory=asyncio.Event)  # every frame and echo reached the consumer


class First(Stage):
    """Forwards data; every upstream frame is answered with one more data frame."""

    tally: Tally

    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, BotStarted | BotEnded):
            self.tally.upstream_at_first += 1
            if isinstance(frame, BotEnded) and frame.reason == "slow":
                self.tally.echoes_sent += 1
                await self.send(chunk(-1))  # back-pressure into a chain that is full
            return
        await self.send(frame)


class Middle(Stage):
    tally: Tally

    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, AudioFrame) and frame.pos >= 0 and frame.pos % 10 == 0:
            await self._up(BotStarted(0, float(frame.pos)))
        await self.send(frame)

    async def _up(self, f: PipelineFrame) -> None:
        if self.tally.awaited_upstream:
            first = self.call.upstream._routes[type(f)]
            await first.put(AudioFrame(-2, np.zeros(1, dtype=np.int16)))  # forbidden: awaited, bounded
        else:
            self.call.upstream.send(f)


class Last(Stage):
    """The slow consumer: every frame costs SLOW and is answered upstream."""

    tally: Tally

    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, AudioFrame):
            await self.clock.sleep(SLOW)
            self.tally.at_last += 1
            if self.tally.at_last == 2 * N:
                self.tally.all_in.set()
            if frame.pos >= 0:
                if self.tally.awaited_upstream:
                    first = self.call.upstream._routes[BotEnded]
                    await first.put(AudioFrame(-3, np.zeros(1, dtype=np.int16)))
                else:
                    self.call.upstream.send(BotEnded(0, "slow"))
                    if frame.pos % 100 == 0:  # a burst past the upstream lane's cap
                        for _ in range(BURST):
                            self.call.upstream.send(BotStarted(0, float(frame.pos)))


def _chain(call: CallContext, tally: Tally) -> list[Stage]:
    def cls(base: type[Stage]) -> type[Stage]:
        return type(base.__name__, (base,), {"tally": tally})

    specs = (
        StageSpec("first", cls(First), lambda c, _: None, InboxShape("user"), upstream=(BotStarted, BotEnded)),
        StageSpec("middle", cls(Middle), lambda c, _: None, InboxShape("sink")),
        StageSpec("last", cls(Last), lambda c, _: None, InboxShape("sink")),
    )
    cfg = replace(ActorConfig(), queues=QueueConfig(user=4, sink=4, system=32))
    return assemble(specs, call, cfg, CallParts(None, None, None))


async def _run(tally: Tally) -> tuple[list[Stage], float]:
    loop = asyncio.get_running_loop()
    call = CallContext.detached("stress")
    stages = _chain(call, tally)
    for s in stages:
        s.start()
    t0 = loop.time()
    try:
        async with asyncio.timeout(BOUND):
            for i in range(N):
                await stages[0].inbox.put(chunk(i))  # the producer waits on back-pressure, as the pump does
            await tally.all_in.wait()
            stages[0].inbox.put_nowait(Stop())
            await asyncio.gather(*(s.task for s in stages if s.task is not None))
    finally:
        await call.tasks.close(1.0)
    return stages, loop.time() - t0


def test_a_slow_consumer_answering_upstream_never_deadlocks_the_chain() -> None:
    tally = Tally()
    stages, took = run_virtual(lambda: _run(tally))
    first, middle, last = stages
    assert tally.at_last == 2 * N and tally.echoes_sent == N
    assert tally.upstream_at_first == N + N // 10 + N // 100 * BURST  # every upstream frame arrived
    assert all(s.stopped for s in stages)
    for s in stages:
        st = s.inbox.stats()
        assert st["dropped"] == 0 and st["sys_dropped"] == 0 and st["up_dropped"] == 0, (s.name, st)
    assert first.inbox.stats()["up_over"] > 0  # the upstream lane went past its cap of 32 and lost nothing
    assert max(s.inbox.max_queued for s in stages) <= 4  # the data lanes stayed bounded
    assert 2 * N * SLOW <= took < BOUND, took


def test_control_an_awaited_upstream_push_wedges_the_same_chain() -> None:
    tally = Tally(awaited_upstream=True)
    with pytest.raises(TimeoutError):
        run_virtual(lambda: _run(tally))
    assert tally.at_last < 2 * N
