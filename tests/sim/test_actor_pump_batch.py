"""The pump's audio batching for STT providers that take batches (``audio_batch``).

* The scenario suite s01-s11 runs with the sim's STT declaring a batch: the
  same structural invariants as tests/sim/test_actor_scenarios.py (interrupts,
  turns, no stale audio, context == played prefix, no leaks) and the same
  user turns and bot answers as the unbatched run of each scenario.
* With a batch, the pump offers audio to the STT stage only once the batch is
  pending or a VAD event is due (the event never overtakes its own speech in
  the pump), and the turn driver still sees every tick's in16 position.
"""

from __future__ import annotations

import numpy as np
import pytest

import brisvox.sim.harness as harness
from brisvox.agent.conversation.context import AssistantMessage, UserMessage
from brisvox.agent.host.actor import CallActor
from brisvox.agent.pipeline.stage.pipeline_frames import AudioFrame, UserStoppedSpeaking
from brisvox.providers.seeded_fakes import FakeLlm, FakeTts
from brisvox.providers.word_codec import Vocab
from brisvox.sim.fakes import FakeStt
from brisvox.sim.harness import oracle_mismatches, simulate
from brisvox.sim.memring import MemRing
from brisvox.sim.scenarios import EXPECTED_INTERRUPTS, EXPECTED_TURNS, SCENARIOS
from brisvox.sim.vloop import run_virtual
from ipc.tick_events import SpeechStop


class BatchingStt(FakeStt):
    audio_batch = 0.08


def _run(name: str, batched: bool):
    call, _ = SCENARIOS[name]()
    orig = harness.FakeStt
    harness.FakeStt = BatchingStt if batched else FakeStt  # type: ignore[misc]
    try:
        return run_virtual(lambda: simulate(call))
    finally:
        harness.FakeStt = orig  # type: ignore[misc]


def _talk(res):
    msgs = list(res.actor.context)
    return ([m.content for m in msgs if isinstance(m, UserMessage)],
            [(m.text, len(m.tool_calls)) for m in msgs if isinstance(m, AssistantMessage)])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_hold_with_a_batching_stt(name):
    res = _run(name, batched=True)
    assert res.actor.pump.frames < res.platform.ticks / 2  # batched: far fewer frames than ticks
    assert res.interrupts == EXPECTED_INTERRUPTS[name]
    assert res.actor.runner.st.turns == EXPECTED_TURNS[name]
    assert res.platform.stale_tts_after_clear == 0
    assert res.platform.wire.frames_after_clear == []
    assert oracle_mismatches(res) == []
    res.actor.context.validate()
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    assert _talk(res) == _talk(_run(name, batched=False))


class _Link:
    def to_gateway(self, frame):
        pass

    def to_worker(self, frame):
        pass

    async def smart_turn(self, end_pos, timeout):
        return None


def _actor(batch: float) -> tuple[CallActor, MemRing]:
    vocab = Vocab()
    stt = BatchingStt(vocab) if batch else FakeStt(vocab)
    src = MemRing(16000)
    actor = CallActor("c", harness.default_actor_config(), stt=stt,
                      llm=FakeLlm([]), tts=FakeTts(vocab), source=src, sink=MemRing(8000), link=_Link(),
                      call_rate=8000, tts_rate=8000)
    return actor, src


def test_the_pump_batches_audio_and_flushes_it_before_a_vad_event():
    async def main():
        actor, src = _actor(0.08)
        inbox = actor.stt.inbox
        actor.on_worker(0)  # the pump starts at the first tick's position
        for _ in range(3):  # 60 ms pending: below the batch
            src.write(np.full(320, 1000, dtype=np.int16))
            actor.on_worker(src.write_pos)
            assert actor.driver._last_audio_end == src.write_pos  # the position, every tick
        assert len(inbox._data) == 0
        src.write(np.full(320, 1000, dtype=np.int16))
        actor.on_worker(src.write_pos)  # 80 ms: one frame with all of it
        assert [(f.pos, f.end) for f in inbox._data] == [(0, 1280)]
        src.write(np.full(320, 1000, dtype=np.int16))
        actor.on_worker(src.write_pos, [SpeechStop(call_id="c", pos=1500, at=1600, ns=0)])
        frames = list(inbox._data)
        assert [(f.pos, f.end) for f in frames] == [(0, 1280), (1280, 1600)]
        assert all(isinstance(f, AudioFrame) for f in frames)
        assert [type(f) for f in inbox._sys] == [UserStoppedSpeaking]

    run_virtual(main)


def test_without_a_batch_every_tick_is_a_frame():
    async def main():
        actor, src = _actor(0.0)
        actor.on_worker(0)
        for _ in range(3):
            src.write(np.full(320, 1000, dtype=np.int16))
            actor.on_worker(src.write_pos)
        assert [(f.pos, f.end) for f in actor.stt.inbox._data] == [(0, 320), (320, 640), (640, 960)]
        assert actor.driver._last_audio_end == 960

    run_virtual(main)
