"""Early finalize on virtual time: the real SttStage over the sim's word-decoding fake STT.

With ``early_finalize`` the Finalize of a fall goes out at the VAD's falling event:

* the stop of the same fall (same ``pos``, no start between) sends no second
  Finalize and gets exactly one UtteranceFinal, carrying the words, whether the
  early answer came before the stop or after it;
* a caller who spoke on (a newer falling, a stop of another ``pos``, a start)
  leaves the early Finalize an orphan: its words are emitted, no UtteranceFinal,
  so they join the next stop's final (one UtteranceFinal per stop, always);
* off (the default), a falling changes nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.agent.pipeline.cascade.stt_stage import SttStage, SttStageConfig
from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    PipelineFrame,
    Start,
    Stop,
    UserSpeechFalling,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscript,
    UtteranceFinal,
)
from brisvox.clock import CLOCK
from brisvox.providers.word_codec import Vocab, encode
from brisvox.sim.fakes import FakeStt, SttFault
from brisvox.sim.vloop import run_virtual
from tests.sim.stage_kit import Collect

RATE = 16000


class Harness:
    """One SttStage fed words at positions; the frames it emits, in order."""

    def __init__(self, prov: Any, early: bool) -> None:
        self.vocab = prov.vocab
        self.call = CallContext.detached("early", clock=CLOCK)
        self.stage = SttStage(self.call, SttStageConfig(early_finalize=early), Inbox("stt", 64, sys_cap=256), prov)
        self.sink = Collect(self.call)
        self.stage.pipe(self.sink)
        self.pos = 0

    async def start(self) -> None:
        self.stage.start()
        self.sink.start()
        self.stage.inbox.put_nowait(Start())
        await asyncio.sleep(0.2)

    async def say(self, *words: str) -> int:
        """The words' audio into the stage; the in16 position after them."""
        samples, _ = encode(self.vocab, list(words), RATE)
        await self.stage.inbox.put(AudioFrame(self.pos, samples))
        self.pos += len(samples)
        return self.pos

    async def event(self, frame: PipelineFrame, then: float = 0.0) -> None:
        self.stage.inbox.put_nowait(frame)
        await asyncio.sleep(then)

    async def stop(self) -> tuple[list[PipelineFrame], dict[str, int]]:
        await asyncio.sleep(1.0)
        self.stage.inbox.put_nowait(Stop("test"))
        assert self.stage.task is not None
        await asyncio.wait([self.stage.task], timeout=3)
        await self.call.tasks.close()
        return self.sink.frames, self.stage.stats()


def finals_per_stop(frames: list[PipelineFrame]) -> list[str]:
    """The final text between UtteranceFinals, one entry per UtteranceFinal."""
    out: list[str] = []
    cur: list[str] = []
    for f in frames:
        if isinstance(f, UserTranscript) and f.final:
            cur.append(f.text)
        elif isinstance(f, UtteranceFinal):
            out.append(" ".join(cur))
            cur = []
    return out


def kinds(frames: list[PipelineFrame]) -> list[str]:
    names = {UserSpeechFalling: "falling", UserStoppedSpeaking: "stop", UtteranceFinal: "UF",
             UserStartedSpeaking: "start"}
    out = []
    for f in frames:
        if type(f) in names:
            out.append(names[type(f)])
        elif isinstance(f, UserTranscript) and f.final:
            out.append("final")
    return out


def test_the_stop_of_the_fall_reuses_the_early_finalize_answered_before_it() -> None:
    prov = FakeStt(Vocab(), faults=[SttFault(final_delay=0.05)])

    async def main() -> tuple[list[PipelineFrame], dict[str, int], float, float]:
        h = Harness(prov, early=True)
        await h.start()
        await h.event(UserStartedSpeaking(CLOCK.now(), 0))
        end = await h.say("book", "a", "table")
        await h.event(UserSpeechFalling(CLOCK.now(), end), then=0.1)  # answered 50 ms after the falling
        answered = next(i for i, f in enumerate(h.sink.frames) if isinstance(f, UserTranscript) and f.final)
        t_stop = CLOCK.now()
        await h.event(UserStoppedSpeaking(CLOCK.now(), end), then=0.001)
        t_uf = CLOCK.now() if any(isinstance(f, UtteranceFinal) for f in h.sink.frames) else -1.0
        frames, st = await h.stop()
        assert answered >= 0
        return frames, st, t_stop, t_uf

    frames, st, t_stop, t_uf = run_virtual(main)
    assert finals_per_stop(frames) == ["book a table"]
    assert kinds(frames) == ["start", "falling", "final", "stop", "UF"]  # text, then the stop, then its UF
    assert t_uf > 0 and t_uf - t_stop < 0.0015  # closed within 1 ms of the stop: no wait for the provider
    assert prov.probe.finalizes == 1  # no second Finalize
    assert st["early_finalizes"] == 1 and st["early_claimed"] == 1 and st["early_orphaned"] == 0


