"""The dedicated tests of the pipeline (docs/TESTING.md), on the production actor in the sim."""

from __future__ import annotations

from dataclasses import replace

from brisvox.agent.conversation.context import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.pipeline.cascade.stt_stage import SttStage
from brisvox.agent.pipeline.cascade.turn_machine import TurnConfig
from brisvox.agent.pipeline.chain import CHAIN, with_stage
from brisvox.agent.pipeline.stage.pipeline_frames import AudioFrame
from brisvox.providers.seeded_fakes import Call, LlmScript, Say, Stall
from brisvox.sim.harness import SimCall, default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import LONG
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter, WorldConfig


def sim(call: SimCall):
    return run_virtual(lambda: simulate(call))


def assistant(res):
    return [m for m in res.actor.context if isinstance(m, AssistantMessage)]


def test_two_consecutive_turns_both_reach_the_wire_with_a_clear_before_each():
    res = sim(
        SimCall(
            steps=[Utter("first question please", at=0.5), Utter("second question now", after_bot_done=0.6)],
            llm=[LlmScript((Say("The first answer is here."),)), LlmScript((Say("The second answer is here."),))],
        )
    )
    wire = res.platform.wire
    assert [wire.utts[u].epoch for u in wire.order] == [1, 2]
    for u in wire.order:
        assert wire.heard_words(u)[-1] == "here."
    # the lazy Clear of each newer epoch came before its first audio on the wire
    clears = dict((e, t) for t, e in wire.clears)
    for u in wire.order:
        h = wire.utts[u]
        assert clears[h.epoch] <= h.first_t
    assert res.actor.out.st.clears_lazy == 2 and res.interrupts == 0


def test_a_verdict_that_arrives_after_a_new_vad_start_is_ignored():
    cfg = default_actor_config()
    cfg = replace(cfg, turn=replace(cfg.turn, turn=TurnConfig(smart_turn=True, fallback_silence=1.5)))
    res = sim(
        SimCall(
            steps=[Utter("I want to book", at=0.5, complete=True), Utter("a table for two", after=0.25)],
            llm=[LlmScript((Say("Sure, a table for two."),))],
            actor=cfg,
            world=WorldConfig(smart_turn_latency=0.5),
        )
    )
    st = res.actor.driver.st
    assert st.analyses >= 2 and st.stale_verdicts >= 1
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == ["I want to book a table for two"]


class SlowSttStage(SttStage):
    """An STT stage whose inbox drains slower than real time (25 ms per 20 ms frame)."""

    async def process(self, frame):
        if isinstance(frame, AudioFrame):
            await self.clock.sleep(0.025)
        await super().process(frame)


def _slow_stt_call(defer: float) -> SimCall:
    cfg = default_actor_config()
    cfg = replace(cfg, queues=replace(cfg.queues, input=128), stt=replace(cfg.stt, max_finalize_defer=defer))
    return SimCall(
        steps=[Utter("please tell me the opening hours of the museum today", at=0.5)],
        llm=[LlmScript((Say("It opens at nine."),))],
        actor=cfg,
    )


def _run_slow(defer: float):
    call = _slow_stt_call(defer)
    call.chain = with_stage(CHAIN, "stt", SlowSttStage)
    return sim(call)


def test_finalize_never_precedes_the_speech_it_finalizes_with_a_slow_stt_inbox():
    res = _run_slow(1.0)
    st = res.actor.stt.st
    assert st.finalize_deferred == 1 and st.finalize_defer_expired == 0
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == ["please tell me the opening hours of the museum today"]
    # control: without the hold the Finalize overtakes the queued audio and words are lost
    bad = _run_slow(0.0)
    users = [m.content for m in bad.actor.context if isinstance(m, UserMessage)]
    assert users != ["please tell me the opening hours of the museum today"]


