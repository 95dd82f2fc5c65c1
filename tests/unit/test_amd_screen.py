"""AmdScreen: a dialled call's screening between the answer and its first word, per verdict."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.agent.host.amd_screen import (
    DEADLINE_SLACK_S,
    VERDICTS,
    AmdConfig,
    AmdScreen,
    Converse,
    Detect,
    HangUp,
    Phase,
    SpeakMessage,
)

MSG = "Hello, this is Brisvox Dental calling about your appointment. Please call us back."


def screen(**kw: object) -> AmdScreen:
    s = AmdScreen(AmdConfig(enabled=True, **kw))  # type: ignore[arg-type]
    assert s.answered(10.0) == [Detect(s.cfg.max_wait_ms)]
    assert s.answered(11.0) == []  # one answer
    assert s.screening
    return s


def test_a_person_is_conversed_with_and_nothing_happens_before_the_verdict():
    s = screen()
    assert s.tick(11.0) == [] and s.screening
    assert s.verdict("human", 0.97, 10.8) == [Converse("human", 0.97)]
    assert not s.screening and s.phase is Phase.CONVERSING
    assert s.record()["verdict_ms"] == 800 and s.record()["source"] == "detector"
    assert s.verdict("machine", 0.99, 11.0) == []  # one verdict per call


def test_a_machine_is_hung_up_on_by_default_and_only_once():
    s = screen()
    assert s.verdict("machine", 0.9, 12.0) == [HangUp("amd_machine")]
    assert s.phase is Phase.ENDED
    assert s.tick(99.0) == [] and s.beep(13.0) == [] and s.message_played(14.0) == []


def test_leave_message_waits_for_the_beep_then_speaks_once_then_hangs_up():
    s = screen(on_machine="leave_message", message=MSG)
    assert s.verdict("machine", 0.9, 12.0) == []
    assert s.phase is Phase.WAITING_BEEP and s.screening and s.deadline == 12.0 + 20.0
    assert s.beep(16.5) == [SpeakMessage(MSG)]
    assert s.beep(17.0) == [] and s.greeting_ended(17.0) == []
    assert s.message_played(25.0) == [HangUp("amd_message_left")]
    r = s.record()
    assert (r["action"], r["beep_ms"], r["message_ms"]) == ("leave_message", 6500, 6500)


def test_a_beep_heard_before_the_verdict_makes_the_message_start_at_the_verdict():
    s = screen(on_machine="leave_message", message=MSG)
    assert s.beep(11.5) == []
    assert s.verdict("machine", 0.8, 11.9) == [SpeakMessage(MSG)]


def test_no_beep_the_message_starts_at_the_greetings_end_or_the_beep_wait():
    s = screen(on_machine="leave_message", message=MSG, beep_wait_ms=5000)
    s.verdict("machine", 0.9, 12.0)
    assert s.greeting_ended(14.0) == [SpeakMessage(MSG)]
    s = screen(on_machine="leave_message", message=MSG, beep_wait_ms=5000)
    s.verdict("machine", 0.9, 12.0)
    assert s.tick(16.9) == []
    assert s.tick(17.0) == [SpeakMessage(MSG)]


def test_the_workers_silence_gives_an_uncertain_verdict_at_the_deadline():
    s = screen(max_wait_ms=2000)
    due = 10.0 + 2.0 + DEADLINE_SLACK_S
    assert s.deadline == due
    assert s.tick(due - 0.01) == []
    assert s.tick(due) == [Converse("uncertain", 0.0)]
    assert s.record()["source"] == "deadline"
    assert s.verdict("human", 1.0, due + 1) == []


def test_a_flow_node_and_an_unknown_verdict():
    s = screen(on_ivr="node:ivr_menu")
    assert s.verdict("ivr", 0.7, 11.0) == [Converse("ivr", 0.7, "ivr_menu")]
    s = screen(on_uncertain="hang_up")
    assert s.verdict("dolphin", 5.0, 11.0) == [HangUp("amd_uncertain")]


def test_leave_message_for_a_verdict_that_has_no_beep_speaks_at_once():
    s = screen(on_fax="leave_message", message=MSG)
    assert s.verdict("fax", 0.99, 11.0) == [SpeakMessage(MSG)]


def test_the_config_refuses_what_it_could_not_do():
    probs = dict(AmdConfig(on_machine="leave_message", on_ivr="node:menu", on_fax="ring").problems(None))
    assert "amd.message" in probs["amd.on_machine"]
    assert "no [flow]" in probs["amd.on_ivr"]
    assert "not continue" in probs["amd.on_fax"]
    assert "no node 'menu'" in dict(AmdConfig(on_ivr="node:menu").problems(frozenset({"start"})))["amd.on_ivr"]
    assert AmdConfig(on_ivr="node:menu").problems(frozenset({"menu"})) == []
    assert AmdConfig.from_table({"max_wait_ms": 2500, "on_human": "continue"}).max_wait_ms == 2500


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["verdict", "beep", "greeting", "played", "tick"]),
                          st.sampled_from([*VERDICTS, "x"]), st.floats(0, 40)), max_size=12),
       st.sampled_from(["continue", "hang_up", "leave_message", "node:n"]))
def test_any_sequence_hangs_up_at_most_once_and_converses_only_after_a_verdict(steps, action):
    s = screen(on_human=action, on_machine=action, on_ivr=action, on_fax=action, on_uncertain=action, message=MSG)
    acts = []
    for kind, v, at in sorted(steps, key=lambda x: x[2]):
        at += 10.0
        match kind:
            case "verdict":
                acts += s.verdict(v, 0.5, at)
            case "beep":
                acts += s.beep(at)
            case "greeting":
                acts += s.greeting_ended(at)
            case "played":
                acts += s.message_played(at)
            case _:
                acts += s.tick(at)
    acts += s.tick(1e9)  # the deadlines always resolve
    assert sum(isinstance(a, HangUp) for a in acts) <= 1
    assert sum(isinstance(a, SpeakMessage) for a in acts) <= 1
    assert sum(isinstance(a, Converse) for a in acts) <= 1
    assert s.verdict_ in VERDICTS
    assert not any(isinstance(a, Converse | SpeakMessage) for a in acts) or s.verdict_at is not None
    if any(isinstance(a, HangUp) for a in acts):
        assert acts[-1] == next(a for a in acts if isinstance(a, HangUp))
