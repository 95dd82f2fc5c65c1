"""The pure turn machine: turns, pauses, verdicts, barge-in guards, epochs."""

from __future__ import annotations

from brisvox.agent.pipeline.cascade.turn_machine import (
    ArmTimer,
    BotAudioEnded,
    BotAudioStarted,
    CancelTimer,
    EndUserTurn,
    Hangup,
    Interrupt,
    InterruptionConfig,
    Note,
    OwnStop,
    Phase,
    RequestAnalysis,
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

OFF = TurnConfig(interruption=InterruptionConfig.off())


def speak_turn(m: TurnMachine, t0: float) -> float:
    m.handle(VadStart(t0))
    m.handle(VadStop(t0 + 1.0))
    acts = m.handle(Tick(t0 + 1.0 + m.cfg.silence))
    assert isinstance(acts[-1], EndUserTurn)
    return t0 + 1.0 + m.cfg.silence


def test_a_turn_starts_pauses_and_ends_after_the_silence():
    m = TurnMachine()
    assert m.handle(VadStart(1.0)) == [StartUserTurn(1, 1.0)]
    assert m.handle(VadStop(2.0)) == [OwnStop("turn"), ArmTimer(2.45)]
    assert m.handle(Tick(2.44)) == []
    assert m.handle(Tick(2.45)) == [EndUserTurn(1, 2.45)]
    assert m.phase is Phase.AWAITING_RESPONSE


def test_resume_within_the_pause_keeps_the_turn():
    m = TurnMachine()
    m.handle(VadStart(1.0))
    m.handle(VadStop(2.0))
    assert m.handle(VadStart(2.2)) == [CancelTimer()]
    assert m.epoch == 1 and m.phase is Phase.USER_SPEAKING
    assert m.handle(Tick(2.45)) == []


def test_a_verdict_after_a_new_vad_start_is_stale():
    m = TurnMachine(TurnConfig(smart_turn=True))
    m.handle(VadStart(1.0))
    acts = m.handle(VadStop(2.0))
    req = next(a for a in acts if isinstance(a, RequestAnalysis))
    m.handle(VadStart(2.1))
    assert m.handle(Verdict(req.id, 0.99, 2.15)) == [Note("stale_verdict")]
    assert m.phase is Phase.USER_SPEAKING


def test_complete_verdict_ends_the_turn_incomplete_waits_for_the_fallback():
    m = TurnMachine(TurnConfig(smart_turn=True, fallback_silence=1.5))
    m.handle(VadStart(1.0))
    req = next(a for a in m.handle(VadStop(2.0)) if isinstance(a, RequestAnalysis))
    assert m.handle(Verdict(req.id, 0.1, 2.1)) == [Note("incomplete")]
    assert m.handle(Tick(3.49)) == []
    assert m.handle(Tick(3.5)) == [EndUserTurn(1, 3.5)]
    m2 = TurnMachine(TurnConfig(smart_turn=True))
    m2.handle(VadStart(1.0))
    req = next(a for a in m2.handle(VadStop(2.0)) if isinstance(a, RequestAnalysis))
    assert m2.handle(Verdict(req.id, 0.9, 2.1)) == [CancelTimer(), EndUserTurn(1, 2.1)]


def test_failed_verdict_leaves_the_fallback_timer():
    m = TurnMachine(TurnConfig(smart_turn=True, fallback_silence=1.0))
    m.handle(VadStart(1.0))
    req = next(a for a in m.handle(VadStop(2.0)) if isinstance(a, RequestAnalysis))
    assert m.handle(Verdict(req.id, None, 2.1)) == [Note("verdict_failed")]
    assert m.handle(Tick(3.0)) == [EndUserTurn(1, 3.0)]


def test_barge_in_with_guards_off_interrupts_before_the_new_turn():
    m = TurnMachine(OFF)
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    acts = m.handle(VadStart(t + 1.0))
    assert acts[0] == Interrupt(1, 2, t + 1.0)
    assert isinstance(acts[-1], StartUserTurn) and acts[-1].epoch == 2
    assert m.phase is Phase.USER_SPEAKING


def test_bot_audio_ended_of_the_interrupted_epoch_is_ignored():
    m = TurnMachine(OFF)
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    m.handle(VadStart(t + 1.0))
    assert m.handle(BotAudioEnded(1)) == []
    assert m.phase is Phase.USER_SPEAKING and m.epoch == 2


def test_echo_window_ignores_a_start_right_after_the_bot_starts():
    m = TurnMachine()
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    assert m.handle(VadStart(t + 0.6)) == [Note("echo")]
    assert m.handle(VadStop(t + 0.7)) == [OwnStop("none")]
    assert m.epoch == 1


def test_backchannel_is_vetoed_and_the_bot_keeps_talking():
    m = TurnMachine()
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    acts = m.handle(VadStart(t + 2.0))
    assert Note("candidate") in acts
    assert m.handle(VadStop(t + 2.3))[0] == OwnStop("candidate")
    # the candidate paused the bot's audio; the veto resumes it (pause_on_candidate)
    assert m.handle(SttFinal("uh-huh", "candidate", t + 2.4)) == [Note("vetoed"), ResumeOutput(1)]
    assert m.epoch == 1 and m.phase is Phase.BOT_SPEAKING
    assert m.handle(BotAudioEnded(1)) == []
    assert m.phase is Phase.IDLE


def test_a_short_real_word_interrupts_at_its_final():
    m = TurnMachine()
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    m.handle(VadStart(t + 2.0))
    m.handle(VadStop(t + 2.2))
    acts = m.handle(SttFinal("stop", "candidate", t + 2.35))
    assert acts[0] == Interrupt(1, 2, t + 2.35)
    assert acts[1] == StartUserTurn(2, t + 2.0, from_candidate=True)
    assert m.phase is Phase.USER_PAUSED
    assert isinstance(acts[-1], ArmTimer) and acts[-1].at == t + 2.2 + m.cfg.silence


def test_long_speech_interrupts_after_max_backchannel_and_an_interim_earlier():
    m = TurnMachine()
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    m.handle(VadStart(t + 2.0))
    assert m.handle(Tick(t + 2.79)) == []
    acts = m.handle(Tick(t + 2.8))
    assert isinstance(acts[0], Interrupt)
    m2 = TurnMachine()
    t = speak_turn(m2, 0.0)
    m2.handle(BotAudioStarted(1, t + 0.5))
    m2.handle(VadStart(t + 2.0))
    assert m2.handle(SttInterim("wait", t + 2.1)) == []  # shorter than min_speech
    acts = m2.handle(SttInterim("wait what", t + 2.35))
    assert isinstance(acts[0], Interrupt) and acts[0].at == t + 2.35


def test_bot_ending_while_a_candidate_speaks_starts_a_plain_turn():
    m = TurnMachine()
    t = speak_turn(m, 0.0)
    m.handle(BotAudioStarted(1, t + 0.5))
    m.handle(VadStart(t + 2.0))
    acts = m.handle(BotAudioEnded(1))
    assert not any(isinstance(a, Interrupt) for a in acts)
    assert StartUserTurn(2, t + 2.0, from_candidate=True) in acts
    assert m.phase is Phase.USER_SPEAKING


def test_hangup_closes_everything():
    m = TurnMachine()
    m.handle(VadStart(1.0))
    m.handle(VadStop(2.0))
    assert m.handle(Hangup()) == [CancelTimer()]
    assert m.handle(VadStart(3.0)) == []
    assert m.phase is Phase.CLOSED


def test_every_stop_has_exactly_one_owner():
    m = TurnMachine()
    for inp in [VadStop(0.5), VadStart(1.0), VadStop(1.5), VadStart(1.6), VadStop(2.0), Tick(3.0), VadStop(3.1)]:
        acts = m.handle(inp)
        if isinstance(inp, VadStop):
            assert sum(isinstance(a, OwnStop) for a in acts) == 1
