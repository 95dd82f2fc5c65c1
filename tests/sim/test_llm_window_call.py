"""A 60-minute, tool-heavy call through the LlmRunner on virtual time: the size of EVERY request.

120 user turns, one every 30 s, each with a 12 KB tool result (about 3,000 tokens) and one
turn with 12 results of 60 KB; a window of 6,000 tokens with a turn cap of 500, far above
what the budget allows, so only the budget can bound the requests. Every request the
scripted LLM receives is checked as it arrives (its size by the default estimate, its
validity as a Context, the system prompt first, the window a run of whole turns ending
at the current one), with the summarizer on and off.
"""

from __future__ import annotations

import sys
import time

import orjson
import pytest

from brisvox.agent.conversation.context import Context, UserMessage
from brisvox.agent.conversation.request import SUMMARY_PREFIX, WINDOW_ESTIMATOR, WindowConfig
from brisvox.clock import CLOCK
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.window_rig import (
    AgentScript,
    SummaryLlm,
    WindowRig,
    agent_llm,
    as_context,
    lookup_registry,
    run_call,
)

BUDGET = 6000
TURNS = 120
REPORT_TURN = 60


def turn_costs(ctx: Context) -> dict[int, int]:
    """Turn number -> tokens of that whole turn in the final context."""
    out: dict[int, int] = {}
    cur = 0
    for m in ctx:
        if isinstance(m, UserMessage):
            cur = int(m.content.split(":")[0].split()[1])
        if cur:
            out[cur] = out.get(cur, 0) + WINDOW_ESTIMATOR.message_tokens(m)
    return out


def words(i: int) -> str:
    ask = "the full report" if i == REPORT_TURN else "a lookup"
    return f"turn {i}: could you do {ask} for me, please? " + "I am calling about my booking. " * 3


@pytest.mark.parametrize("summarize", [False, True], ids=["no-summary", "summary"])
def test_every_request_of_a_60_minute_tool_heavy_call_fits_the_budget(summarize: bool) -> None:
    script = AgentScript()
    summ = SummaryLlm("ok", delay=1.0) if summarize else None

    async def main() -> tuple[dict[str, int], Context]:
        async with WindowRig(agent_llm(script), lookup_registry(result_bytes=12_000),
                             window=WindowConfig(max_tokens=BUDGET, max_turns=500),
                             summary_llm=summ) as rig:
            await run_call(rig, TURNS, every=30.0, text=words)  # the report turn's 12 results: 60 KB each
            assert CLOCK.now() >= 60 * 60 - 1
            rig.runner.ctx.validate()
            return rig.runner.stats(), rig.runner.ctx

    t0 = time.perf_counter()
    st, ctx = run_virtual(main)
    print(f"60-minute window call ({'summary' if summarize else 'no summary'}): "
          f"{time.perf_counter() - t0:.1f} s wall, {len(script.seen)} requests, "
          f"largest {max(s.tokens for s in script.seen)} tokens", file=sys.stderr)
    assert st["turns"] == TURNS and st["requests"] == len(script.seen) >= 2 * TURNS
    for n, seen in enumerate(script.seen):
        assert seen.tokens <= BUDGET, (n, seen.tokens)  # EVERY request
        as_context(seen.request).validate()
        assert seen.request.messages[0].text == "You are a test agent."
        # whole turns ending at the current one: consecutive turn numbers
        assert seen.turns == list(range(seen.turns[0], seen.turns[0] + len(seen.turns))), n
    # the budget binds, tightly: the next older turn would not have fitted
    cost = turn_costs(ctx)
    assert max(s.tokens for s in script.seen) > BUDGET * 0.95
    for n, seen in enumerate(script.seen):
        if seen.summary is None and seen.turns[0] > 1:
            assert seen.tokens + cost[seen.turns[0] - 1] > BUDGET, n
    # the report turn: its 12 results clipped oldest first, every one valid JSON saying so
    report = [s for s in script.seen if s.turns and s.turns[-1] == REPORT_TURN and s.request.messages[-1].role == "tool"]
    assert len(report) == 1
    results = [m for m in report[0].request.messages if m.role == "tool"]
    assert len(results) == 12
    bodies = [orjson.loads(m.text) for m in results]
    assert all(b["clipped"] is True for b in bodies[:11])
    assert st["requests_clipped"] >= 1 and st["results_clipped"] >= 11 and st["requests_over_budget"] == 0
    if summarize:
        assert summ is not None and st["summaries"] >= TURNS // 2 and st["summary_failures"] == 0
        last = script.seen[-1]
        assert last.summary is not None and last.summary.startswith(SUMMARY_PREFIX)
        assert "turn 1," in last.summary and f"turn {REPORT_TURN}," in last.summary
        assert 1 not in last.turns
    else:
        assert all(s.summary is None for s in script.seen)
        assert st["uncovered_requests"] == 0  # counted only with a summarizer
