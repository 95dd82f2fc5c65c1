"""Pause on candidate, end to end on virtual time: the production actor in the sim world.

What each test proves (the sim gateway honours Pause/Resume like the real one:
nothing released while held, Resume from the held position, a Clear ends the
hold with Cleared at the held position):

* a backchannel ("uh-huh") during the bot's answer holds the audio at once
  (within a few ticks of the caller's first sample), the veto resumes it from
  the held position, and the caller hears the WHOLE answer: every word once,
  in order, nothing lost or repeated; the context keeps the answer whole and
  there is no interrupt;
* a real barge-in holds the audio at once, then cuts it where it was held:
  no word of the cut answer reaches the wire after the hold, Cleared reports
  the held position, and the context keeps exactly the words the wire
  carried (the played-text oracle);
* a barge-in the guard can only confirm by its length (a sound without
  words: no interim, like local Whisper) is silent from its first 60 ms on,
  though the confirmation takes ``max_backchannel``;
* while the release is held the writer stops too: with many backchannels
  during a long answer the out ring's unreleased audio never exceeds the
  actor's write-ahead (``max_ahead``) plus a report period, whatever the
  total hold time (without the bound it grew by every hold);
* ``pause_on_candidate = False`` (control run): no Pause, the backchannel is
  still vetoed.
"""

from __future__ import annotations

from dataclasses import replace

from brisvox.agent.pipeline.cascade.turn_machine import InterruptionConfig
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import LONG
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import TICK, Utter

VERY_LONG = " ".join([LONG] * 4)


def run(steps, text=LONG, actor=None):
    call = SimCall(steps=steps, llm=[LlmScript((Say(text),)), LlmScript((Say("Sure."),))], actor=actor)
    return run_virtual(lambda: simulate(call))


def kinds(res) -> list[str]:
    return [k for _, k, _, _ in res.platform.pause_log]


def words_heard(res, epoch: int) -> list[tuple[str, float]]:
    w = res.platform.wire
    return [(x, t) for u in w.order if w.utts[u].epoch == epoch for x, _, t in w.utts[u].words]


def norm(text: str) -> list[str]:
    return text.split()


def test_a_backchannel_pauses_then_resumes_and_the_whole_answer_is_heard():
    res = run([Utter("tell me about the weather", at=0.5), Utter("uh-huh", after_bot_words=6)])
    log = res.platform.pause_log
    assert kinds(res) == ["pause", "resume"]
    (t_pause, _, epoch, held), (t_resume, _, epoch2, resumed_at) = log
    assert epoch == epoch2 == 1
    assert resumed_at == held  # nothing was released while held
    # held at the candidate's start: the sim VAD needs 2 frames, the actor reacts in the same tick
    onset = res.platform.caller.spoken[1].start_t
    assert 0 <= t_pause - onset <= 3 * TICK + 1e-9
    assert t_resume > t_pause
    # nothing of the answer reached the wire while held
    assert not [t for _, t in words_heard(res, 1) if t_pause + TICK < t < t_resume]
    # the caller heard every word of the answer exactly once, in order
    assert [x for x, _ in words_heard(res, 1)] == norm(LONG)
    assert res.interrupts == 0 and res.actor.driver.st.vetoed == 1
    assert res.actor.driver.st.output_pauses == 1 and res.actor.driver.st.output_resumes == 1
    assert res.assistant_texts()[0] == LONG
    assert res.actor.book.st.marks_played == 1
    assert oracle_mismatches(res) == []


def test_a_real_barge_in_pauses_then_cuts_at_the_held_position():
    res = run([Utter("what is the weather like", at=0.5),
               Utter("wait stop please tell me about tomorrow", after_bot_words=6)])
    assert kinds(res) == ["pause", "cleared"]
    (t_pause, _, epoch, held), (t_cut, _, dead, at_cut) = res.platform.pause_log
    assert epoch == 1 and dead == 1 and at_cut == held
    assert t_cut - t_pause >= InterruptionConfig().min_speech - 1e-9  # the guard still judged it
    # Cleared reported the held position: the played-text cut is what was released
    assert [fin for _, e, fin in res.platform.clear_log if e == 1] == [held]
    heard = words_heard(res, 1)
    assert heard and all(t <= t_pause + TICK for _, t in heard)  # silent from the hold on
    assert res.interrupts == 1
    assert oracle_mismatches(res) == []
    cut = res.assistant_texts()[0]
    assert norm(cut) == [x for x, _ in heard]
    assert res.platform.wire.frames_after_clear == []


def test_a_wordless_barge_in_is_silent_at_once_though_confirmed_by_its_length():
    res = run([Utter("what is the weather like", at=0.5), Utter("", noise=1.5, after_bot_words=6)])
    assert kinds(res) == ["pause", "cleared"]
    (t_pause, _, _, held), (t_cut, _, _, at_cut) = res.platform.pause_log
    onset = res.platform.caller.spoken[1].start_t
    assert t_pause - onset <= 3 * TICK + 1e-9
    # no interim: confirmed only max_backchannel after its (backdated) start, silent since the hold
    assert t_cut - onset >= InterruptionConfig().max_backchannel - TICK - 1e-9  # start backdated <= 1 tick
    assert at_cut == held
    assert all(t <= t_pause + TICK for _, t in words_heard(res, 1))
    assert res.interrupts == 1
    assert oracle_mismatches(res) == []


def test_holds_never_let_the_writer_run_ahead_of_the_release():
    steps = [Utter("tell me everything about the weather", at=0.5)]
    steps += [Utter("uh-huh", after_bot_words=8)]
    steps += [Utter("mhm", after=2.5) for _ in range(5)]
    res = run(steps, text=VERY_LONG)
    pauses = [x for x in res.platform.pause_log if x[1] == "pause"]
    assert len(pauses) == 6 and kinds(res).count("resume") == 6
    held_s = sum(b[0] - a[0] for a, b in zip(res.platform.pause_log[::2], res.platform.pause_log[1::2], strict=True))
    assert held_s > 3.0  # more than the ring could absorb without the bound
    max_ahead = default_actor_config().out.max_ahead
    rate = res.platform.cfg.call_rate
    # write-ahead + one report period + one TTS piece of slack
    assert res.platform.max_unreleased <= (max_ahead + 0.1 + 0.25) * rate
    assert [x for x, _ in words_heard(res, 1)] == norm(VERY_LONG)
    assert res.actor.stats()["out"]["hold_overflows"] == 0
    assert res.interrupts == 0


def test_without_pause_on_candidate_nothing_is_held():
    base = default_actor_config()
    icfg = replace(base.turn.turn.interruption, pause_on_candidate=False)
    cfg = replace(base, turn=replace(base.turn, turn=replace(base.turn.turn, interruption=icfg)))
    res = run([Utter("tell me about the weather", at=0.5), Utter("uh-huh", after_bot_words=6)], actor=cfg)
    assert res.platform.pause_log == []
    assert res.actor.driver.st.vetoed == 1 and res.interrupts == 0
    assert res.assistant_texts()[0] == LONG
