"""Fillers through the whole call on virtual time: pre-rendered clips, barge-ins, the heard prefix.

* A filler phrase is synthesized once per agent, voice and rate (on first use) and played from
  memory afterwards: the second filler of a call and the fillers of a second call of the same
  agent make NO TTS request (the FakeTts probe sees the phrase once), another voice or an
  unnamed agent renders its own.
* A barge-in during a clip cuts it like any utterance: the context keeps the heard prefix
  (the wire oracle holds, the wire heard exactly those words).
* A filler rendered by the provider and cut by a barge-in keeps its heard prefix too.
* No filler when the barge-in comes before the filler delay.

The simulator's audio codec numbers words per call (``Vocab``, first use first), so a clip
made in one call decodes in another only when both numbered the filler's words alike: the
caller's first words are the filler's own, which fixes their codes in every call.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from brisvox.agent.conversation.context import AssistantMessage
from brisvox.agent.pipeline.cascade.tts_clips import forget_shared
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import (
    SimCall,
    SimResult,
    default_actor_config,
    oracle_mismatches,
    simulate,
)
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

FILLER = "one moment please"
OPENING = "one moment please look it up"  # the caller's first words number the filler's words (module doc)


@pytest.fixture(autouse=True)
def _fresh_clips():
    forget_shared()
    yield
    forget_shared()


def _call(steps: list[Utter], llm: list[LlmScript], scope: str, voice: str = "") -> SimCall:
    cfg = default_actor_config()
    cfg = replace(cfg, llm=replace(cfg.llm, filler_phrases=(FILLER,)),
                  tts=replace(cfg.tts, clip_scope=scope, tts=replace(cfg.tts.tts, voice=voice)))
    return SimCall(steps=steps, llm=llm, registry=SimTools(lookup_seconds=2.5).registry, actor=cfg)


def two_lookups(scope: str, voice: str = "") -> SimCall:
    """Two turns, each with a slow lookup (2.5 s > the 1.2 s filler delay): two fillers."""
    return _call([Utter(OPENING, at=0.5), Utter("and the other one", after_bot_done=0.8)],
                 [LlmScript((Say("Let me look."), Call("slow_lookup", {"city": "Paris"}))),
                  LlmScript((Say("Found it."),)),
                  LlmScript((Say("Let me look again."), Call("slow_lookup", {"city": "Rome"}))),
                  LlmScript((Say("Found that too."),))], scope, voice)


def barge_in(scope: str, after_words: int, text: str = "no stop") -> SimCall:
    """One slow lookup; the caller barges in after ``after_words`` bot words ("Let me look."
    is three, then the filler's)."""
    return _call([Utter(OPENING, at=0.5), Utter(text, after_bot_words=after_words),
                  Utter("thanks bye", after_bot_done=0.8)],
                 [LlmScript((Say("Let me look."), Call("slow_lookup", {"city": "Paris"}))),
                  LlmScript((Say("Sure."),)), LlmScript((Say("You are welcome."),))], scope)


def sim(call: SimCall) -> SimResult:
    res = run_virtual(lambda: simulate(call))
    assert oracle_mismatches(res) == []
    res.actor.context.validate()
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    assert res.actor.book.st.not_a_prefix == 0 and res.actor.book.st.conflicts == 0
    return res


def sent(res: SimResult) -> list[str]:
    """What the TTS provider was asked to speak, per context, in order."""
    out: dict[int, str] = {}
    for ctx, text in res.tts.probe.texts:
        out[ctx] = out.get(ctx, "") + text
    return list(out.values())


def tts(res: SimResult) -> tuple[int, int, int]:
    st = res.actor.stats()["tts"]
    return st["contexts"], st["clips_played"], st["clips_rendered"]


def assistant(res: SimResult) -> list[str]:
    return res.assistant_texts()


def filler_words(res: SimResult, epoch: int = 1) -> list[str]:
    r = res.actor.book.round(epoch, 1)  # the filler is round 1 of its turn
    assert r is not None and r.utterance is not None
    return res.platform.wire.heard_words(r.utterance)


ANSWERS = ["Let me look.", FILLER, "Found it.", "Let me look again.", FILLER, "Found that too."]


def test_the_second_filler_of_a_call_and_a_filler_of_a_second_call_make_no_tts_request():
    first = sim(two_lookups("agent-clips"))
    # call 1: the first filler is rendered by the provider (and kept), the second is the clip
    assert sent(first) == ["Let me look.", FILLER, "Found it.", "Let me look again.", "Found that too."]
    assert tts(first) == (5, 1, 1)
    assert first.actor.runner.st.fillers == 2
    assert assistant(first) == ANSWERS
    assert filler_words(first, 1) == filler_words(first, 2) == FILLER.split()
    # call 2 of the same agent in the same process: both fillers from memory, no TTS request
    second = sim(two_lookups("agent-clips"))
    assert sent(second) == ["Let me look.", "Found it.", "Let me look again.", "Found that too."]
    assert tts(second) == (4, 2, 0)
    assert assistant(second) == ANSWERS
    assert filler_words(second, 1) == filler_words(second, 2) == FILLER.split()
    # the clip is an utterance like any other: its end is marked and played
    assert second.actor.book.st.marks_played == first.actor.book.st.marks_played == 2


def test_clips_are_kept_per_agent_and_voice_and_an_unnamed_agent_keeps_its_own():
    sim(two_lookups("agent-clips"))
    other_voice = sim(two_lookups("agent-clips", voice="other"))
    assert tts(other_voice) == (5, 1, 1)  # rendered again in that voice, then its own clip
    other_agent = sim(two_lookups("another-agent"))
    assert tts(other_agent) == (5, 1, 1)
    unnamed = [sim(two_lookups("")) for _ in range(2)]  # the call's own cache: never shared
    assert [tts(r) for r in unnamed] == [(5, 1, 1), (5, 1, 1)]
    assert unnamed[0].fingerprint() == unnamed[1].fingerprint()


def test_a_barge_in_during_a_clip_cuts_it_to_the_heard_prefix():
    sim(two_lookups("agent-clips"))  # renders and keeps the clip
    res = sim(barge_in("agent-clips", after_words=5))
    assert tts(res) == (3, 1, 0) and res.interrupts == 1
    assert sent(res) == ["Let me look.", "Sure.", "You are welcome."]  # the filler was never sent
    heard = filler_words(res)
    assert heard == ["one", "moment"]  # the barge-in decision came while "please" was still unheard
    assert assistant(res) == ["Let me look.", "one moment", "Sure.", "You are welcome."]
    assert res.actor.book.st.truncations == 1
    # the clip round sits after the interrupted lookup's result, before the barge-in's turn
    ctx = res.context
    i = next(i for i, m in enumerate(ctx) if m.get("text") == "one moment")
    assert ctx[i - 1]["role"] == "tool" and ctx[i + 1] == {"role": "user", "content": "no stop"}


def test_a_rendered_filler_cut_by_a_barge_in_keeps_its_heard_prefix():
    res = sim(barge_in("", after_words=5))
    assert tts(res) == (4, 0, 1) and res.interrupts == 1
    assert sent(res) == ["Let me look.", FILLER, "Sure.", "You are welcome."]
    assert filler_words(res) == ["one", "moment"]
    assert assistant(res) == ["Let me look.", "one moment", "Sure.", "You are welcome."]
    assert res.actor.book.st.truncations == 1
    msgs = list(res.actor.context)
    assert msgs.count(AssistantMessage("one moment")) == 1


def test_no_filler_when_the_barge_in_comes_before_the_filler_delay():
    res = sim(barge_in("", after_words=3))
    assert res.interrupts == 1 and res.actor.runner.st.fillers == 0
    # the lookup ran 0.89 s until the barge-in cancelled it: before the filler delay (1.2 s)
    [rec] = res.actor.runner.tool_records
    assert (rec.name, rec.outcome, rec.duration_ms) == ("slow_lookup", "interrupted", 888.8)
    assert assistant(res) == ["Let me look.", "Sure.", "You are welcome."]
    assert FILLER not in sent(res)
    assert not any(FILLER in t for t in assistant(res))
    assert [r.round for r in res.actor.book.rounds.values() if r.epoch == 1] == [0]  # no filler round
