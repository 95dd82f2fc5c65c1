"""brisvox/client/script.py: the caller of ``brisvox call`` driven tick by tick on synthetic time,
with a fake bot feeding it audio, clears and the end of the call."""

from __future__ import annotations

import numpy as np
import pytest

from brisvox.client.script import CallerScript, Phase, ScriptTiming, Step
from brisvox.client.speech import make_line

RATE = 8000
FRAME = 160
TICK = 0.02
LOUD = np.full(FRAME, 6000, np.int16)
QUIET = np.zeros(FRAME, np.int16)


def line(lead_frames: int, speech_frames: int, tail_frames: int, label: str = "l") -> Step:
    x = np.concatenate([np.zeros(lead_frames * FRAME, np.int16), np.full(speech_frames * FRAME, 5000, np.int16),
                        np.zeros(tail_frames * FRAME, np.int16)])
    return Step(line=make_line(label, x, RATE, text=label))


class Bot:
    """Plays ``frames`` loud frames starting at ``at`` (one per tick), optionally stopping
    with a clear at ``clear_at``."""

    def __init__(self) -> None:
        self.plan: list[tuple[float, int, float | None]] = []  # (start, frames, clear_at)

    def add(self, at: float, frames: int, clear_at: float | None = None) -> None:
        self.plan.append((at, frames, clear_at))

    def feed(self, s: CallerScript, now: float) -> None:
        for at, frames, clear_at in self.plan:
            if clear_at is not None and abs(now - clear_at) < TICK / 2:
                s.on_clear(now)
            stop = at + frames * TICK
            if clear_at is not None:
                stop = min(stop, clear_at)
            if at - 1e-9 <= now < stop - 1e-9:
                s.on_bot_audio(LOUD, now)


def run(s: CallerScript, bot: Bot | None = None, limit: float = 60.0, hook=None) -> list:  # noqa: ANN001
    sent = []
    now = 0.0
    s.start(now)
    while now < limit:
        if bot is not None:
            bot.feed(s, now)
        if hook is not None:
            hook(s, now)
        out = s.tick(now)
        if out.hangup:
            return sent
        sent.append((now, out))
        now = round(now + TICK, 6)
    raise AssertionError("the script never hung up")


TIMING = ScriptTiming(lead_in=0.2, answer_wait=2.0, press_wait=0.5, answer_gap=0.3, pause=0.1, tail=0.1)


def test_one_line_answered_measures_caller_stopped_to_first_bot_audio() -> None:
    s = CallerScript([line(2, 10, 3)], RATE, TIMING)
    bot = Bot()
    # lead-in 0.2 s; speech frames 2..11 of the line -> speech ends at 0.2 + 12*0.02 = 0.44
    bot.add(at=1.0, frames=20)
    sent = run(s, bot)
    (t,) = s.turns
    assert t.t_speech_start == pytest.approx(0.2 + 2 * TICK)
    assert t.t_speech_end == pytest.approx(0.44)
    assert t.t_first_audio == pytest.approx(1.0)
    assert t.latency_ms == pytest.approx(560.0)
    assert t.answer_s == pytest.approx(20 * TICK)
    assert not t.unanswered and not t.barged
    # every tick sent exactly one 20 ms frame; the speech frames are the line's
    assert all(len(o.frame) == FRAME for _, o in sent)
    loud = [now for now, o in sent if np.any(o.frame)]
    assert loud[0] == pytest.approx(0.24) and loud[-1] == pytest.approx(0.42)
    # hang-up: answer end (1.4) + gap 0.3 -> tail 0.1
    assert s.t_end == pytest.approx(1.8, abs=0.03)
    assert s.end_reason == "hung up"


def test_an_unanswered_line_gives_up_after_answer_wait() -> None:
    s = CallerScript([line(0, 5, 0), line(0, 5, 0)], RATE, TIMING)
    run(s)
    assert [t.unanswered for t in s.turns] == [True, True]
    assert all(t.latency_ms is None for t in s.turns)
    # the second line waited for the first one's answer_wait + pause
    assert s.turns[1].t_speech_start == pytest.approx(s.turns[0].t_speech_end + 2.0 + 0.1, abs=0.05)


def test_a_greeting_is_turn_zero_and_the_caller_waits_for_it() -> None:
    s = CallerScript([line(0, 5, 0)], RATE, TIMING)
    bot = Bot()
    bot.add(at=0.06, frames=30)  # the bot speaks first, during the lead-in
    bot.add(at=2.0, frames=5)
    run(s, bot)
    g, t = s.turns
    assert g.kind == "greeting" and g.index == 0 and g.latency_ms is None
    assert g.answer_s == pytest.approx(30 * TICK)
    # the line starts only after the greeting ended (0.66) + answer_gap + pause
    assert t.t_speech_start >= 0.66 + 0.3 + 0.1 - 1e-6
    assert t.t_first_audio == pytest.approx(2.0)