def test_the_stop_before_the_early_answer_gets_it_as_its_own() -> None:
    prov = FakeStt(Vocab(), faults=[SttFault(final_delay=0.15)])

    async def main() -> tuple[list[PipelineFrame], dict[str, int]]:
        h = Harness(prov, early=True)
        await h.start()
        await h.event(UserStartedSpeaking(CLOCK.now(), 0))
        end = await h.say("two", "people", "tonight")
        await h.event(UserSpeechFalling(CLOCK.now(), end), then=0.1)
        assert not any(isinstance(f, UserTranscript) and f.final for f in h.sink.frames)
        await h.event(UserStoppedSpeaking(CLOCK.now(), end))
        return await h.stop()

    frames, st = run_virtual(main)
    assert finals_per_stop(frames) == ["two people tonight"]
    assert kinds(frames) == ["start", "falling", "stop", "final", "UF"]
    assert prov.probe.finalizes == 1
    assert st["early_claimed"] == 1 and st["answered"] == 1 and st["synthetic"] == 0


def test_speech_resumed_after_the_falling_joins_the_next_stops_final() -> None:
    prov = FakeStt(Vocab(), faults=[SttFault(final_delay=0.05)])

    async def main() -> tuple[list[PipelineFrame], dict[str, int]]:
        h = Harness(prov, early=True)
        await h.start()
        await h.event(UserStartedSpeaking(CLOCK.now(), 0))
        first = await h.say("i", "would", "like")
        await h.event(UserSpeechFalling(CLOCK.now(), first), then=0.1)  # answered: an orphan-to-be
        end = await h.say("a", "window", "seat")  # the caller went on: no start, a newer fall
        await h.event(UserSpeechFalling(CLOCK.now(), end), then=0.02)
        await h.event(UserStoppedSpeaking(CLOCK.now(), end))
        # a second turn that resumed after its falling: the stop carries another pos
        await h.event(UserStartedSpeaking(CLOCK.now(), h.pos))
        mid = await h.say("at", "eight")
        await h.event(UserSpeechFalling(CLOCK.now(), mid), then=0.1)
        end2 = await h.say("please")
        await h.event(UserStoppedSpeaking(CLOCK.now(), end2))
        return await h.stop()

    frames, st = run_virtual(main)
    assert finals_per_stop(frames) == ["i would like a window seat", "at eight please"]
    assert sum(isinstance(f, UtteranceFinal) for f in frames) == 2  # one per stop
    assert prov.probe.finalizes == 4  # three early (two orphans), one of the second stop
    assert st["early_finalizes"] == 3 and st["early_claimed"] == 1 and st["early_orphaned"] == 2


def test_a_start_after_the_falling_orphans_the_early_finalize() -> None:
    prov = FakeStt(Vocab(), faults=[SttFault(final_delay=0.05)])

    async def main() -> tuple[list[PipelineFrame], dict[str, int]]:
        h = Harness(prov, early=True)
        await h.start()
        await h.event(UserStartedSpeaking(CLOCK.now(), 0))
        end = await h.say("hello")
        await h.event(UserSpeechFalling(CLOCK.now(), end))
        await h.event(UserStartedSpeaking(CLOCK.now(), end), then=0.1)  # (a test of the rule: a start)
        end = await h.say("there")
        await h.event(UserStoppedSpeaking(CLOCK.now(), end))
        return await h.stop()

    frames, st = run_virtual(main)
    assert finals_per_stop(frames) == ["hello there"]
    assert st["early_orphaned"] == 1 and st["early_claimed"] == 0


def test_a_dead_session_still_closes_the_claimed_stop_once() -> None:
    prov = FakeStt(Vocab(), faults=[SttFault(hang_finalize=True)])

    async def main() -> tuple[list[PipelineFrame], dict[str, int]]:
        h = Harness(prov, early=True)
        await h.start()
        await h.event(UserStartedSpeaking(CLOCK.now(), 0))
        end = await h.say("cancel", "my", "booking")
        await h.event(UserSpeechFalling(CLOCK.now(), end), then=0.1)
        await h.event(UserStoppedSpeaking(CLOCK.now(), end))
        await asyncio.sleep(4.0)  # past timeouts.finalize: the session is declared dead
        return await h.stop()

    frames, st = run_virtual(main)
    ufs = [f for f in frames if isinstance(f, UtteranceFinal)]
    assert len(ufs) == 1 and ufs[0].synthetic
    assert st["finalize_timeouts"] == 1 and st["early_claimed"] == 1


def test_off_a_falling_sends_nothing() -> None:
    prov = FakeStt(Vocab(), faults=[SttFault(final_delay=0.05)])

    async def main() -> tuple[list[PipelineFrame], dict[str, int]]:
        h = Harness(prov, early=False)
        await h.start()
        await h.event(UserStartedSpeaking(CLOCK.now(), 0))
        end = await h.say("book", "a", "table")
        await h.event(UserSpeechFalling(CLOCK.now(), end), then=0.1)
        assert prov.probe.finalizes == 0
        await h.event(UserStoppedSpeaking(CLOCK.now(), end))
        return await h.stop()

    frames, st = run_virtual(main)
    assert finals_per_stop(frames) == ["book a table"]
    assert prov.probe.finalizes == 1 and st["early_finalizes"] == 0
