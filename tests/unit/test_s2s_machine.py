"""The S2S machine's rules, input by input (brisvox/agent/pipeline/s2s/machine.py)."""

from __future__ import annotations

from brisvox.agent.pipeline.s2s import machine as M
from brisvox.providers.s2s import base as s2


def machine(detection: str = "provider", **kw) -> M.S2sMachine:
    return M.S2sMachine(M.S2sTurnConfig(turn_detection=detection, **kw))  # type: ignore[arg-type]


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_each_new_response_opens_an_epoch_and_a_tool_continuation_shares_it():
    m = machine()
    assert m.handle(s2.S2sResponseStarted("r1")) == [M.NewEpoch(1, 0, "r1")]
    m.handle(s2.S2sToolCall("r1", "c1", "f", "{}"))
    (run,) = m.handle(s2.S2sResponseDone("r1"))
    assert isinstance(run, M.RunTools) and run.epoch == 1 and [c.call_id for c in run.calls] == ["c1"]
    assert m.handle(M.ToolsDone("r1")) == []
    assert m.handle(s2.S2sResponseStarted("r2")) == [M.NewEpoch(1, 1, "r2")]
    assert kinds(m.handle(s2.S2sResponseDone("r2"))) == ["RoundEnded", "EndBotTurn"]
    # the next user turn's response is a new epoch
    assert m.handle(s2.S2sResponseStarted("r3")) == [M.NewEpoch(2, 0, "r3")]


def test_a_barge_in_kills_the_epoch_and_its_late_audio_is_stale():
    m = machine()
    m.handle(s2.S2sResponseStarted("r1"))
    m.handle(M.BotStarted(1, 1.0))
    (b,) = m.handle(s2.S2sSpeechStarted())
    assert isinstance(b, M.BargeIn) and (b.old_epoch, b.new_epoch, b.cancel, b.by) == (1, 2, "r1", "provider")
    assert m.handle(s2.S2sAudio("r1", "i1", b"\0\0")) == [M.Count("stale_audio")]
    assert m.handle(s2.S2sToolCall("r1", "c1", "f", "{}")) == [M.Count("stale_tool_calls")]
    assert m.handle(s2.S2sResponseDone("r1", "cancelled")) == [M.Count("stale_events")]
    assert m.handle(s2.S2sResponseStarted("r2")) == [M.NewEpoch(2, 0, "r2")]  # the floor, not 3


def test_a_vad_candidate_pauses_then_confirms_or_is_vetoed():
    m = machine()
    m.handle(s2.S2sResponseStarted("r1"))
    m.handle(M.BotStarted(1, 1.0))
    out = m.handle(M.VadStart(2.0))
    assert kinds(out) == ["SpeechBegan", "Pause"] and m.deadline == 2.0 + 0.8
    assert kinds(m.handle(M.VadStop(2.3, 100))) == ["Resume", "Count"]  # a backchannel
    m.handle(M.VadStart(3.0))
    assert m.handle(M.Timer(3.5)) == []
    (b,) = m.handle(M.Timer(3.8))
    assert isinstance(b, M.BargeIn) and b.at == 3.0 and b.by == "vad"


def test_speech_inside_the_echo_window_is_ignored():
    m = machine()
    m.handle(s2.S2sResponseStarted("r1"))
    m.handle(M.BotStarted(1, 1.0))
    assert kinds(m.handle(M.VadStart(1.1))) == ["SpeechBegan", "Count"]


def test_brisvox_turn_end_waits_for_the_verdict_and_a_resume_continues_the_turn():
    m = machine("brisvox")
    assert kinds(m.handle(M.VadStart(0.5))) == ["SpeechBegan", "UserStarted"]
    assert m.handle(M.VadStop(1.5, 24000)) == [M.AskVerdict(24000)]
    assert m.handle(M.Verdict(False, 1.6)) == [] and m.deadline == 1.6 + 1.2
    m.handle(M.VadStart(2.0))  # the caller goes on: no commit
    assert m.deadline is None
    m.handle(M.VadStop(3.0, 48000))
    assert m.handle(M.Verdict(True, 3.05)) == [M.CommitTurn(3.05)]
    assert m.handle(M.Verdict(True, 3.1)) == [M.Count("stale_verdicts")]


def test_a_verdict_that_never_comes_commits_at_its_timeout():
    m = machine("brisvox")
    m.handle(M.VadStart(0.5))
    m.handle(M.VadStop(1.5, 24000))
    assert m.handle(M.Timer(1.5 + 0.5)) == [M.CommitTurn(2.0)]


def test_a_dead_session_ends_its_response_and_epoch():
    m = machine()
    m.handle(s2.S2sResponseStarted("r1"))
    out = m.handle(M.SessionLost(2.0))
    assert out[0] == M.RoundEnded(1, 0, "r1", "failed") and M.EndBotTurn(1) in out
    assert m.streaming == ""


def test_nothing_is_accepted_after_close():
    m = machine()
    m.close()
    assert m.handle(s2.S2sResponseStarted("r1")) == []