def test_barge_in_starts_the_next_line_over_the_answer_and_measures_the_stop() -> None:
    timing = ScriptTiming(lead_in=0.2, answer_wait=2.0, answer_gap=0.3, pause=0.1, tail=0.1,
                          barge_in=0.4, barge_turn=1)
    s = CallerScript([line(0, 10, 0, "one"), line(0, 25, 0, "two")], RATE, timing)
    bot = Bot()
    # line 1: speech 0.2..0.4; the answer starts at 1.0 and would last 3 s
    # barge-in at 1.0 + 0.4 = 1.4; the bot clears 0.3 s later
    bot.add(at=1.0, frames=150, clear_at=1.7)
    bot.add(at=2.8, frames=10)  # answer to line 2 (which ends at 1.4 + 0.5 = 1.9)
    sent = run(s, bot)
    one, two = s.turns
    assert one.barged and two.kind == "line" and not two.barged
    assert one.barge_onset == pytest.approx(1.4)
    assert one.t_clear == pytest.approx(1.7)
    assert one.bot_stopped == pytest.approx(1.7)
    assert one.stop_ms == pytest.approx(300.0)
    assert one.overlap_s == pytest.approx(0.3, abs=TICK + 1e-9)  # the frame of the barge tick may come first
    # the caller really spoke over the bot: loud caller frames from 1.4 on
    assert any(np.any(o.frame) for now, o in sent if 1.4 <= now < 1.7)
    assert two.t_speech_end == pytest.approx(1.9)
    assert two.t_first_audio == pytest.approx(2.8) and two.latency_ms == pytest.approx(900.0)
    assert s.unattributed_s == 0.0


def test_a_barge_in_due_in_a_pause_between_clauses_waits_for_the_bot_to_talk_again() -> None:
    timing = ScriptTiming(lead_in=0.2, answer_wait=2.0, answer_gap=1.0, pause=0.1, tail=0.1,
                          barge_in=0.4, barge_turn=1)
    s = CallerScript([line(0, 10, 0, "one"), line(0, 25, 0, "two")], RATE, timing)
    bot = Bot()
    # the answer's first clause 1.0..1.2, a pause, the next clause from 1.6 (cleared at 1.9)
    bot.add(at=1.0, frames=10)
    bot.add(at=1.6, frames=100, clear_at=1.9)
    bot.add(at=3.0, frames=10)  # answer to line 2
    run(s, bot)
    one, two = s.turns[0], s.turns[1]
    assert one.barged and one.barge_onset == pytest.approx(1.6)  # not 1.4, into the pause
    assert one.stop_ms == pytest.approx(300.0)
    assert not two.barged


def test_an_answer_that_ends_before_the_barge_in_is_not_barged() -> None:
    timing = ScriptTiming(lead_in=0.2, answer_wait=2.0, answer_gap=0.3, pause=0.1, tail=0.1,
                          barge_in=1.0, barge_turn=1)
    s = CallerScript([line(0, 10, 0, "one"), line(0, 10, 0, "two")], RATE, timing)
    bot = Bot()
    bot.add(at=1.0, frames=10)  # 1.0..1.2, then silence: the answer ends at 1.5, before 2.0
    bot.add(at=2.5, frames=10)
    run(s, bot)
    one, two = s.turns[0], s.turns[1]
    assert not one.barged and one.stop_ms is None
    assert two.t_speech_start >= 1.2 + 0.3 + 0.1 - 1e-6  # spoken after the pause, not over the bot


def test_a_bot_that_never_stops_is_reported_as_not_stopped_before_the_line_ended() -> None:
    timing = ScriptTiming(lead_in=0.2, answer_wait=2.0, answer_gap=0.3, pause=0.1, tail=0.1,
                          barge_in=0.2, barge_turn=1)
    s = CallerScript([line(0, 5, 0), line(0, 10, 0)], RATE, timing)
    bot = Bot()
    bot.add(at=0.5, frames=100)  # 0.5 .. 2.5, no clear
    run(s, bot)
    one = s.turns[0]
    # barge onset 0.7, the barging line ends 0.9: the bot was still talking then
    assert one.stop_ms == pytest.approx(200.0)
    assert one.t_clear is None


def test_barge_in_needs_a_line_after_the_barged_turn() -> None:
    with pytest.raises(ValueError):
        CallerScript([line(0, 5, 0)], RATE, ScriptTiming(barge_in=1.0))
    with pytest.raises(ValueError):
        CallerScript([line(0, 5, 0), Step(digits="5")], RATE, ScriptTiming(barge_in=1.0))


def test_a_press_step_sends_its_digits_once_then_waits_for_a_reaction() -> None:
    s = CallerScript([line(0, 5, 0), Step(digits="5#")], RATE, TIMING)
    bot = Bot()
    bot.add(at=0.6, frames=5)
    sent = run(s, bot, hook=lambda sc, now: sc.on_bot_dtmf("9", now) if abs(now - 1.5) < 0.01 else None)
    presses = [(now, o.digits) for now, o in sent if o.digits]
    assert len(presses) == 1 and presses[0][1] == "5#"
    press = s.turns[1]
    assert press.kind == "press" and press.t_speech_start == pytest.approx(presses[0][0])
    assert press.unanswered  # no audible reaction within press_wait
    assert s.bot_digits == [(pytest.approx(1.5), "9")]


def test_the_far_end_hanging_up_ends_the_script() -> None:
    s = CallerScript([line(0, 5, 0), line(0, 5, 0)], RATE, TIMING)
    sent = run(s, hook=lambda sc, now: sc.on_end("bye", now) if abs(now - 0.5) < 0.01 else None)
    assert s.phase is Phase.DONE and s.end_reason == "bye"
    assert sent[-1][0] < 0.5
    assert s.tick(0.6).hangup


def test_a_clear_drops_buffered_bot_audio_from_the_answer() -> None:
    s = CallerScript([line(0, 5, 0)], RATE, TIMING)
    s.start(0.0)
    now = 0.0
    while s.phase is not Phase.WAITING:
        s.tick(now)
        now = round(now + TICK, 6)
    # five frames arrive at once (a burst): they would play until now + 0.1
    for _ in range(5):
        s.on_bot_audio(LOUD, now)
    turn = s.turns[0]
    assert turn.t_last_audio == pytest.approx(now + 0.1)
    s.on_clear(now + 0.03)
    assert turn.t_last_audio == pytest.approx(now + 0.03)
