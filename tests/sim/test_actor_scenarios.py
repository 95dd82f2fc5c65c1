"""The scenario suite s01-s11 on virtual time against the production call actor.

Every scenario is asserted on the structural invariants:
outcome (the call ends cleanly), interrupt count, user turns, no stale audio
after a clear, context == played prefix (wire oracle, +-1 frame), a valid
context, no leaked tasks, determinism (two runs, one fingerprint); plus what
the scenario itself is about.
"""

from __future__ import annotations

import pytest

from brisvox.agent.conversation.context import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from brisvox.sim.harness import oracle_mismatches, simulate
from brisvox.sim.scenarios import EXPECTED_INTERRUPTS, EXPECTED_TURNS, SCENARIOS
from brisvox.sim.vloop import run_virtual


def run(name: str):
    call, tools = SCENARIOS[name]()
    return run_virtual(lambda: simulate(call)), tools


@pytest.fixture(scope="module")
def results():
    return {name: run(name) for name in SCENARIOS}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_structural_invariants(results, name):
    res, _ = results[name]
    assert res.interrupts == EXPECTED_INTERRUPTS[name]
    assert res.actor.runner.st.turns == EXPECTED_TURNS[name]
    # no stale audio: nothing of a cut epoch was written after the decision, none reached the wire
    assert res.platform.stale_tts_after_clear == 0
    assert res.platform.wire.frames_after_clear == []
    # context == played prefix, and valid
    assert oracle_mismatches(res) == []
    res.actor.context.validate()
    # roles: system prompt first, user turns as expected
    msgs = list(res.actor.context)
    assert isinstance(msgs[0], SystemMessage)
    assert sum(isinstance(m, UserMessage) for m in msgs) == EXPECTED_TURNS[name]
    # no leaked tasks, nothing lost on the way
    assert res.live_tasks_after == 0
    assert res.stray_tasks == []
    st = res.actor.stats()
    assert st["llm"]["zombies"] == 0 and st["llm"]["round_crashes"] == 0
    for stage in ("stt", "turn", "llm", "segmenter", "tts", "out"):
        assert st[stage]["sys_dropped"] == 0
    assert st["book"]["not_a_prefix"] == 0
    assert st["book"]["conflicts"] == 0


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_determinism(results, name):
    res, _ = results[name]
    again, _ = run(name)
    assert again.fingerprint() == res.fingerprint()


def texts(res):
    return [m.text for m in res.actor.context if isinstance(m, AssistantMessage)]


def test_s01_answer_played_whole(results):
    res, _ = results["s01"]
    assert texts(res) == ["I am fine, thank you for asking. How can I help you today?"]
    assert res.actor.book.st.marks_played == 1


def test_s02_cut_answer_then_next_turns(results):
    res, _ = results["s02"]
    t = texts(res)
    assert 0 < len(t[0]) < 60 and "Well, there are many things to say about that.".startswith(t[0])
    assert t[1:] == ["Sorry. Go ahead.", "Colder tomorrow."]
    assert res.actor.book.st.truncations == 1


def test_s03_every_turn_reaches_the_wire(results):
    res, _ = results["s03"]
    wire = res.platform.wire
    assert [wire.utts[u].epoch for u in wire.order] == [1, 2, 3]
    assert all(wire.heard_words(u) for u in wire.order)
    assert res.actor.out.st.clears_lazy == 3


def test_s04_a_short_pause_is_one_turn(results):
    res, _ = results["s04"]
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == ["I would like to book a table for two tonight"]


def test_s05_stt_death_promotes_the_interim_and_recovers(results):
    res, _ = results["s05"]
    st = res.actor.stt.st
    assert st.deaths >= 1 and st.synthetic >= 1 and st.interims_promoted >= 1
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users[0].startswith("can you hear me")
    assert users[1] == "and now a second question"


def test_s06_llm_failure_invents_no_speech(results):
    res, _ = results["s06"]
    msgs = list(res.actor.context)
    assert isinstance(msgs[1], UserMessage) and isinstance(msgs[2], UserMessage)
    assert texts(res) == ["Yes, I am here."]
    assert res.actor.runner.st.errors == 1 and res.actor.runner.st.silent_turns == 1
    assert len(res.llm.probe.request_times) == 2  # one request per turn: the runner does not retry


def test_s07_a_cough_is_an_empty_turn(results):
    res, _ = results["s07"]
    assert res.actor.driver.st.empty_turns == 1
    assert len(res.llm.probe.requests) == 1


def test_s08_tool_turn_order(results):
    res, tools = results["s08"]
    msgs = list(res.actor.context)[1:]
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1].tool_calls[0].id == "t1.0" and msgs[2].call_id == "t1.0"
    assert tools.bodies["get_weather"] == 1
    assert [r["name"] for r in res.record["tools"]] == ["get_weather"]
    assert res.record["tools"][0]["outcome"] == "ok"


def test_s09_backchannel_is_vetoed(results):
    res, _ = results["s09"]
    assert res.actor.driver.st.vetoed == 1
    assert texts(res)[0].endswith("in the evening.")


def test_s10_side_effect_runs_once_and_is_reported_once(results):
    res, tools = results["s10"]
    assert tools.bodies["book_table"] == 1
    notes = [m for m in res.actor.context if isinstance(m, SystemMessage) and "Late tool result" in m.content]
    assert len(notes) == 1 and "BK-1001" in notes[0].content
    interrupted = [m for m in res.actor.context if isinstance(m, ToolMessage) and m.is_error]
    assert len(interrupted) == 1


def test_s11_hangup_cuts_the_context_and_writes_the_record(results):
    res, _ = results["s11"]
    t = texts(res)
    assert len(t) == 1 and 0 < len(t[0]) < 80
    rec = res.record
    assert rec["end_reason"] == "caller_hangup"
    assert rec["conversation"][-1]["text"] == t[0]
    assert rec["turns"] and rec["turns"][0]["epoch"] == 1
