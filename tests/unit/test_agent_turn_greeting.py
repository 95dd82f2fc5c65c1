"""TurnMachine's BotTurn (the agent's greeting): a bot turn of a new epoch, only from IDLE."""

from __future__ import annotations

from brisvox.agent.pipeline.cascade import turn_machine as tm


def test_bot_turn_from_idle_opens_a_bot_turn_and_a_barge_in_interrupts_it():
    m = tm.TurnMachine(tm.TurnConfig(interruption=tm.InterruptionConfig.off()))
    acts = m.handle(tm.BotTurn(0.0))
    assert acts == [tm.StartBotTurn(1, 0.0)]
    assert m.phase is tm.Phase.AWAITING_RESPONSE and m.epoch == 1
    m.handle(tm.BotAudioStarted(1, 0.2))
    assert m.phase is tm.Phase.BOT_SPEAKING
    acts = m.handle(tm.VadStart(1.0))
    assert isinstance(acts[0], tm.Interrupt) and acts[0].old_epoch == 1 and acts[0].new_epoch == 2
    assert any(isinstance(a, tm.StartUserTurn) and a.epoch == 2 for a in acts)


def test_bot_turn_is_ignored_once_the_caller_is_talking_and_ends_like_any_response():
    m = tm.TurnMachine()
    m.handle(tm.VadStart(0.0))
    assert m.handle(tm.BotTurn(0.1)) == []
    assert m.epoch == 1 and m.phase is tm.Phase.USER_SPEAKING
    m2 = tm.TurnMachine()
    m2.handle(tm.BotTurn(0.0))
    m2.handle(tm.BotAudioStarted(1, 0.1))
    m2.handle(tm.BotAudioEnded(1))
    assert m2.phase is tm.Phase.IDLE
    assert m2.handle(tm.VadStart(2.0)) == [tm.StartUserTurn(2, 2.0)]
