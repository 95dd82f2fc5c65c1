"""The STT stage's incident paths on virtual time: the real SttStage over the real resilience layer.

* A session death with the provider down: the layer's recovery fails, the
  stage's three reconnects (1 s apart, counted from the death) fail, the
  stage is degraded; an utterance while degraded is answered synthetically
  (an empty turn: the caller hears nothing for it, the record counts it);
  the next speech start grants a fresh budget and, the provider back and its
  breaker half-open, the session is recovered and that utterance answered.
* A Finalize that is never answered: the session is declared dead after
  ``timeouts.finalize``, replaced one backoff later, and the next utterance
  is transcribed whole.
* The 1 s Finalize cap: a stop that overtakes audio which reaches the stage
  more than 1 s later sends its Finalize exactly ``max_finalize_defer`` after
  the stop.
* A provider that stalls on an audio send: the audio queue overflows
  (drop-newest, counted) and the utterance's end still arrives (one
  Finalize, answered by the provider, no finals-gate timeout).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from brisvox.agent.conversation.context import AssistantMessage, UserMessage
from brisvox.agent.pipeline.cascade.stt_stage import SttStage
from brisvox.agent.pipeline.chain import CHAIN, with_stage
from brisvox.agent.pipeline.stage.pipeline_frames import AudioFrame, UserStoppedSpeaking
from brisvox.providers.resilience import Resilience, ResilienceConfig, wrap
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim import harness
from brisvox.sim.fakes import SttFault
from brisvox.sim.harness import SimCall, SimResult, default_actor_config
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.failover_kit import Contacts, LegStt, Switch, layered


def users(res: SimResult) -> list[str]:
    return [m.content for m in res.actor.context if isinstance(m, UserMessage)]


def assistant(res: SimResult) -> list[str]:
    return [m.text for m in res.actor.context if isinstance(m, AssistantMessage)]


def heard(res: SimResult) -> list[tuple[int, list[str]]]:
    """(epoch, the words that reached the wire) per bot utterance."""
    w = res.platform.wire
    return [(w.utts[u].epoch, w.heard_words(u)) for u in w.order]


class Stt:
    """The layer over the sim's fake STT of the call, and the leg's outage switch."""

    def __init__(self, res: Resilience) -> None:
        self.res = res
        self.sw = Switch()
        self.contacts = Contacts()
        self.fake: Any = None
        self.wrapper: Any = None

    def layer(self, stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        self.fake = stt
        self.wrapper = wrap("stt", LegStt(stt, self.sw, self.contacts, "stt-a"), resilience=self.res)
        return self.wrapper, llm, tts


def test_reconnect_budget_spent_degrades_the_stage_until_a_speech_start_then_it_recovers() -> None:
    async def main() -> tuple[SimResult, Stt, list[float]]:
        s = Stt(Resilience(ResilienceConfig()))  # breaker: 5 failures, open 30 s
        marks: list[float] = []

        async def outage() -> None:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(6.0)
            s.sw.down = True
            for x in s.fake.live:
                x._die("died")  # the live session dies with the provider
            marks.append(loop.time())
            await asyncio.sleep(14.0)
            s.sw.down = False  # back at 20 s; the breaker (opened at 8 s) half-opens at 38 s

        call = SimCall(steps=[Utter("what time is it please", at=0.5), Utter("can you hear me", at=12.0),
                              Utter("thanks a lot", at=45.0)],
                       llm=[LlmScript((Say("It is noon."),)), LlmScript((Say("You are welcome."),))])
        with layered(s.layer):
            t = asyncio.ensure_future(outage())
            res = await harness.simulate(call)
            await t
        return res, s, marks

    res, s, marks = run_virtual(main)
    st = res.record["stats"]["stt"]
    died = marks[0]
    # what the caller hears: the first and the last turn answered, nothing for the degraded one
    assert heard(res) == [(1, ["It", "is", "noon."]), (3, ["You", "are", "welcome."])]
    assert users(res) == ["what time is it please", "thanks a lot"]
    assert assistant(res) == ["It is noon.", "You are welcome."]
    # what the record says
    assert st["deaths"] == 1 and st["degraded"] == 2  # after the death, and again after the granted budget
    assert st["finalizes"] == 3 and st["answered"] == 2 and st["synthetic"] == 1
    assert st["connects"] == 1 + 3 + 3 + 1 and st["connect_failures"] == 6
    assert st["audio_no_session"] > 0
    assert res.record["stats"]["turn"]["empty_turns"] == 1
    assert res.record["stats"]["turn"]["turns_ended"] == 2
    # the layer: one failed recovery at the death, then the stage's reconnects 1 s apart from it
    # (a connect without a secondary tries the primary twice) until the breaker opened
    times = [round(x - died, 6) for x in s.contacts.times[1:]]
    assert times[:5] == [0.0, 1.0, 1.0, 2.0, 2.0]
    lw = s.wrapper.stats()
    assert lw["recovery_failures"] == 1 and lw["breaker_refusals"] > 0
    # the speech start at 45 s got a fresh budget: one probe, the session connected, the breaker closed
    assert 45.0 < s.contacts.times[-1] < 45.5 and len(s.contacts.times) == 7
    assert s.res.breaker("stt:stt-a").state == "closed"
    assert res.stray_tasks == [] and res.live_tasks_after == 0


def test_a_finalize_that_times_out_replaces_the_session_and_the_next_utterance_is_transcribed() -> None:
    async def main() -> tuple[SimResult, Stt]:
        s = Stt(Resilience(ResilienceConfig()))
        call = SimCall(steps=[Utter("please call me back tomorrow", at=0.5),
                              Utter("and send me the details", after_bot_done=1.0)],
                       llm=[LlmScript((Say("I will."),)), LlmScript((Say("Sent."),))],
                       stt_faults=[SttFault(hang_finalize=True)])  # the first session never answers one
        with layered(s.layer):
            res = await harness.simulate(call)
        return res, s

    res, s = run_virtual(main)
    st = res.actor.stt.st
    assert st.finalize_timeouts == 1 and st.deaths == 1
    assert st.connects == 2 and st.connect_failures == 0 and s.fake.probe.sessions == 2
    assert st.finalizes == 2 and st.synthetic == 1 and st.answered == 1  # one UtteranceFinal per Finalize
    u = users(res)
    assert u[0].startswith("please call me")  # the gate fell back to the interim
    assert u[1] == "and send me the details"  # transcribed whole by the replacement session
    assert assistant(res) == ["I will.", "Sent."]
    assert [e for e, _ in heard(res)] == [1, 2]
    # the replacement came one reconnect backoff after the timeout, through the layer, no recovery
    lw = s.wrapper.stats()
    assert lw["recoveries"] == 0 and lw["failures"] == 0 and lw["attempts"] == 2
    assert res.stray_tasks == [] and res.live_tasks_after == 0


class LaggingSttStage(SttStage):
    """An STT stage whose audio is processed slower than real time (40 ms per 20 ms frame), so a
    VAD stop (system lane) reaches it seconds before the audio it ends; the stop's arrival is
    recorded."""

    stops: list[float]

    async def process(self, frame: Any) -> None:
        if isinstance(frame, AudioFrame):
            await self.clock.sleep(0.04)
        elif isinstance(frame, UserStoppedSpeaking):
            self.__dict__.setdefault("stops", []).append(self.clock.now())
        await super().process(frame)


class TimedStt:
    """The fake STT with the time of every Finalize its sessions received."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self.name = fake.name
        self.finalized: list[float] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    async def connect(self, config: Any, timeout: float) -> Any:  # noqa: ASYNC109
        s = await self.fake.connect(config, timeout)
        orig = s.finalize

        async def finalize(t: float) -> None:
            self.finalized.append(asyncio.get_running_loop().time())
            await orig(t)

        s.finalize = finalize
        return s


