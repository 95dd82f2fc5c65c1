"""Keypad input: the aggregator (brisvox/agent/pipeline/cascade/dtmf.py), the turn machine's Keypad
input, and the agent file's ``[dtmf]`` table (mapped onto the driver, checked offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisvox.agent.definition import actor_config, check_agent_file, load_agent
from brisvox.agent.pipeline.cascade import turn_machine as tm
from brisvox.agent.pipeline.cascade.dtmf import (
    LIMIT,
    Close,
    Entry,
    Key,
    KeypadAggregator,
    KeypadConfig,
    Refused,
    Tick,
)
from brisvox.cli.brisvoxd import main as brisvoxd

ROOT = Path(__file__).resolve().parents[2]


def press(agg: KeypadAggregator, keys: str, t0: float = 0.0, step: float = 0.1) -> list:
    out: list = []
    for i, k in enumerate(keys):
        out += agg.handle(Key(k, t0 + i * step))
    return out


# --- the aggregator --------------------------------------------------------------------


def test_the_terminator_ends_the_entry_at_once_without_itself():
    agg = KeypadAggregator()
    assert press(agg, "123") == [] and agg.pending == "123" and agg.deadline == pytest.approx(2.2)
    assert agg.handle(Key("#", 0.3)) == [Entry("123", "terminator")]
    assert agg.deadline is None and agg.pending == ""
    assert agg.st.by_terminator == 1 and agg.st.longest == 3


def test_a_terminator_alone_is_the_entry_of_itself():
    agg = KeypadAggregator()
    assert agg.handle(Key("#", 1.0)) == [Entry("#", "terminator")]
    assert agg.deadline is None


def test_the_inter_digit_timeout_runs_from_the_newest_digit():
    agg = KeypadAggregator(KeypadConfig(inter_digit_timeout=2.0))
    press(agg, "12", step=1.5)  # the second key at 1.5 moves the deadline to 3.5
    assert agg.handle(Tick(3.49)) == []  # before the deadline: nothing
    assert agg.handle(Tick(3.5)) == [Entry("12", "timeout")]
    assert agg.handle(Tick(9.0)) == [] and agg.deadline is None  # nothing pending: no entry
    assert agg.st.by_timeout == 1


def test_max_digits_ends_the_entry_with_the_key_that_filled_it():
    agg = KeypadAggregator(KeypadConfig(max_digits=1))
    assert press(agg, "13") == [Entry("1", "max_digits"), Entry("3", "max_digits")]
    agg = KeypadAggregator(KeypadConfig(max_digits=4, terminator=""))
    assert press(agg, "12#45") == [Entry("12#4", "max_digits")]  # no terminator: # is a digit
    assert agg.pending == "5"


def test_star_and_the_letters_are_digits_and_keys_are_upper_cased():
    agg = KeypadAggregator()
    assert press(agg, "*9ab#") == [Entry("*9AB", "terminator")]
    agg = KeypadAggregator(KeypadConfig(terminator="*"))
    assert press(agg, "4#*") == [Entry("4#", "terminator")]


def test_a_flood_is_bounded_refused_and_counted():
    agg = KeypadAggregator(KeypadConfig(terminator=""))
    out = press(agg, "7" * 100, step=0.01)
    assert out == [Refused("7", "overflow")] * (100 - LIMIT)
    assert len(agg.pending) == LIMIT == 32
    assert agg.st.overflow == 68 and agg.refused == 68
    # the timeout runs from the newest digit TAKEN: the flood does not hold the entry open
    assert agg.handle(Tick(0.31 + 2.0)) == [Entry("7" * 32, "timeout")]
    assert press(agg, "12#"[:2], t0=5.0) == [] and agg.pending == "12"  # a new entry starts clean


def test_the_terminator_still_ends_a_full_entry():
    agg = KeypadAggregator()
    press(agg, "5" * 40, step=0.01)
    assert agg.handle(Key("#", 1.0)) == [Entry("5" * 32, "terminator")]
    assert agg.st.overflow == 8


def test_invalid_keys_and_keys_after_close_are_refused():
    agg = KeypadAggregator()
    assert press(agg, "1x") == [Refused("X", "invalid")]
    assert agg.handle(Key("12", 0.5)) == [Refused("12", "invalid")]
    assert agg.handle(Close()) == [] and agg.st.abandoned == 1 and agg.deadline is None
    assert agg.handle(Key("2", 1.0)) == [Refused("2", "closed")]
    assert agg.handle(Tick(99.0)) == []
    st = agg.st
    assert (st.keys, st.invalid, st.closed, st.entries) == (4, 2, 1, 0)


def test_every_key_is_accounted_for():
    agg = KeypadAggregator(KeypadConfig(max_digits=3))
    keys = "12#4567z" + "8" * 4 + "#"
    out = press(agg, keys)
    entries = [a for a in out if isinstance(a, Entry)]
    refused = [a for a in out if isinstance(a, Refused)]
    assert [e.digits for e in entries] == ["12", "456", "788", "88"]
    agg.handle(Close())
    st = agg.st
    taken = sum(len(e.digits) for e in entries)
    assert st.keys == len(keys) == taken + st.by_terminator + len(refused) + st.abandoned


def test_the_text_form_and_its_validation():
    cfg = KeypadConfig()
    assert cfg.render("123") == "The caller pressed 1 2 3 on the keypad."
    assert KeypadConfig(text="[keypad] {digits}").render("0#") == "[keypad] 0#"
    for bad in ("no digits here", "{nope}", "{0}", "{digits", "{digits.x}"):
        with pytest.raises(ValueError, match="^text: "):
            KeypadConfig(text=bad)
    for kw, key in (({"terminator": "x"}, "terminator"), ({"terminator": "##"}, "terminator"),
                    ({"max_digits": 33}, "max_digits"), ({"inter_digit_timeout": 0.0}, "inter_digit_timeout")):
        with pytest.raises(ValueError, match=f"^{key}: "):
            KeypadConfig(**kw)  # type: ignore[arg-type]


# --- the turn machine's Keypad input ---------------------------------------------------------


def test_keypad_from_idle_is_a_turn_ended_at_once():
    m = tm.TurnMachine()
    acts = m.handle(tm.Keypad(1.0))
    assert acts == [tm.StartUserTurn(1, 1.0), tm.EndUserTurn(1, 1.0)]
    assert m.phase is tm.Phase.AWAITING_RESPONSE and m.epoch == 1
    assert m.handle(tm.BotAudioStarted(1, 1.5)) == [] and m.phase is tm.Phase.BOT_SPEAKING
    assert m.handle(tm.BotAudioEnded(1)) == [] and m.phase is tm.Phase.IDLE


def test_keypad_while_the_bot_speaks_interrupts_without_guards():
    m = tm.TurnMachine()  # recommended guards: a VAD start would only be a candidate
    m.handle(tm.Keypad(1.0))
    m.handle(tm.BotAudioStarted(1, 1.2))
    acts = m.handle(tm.Keypad(2.0))
    assert acts == [tm.Interrupt(1, 2, 2.0), tm.StartUserTurn(2, 2.0), tm.EndUserTurn(2, 2.0)]
    assert m.phase is tm.Phase.AWAITING_RESPONSE
    assert m.handle(tm.BotAudioEnded(1)) == []  # the cut answer's end is of an old epoch


def test_keypad_over_a_paused_candidate_interrupts_and_clears_the_hold():
    m = tm.TurnMachine()
    m.handle(tm.Keypad(1.0))
    m.handle(tm.BotAudioStarted(1, 1.0))
    acts = m.handle(tm.VadStart(2.0))  # a candidate: the bot's audio is held
    assert tm.PauseOutput(1, 2.0) in acts and m.paused == 1
    acts = m.handle(tm.Keypad(2.3))
    assert acts[0] == tm.Interrupt(1, 2, 2.3) and tm.CancelTimer() in acts
    assert m.paused == 0 and not m.candidate_pending
    assert m.handle(tm.Tick(9.0)) == []  # the candidate's timer is gone


def test_keypad_leaves_an_open_spoken_turn_behind():
    m = tm.TurnMachine(tm.TurnConfig(smart_turn=True))
    m.handle(tm.VadStart(1.0))
    acts = m.handle(tm.VadStop(1.5))
    assert any(isinstance(a, tm.RequestAnalysis) for a in acts) and m.phase is tm.Phase.USER_PAUSED
    aid = m.analysis_id
    acts = m.handle(tm.Keypad(1.6))
    assert acts == [tm.CancelTimer(), tm.StartUserTurn(2, 1.6), tm.EndUserTurn(2, 1.6)]  # no Interrupt
    assert m.handle(tm.Verdict(aid, 0.9, 1.7)) == [tm.Note("stale_verdict")]
    assert m.handle(tm.VadStop(1.8)) == [tm.OwnStop("none")]


def test_keypad_after_hangup_does_nothing():
    m = tm.TurnMachine()
    m.handle(tm.Hangup())
    assert m.handle(tm.Keypad(1.0)) == [] and m.epoch == 0


# --- the agent file's [dtmf] -----------------------------------------------------------------

SCRIPTED = (ROOT / "configs" / "agents" / "scripted.toml").read_text()


def _write(tmp_path: Path, table: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(SCRIPTED + "\n" + table)
    return p


def test_every_dtmf_key_reaches_the_driver(tmp_path):
    p = _write(tmp_path, '[dtmf]\ninter_digit_timeout = 3.5\nterminator = "*"\nmax_digits = 4\n'
                         'text = "[keypad] {digits}"\n')
    k = actor_config(load_agent(p, env={})).turn.keypad
    assert (k.inter_digit_timeout, k.terminator, k.max_digits, k.text, k.limit) == (3.5, "*", 4, "[keypad] {digits}", 32)
    assert actor_config(load_agent(ROOT / "configs" / "agents" / "scripted.toml", env={})).turn.keypad == KeypadConfig()


@pytest.mark.parametrize("table,key", [
    ('[dtmf]\nterminator = "x"\n', "dtmf.terminator"),
    ("[dtmf]\nmax_digits = 40\n", "dtmf.max_digits"),
    ("[dtmf]\ninter_digit_timeout = 0\n", "dtmf.inter_digit_timeout"),
    ('[dtmf]\ntext = "no digits"\n', "dtmf.text"),
    ('[dtmf]\ntext = "{who} pressed {digits}"\n', "dtmf.text"),
    ("[dtmf]\nbuffer = 3\n", "dtmf.buffer"),
])
def test_brisvoxd_check_refuses_bad_dtmf_values_naming_the_key_and_line(tmp_path, capsys, table, key):
    p = _write(tmp_path, table)
    assert brisvoxd(["check", str(p)]) == 2
    out = capsys.readouterr().out
    line = next(i for i, t in enumerate(p.read_text().splitlines(), 1) if t.startswith(key.split(".")[1]))
    assert f"{p}:{line}: error: {key}:" in out


def test_a_speech_to_speech_agent_with_dtmf_is_warned(tmp_path):
    text = (ROOT / "configs" / "agents" / "openai_realtime.toml").read_text() + '\n[dtmf]\nterminator = "#"\n'
    p = tmp_path / "s2s.toml"
    p.write_text(text)
    _, problems = check_agent_file(p, env={"OPENAI_API_KEY": "x"})
    assert [(x.severity, x.key) for x in problems if x.key == "dtmf"] == [("warning", "dtmf")]
