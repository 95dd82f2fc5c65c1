"""A turn whose LLM request never answers, on virtual time: the real actor over the real
resilience layer (a single LLM vendor, as a call without an LLM ``secondary`` has).

The layer re-issues a request that failed before its first event, but a SILENT request only
when another leg could take over; the round's first-token timeout (8 s) ends it from
outside. Without the round's one re-issue the caller hears nothing for that turn (a silent
turn: the chaos run's ``llmhang`` calls); with it, the second request answers and the
caller hears the answer, one first-token timeout later. A vendor that stays silent gets the
two contacts of a single vendor's bound and the turn ends silent, counted.
"""

from __future__ import annotations

from typing import Any

from brisvox.agent.conversation.context import AssistantMessage
from brisvox.providers.resilience import Resilience, ResilienceConfig, wrap
from brisvox.providers.seeded_fakes import FakeLlm, LlmScript, Say
from brisvox.sim import harness
from brisvox.sim.harness import SimCall, SimResult
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.failover_kit import layered

HUNG = LlmScript((Say("too late"),), ttft=600.0)  # no first event for 10 minutes


def heard(res: SimResult) -> list[tuple[int, list[str]]]:
    w = res.platform.wire
    return [(w.utts[u].epoch, w.heard_words(u)) for u in w.order]


def simulate(llm: list[LlmScript]) -> tuple[SimResult, Any]:
    fakes: list[Any] = []

    def layer(stt: Any, fake_llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        fakes.append(fake_llm)
        return stt, wrap("llm", fake_llm, resilience=Resilience(ResilienceConfig())), tts

    async def main() -> SimResult:
        call = SimCall(steps=[Utter("what time is it please", at=0.5),
                              Utter("and tomorrow", after_bot_done=1.0, at=40.0)], llm=llm)
        with layered(layer):
            return await harness.simulate(call)

    res = run_virtual(main)
    return res, fakes[0]


def test_a_request_that_never_answers_is_re_issued_once_and_the_caller_hears_the_answer() -> None:
    res, llm = simulate([HUNG, LlmScript((Say("It is noon."),)), LlmScript((Say("Tomorrow too."),))])
    st = res.record["stats"]["llm"]
    assert heard(res) == [(1, ["It", "is", "noon."]), (2, ["Tomorrow", "too."])]
    assert [m.text for m in res.actor.context if isinstance(m, AssistantMessage)] == ["It is noon.", "Tomorrow too."]
    assert st["first_token_timeouts"] == 1 and st["first_token_retries"] == 1
    assert st["requests"] == 3 and st["errors"] == 0 and st["silent_turns"] == 0
    assert llm.probe.count == 3 and llm.probe.closed_early >= 1  # the hung stream was closed
    # the re-issue left one first-token timeout (8 s) after the first request
    t = llm.probe.request_times
    assert abs((t[1] - t[0]) - 8.0) < 0.05
    assert res.stray_tasks == [] and res.live_tasks_after == 0


def test_a_vendor_silent_twice_ends_the_turn_silent_after_two_contacts() -> None:
    res, llm = simulate([HUNG, HUNG, LlmScript((Say("Tomorrow too."),))])
    st = res.record["stats"]["llm"]
    assert heard(res) == [(2, ["Tomorrow", "too."])]  # the second turn is answered as usual
    assert st["first_token_timeouts"] == 2 and st["first_token_retries"] == 1
    assert st["errors"] == 1 and st["silent_turns"] == 1
    assert llm.probe.count == 3  # two for the silent turn (a single vendor's bound), one for the next
    assert res.stray_tasks == [] and res.live_tasks_after == 0


def test_nothing_is_re_issued_when_the_layer_fails_over_a_silent_request_itself() -> None:
    """With a secondary the layer moves a silent request to it after ``llm_attempt_timeout``;
    the round adds no re-issue of its own (contacts: one each)."""
    second = FakeLlm([LlmScript((Say("It is noon."),))], seed=5)
    fakes: list[Any] = []

    def layer(stt: Any, fake_llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        fakes.append(fake_llm)
        return stt, wrap("llm", fake_llm, second, "a", "b", resilience=Resilience(ResilienceConfig())), tts

    async def main() -> SimResult:
        call = SimCall(steps=[Utter("what time is it please", at=0.5),
                              Utter("and tomorrow", after_bot_done=1.0, at=40.0)],
                       llm=[HUNG, LlmScript((Say("Tomorrow too."),))])
        with layered(layer):
            return await harness.simulate(call)

    res = run_virtual(main)
    st = res.record["stats"]["llm"]
    assert heard(res) == [(1, ["It", "is", "noon."]), (2, ["Tomorrow", "too."])]
    assert st["first_token_timeouts"] == 0 and st["first_token_retries"] == 0 and st["requests"] == 2
    assert fakes[0].probe.count == 2 and second.probe.count == 1  # the silent one failed over at 4 s