def test_a_finalize_held_behind_lagging_audio_goes_out_at_the_1_s_cap() -> None:
    cfg = default_actor_config()
    cfg = replace(cfg, queues=replace(cfg.queues, input=512))
    call = SimCall(steps=[Utter("please tell me the opening hours of the museum today", at=0.5)],
                   llm=[LlmScript((Say("It opens at nine."),))], actor=cfg)
    call.chain = with_stage(CHAIN, "stt", LaggingSttStage)
    timed: list[TimedStt] = []

    def layer(stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        timed.append(TimedStt(stt))
        return wrap("stt", timed[0], resilience=Resilience(ResilienceConfig())), llm, tts

    async def main() -> SimResult:
        with layered(layer):
            return await harness.simulate(call)

    res = run_virtual(main)
    stage = res.actor.stt
    st = stage.st
    assert isinstance(stage, LaggingSttStage) and len(stage.stops) == 1
    assert st.finalize_deferred == 1 and st.finalize_defer_expired == 1
    assert stage.cfg.max_finalize_defer == 1.0
    assert len(timed[0].finalized) == 1
    # the cap, late by at most the one frame the stage was busy with when it passed (40 ms here)
    held = timed[0].finalized[0] - stage.stops[0]
    assert 1.0 - 1e-9 <= held <= 1.0 + 0.04 + 1e-9, held
    assert st.finalizes == 1 and st.answered + st.synthetic == 1  # one UtteranceFinal for the stop
    assert len(users(res)) == 1 and assistant(res) == ["It opens at nine."]


class StallOnce:
    """The fake STT whose first session stalls one audio send for ``stall`` seconds (within the
    send timeout: a slow network, not a dead one)."""

    def __init__(self, fake: Any, after_chunks: int, stall: float) -> None:
        self.fake = fake
        self.name = fake.name
        self.after = after_chunks
        self.stall = stall
        self.sent = 0
        self.finalize_after: list[int] = []  # audio chunks the session had when each Finalize came

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    async def connect(self, config: Any, timeout: float) -> Any:  # noqa: ASYNC109
        s = await self.fake.connect(config, timeout)
        send, fin = s.send_audio, s.finalize

        async def send_audio(pcm: bytes, t: float) -> None:
            self.sent += 1
            if self.sent == self.after:
                await asyncio.sleep(min(self.stall, t - 0.1))
            await send(pcm, t)

        async def finalize(t: float) -> None:
            self.finalize_after.append(self.sent)
            await fin(t)

        s.send_audio, s.finalize = send_audio, finalize
        return s


def test_an_overflowing_audio_queue_drops_and_counts_and_the_utterance_still_ends() -> None:
    prov: list[StallOnce] = []

    def layer(stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        prov.append(StallOnce(stt, after_chunks=40, stall=1.8))
        return wrap("stt", prov[0], resilience=Resilience(ResilienceConfig())), llm, tts

    call = SimCall(steps=[Utter("please tell me the opening hours of the museum today", at=0.5)],
                   llm=[LlmScript((Say("It opens at nine."),))])

    async def main() -> SimResult:
        with layered(layer):
            return await harness.simulate(call)

    res = run_virtual(main)
    st = res.actor.stt.st
    assert st.audio_dropped > 0  # the queue (64) overflowed while the send stalled
    assert st.deaths == 0 and st.connects == 1
    assert st.finalizes == 1 and st.answered == 1 and st.synthetic == 0  # the provider answered the end
    assert st.finalize_defer_expired == 0
    assert len(prov[0].finalize_after) == 1
    drv = res.actor.driver.st
    assert drv.gate_timeouts == 0 and drv.turns_ended == 1
    # the newest audio was dropped while the send stalled (a word in the middle); the utterance's
    # end, queued after the stall, reached the provider ahead of its Finalize
    assert users(res) == ["please tell me the opening of the museum today"]
    assert assistant(res) == ["It opens at nine."]
