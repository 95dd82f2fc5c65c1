"""Smart Turn analyses that can no longer change the turn are cancelled (virtual time).

The production actor against the sim world, whose Smart Turn answers after
``smart_turn_latency`` as if queued on the worker's job lane the whole time, and drops a
request on ``SmartTurnCancel`` (answered without a verdict, as the worker answers a queued
analysis it takes out). The turn driver cancels what the machine would no longer use: the
analysis of a pause the caller ended by speaking again, and the one of a turn the
fallback silence already ended. A wanted analysis is never cancelled, and no turn is ever
decided on a cancelled one.
"""

from __future__ import annotations

from dataclasses import replace

from brisvox.agent.conversation.context import UserMessage
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, default_actor_config, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter


def smart():
    cfg = default_actor_config()
    return replace(cfg, turn=replace(cfg.turn, turn=replace(cfg.turn.turn, smart_turn=True)))


def sim(call: SimCall, latency: float):
    call.actor = smart()
    call.world = replace(call.world, smart_turn_latency=latency)
    return run_virtual(lambda: simulate(call))


def users(res) -> list[str]:
    return [m.content for m in res.actor.context if isinstance(m, UserMessage)]


def ended(res) -> list[dict]:
    return [t for t in res.record["turns"] if t["t_turn_end"] is not None]


def test_the_analysis_of_a_pause_the_caller_resumed_is_cancelled_and_decides_nothing():
    # "I want to book" is incomplete (the world's verdict would be 0.1); the caller goes on
    # 300 ms later, while that analysis (600 ms) is still queued: it is cancelled, and the
    # turn is decided by the second pause's own analysis, once, with the whole text
    call = SimCall(steps=[Utter("I want to book", at=0.5, complete=False), Utter("a table for two", after=0.3)],
                   llm=[LlmScript((Say("Sure, a table for two."),))])
    res = sim(call, latency=0.6)
    st = res.actor.driver.st
    assert st.analyses == 2 and st.analyses_cancelled == 1 and st.analyses_failed == 0
    assert res.platform.smart_turn_requests == 2 and res.platform.smart_turn_cancelled == 1
    assert st.resumes == 0 and st.turns == 1  # a pause inside one turn, not a resumed held end
    assert users(res) == ["I want to book a table for two"]
    (turn,) = ended(res)
    # decided by the second analysis's complete verdict (600 ms after the last stop), not by
    # the fallback silence (1.5 s) and not by the cancelled one
    assert turn["t_verdict"] - turn["t_vad_stop"] >= 0.6 - 1e-6
    assert turn["t_turn_end"] - turn["t_vad_stop"] < 1.0


def test_a_slow_analysis_that_is_still_wanted_is_never_cancelled():
    call = SimCall(steps=[Utter("hello there how are you", at=0.5)], llm=[LlmScript((Say("Fine."),))])
    res = sim(call, latency=0.6)
    st = res.actor.driver.st
    assert st.analyses == 1 and st.analyses_cancelled == 0 and res.platform.smart_turn_cancelled == 0
    (turn,) = ended(res)
    assert turn["t_turn_end"] - turn["t_vad_stop"] < 1.0  # its complete verdict ended the turn


def test_the_analysis_of_a_turn_the_fallback_silence_ended_is_cancelled_not_counted_failed():
    call = SimCall(steps=[Utter("hello there how are you", at=0.5)], llm=[LlmScript((Say("Fine."),))])
    res = sim(call, latency=2.5)  # longer than the fallback silence (1.5 s)
    st = res.actor.driver.st
    assert st.analyses == 1 and st.analyses_cancelled == 1 and st.analyses_failed == 0
    assert res.platform.smart_turn_cancelled == 1
    assert users(res) == ["hello there how are you"]
    (turn,) = ended(res)
    assert turn["t_verdict"] is None  # the turn ended on the fallback silence, before any verdict