def test_tool_exactly_once_with_a_barge_in_during_execution_then_new_turns():
    tools = SimTools(book_seconds=4.0)
    res = sim(
        SimCall(
            steps=[
                Utter("book a table for kaya", at=0.5),
                Utter("actually never mind that", after_bot_words=6),
                Utter("so is it booked", after_bot_done=1.0),
                Utter("thank you very much", after_bot_done=1.0),
            ],
            llm=[
                LlmScript((Say("Okay, booking it now."), Call("book_table", {"name": "Kaya", "people": 2}))),
                LlmScript((Say("Alright."),)),
                LlmScript((Say("Yes, it is booked."),)),
                LlmScript((Say("You are welcome."),)),
            ],
            registry=tools.registry,
        )
    )
    assert res.interrupts == 1
    assert tools.bodies["book_table"] == 1
    notes = [m for m in res.actor.context if isinstance(m, SystemMessage) and "Late tool result" in m.content]
    assert len(notes) == 1
    # the note came before the user message of the turn after the barge-in's turn
    msgs = list(res.actor.context)
    i = msgs.index(notes[0])
    assert isinstance(msgs[i + 1], UserMessage) and msgs[i + 1].content == "so is it booked"
    outcomes = [(r["name"], r["outcome"]) for r in res.record["tools"]]
    assert outcomes == [("book_table", "interrupted")]
    assert oracle_mismatches(res) == []


def test_multi_round_turn_with_a_barge_in_in_round_two():
    tools = SimTools(lookup_seconds=0.3)
    res = sim(
        SimCall(
            steps=[Utter("look it up for me", at=0.5), Utter("okay stop there", after_bot_words=14)],
            llm=[
                LlmScript((Say("Let me look that up."), Call("slow_lookup", {"city": "Rome"}))),
                LlmScript((Say(LONG),)),
                LlmScript((Say("Okay."),)),
            ],
            registry=tools.registry,
        )
    )
    assert res.interrupts == 1
    msgs = list(res.actor.context)
    a = assistant(res)
    assert a[0].text == "Let me look that up." and a[0].tool_calls
    assert any(isinstance(m, ToolMessage) and not m.is_error for m in msgs)
    assert LONG.startswith(a[1].text) and 0 < len(a[1].text) < len(LONG)
    assert oracle_mismatches(res) == []
    assert tools.bodies["slow_lookup"] == 1


def _barge_in(world: WorldConfig) -> SimCall:
    return SimCall(
        steps=[Utter("what is the weather like", at=0.5), Utter("wait stop please", after_bot=1.7)],
        llm=[LlmScript((Say(LONG),)), LlmScript((Say("Okay."),))],
        world=world,
    )


def _heard_count(res) -> tuple[int, str]:
    wire = res.platform.wire
    u = wire.order[0]
    return len(wire.heard_words(u)), assistant(res)[0].text


def test_settle_timeout_falls_back_to_the_last_known_position():
    res = sim(_barge_in(WorldConfig(cleared_delay=2.0)))
    book = res.actor.book.st
    assert book.settle_timeouts == 1
    n_heard, text = _heard_count(res)
    assert LONG.startswith(text)
    assert len(text.split()) <= n_heard  # never more than was heard
    assert len(text.split()) >= n_heard - 3  # the last report is at most 100 ms old
    # the settle wait is counted from the barge-in: the next request is not delayed
    assert res.record["turns"][1]["request_ms"] <= 20.0


def test_a_missing_final_position_uses_the_last_report_and_never_inflates():
    res = sim(_barge_in(WorldConfig(drop_cleared=True)))
    assert res.actor.book.st.settle_timeouts == 1
    assert res.actor.book.st.cleared_finals == 0  # the gateway never answers
    n_heard, text = _heard_count(res)
    assert LONG.startswith(text)
    assert len(text.split()) <= n_heard
    # later positions (the next answer playing) did not mark the cut utterance as played
    assert res.actor.book.st.truncations == 1


def test_the_response_deadline_backstop_ends_a_stalled_turn():
    cfg = default_actor_config()
    cfg = replace(cfg, turn=replace(cfg.turn, response_deadline=3.0),
                  llm=replace(cfg.llm, timeouts=replace(cfg.llm.timeouts, llm_first_token=30.0)))
    res = sim(
        SimCall(
            steps=[Utter("hello there", at=0.5), Utter("hello again", after=5.0)],
            llm=[LlmScript((Stall(20.0), Say("late")), ttft=0.1), LlmScript((Say("Hi."),))],
            actor=cfg,
            max_time=60.0,
        )
    )
    assert res.actor.driver.st.response_deadlines == 1
    # the backstop made the machine idle: the next utterance is a plain turn (no Interrupt)
    # whose UserTurnEnded halts the stalled round
    assert res.interrupts == 0 and res.actor.runner.st.halts == 1
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == ["hello there", "hello again"]
