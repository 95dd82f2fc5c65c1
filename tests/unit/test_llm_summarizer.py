"""The runner's background summarizer on virtual time (brisvox/agent/pipeline/llm/summarizer.py).

A slow (1 s), a hanging and a failing summarizer never delay a request (every request
leaves at the instant it leaves without a summarizer); the breaker bounds the attempts of a
hanging one; a too-large summary never replaces the summary (a little too large: clipped);
the summary replaces the dropped turns in later requests, and never covers the turn that
has just finished; the refresh is one task of the runner's stage and ends with the call;
no summarizer configured: no summary; "agent": the agent's own LLM summarizes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brisvox.agent.conversation.context import SystemMessage
from brisvox.agent.conversation.request import SUMMARY_PREFIX, WINDOW_ESTIMATOR, WindowConfig
from brisvox.agent.pipeline.llm.summarizer import SummaryConfig
from brisvox.clock import CLOCK
from brisvox.providers.base import LlmRequest
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.window_rig import (
    TAG,
    AgentScript,
    Seen,
    SummaryLlm,
    WindowRig,
    agent_llm,
    lookup_registry,
    run_call,
)

WINDOW = WindowConfig(max_tokens=1500, max_turns=500)


def chat(i: int) -> str:
    return f"turn {i}: " + "I would like to change my booking to another day. " * 6  # ~90 tokens


def quick(i: int) -> str:
    return f"turn {i}: please do a lookup " + "about my order. " * 4


def call(summ: SummaryLlm | None, turns: int, every: float, text: Any, *, window: WindowConfig = WINDOW,
         cfg: SummaryConfig | None = None, during: Any = None) -> tuple[list[Seen], dict[str, int], WindowRig]:
    script = AgentScript()

    async def main() -> tuple[dict[str, int], WindowRig]:
        async with WindowRig(agent_llm(script), lookup_registry(result_bytes=2000), window=window,
                             summary_llm=summ, summary=cfg) as rig:
            await run_call(rig, turns, every=every, text=text)
            if during is not None:
                during(rig)
            return rig.runner.stats(), rig

    st, rig = run_virtual(main)
    return script.seen, st, rig


def first_requests(seen: list[Seen], rig: WindowRig) -> list[float]:
    """Delay from each turn's end to its first request."""
    out = []
    for _epoch, at in sorted(rig.turn_ends.items()):
        out.append(next(s.at for s in seen if s.at >= at) - at)
    return out


# -- never on the request path ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["slow", "hang", "fail"])
def test_a_slow_hanging_or_failing_summarizer_never_delays_a_request(mode: str) -> None:
    base, base_st, base_rig = call(None, 40, 1.5, quick)
    summ = SummaryLlm("ok" if mode == "slow" else mode, delay=1.0)
    seen, st, rig = call(summ, 40, 1.5, quick)  # quick turns: a refresh is often still running
    assert [s.at for s in seen] == [s.at for s in base]  # every request at the same instant
    assert first_requests(seen, rig) == pytest.approx([0.0] * 40, abs=1e-9)
    assert st["requests"] == base_st["requests"] and st["turns"] == 40
    assert summ.calls, "the summarizer was asked"
    if mode == "slow":
        assert st["summaries"] >= 10 and st["summary_failures"] == st["summary_timeouts"] == 0
        assert any(s.summary for s in seen)
    elif mode == "hang":
        assert st["summaries"] == 0 and st["summary_timeouts"] >= 3
        assert st["summary_degraded"] == 1 and st["summary_backoffs"] > 0
        assert len(summ.calls) <= 5  # 8 s, 8 s, 8 s, then 16 s of backoff, ...: bounded
        assert all(s.summary is None for s in seen) and st["uncovered_requests"] > 0
    else:
        assert st["summaries"] == 0 and st["summary_failures"] >= 3 and st["summary_degraded"] == 1
        assert st["summary_backoffs"] > 0 and len(summ.calls) < 40


def test_the_breaker_backs_off_doubling_to_the_cap_and_closes_on_a_success() -> None:
    summ = SummaryLlm("fail", delay=0.1)
    seen, st, rig = call(summ, 200, 1.0, quick)
    gaps = [round(b - a) for a, b in zip(summ.calls, summ.calls[1:], strict=False)]
    assert gaps[:2] == [1, 1]  # the first failures: the next turn end tries again
    assert gaps[2:5] == [17, 33, 61] and max(gaps) <= 61  # 16 s, 32 s, then 60 s (+ the turn cadence)
    assert st["summary_failures"] == len(summ.calls)
    s = rig.runner.summarizer
    summ.mode = "ok"
    s.retry_at = 0.0

    async def again() -> None:
        async with WindowRig(agent_llm(AgentScript()), lookup_registry(), window=WINDOW) as r2:
            r2.runner.summarizer.llm = summ
            r2.runner.summarizer.failures = 7
            await run_call(r2, 30, every=5.0, text=chat)
            assert r2.runner.summarizer.failures == 0 and r2.runner.st.summaries > 0
    run_virtual(again)


def test_the_refresh_is_one_task_of_the_runner_stage_and_ends_with_the_call() -> None:
    summ = SummaryLlm("hang")
    live: list[int] = []

    def during(rig: WindowRig) -> None:
        live.append(len(rig.tasks.of_stages({"llm"})))
        t = rig.runner.summarizer.task
        assert t is not None and not t.done()
    seen, st, rig = call(summ, 12, 0.5, quick, during=during, cfg=SummaryConfig(timeout=30.0))
    assert live == [2]  # the stage's own task and the one refresh
    assert len(summ.calls) == 1 and st["turns"] == 12  # one at a time: the turns meanwhile start none
    assert rig.tasks.live() == 0  # cancelled with the call


