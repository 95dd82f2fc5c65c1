"""The turn machine's early analysis: a VadFalling starts Smart Turn, the stop of the same fall reuses it."""

from __future__ import annotations

from brisvox.agent.pipeline.cascade import turn_machine as tm

EARLY = tm.TurnConfig(smart_turn=True, early_analysis=True, fallback_silence=1.5)


def requests(acts: list[tm.Action]) -> list[tm.RequestAnalysis]:
    return [a for a in acts if isinstance(a, tm.RequestAnalysis)]


def speaking(cfg: tm.TurnConfig = EARLY) -> tm.TurnMachine:
    m = tm.TurnMachine(cfg)
    m.handle(tm.VadStart(1.0))
    return m


def test_an_early_verdict_is_reused_at_the_stop_of_the_same_fall():
    m = speaking()
    acts = m.handle(tm.VadFalling(2.0, 32000))
    assert requests(acts) == [tm.RequestAnalysis(1, 2.0, early=True)]
    assert m.handle(tm.Verdict(1, 0.9, 2.13)) == [tm.Note("early_verdict")]
    assert m.phase is tm.Phase.USER_SPEAKING  # nothing is decided before the stop
    acts = m.handle(tm.VadStop(2.0, 32000))
    assert requests(acts) == []  # one analysis for the fall, not two
    assert acts == [tm.OwnStop("turn"), tm.Note("early_reused"), tm.EndUserTurn(1, 2.0)]
    assert m.phase is tm.Phase.AWAITING_RESPONSE and m.deadline is None


def test_an_early_analysis_still_running_at_the_stop_decides_when_it_comes():
    m = speaking()
    m.handle(tm.VadFalling(2.0, 32000))
    acts = m.handle(tm.VadStop(2.0, 32000))
    assert requests(acts) == [] and acts[-1] == tm.ArmTimer(3.5)
    assert m.handle(tm.Verdict(1, 0.9, 2.25)) == [tm.CancelTimer(), tm.EndUserTurn(1, 2.25)]


def test_an_incomplete_early_verdict_leaves_the_turn_to_the_fallback_silence():
    m = speaking()
    m.handle(tm.VadFalling(2.0, 32000))
    m.handle(tm.Verdict(1, 0.1, 2.1))
    acts = m.handle(tm.VadStop(2.0, 32000))
    assert requests(acts) == [] and tm.Note("incomplete") in acts and acts[-1] == tm.ArmTimer(3.5)
    assert m.handle(tm.Tick(3.5)) == [tm.EndUserTurn(1, 3.5)]


def test_speech_again_discards_it_and_the_stop_asks_again():
    # the stop of a later fall (speech resumed: its pos moved) is not the analysed one
    m = speaking()
    m.handle(tm.VadFalling(2.0, 32000))
    m.handle(tm.Verdict(1, 0.9, 2.1))
    acts = m.handle(tm.VadStop(2.6, 41600))
    assert tm.Note("early_discarded") in acts
    assert requests(acts) == [tm.RequestAnalysis(2, 2.6)]
    assert m.phase is tm.Phase.USER_PAUSED  # the early "complete" did not end the turn
    assert m.handle(tm.Verdict(2, 0.9, 2.7))[-1] == tm.EndUserTurn(1, 2.7)
    # a VAD start discards it too; a verdict coming after that is stale
    m2 = speaking()
    m2.handle(tm.VadFalling(2.0, 32000))
    assert m2.handle(tm.VadStart(2.1)) == [tm.Note("early_discarded")]
    assert m2.handle(tm.Verdict(1, 0.9, 2.2)) == [tm.Note("stale_verdict")]
    assert requests(m2.handle(tm.VadStop(2.0, 32000))) == [tm.RequestAnalysis(2, 2.0)]


def test_a_falling_without_a_stop_costs_one_request_at_most():
    m = speaking()
    acts = m.handle(tm.VadFalling(2.0, 32000)) + m.handle(tm.VadFalling(2.0, 32000))  # announced twice
    acts += m.handle(tm.Verdict(1, 0.9, 2.1)) + m.handle(tm.Tick(9.0))
    assert len(requests(acts)) == 1
    assert m.phase is tm.Phase.USER_SPEAKING and m.epoch == 1


def test_no_stale_verdict_is_used_for_a_later_fall():
    m = speaking()
    m.handle(tm.VadFalling(2.0, 32000))  # fall A (analysis 1), then speech again without a stop
    acts = m.handle(tm.VadFalling(2.8, 44800))  # fall B (analysis 2)
    assert tm.Note("early_discarded") in acts and requests(acts) == [tm.RequestAnalysis(2, 2.8, early=True)]
    assert m.handle(tm.Verdict(1, 0.9, 2.9)) == [tm.Note("stale_verdict")]  # A's verdict: not B's
    acts = m.handle(tm.VadStop(2.8, 44800))
    assert requests(acts) == [] and not any(isinstance(a, tm.EndUserTurn) for a in acts)
    assert m.handle(tm.Verdict(2, 0.9, 3.0))[-1] == tm.EndUserTurn(1, 3.0)
    # the next turn starts clean: its stop asks for its own analysis
    m.handle(tm.BotAudioEnded(1))
    m.handle(tm.VadStart(5.0))
    assert requests(m.handle(tm.VadStop(6.0, 44800))) == [tm.RequestAnalysis(3, 6.0)]


def test_off_unless_both_switches_and_only_for_an_open_user_turn():
    for cfg in (tm.TurnConfig(smart_turn=True), tm.TurnConfig(early_analysis=True)):
        m = speaking(cfg)
        assert m.handle(tm.VadFalling(2.0, 32000)) == [] and m.early_id == 0
    m = tm.TurnMachine(EARLY)
    assert m.handle(tm.VadFalling(0.5, 8000)) == []  # IDLE: no turn to analyse
    m = speaking()
    m.handle(tm.VadStop(2.0, 32000))
    assert m.handle(tm.VadFalling(2.1, 32000)) == []  # paused already
