"""The turn machine's pause on candidate: PauseOutput at a candidate's start,
Interrupt (the Clear cuts) at its confirmation, ResumeOutput at its veto.

Also the two properties that keep it honest on any input sequence: every
PauseOutput is closed by exactly one ResumeOutput of its epoch or an
Interrupt of it (or a Hangup) before the next one, and with the pause
filtered out the machine's actions are exactly those of the same machine
with ``pause_on_candidate = False`` (so the existing guards are unchanged).
"""

from __future__ import annotations

import random
from dataclasses import replace

from brisvox.agent.pipeline.cascade.turn_machine import (
    ArmTimer,
    BotAudioEnded,
    BotAudioStarted,
    BotTurn,
    CancelTimer,
    Hangup,
    Interrupt,
    InterruptionConfig,
    Note,
    OwnStop,
    PauseOutput,
    Phase,
    ResumeOutput,
    StartUserTurn,
    SttFinal,
    SttInterim,
    Tick,
    TurnConfig,
    TurnMachine,
    VadStart,
    VadStop,
    Verdict,
)

NO_PAUSE = TurnConfig(interruption=replace(InterruptionConfig.recommended(), pause_on_candidate=False))


def bot_speaking(m: TurnMachine) -> float:
    """A turn of epoch 1 ended at t, the bot's audio started at t + 0.5; returns t."""
    m.handle(VadStart(0.0))
    m.handle(VadStop(1.0))
    m.handle(Tick(1.0 + m.cfg.silence))
    t = 1.0 + m.cfg.silence
    m.handle(BotAudioStarted(1, t + 0.5))
    return t


def test_recommended_pauses_off_does_not():
    assert InterruptionConfig.recommended().pause_on_candidate is True
    assert InterruptionConfig.off().pause_on_candidate is False


def test_a_candidate_pauses_the_output_the_moment_it_opens():
    m = TurnMachine()
    t = bot_speaking(m)
    assert m.handle(VadStart(t + 2.0)) == [PauseOutput(1, t + 2.0), Note("candidate"), ArmTimer(t + 2.8)]
    assert m.paused == 1
    # the candidate stops and starts again: still one hold, no second Pause
    m.handle(VadStop(t + 2.2))
    assert not any(isinstance(a, PauseOutput) for a in m.handle(VadStart(t + 2.3)))


def test_confirmation_by_length_cuts_without_a_resume():
    m = TurnMachine()
    t = bot_speaking(m)
    m.handle(VadStart(t + 2.0))
    acts = m.handle(Tick(t + 2.8))
    assert acts[0] == Interrupt(1, 2, t + 2.8)  # the driver's clear hook cuts at the held position
    assert not any(isinstance(a, ResumeOutput | PauseOutput) for a in acts)
    assert m.paused == 0 and m.phase is Phase.USER_SPEAKING


def test_confirmation_by_a_real_word_cuts_without_a_resume():
    m = TurnMachine()
    t = bot_speaking(m)
    m.handle(VadStart(t + 2.0))
    assert m.handle(SttInterim("wait", t + 2.1)) == []  # shorter than min_speech: still held
    acts = m.handle(SttInterim("wait what", t + 2.35))
    assert acts[0] == Interrupt(1, 2, t + 2.35)
    assert not any(isinstance(a, ResumeOutput) for a in acts)


def test_a_short_real_word_cuts_at_its_final():
    m = TurnMachine()
    t = bot_speaking(m)
    m.handle(VadStart(t + 2.0))
    m.handle(VadStop(t + 2.2))
    acts = m.handle(SttFinal("stop", "candidate", t + 2.35))
    assert acts[0] == Interrupt(1, 2, t + 2.35) and not any(isinstance(a, ResumeOutput) for a in acts)


def test_a_backchannel_or_an_empty_final_resumes():
    for text in ("uh-huh", "", "yeah okay"):
        m = TurnMachine()
        t = bot_speaking(m)
        m.handle(VadStart(t + 2.0))
        assert m.handle(VadStop(t + 2.3)) == [OwnStop("candidate"), CancelTimer()]
        assert m.handle(SttFinal(text, "candidate", t + 2.4)) == [Note("vetoed"), ResumeOutput(1)]
        assert m.paused == 0 and m.epoch == 1 and m.phase is Phase.BOT_SPEAKING
        # a later candidate pauses again
        assert m.handle(VadStart(t + 4.0))[0] == PauseOutput(1, t + 4.0)


def test_no_pause_inside_the_echo_window():
    m = TurnMachine()
    t = bot_speaking(m)
    assert m.handle(VadStart(t + 0.6)) == [Note("echo")]
    assert m.paused == 0


