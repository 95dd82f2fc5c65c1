"""bench/loadgen/caller.py: one simulated caller's script, driven tick by tick on synthetic time."""

from __future__ import annotations

import numpy as np
import pytest

from bench.loadgen.caller import CallerTiming, CallScript, Phase
from bench.workload import CallPlan
from brisvox.wire import g711

TICK = 0.02
SIL = "SIL"
LOUD = g711.ulaw_encode(np.full(160, 6000, np.int16))
QUIET = bytes([g711.ULAW_SILENCE]) * 160
TIMING = CallerTiming(lead_in=0.1, pause_after_bot=0.1, response_timeout=1.0, tail=0.06, answer=0.2)


def make(barge: tuple[int | None, ...] = (None, None), frames_per_line: int = 5) -> CallScript:
    plan = CallPlan(index=0, start_ms=0, lines=tuple(f"l{k}" for k in range(len(barge))), barge_in_ms=barge)
    lines = [[f"L{k}F{i}" for i in range(frames_per_line)] for k in range(len(barge))]
    s = CallScript(plan, lines, SIL, TIMING)
    s.start(0.0)
    return s


def drive(s: CallScript, until: float, t: float, bot=None) -> tuple[float, list[str | None]]:
    """Tick the script from t to until; ``bot(now)`` may feed bot events each tick."""
    sent: list[str | None] = []
    while t < until - 1e-9 and s.phase is not Phase.DONE:
        if bot:
            bot(t)
        sent.append(s.next_payload(t))
        t = round(t + TICK, 6)
    return t, sent


def test_lead_in_then_line_then_silence_while_waiting() -> None:
    s = make()
    t, sent = drive(s, 0.3, 0.0)
    assert sent[:5] == [SIL] * 5
    assert sent[5:10] == [f"L0F{i}" for i in range(5)]
    assert set(sent[10:]) == {SIL}
    turn = s.turns[0]
    assert turn.t_speech_start == pytest.approx(0.10) and turn.t_speech_end == pytest.approx(0.18)
    assert s.phase is Phase.WAITING


def test_an_answered_turn_measures_latency_then_pauses_and_speaks_again() -> None:
    s = make()
    t, _ = drive(s, 0.3, 0.0)
    for i in range(5):  # 200 ms of answer, 40 ms frames, arriving at real time
        s.on_media(0.6 + i * 0.04, LOUD + LOUD[:160])
    assert s.turns[0].latency_s == pytest.approx(0.6 - 0.18)
    t, sent = drive(s, 0.96, t)  # the answer ends playing at 0.8; then 100 ms of pause
    assert s.k == 1 and "L1F0" in sent
    assert 0.8 + 0.1 <= s.turns[1].t_speech_start <= 0.8 + 0.1 + 2 * TICK  # played, then paused
    assert s.turns[0].t_clear is None and not s.turns[0].unanswered


def test_no_answer_within_the_timeout_counts_unanswered_and_moves_on() -> None:
    s = make()
    t, sent = drive(s, 1.5, 0.0)
    assert s.turns[0].unanswered and s.turns[0].latency_s is None
    assert "L1F0" in sent


def test_barge_in_starts_the_next_line_and_a_clear_ends_the_old_answer() -> None:
    s = make(barge=(120, None))
    t, _ = drive(s, 0.3, 0.0)
    s.on_media(0.40, LOUD)  # first audio of answer 0 at 0.40: barge-in due at 0.52
    s.on_media(0.41, LOUD)
    t, sent = drive(s, 0.54, t)
    assert sent[-1] == "L1F0" and s.turns[0].t_barge == pytest.approx(0.52)
    s.on_media(0.55, LOUD)  # the bot keeps talking until it notices
    s.on_mark(0.56, "m1")  # pending: the audio before it has not played yet
    assert s.due_marks(0.56) == []
    s.on_clear(0.70)
    assert s.due_marks(0.70) == ["m1"]  # a clear answers every pending mark
    old = s.turns[0]
    assert old.t_clear == pytest.approx(0.70) and old.t_last_after_barge == pytest.approx(0.55)
    # playout: 0.40-0.42, 0.42-0.44 (buffered), then 0.55 arrived late and played to 0.57
    assert old.heard_after_barge_s == pytest.approx(0.57 - 0.52)
    s.on_media(0.71, LOUD)  # stray audio after the clear is not the new turn's answer
    assert s.result.unattributed_frames == 1
    t, _ = drive(s, 0.7, t)
    assert s.turns[1].t_speech_end is not None and s.attrib is s.turns[1]


def test_a_clear_before_an_answer_starts_does_not_end_it() -> None:
    s = make()
    t, _ = drive(s, 0.3, 0.0)
    s.on_clear(0.35)  # some servers clear before the first audio of every answer
    s.on_media(0.40, LOUD)
    assert s.turns[0].latency_s == pytest.approx(0.40 - 0.18)
    assert s.turns[0].t_clear is None


def test_marks_echo_when_the_audio_before_them_has_played() -> None:
    s = make()
    t, _ = drive(s, 0.3, 0.0)
    s.on_media(0.40, LOUD)  # plays until 0.42
    s.on_media(0.40, LOUD)  # until 0.44
    s.on_mark(0.40, "end")
    assert s.due_marks(0.43) == []
    assert s.due_marks(0.4401) == ["end"]
    assert s.result.marks_echoed == 1


def test_the_call_hangs_up_after_the_last_turn_and_the_tail() -> None:
    s = make(barge=(None,))
    t, _ = drive(s, 0.3, 0.0)
    for i in range(10):
        s.on_media(0.4 + i * 0.02, LOUD)
    t, sent = drive(s, 2.0, t)
    assert sent[-1] is None and s.phase is Phase.DONE
    assert s.result.t_end is not None and 0.7 < s.result.t_end < 0.9


def test_quiet_bot_frames_do_not_start_an_answer() -> None:
    s = make()
    t, _ = drive(s, 0.3, 0.0)
    s.on_media(0.35, QUIET)
    assert s.turns[0].latency_s is None
    s.on_media(0.40, LOUD)
    assert s.turns[0].latency_s == pytest.approx(0.22)


def test_audio_while_the_caller_speaks_a_new_line_is_not_counted_late() -> None:
    s = make()
    t, _ = drive(s, 0.3, 0.0)
    for i in range(10):
        s.on_media(0.4 + i * 0.02, LOUD)
    t, _ = drive(s, 0.76, t)  # answer over at 0.6, 100 ms pause, line 1 starts at ~0.72
    assert s.phase is Phase.SPEAKING and s.k == 1
    s.on_media(t, LOUD)  # the bot talks over the caller's new line (a false end of turn)
    assert s.result.unattributed_frames == 1
    assert s.turns[0].playout.late_s == [0.0] * 10
