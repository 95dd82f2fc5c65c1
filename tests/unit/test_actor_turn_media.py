"""The call's media state in the pure machines (the turn machine, the S2S machine), the
call record's ``media`` section, and the gateway call machine's Abandon once the agent
side started (a dialled call's early media starts it before the answer).

* held: no turn from the caller's audio or keys, the bot cut (an Interrupt to a new epoch,
  no user turn after it), an open user turn dropped; resumed: nothing said, the next
  speech is an ordinary turn;
* early: no turn, no greeting; answered: the greeting that waited, then ordinary turns;
* answered all along: the machine is what it always was.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.agent.host.call_media import MediaLog
from brisvox.agent.pipeline.cascade import turn_machine as tm
from brisvox.agent.pipeline.s2s import machine as S
from brisvox.gateway.core import call_machine as CM
from brisvox.providers.s2s import base as s2

OFF = tm.TurnConfig(interruption=tm.InterruptionConfig.off())


def test_a_hold_cuts_the_speaking_bot_and_opens_no_turn_until_the_resume():
    m = tm.TurnMachine()
    m.handle(tm.VadStart(1.0))
    m.handle(tm.VadStop(2.0))
    assert isinstance(m.handle(tm.Tick(2.45))[-1], tm.EndUserTurn)
    m.handle(tm.BotAudioStarted(1, 3.0))
    acts = m.handle(tm.Media("held", 4.0))
    assert tm.Interrupt(1, 2, 4.0) in acts
    assert not any(isinstance(a, tm.StartUserTurn | tm.StartBotTurn) for a in acts)
    assert m.phase is tm.Phase.IDLE and m.epoch == 2
    # music on hold: the VAD fires, nothing opens
    assert m.handle(tm.VadStart(5.0)) == [tm.Note("media_muted")]
    assert m.handle(tm.VadStop(6.0)) == [tm.OwnStop("none")]
    assert m.handle(tm.Keypad(6.5)) == [tm.Note("media_muted")]
    assert m.handle(tm.Tick(9.0)) == [] and m.phase is tm.Phase.IDLE
    assert m.handle(tm.BotAudioEnded(1)) == []  # the cut epoch's end: nothing
    # resumed: nothing is said; the caller's next words are an ordinary turn
    assert m.handle(tm.Media("answered", 10.0)) == [tm.Note("media_answered")]
    assert m.handle(tm.VadStart(11.0)) == [tm.StartUserTurn(3, 11.0)]


def test_a_hold_during_a_pause_candidate_cuts_without_a_resume():
    m = tm.TurnMachine()
    m.handle(tm.VadStart(1.0))
    m.handle(tm.VadStop(2.0))
    m.handle(tm.Tick(2.45))
    m.handle(tm.BotAudioStarted(1, 3.0))
    assert tm.PauseOutput(1, 4.0) in m.handle(tm.VadStart(4.0))
    acts = m.handle(tm.Media("held", 4.2))
    assert tm.Interrupt(1, 2, 4.2) in acts and not any(isinstance(a, tm.ResumeOutput) for a in acts)
    assert m.paused == 0 and not m.candidate_pending


def test_a_hold_drops_the_open_user_turn():
    m = tm.TurnMachine()
    m.handle(tm.VadStart(1.0))
    m.handle(tm.VadStop(2.0))  # paused, the silence timer armed
    acts = m.handle(tm.Media("held", 2.1))
    assert tm.DropUserTurn(1) in acts and tm.CancelTimer() in acts
    assert not any(isinstance(a, tm.Interrupt) for a in acts)
    assert m.handle(tm.Tick(3.0)) == []  # the dropped turn never ends
    assert m.handle(tm.Verdict(m.analysis_id, 0.9, 3.0)) == [tm.Note("stale_verdict")]


def test_early_media_defers_the_greeting_to_the_answer():
    m = tm.TurnMachine()
    assert m.handle(tm.Media("early", 0.0)) == [tm.Note("media_muted_call")]
    assert m.handle(tm.BotTurn(0.1)) == []  # ringback: no greeting yet
    assert m.handle(tm.VadStart(0.5)) == [tm.Note("media_muted")]  # an announcement: no turn
    assert m.handle(tm.VadStop(1.5)) == [tm.OwnStop("none")]
    assert m.epoch == 0
    assert m.handle(tm.Media("answered", 3.0)) == [tm.Note("media_answered"), tm.StartBotTurn(1, 3.0)]
    assert m.phase is tm.Phase.AWAITING_RESPONSE
    m2 = tm.TurnMachine()
    m2.handle(tm.Media("early", 0.0))
    assert m2.handle(tm.Media("answered", 1.0)) == [tm.Note("media_answered")]  # no greeting asked: none


MEDIA = st.sampled_from(["held", "early"])
TURN_INPUTS = st.one_of(
    st.builds(tm.VadStart, st.floats(0, 50)),
    st.builds(tm.VadStop, st.floats(0, 50)),
    st.builds(tm.VadFalling, st.floats(0, 50), st.integers(0, 10_000)),
    st.builds(tm.SttInterim, st.sampled_from(["stop", "uh-huh", ""]), st.floats(0, 50)),
    st.builds(tm.SttFinal, st.sampled_from(["stop please", "mhm", ""]),
              st.sampled_from(["turn", "candidate", "none"]), st.floats(0, 50)),
    st.builds(tm.Tick, st.floats(0, 60)),
    st.builds(tm.BotAudioStarted, st.integers(0, 4), st.floats(0, 50)),
    st.builds(tm.BotAudioEnded, st.integers(0, 4)),
    st.builds(tm.BotTurn, st.floats(0, 50)),
    st.builds(tm.Keypad, st.floats(0, 50)),
    st.builds(tm.Verdict, st.integers(0, 6), st.sampled_from([0.9, 0.1, None]), st.floats(0, 50)),
)
OPENING = (tm.StartUserTurn, tm.StartBotTurn, tm.EndUserTurn, tm.PauseOutput)


@settings(max_examples=300, deadline=None)
@given(st.lists(TURN_INPUTS, max_size=10), MEDIA, st.lists(TURN_INPUTS, max_size=20), st.booleans())
def test_nothing_opens_a_turn_or_speaks_while_the_call_does_not_converse(before, state, during, smart):
    m = tm.TurnMachine(tm.TurnConfig(smart_turn=smart))
    for i in before:
        m.handle(i)
    m.handle(tm.Media(state, 60.0))
    assert not m.bot_active and m.phase is tm.Phase.IDLE
    epoch = m.epoch
    for i in during:
        acts = m.handle(i)
        assert not any(isinstance(a, OPENING + (tm.Interrupt,)) for a in acts), (i, acts)
        if isinstance(i, tm.VadStop):
            assert acts == [tm.OwnStop("none")]
    assert m.epoch == epoch


def test_a_hold_in_the_s2s_machine_cuts_the_response_and_mutes_every_opener():
    m = S.S2sMachine(S.S2sTurnConfig(turn_detection="brisvox", smart_turn=False))
    assert isinstance(m.handle(s2.S2sResponseStarted("r1"))[-1], S.NewEpoch)
    acts = m.handle(tm.Media("held", 2.0))
    cut, = [a for a in acts if isinstance(a, S.BargeIn)]
    assert cut.cancel == "r1" and cut.by == "media"
    assert not any(isinstance(a, S.UserStarted) for a in acts)
    assert m.handle(tm.VadStart(3.0)) == [S.Count("media_muted")]
    assert m.handle(s2.S2sSpeechStarted()) == [S.Count("media_muted")]
    started = m.handle(s2.S2sResponseStarted("r2"))  # the provider answers anyway: cut at once
    assert any(isinstance(a, S.BargeIn) and a.cancel == "r2" and a.by == "media" for a in started)
    assert m.handle(s2.S2sAudio("r2", "i2", b"\x00" * 320)) == [S.Count("stale_audio")]  # never played
    assert m.handle(tm.Media("answered", 9.0)) == [S.Count("media_answered")]
    assert m.handle(tm.VadStart(10.0))[-1] == S.UserStarted(10.0)  # after the resume: a turn again


def test_abandon_is_ignored_once_the_agent_side_started():
    m = CM.CallMachine()
    m.handle(CM.Admit("sip", process=True))
    m.handle(CM.TransportStarted())
    m.handle(CM.AgentStarted(ok=True, now=1.0))
    out = m.handle(CM.TransportEnded("busy", now=2.0))
    assert CM.SendCallEnd("busy") in out
    assert m.handle(CM.Abandon()) == ()  # the agent still has the rings
    assert not m.released
    assert m.handle(CM.AgentEnded("bye", leg=True)) == (CM.Release(),)


def test_the_media_log_is_the_records_section():
    log = MediaLog("early", 100.0)
    assert not log.converses
    assert log.note("answered", 103.0, {"ringing_at_ms": 120, "progress_at_ms": 300, "answered_at_ms": 3000,
                                        "bogus": 1})
    assert log.converses and not log.note("answered", 104.0)
    assert log.note("held", 110.0) and log.note("answered", 112.5)
    assert not log.note("on the moon", 113.0)
    rec = log.record(120.0)
    assert rec["initial"] == "early" and rec["state"] == "answered"
    assert [c["state"] for c in rec["changes"]] == ["answered", "held", "answered"]
    assert rec["changes"][1]["at_s"] == 10.0 and rec["holds"] == 1 and rec["held_s"] == 2.5
    assert rec["dial"] == {"ringing_at_ms": 120, "progress_at_ms": 300, "answered_at_ms": 3000}
    assert rec["refused"] == 1
    held_now = MediaLog("answered", 0.0)
    held_now.note("held", 5.0)
    assert held_now.record(8.0)["held_s"] == 3.0  # a hold still running at hang-up counts