# -- the summary --------------------------------------------------------------------------------


def test_the_summary_replaces_the_dropped_turns_and_never_covers_the_turn_just_finished() -> None:
    summ = SummaryLlm("ok", delay=1.0)
    seen, st, rig = call(summ, 40, 20.0, chat)
    assert st["summaries"] > 20 and st["summary_failures"] == 0
    holes = 0
    for s in seen:
        current = s.turns[-1]
        covered = {int(t) for t in TAG.findall(s.summary or "")}
        missing = set(range(1, current + 1)) - set(s.turns) - covered
        if missing:
            holes += 1
        if s.summary is not None:
            assert s.summary.startswith(SUMMARY_PREFIX)
            assert s.request.messages[1].role == "system" and s.request.messages[2].role == "user"
            assert not covered & set(s.turns)  # in place of the dropped turns, not beside them
        assert s.tokens <= WINDOW.max_tokens
    assert holes == st["uncovered_requests"] == 0  # uniform turns: the ahead summary is ready in time
    assert seen[-1].summary is not None and "turn 1," in seen[-1].summary
    # each summary request saw only turns that had ended before the turn that had just ended
    for at, text in zip(summ.calls, summ.answers, strict=True):
        just_ended = max(e for e, t in rig.turn_ends.items() if t <= at)
        assert max(int(t) for t in TAG.findall(text)) < just_ended


def test_a_too_large_summary_never_replaces_the_summary() -> None:
    summ = SummaryLlm("huge", delay=0.5, huge_after=1)
    seen, st, rig = call(summ, 40, 20.0, chat)
    assert st["summaries"] == 1 and st["summary_too_large"] >= 3 and st["summary_degraded"] == 1
    carried = {s.summary for s in seen if s.summary is not None}
    assert carried == {SUMMARY_PREFIX + summ.answers[0]}  # the first, good one, and only it
    assert all(s.tokens <= WINDOW.max_tokens for s in seen)


def test_a_summary_a_little_too_large_is_clipped_to_its_limit() -> None:
    cfg = SummaryConfig(max_tokens=200)
    limit = (200 - WINDOW_ESTIMATOR.message_tokens(SystemMessage(SUMMARY_PREFIX))) * 4
    summ = SummaryLlm("huge", delay=0.5, size=int(limit * 1.5))
    seen, st, rig = call(summ, 30, 20.0, chat, cfg=cfg)
    assert st["summary_clipped"] == st["summaries"] >= 1 and st["summary_too_large"] == 0
    notes = [s.request.messages[1] for s in seen if s.summary is not None]
    assert notes and all(WINDOW_ESTIMATOR.message_tokens(SystemMessage(n.text)) <= 200 for n in notes)
    assert all(n.text.endswith(" …") for n in notes)


def test_no_summarizer_configured_no_summary_and_agent_uses_the_agents_own_llm() -> None:
    seen, st, _ = call(None, 20, 20.0, chat)
    assert st["summary_requests"] == 0 and all(s.summary is None for s in seen)
    assert st["requests_trimmed"] > 0 and st["uncovered_requests"] == 0

    script = AgentScript()

    async def main() -> dict[str, int]:
        async with WindowRig(agent_llm(script), lookup_registry(), window=WINDOW,
                             summary=SummaryConfig(provider="agent")) as rig:
            await run_call(rig, 20, every=20.0, text=chat)
            return rig.runner.stats()

    st = run_virtual(main)
    summary_asks = [s for s in script.seen if "running summary" in s.request.messages[0].text]
    assert st["summary_requests"] == len(summary_asks) > 0
    assert st["summaries"] == len(summary_asks)  # the scripted answer is short enough
    assert any(s.summary for s in script.seen if s not in summary_asks)


def test_a_reset_drops_the_summary_and_a_refresh_in_flight() -> None:
    summ = SummaryLlm("ok", delay=3.0)

    async def main() -> None:
        async with WindowRig(agent_llm(AgentScript()), lookup_registry(), window=WINDOW, summary_llm=summ) as rig:
            await run_call(rig, 20, every=20.0, text=chat)
            s = rig.runner.summarizer
            assert s.summary is not None
            await rig.turn(21, chat(21))
            await asyncio.sleep(0.5)  # the refresh is in flight
            s.reset()
            assert s.summary is None
            await CLOCK.sleep(5.0)
            assert s.summary is None and rig.runner.st.summaries_discarded == 1
    run_virtual(main)


def test_the_summary_request_is_bounded() -> None:
    summ = SummaryLlm("ok", delay=0.1)
    requests: list[LlmRequest] = []
    real = summ.stream

    def spy(req: LlmRequest) -> Any:
        requests.append(req)
        return real(req)

    summ.stream = spy  # type: ignore[method-assign,assignment]
    cfg = SummaryConfig(input_tokens=3000, message_bytes=1000)
    seen, st, _ = call(summ, 20, 20.0, lambda i: f"turn {i}: please do the full report", cfg=cfg,
                       window=WindowConfig(max_tokens=6000))
    assert requests and st["summaries"] > 0
    for r in requests:
        assert r.max_tokens == cfg.max_tokens and r.temperature == 0.0
        assert len(r.messages[-1].text) < (3000 * 4 + 13 * (1000 + 40)) + 2000  # a chunk: one big turn at most
