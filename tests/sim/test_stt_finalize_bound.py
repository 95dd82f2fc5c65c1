"""The STT stage's Finalize bounds on virtual time: the real SttStage over the sim's fake STT.

* The command queue: while the provider's ``finalize`` send is stuck, a burst
  of VAD stops queues at most ``finalize_queue`` (32) Finalizes; the rest are
  never sent and are answered synthetically, after every queued one, counted
  (``finalize_overflow``). Each of the 40 stops gets exactly one
  UtteranceFinal.
* The ledger of unanswered Finalizes: a provider that answers late holds 32
  unanswered; a Finalize past that is not sent and is answered synthetically
  right after the newest unanswered one is answered, so UtteranceFinals keep
  the order of the stops.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from brisvox.agent.pipeline.cascade.stt_stage import SttStage, SttStageConfig
from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    Start,
    Stop,
    UserStoppedSpeaking,
    UtteranceFinal,
)
from brisvox.clock import CLOCK
from brisvox.providers.word_codec import Vocab
from brisvox.sim.fakes import FakeStt, SttFault
from brisvox.sim.vloop import run_virtual
from tests.sim.stage_kit import Collect

STOPS = 40


@dataclass
class GatedStt:
    """The fake STT whose sessions' ``finalize`` sends wait for ``gate`` (a stuck socket), then take
    10 ms each."""

    fake: FakeStt
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0

    @property
    def name(self) -> str:
        return self.fake.name

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    async def connect(self, config: Any, timeout: float) -> Any:  # noqa: ASYNC109
        s = await self.fake.connect(config, timeout)
        orig = s.finalize

        async def finalize(t: float) -> None:
            await self.gate.wait()
            await asyncio.sleep(0.01)
            self.sent += 1
            await orig(t)

        s.finalize = finalize
        return s


async def burst(provider: Any, before_release: Any) -> tuple[list[UtteranceFinal], dict[str, int], int]:
    """40 VAD stops 10 ms apart; ``before_release(stage)`` runs 1 s later; the stage stopped at 5 s.
    Returns the UtteranceFinals in order, the stage's counters, the most Finalizes ever queued."""
    call = CallContext.detached("bound", clock=CLOCK)
    stage = SttStage(call, SttStageConfig(), Inbox("stt", 64, sys_cap=256), provider)
    sink = Collect(call)
    stage.pipe(sink)
    stage.start()
    sink.start()
    stage.inbox.put_nowait(Start())
    await asyncio.sleep(0.2)  # connected
    await stage.inbox.put(AudioFrame(0, np.zeros(320, dtype=np.int16)))
    await asyncio.sleep(0.05)  # processed: every stop below is queued at once, none held
    most = 0
    for _ in range(STOPS):
        stage.inbox.put_nowait(UserStoppedSpeaking(CLOCK.now(), 320))
        await asyncio.sleep(0.01)
        most = max(most, len(stage._finalizes))
    await asyncio.sleep(1.0)
    before_release(stage)
    await asyncio.sleep(3.8)
    stage.inbox.put_nowait(Stop("test"))
    assert stage.task is not None
    await asyncio.wait([stage.task], timeout=3)
    await call.tasks.close()
    finals = [f for f in sink.frames if isinstance(f, UtteranceFinal)]
    return finals, stage.stats(), most


def test_a_finalize_burst_behind_a_stuck_send_queues_32_and_answers_the_rest_synthetically() -> None:
    # once released, each Finalize is answered 1 ms after its send: the ledger never fills
    prov = GatedStt(FakeStt(Vocab(), faults=[SttFault(final_delay=0.001)]))

    async def main() -> tuple[list[UtteranceFinal], dict[str, int], int]:
        return await burst(prov, lambda stage: prov.gate.set())

    finals, st, most = run_virtual(main)
    assert most == 32  # the command queue never held more (the first Finalize is in the stuck send)
    assert len(finals) == STOPS  # one UtteranceFinal per Finalize, always
    assert st["finalizes"] == STOPS and st["finalize_overflow"] == STOPS - 33
    assert prov.sent == 33 and prov.fake.probe.finalizes == 33  # the overflow never reached the provider
    assert st["answered"] == 33 and st["synthetic"] == STOPS - 33
    # the overflow came after every queued Finalize: answered last
    assert [f.synthetic for f in finals] == [False] * 33 + [True] * (STOPS - 33)


def test_finalizes_past_32_unanswered_are_not_sent_and_are_answered_in_their_place() -> None:
    # every Finalize answered 1.5 s late: the burst leaves 32 unanswered before the first answer
    prov = FakeStt(Vocab(), faults=[SttFault(final_delay=1.5)])

    async def main() -> tuple[list[UtteranceFinal], dict[str, int], int]:
        return await burst(prov, lambda stage: None)

    finals, st, most = run_virtual(main)
    assert most <= 1  # the session task took each one at once
    assert len(finals) == STOPS
    assert prov.probe.finalizes == 32  # the ledger's bound
    assert st["finalize_overflow"] == STOPS - 32 and st["finalize_timeouts"] == 0
    assert st["answered"] == 32 and st["synthetic"] == STOPS - 32
    # the 8 past the bound were answered right after the newest unanswered one, not before
    assert [f.synthetic for f in finals] == [False] * 32 + [True] * (STOPS - 32)
