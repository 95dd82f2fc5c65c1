"""Keypad input on virtual time, through the production actor: the caller's digits are
aggregated into entries and each entry is a user turn the (scripted) LLM answers.

* An entry ended by the terminator, or by the inter-digit timeout, is one user turn in
  the agent's text form (the request the LLM gets shows it), answered like a spoken one.
* An entry while the bot speaks is a barge-in: one Clear, the answer cut to what was
  heard (played-text oracle), no stale audio, then the entry's turn is answered.
* An entry while the caller is still speaking drops that spoken turn (counted).
* Digits pressed faster than the turn driver's 8-deep lane takes them are all
  delivered, in order (the actor's DTMF FIFO); a flood is bounded and counted at both
  bounds (the FIFO's 64 digits, the entry's 32) with a few log lines, and the call
  goes on.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from brisvox.agent.conversation.context import UserMessage
from brisvox.agent.pipeline.cascade.dtmf import KeypadConfig
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import LONG
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import HangUp, Press, Utter

PRESSED = "The caller pressed {} on the keypad."


def sim(call: SimCall):
    return run_virtual(lambda: simulate(call))


def users(res) -> list[str]:
    return [m.content for m in res.actor.context if isinstance(m, UserMessage)]


def last_user_of_each_request(res) -> list[str]:
    return [next(m.text for m in reversed(r.messages) if m.role == "user") for r in res.llm.probe.requests]


def keys(digits: str, first_after: float, gap: float = 0.25) -> list[Press]:
    return [Press(d, after=first_after if i == 0 else gap) for i, d in enumerate(digits)]


def clean(res) -> None:
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    res.actor.context.validate()


def test_an_entry_ended_by_the_terminator_is_a_user_turn_the_llm_answers():
    res = sim(SimCall(
        steps=[Utter("hello there", at=0.5), *keys("123#", 3.0), HangUp(after=4.0)],
        llm=[LlmScript((Say("Hi, how can I help?"),)), LlmScript((Say("You chose one two three."),))],
    ))
    assert last_user_of_each_request(res) == ["hello there", PRESSED.format("1 2 3")]
    assert users(res) == ["hello there", PRESSED.format("1 2 3")]
    assert res.assistant_texts()[-1] == "You chose one two three."
    d = res.actor.driver.stats()
    assert d["keypad_entries"] == 1 and d["keypad_by_terminator"] == 1 and d["dtmf"] == 4
    assert res.interrupts == 0 and res.actor.runner.st.turns == 2
    turn = res.record["turns"][-1]  # the keypad turn has a record of its own, answered
    assert turn["epoch"] == 2 and turn["response_ms"] is not None
    assert oracle_mismatches(res) == []
    clean(res)


def test_an_entry_without_terminator_ends_at_the_inter_digit_timeout():
    cfg = default_actor_config()
    cfg = replace(cfg, turn=replace(cfg.turn, keypad=KeypadConfig(inter_digit_timeout=1.0, text="[keypad] {digits}")))
    res = sim(SimCall(
        steps=[*keys("42", 1.0, gap=0.6), HangUp(after=4.0)],
        llm=[LlmScript((Say("Forty two, noted."),))],
        actor=cfg,
    ))
    assert last_user_of_each_request(res) == ["[keypad] 42"]
    assert res.assistant_texts() == ["Forty two, noted."]
    d = res.actor.driver.stats()
    assert d["keypad_by_timeout"] == 1 and d["keypad_entries"] == 1
    # the entry ended one timeout after the second key (1.0 + 0.6 + 1.0 s from the start)
    turn = res.record["turns"][0]
    assert 2.55 <= turn["t_turn_end"] <= 2.7, turn
    clean(res)


def test_an_entry_while_the_bot_speaks_clears_it_and_starts_a_new_turn():
    res = sim(SimCall(
        steps=[Utter("tell me about the weather", at=0.5), *keys("9#", 3.2, gap=0.1), HangUp(after=5.0)],
        llm=[LlmScript((Say(LONG),)), LlmScript((Say("Option nine it is."),))],
    ))
    assert res.interrupts == 1
    assert [e for _, e, _ in res.platform.clear_log if e >= 1] == [1]  # one Clear: the answer's epoch
    assert res.platform.wire.frames_after_clear == [] and res.platform.stale_tts_after_clear == 0
    texts = res.assistant_texts()
    assert LONG.startswith(texts[0]) and 0 < len(texts[0]) < len(LONG)  # cut to what was heard
    assert texts[-1] == "Option nine it is."
    assert users(res) == ["tell me about the weather", PRESSED.format("9")]
    assert oracle_mismatches(res) == []
    clean(res)


def test_an_entry_while_the_caller_speaks_drops_the_spoken_turn():
    res = sim(SimCall(
        steps=[Utter("hello I would like to talk about my order please", at=0.5),
               Press("1", at=0.9), Press("#", at=1.0), HangUp(at=7.0)],
        llm=[LlmScript((Say("Option one."),))],
        llm_default=LlmScript((Say("Unexpected."),)),
    ))
    assert users(res) == [PRESSED.format("1")]
    assert res.assistant_texts() == ["Option one."]
    assert res.actor.driver.st.keypad_over_speech == 1
    assert res.llm.probe.count == 1
    clean(res)


def test_digits_pressed_faster_than_the_lane_takes_them_are_all_delivered():
    digits = "0123456789*ABCD0123456789"  # 25 digits and the terminator, all in one 20 ms tick
    res = sim(SimCall(
        steps=[*(Press(d, at=1.0) for d in digits + "#"), HangUp(after=4.0)],
        llm=[LlmScript((Say("Got it."),))],
    ))
    p = res.actor.pump
    assert p.dtmf == 26 and p.dtmf_refused == 0
    assert p.dtmf_queued == 26 - 8 and p.dtmf_max_queued == 26 - 8  # the lane holds 8, the FIFO the rest
    assert res.actor.driver.st.dtmf == 26 and res.actor.driver.inbox.dropped == 0
    assert last_user_of_each_request(res) == [PRESSED.format(" ".join(digits))]
    clean(res)


def test_a_flood_is_bounded_and_counted_and_the_call_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="brisvox.agent")
    res = sim(SimCall(
        steps=[*(Press("7", at=1.0) for _ in range(500)), Press("#", after=0.5),
               Utter("are you still there", after=3.0), HangUp(after=4.0)],
        llm=[LlmScript((Say("Noted."),)), LlmScript((Say("Yes, I am here."),))],
    ))
    p = res.actor.pump
    assert p.dtmf == 501
    assert p.dtmf_refused == 500 - 8 - 64  # the lane's 8 and the FIFO's 64 were taken
    assert p.dtmf_max_queued == 64
    d = res.actor.driver.stats()
    assert d["dtmf"] == 8 + 64 + 1 and d["keypad_overflow"] == 72 - 32  # an entry holds 32 digits
    assert last_user_of_each_request(res) == [PRESSED.format(" ".join("7" * 32)), "are you still there"]
    assert res.assistant_texts()[-1] == "Yes, I am here."
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 0 < len(lines) <= 20  # the 1st, 2nd, 4th, ... refusal: a few lines for hundreds of keys
    clean(res)
