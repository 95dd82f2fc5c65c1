"""The resilience layer under the production call actor, on virtual time: mid-call deaths and hangs.

* Mid-call deaths in turn 1 (the STT session cut after its first interim, an
  LLM 503 before content, the TTS session cut before its first audio), one at
  a time and all three together, on an agent WITHOUT a secondary: the
  conversation (context messages, bot words on the wire) is identical to the
  fault-free run, and the same faults without the layer change it (the LLM
  runner has no retry of its own: the layer is the only one).
* Mutation check: the STT recovery with its replay switched off (a broken
  variant of the relay) loses the caller's words, so the test would fail.
* Blackholed primaries (connects and requests never answer) with
  secondaries: STT and TTS fail over at exactly the 2 s attempt timeout, the
  LLM at its 4 s first-event timeout, and the call is answered whole.
"""

from __future__ import annotations

from typing import Any

import pytest

from brisvox.providers.resilience import Resilience, wrap
from brisvox.providers.resilience.stt import ResilientSttSession
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.failover_kit import (
    Contacts,
    LegLlm,
    LegStt,
    LegTts,
    Switch,
    conversation,
    run_layered,
)

ANSWER1, ANSWER2 = "It is noon right now.", "You are very welcome."


def call(at: float = 0.5, quiet: float = 2.5) -> SimCall:
    return SimCall(steps=[Utter("what time is it please", at=at), Utter("thanks a lot", after_bot_done=1.0)],
                   llm=[LlmScript((Say(ANSWER1),)), LlmScript((Say(ANSWER2),))], quiet=quiet)


def legs(faults: set[str], layered: bool, res: Resilience | None = None) -> Any:
    c = Contacts()

    def layer(stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        sw = Switch()
        s = LegStt(stt, sw, c, "stt-a", kill_after_interim="stt" in faults)
        m = LegLlm(llm, sw, c, "llm-a", fail_first=1 if "llm" in faults else 0)
        t = LegTts(tts, sw, c, "tts-a", kill_before_audio="tts" in faults)
        if not layered:
            return s, m, t
        r = res or Resilience()
        return wrap("stt", s, resilience=r), wrap("llm", m, resilience=r), wrap("tts", t, resilience=r)

    return layer


def run(faults: set[str], layered: bool = True) -> Any:
    return run_virtual(lambda: run_layered(call(), legs(faults, layered)))


@pytest.fixture(scope="module")
def clean() -> Any:
    res = run(set())
    msgs, words = conversation(res)
    assert msgs == [("user", "what time is it please"), ("assistant", ANSWER1), ("user", "thanks a lot"),
                    ("assistant", ANSWER2)]
    assert words == (ANSWER1 + " " + ANSWER2).split()
    return msgs, words


@pytest.mark.parametrize("faults", [{"stt"}, {"llm"}, {"tts"}, {"stt", "llm", "tts"}],
                         ids=["stt", "llm", "tts", "all"])
def test_a_mid_call_death_in_turn_1_leaves_the_conversation_unchanged(clean: Any, faults: set[str]) -> None:
    res = run(faults)
    assert conversation(res) == clean
    st = res.actor.stats()
    assert st["stt"]["deaths"] == 0 and st["tts"]["deaths"] == 0 and st["llm"]["errors"] == 0
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    stt, llm, tts = res.actor.stt.provider, res.actor.runner.provider, res.actor.tts.provider
    assert stt.stats()["recoveries"] == ("stt" in faults)
    assert stt.stats()["replayed_ms"] > 0 if "stt" in faults else stt.stats()["replayed_ms"] == 0
    assert llm.stats()["failovers"] == ("llm" in faults)
    assert tts.stats()["respoken"] == ("tts" in faults)

    bare = run(faults, layered=False)
    assert conversation(bare) != clean
    if "llm" in faults:  # no retry in the runner: the 503 ends turn 1
        assert bare.actor.stats()["llm"]["errors"] == 1


class NoReplay(ResilientSttSession):
    """A broken relay: recovers the session but forgets to replay the window."""

    async def _recover(self, why: str) -> bool:
        ok = await super()._recover(why)
        self._replay = False
        return ok


def test_mutation_the_stt_recovery_without_its_replay_loses_the_callers_words(clean: Any,
                                                                              monkeypatch: Any) -> None:
    from brisvox.providers.resilience import stt as stt_mod

    monkeypatch.setattr(stt_mod, "ResilientSttSession", NoReplay)
    res = run({"stt"})
    assert res.actor.stt.provider.stats()["recoveries"] == 1
    assert conversation(res) != clean  # the test above would catch a relay that does not replay


def test_blackholed_primaries_fail_over_at_the_attempt_timeout_and_the_call_is_answered() -> None:
    prim, sec = Contacts(), Contacts()
    down, up = Switch(hang=True), Switch()
    res = Resilience()

    def layer(stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        return (wrap("stt", LegStt(stt, down, prim, "stt-a"), LegStt(stt, up, sec, "stt-b"), resilience=res),
                wrap("llm", LegLlm(llm, down, prim, "llm-a"), LegLlm(llm, up, sec, "llm-b"), resilience=res),
                wrap("tts", LegTts(tts, down, prim, "tts-a"), LegTts(tts, up, sec, "tts-b"), resilience=res))

    out = run_virtual(lambda: run_layered(call(at=3.0, quiet=6.0), layer))  # a 4 s wait is no silence
    msgs, words = conversation(out)
    assert [m for _, m in msgs] == ["what time is it please", ANSWER1, "thanks a lot", ANSWER2]
    assert words == (ANSWER1 + " " + ANSWER2).split()
    # contacts in order: STT and TTS connect at the start, the LLM per turn
    assert len(prim.times) == 4 and len(sec.times) == 4
    gaps = sorted(round(s - p, 6) for p, s in zip(prim.times, sec.times, strict=True))
    assert gaps == [2.0, 2.0, 4.0, 4.0]
    assert out.live_tasks_after == 0 and out.stray_tasks == []