def test_no_pause_when_switched_off_or_with_guards_off():
    m = TurnMachine(NO_PAUSE)
    t = bot_speaking(m)
    assert m.handle(VadStart(t + 2.0)) == [Note("candidate"), ArmTimer(t + 2.8)]
    m.handle(VadStop(t + 2.3))
    assert m.handle(SttFinal("uh-huh", "candidate", t + 2.4)) == [Note("vetoed")]
    off = TurnMachine(TurnConfig(interruption=InterruptionConfig.off()))
    t = bot_speaking(off)
    acts = off.handle(VadStart(t + 2.0))
    assert isinstance(acts[0], Interrupt) and not any(isinstance(a, PauseOutput) for a in acts)


def test_a_candidate_while_awaiting_the_response_holds_its_first_audio():
    m = TurnMachine()
    m.handle(VadStart(0.0))
    m.handle(VadStop(1.0))
    m.handle(Tick(1.45))
    assert m.phase is Phase.AWAITING_RESPONSE
    assert m.handle(VadStart(1.6))[0] == PauseOutput(1, 1.6)
    m.handle(VadStop(1.8))
    assert m.handle(SttFinal("mhm", "candidate", 1.9)) == [Note("vetoed"), ResumeOutput(1)]


def test_the_bot_ending_by_itself_releases_the_hold_before_the_new_turn():
    m = TurnMachine()
    t = bot_speaking(m)
    m.handle(VadStart(t + 2.0))
    acts = m.handle(BotAudioEnded(1))
    assert acts[0] == ResumeOutput(1)
    assert StartUserTurn(2, t + 2.0, from_candidate=True) in acts
    assert not any(isinstance(a, Interrupt) for a in acts)


def test_a_greeting_is_held_like_an_answer():
    m = TurnMachine()
    m.handle(BotTurn(0.0))
    m.handle(BotAudioStarted(1, 0.1))
    assert m.handle(VadStart(1.0))[0] == PauseOutput(1, 1.0)
    assert isinstance(m.handle(Tick(1.8))[0], Interrupt)


def test_hangup_drops_the_hold():
    m = TurnMachine()
    t = bot_speaking(m)
    m.handle(VadStart(t + 2.0))
    m.handle(Hangup())
    assert m.paused == 0


# --- properties over random input sequences ----------------------------------------------

WORDS = ["", "uh-huh", "yeah", "stop", "wait what", "mhm okay", "tell me more"]


def random_inputs(rng: random.Random, machine: TurnMachine, n: int):
    t = 0.0
    for _ in range(n):
        t += rng.choice((0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9))
        k = rng.randrange(11)
        if k <= 2:
            yield VadStart(t)
        elif k <= 4:
            yield VadStop(t)
        elif k == 5:
            yield SttInterim(rng.choice(WORDS), t)
        elif k == 6:
            yield SttFinal(rng.choice(WORDS), rng.choice(("turn", "candidate", "none")), t)
        elif k == 7:
            yield Tick(t)
        elif k == 8:
            yield BotAudioStarted(machine.epoch - rng.randrange(2), t)
        elif k == 9:
            yield BotAudioEnded(machine.epoch - rng.randrange(2))
        else:
            yield rng.choice((Verdict(machine.analysis_id, rng.random(), t), BotTurn(t)))
    if rng.random() < 0.3:
        yield Hangup()


def test_every_pause_is_closed_once_and_nothing_else_changes():
    pauses = 0
    for seed in range(300):
        rng = random.Random(seed)
        on, off = TurnMachine(), TurnMachine(NO_PAUSE)
        open_epoch = 0
        for inp in random_inputs(rng, on, 120):
            a_on = on.handle(inp)
            a_off = off.handle(inp)
            assert [a for a in a_on if not isinstance(a, PauseOutput | ResumeOutput)] == a_off, (seed, inp)
            for a in a_on:
                if isinstance(a, PauseOutput):
                    assert open_epoch == 0, (seed, inp, a_on)  # never two holds at once
                    assert a.epoch == on.epoch
                    open_epoch = a.epoch
                    pauses += 1
                elif isinstance(a, ResumeOutput):
                    assert a.epoch == open_epoch, (seed, inp, a_on)
                    open_epoch = 0
                elif isinstance(a, Interrupt) and open_epoch:
                    assert a.old_epoch == open_epoch
                    open_epoch = 0
            if isinstance(inp, Hangup):
                open_epoch = 0
            assert on.paused == open_epoch
            # held only while a candidate is pending
            assert bool(open_epoch) == (on.candidate_pending and on.bot_active), (seed, inp)
    assert pauses > 100  # the sequences do exercise holds
