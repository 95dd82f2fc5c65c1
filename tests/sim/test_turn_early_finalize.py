"""Early finalize through the whole call on virtual time: the production actor, the sim's VAD
with falling events, the sim's word-decoding STT (each Finalize answered 150 ms later).

With ``early_finalize`` the STT stage sends the Finalize at the falling (100 ms into the
silence), so the final is in when the stop (200 ms) is decided: the turn ends that much
sooner, with the same words; a caller who spoke on after a falling still gets one user
message with every word; every scenario keeps every word of the caller's and passes the
oracle.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from brisvox.agent.conversation.context import UserMessage
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.fakes import SttFault
from brisvox.sim.harness import SimCall, default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import SCENARIOS
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

FALL = 5  # frames: a falling after 100 ms of silence, the stop after 200 ms


def sim(call: SimCall, early: bool, fall: int = FALL):
    cfg = default_actor_config()
    turn = replace(cfg.turn.turn, smart_turn=True)  # the turn ends on the verdict and the final, not a timer
    call.actor = replace(cfg, stt=replace(cfg.stt, early_finalize=early), turn=replace(cfg.turn, turn=turn))
    call.world = replace(call.world, vad_fall_frames=fall)
    return run_virtual(lambda: simulate(call))


def users(res):
    return [m.content for m in res.actor.context if isinstance(m, UserMessage)]


def one_turn() -> SimCall:
    return SimCall(steps=[Utter("hello there how are you", at=0.5)],
                   llm=[LlmScript((Say("I am fine, thank you."),))],
                   stt_faults=[SttFault(final_delay=0.15)])


def ended(res) -> dict:
    (turn,) = [t for t in res.record["turns"] if t["t_turn_end"] is not None]
    return turn


def test_the_final_is_in_at_the_stop_and_the_turn_ends_sooner():
    on, off = sim(one_turn(), early=True), sim(one_turn(), early=False)
    assert users(on) == users(off) == ["hello there how are you"]
    st = on.actor.stt.st
    assert st.early_finalizes == 1 and st.early_claimed == 1 and st.finalizes == 1  # no second Finalize
    t_on, t_off = ended(on), ended(off)
    # off: the final comes 150 ms after the stop's Finalize; on: 150 ms after the falling's
    assert t_off["t_stt_final"] - t_off["t_vad_stop"] == pytest.approx(0.15, abs=0.03)
    assert t_on["t_stt_final"] - t_on["t_vad_stop"] <= 0.07
    assert (t_off["t_turn_end"] - t_off["t_vad_stop"]) - (t_on["t_turn_end"] - t_on["t_vad_stop"]) >= 0.08


def test_speech_after_a_falling_joins_one_user_message():
    # 150 ms of silence: a falling (100 ms) and its Finalize, then speech again before the stop
    call = SimCall(steps=[Utter("I want to book", at=0.5), Utter("a table for two", after=0.15)],
                   llm=[LlmScript((Say("Sure, a table for two."),))], stt_faults=[SttFault(final_delay=0.05)])
    res = sim(call, early=True)
    st = res.actor.stt.st
    assert st.early_finalizes == 2 and st.early_orphaned == 1 and st.early_claimed == 1
    assert users(res) == ["I want to book a table for two"]
    assert oracle_mismatches(res) == []


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_has_the_same_conversation_with_and_without_it(name):
    def run(early: bool):
        call, _ = SCENARIOS[name]()
        return sim(call, early)

    off, on = run(False), run(True)
    # every word the caller said reaches the context, in order; the bot may answer a turn sooner (s04:
    # its first word plays before the caller's resumed speech, which then barges in), so the
    # assistant's side is judged by the oracle, not compared
    assert " ".join(users(on)).split() == " ".join(users(off)).split()
    for res in (off, on):
        assert oracle_mismatches(res) == []
        assert res.live_tasks_after == 0
    assert off.actor.stt.st.early_finalizes == 0
