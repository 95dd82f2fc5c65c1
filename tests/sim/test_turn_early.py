"""Early Smart Turn on virtual time: the production actor, the sim's VAD with falling events.

With ``[turn] early_analysis`` the turn driver asks Smart Turn at the VAD falling and the
stop of the same fall takes that verdict: one request per fall, never a stale verdict,
and the conversation of every scenario the same as without it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from brisvox.agent.conversation.context import UserMessage
from brisvox.agent.pipeline.cascade.turn_machine import TurnConfig
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import SCENARIOS
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter, WorldConfig

FALL = 5  # frames: a falling after 100 ms of silence, the stop after 200 ms


def smart(early: bool):
    cfg = default_actor_config()
    turn = replace(cfg.turn.turn, smart_turn=True, early_analysis=early)
    return replace(cfg, turn=replace(cfg.turn, turn=turn))


def sim(call: SimCall, early: bool, **world):
    call.actor = smart(early)
    call.world = replace(call.world, vad_fall_frames=FALL, **world)
    return run_virtual(lambda: simulate(call))


def users(res):
    return [m.content for m in res.actor.context if isinstance(m, UserMessage)]


def one_turn() -> SimCall:
    return SimCall(steps=[Utter("hello there how are you", at=0.5)],
                   llm=[LlmScript((Say("I am fine, thank you."),))])


def test_the_early_verdict_is_reused_at_the_stop():
    res = sim(one_turn(), early=True)
    st = res.actor.driver.st
    assert res.platform.smart_turn_requests == 1  # one request, not two
    assert st.early_analyses == 1 and st.early_reused == 1 and st.early_discarded == 0
    assert res.actor.pump.vad_fallings == 1
    (turn,) = [t for t in res.record["turns"] if t["t_turn_end"] is not None]
    assert turn["verdict_early"] is True and turn["t_verdict"] <= turn["t_vad_stop"]
    assert turn["t_vad_stop"] <= turn["t_stt_final"] <= turn["t_turn_end"] <= turn["t_request"]
    off = sim(one_turn(), early=False)
    assert off.platform.smart_turn_requests == 1 and off.actor.driver.st.early_analyses == 0
    (t_off,) = [t for t in off.record["turns"] if t["t_turn_end"] is not None]
    assert t_off["verdict_early"] is False and t_off["t_verdict"] > t_off["t_vad_stop"]
    assert res.context == off.context


def test_speech_again_after_a_falling_discards_the_early_analysis():
    # 150 ms of silence: a falling (100 ms), then speech again before the stop (200 ms)
    call = SimCall(steps=[Utter("I want to book", at=0.5), Utter("a table for two", after=0.15)],
                   llm=[LlmScript((Say("Sure, a table for two."),))])
    res = sim(call, early=True)
    st = res.actor.driver.st
    assert st.early_analyses == 2 and st.early_discarded == 1 and st.early_reused == 1
    assert res.platform.smart_turn_requests == 2  # one per fall, none more at the stop
    assert users(res) == ["I want to book a table for two"]


def test_a_late_early_verdict_of_a_resumed_pause_is_stale():
    # the analysis takes 0.5 s: the stop (200 ms) takes the early analysis still on its way, the
    # caller resumes at 250 ms, and its verdict, when it comes, is stale; the next fall asks anew
    call = SimCall(steps=[Utter("I want to book", at=0.5), Utter("a table for two", after=0.25)],
                   llm=[LlmScript((Say("Sure, a table for two."),))])
    res = sim(call, early=True, smart_turn_latency=0.5)
    st = res.actor.driver.st
    assert st.stale_verdicts >= 1 and st.early_reused == 2
    assert res.platform.smart_turn_requests == 2
    assert users(res) == ["I want to book a table for two"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_has_the_same_conversation_with_and_without_it(name):
    def run(early: bool):
        call, _ = SCENARIOS[name]()
        return sim(call, early)

    off, on = run(False), run(True)
    assert on.context == off.context
    # the suite's counts are the fixed policy's; with Smart Turn both settings agree on theirs
    assert (on.interrupts, on.actor.runner.st.turns) == (off.interrupts, off.actor.runner.st.turns)
    for res in (off, on):
        assert oracle_mismatches(res) == []
        assert res.live_tasks_after == 0
    assert off.actor.driver.st.early_analyses == 0
    # every user turn's stop took its fall's early verdict: not one request more than without it
    assert on.actor.driver.st.early_reused >= 1
    assert on.platform.smart_turn_requests == off.platform.smart_turn_requests


def test_without_falling_events_the_switch_changes_nothing():
    call = one_turn()
    call.actor = smart(True)
    res = run_virtual(lambda: simulate(call))
    assert res.actor.driver.st.early_analyses == 0 and res.platform.smart_turn_requests == 1
    plain = one_turn()
    plain.actor = smart(False)
    assert run_virtual(lambda: simulate(plain)).fingerprint() == res.fingerprint()


def test_the_world_sends_no_falling_by_default():
    assert WorldConfig().vad_fall_frames == 0
    assert TurnConfig().early_analysis is False
