"""How often one LLM vendor is contacted in one turn (docs/PROVIDERS.md, "How often one vendor
is contacted"): the real LlmRunner over the real resilience layer around fake vendors that
fail (errors before the first token, raised errors, empty streams, hangs, 429 with a short and
a long ``Retry-After``, request errors), on virtual time.

The documented bound, per model request: a single vendor at most 2 contacts (the first
attempt and one re-issue by the layer), a primary with a secondary at most 1 each; the runner
itself never retries a failure (one request per round), so a turn makes at most that many
contacts per model request it makes (one without tools). The one exception, within the same
bound: a request with no event within the round's first-token timeout, which the layer
re-issues only with a secondary, is re-issued once by the round when there is none. Before, the runner's own retry re-issued
the whole layered request: 4 contacts of a single vendor, 2 of each leg.
"""

from __future__ import annotations

from typing import Any

import pytest

from brisvox.agent.pipeline.stage.pipeline_frames import BotEnded
from brisvox.providers.resilience import Resilience, ResilientLlm
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.failing_llm import ANSWER, FailingLlm
from tests.providers_fakes.runner_rig import Rig, ToolLog, scenario_registry

BOUND = {"single": 2, "secondary": 1}  # contacts of one vendor per model request, at most
TURNS = 3

# mode -> contacts in the first turn: (single vendor), (primary, secondary)
FAILURES: dict[str, tuple[tuple[int], tuple[int, int]]] = {
    "error": ((2,), (1, 1)),
    "raise": ((2,), (1, 1)),
    "empty": ((2,), (1, 1)),
    "hang": ((2,), (1, 1)),  # alone: the round re-issues it once at its first-token timeout; with a secondary: 4 s, then it
    "429": ((2,), (1, 1)),  # alone: waited (1 s), then re-issued; with a secondary: at once there
    "429_long": ((1,), (1, 1)),  # alone: longer than retry_after_max, not waited: the turn ends
    "bad_request": ((1,), (1, 0)),  # a request error: never re-issued
    "auth": ((2,), (1, 1)),  # a 401 is not a request error to the layer: re-issued like any failure
}


def silent(rig: Rig) -> list[int]:
    out = []
    while (f := rig.upstream._pop()) is not None:
        if isinstance(f, BotEnded) and f.reason == "silent":
            out.append(f.epoch)
    return out


def call(vendors: list[FailingLlm], turns: int = TURNS, layered: bool = True) -> list[dict[str, Any]]:
    """One call of ``turns`` turns: per turn, the contacts of each vendor, the model requests
    the runner made, what was spoken, the runner's errors."""

    async def main() -> list[dict[str, Any]]:
        llm: Any = vendors[0]
        if layered:
            llm = ResilientLlm(vendors[0], vendors[1] if len(vendors) > 1 else None, resilience=Resilience())
        out: list[dict[str, Any]] = []
        async with Rig(llm, scenario_registry(ToolLog())) as rig:
            for epoch in range(1, turns + 1):
                before = [v.contacts for v in vendors]
                st = (rig.runner.st.requests, rig.runner.st.errors)
                text = await rig.turn(epoch, "hello", timeout=120)
                out.append({"contacts": tuple(v.contacts - b for v, b in zip(vendors, before, strict=True)),
                            "requests": rig.runner.st.requests - st[0], "errors": rig.runner.st.errors - st[1],
                            "text": text, "silent": epoch in silent(rig)})
        return out

    return run_virtual(main)


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_a_single_vendor_is_contacted_at_most_twice_per_turn(mode: str) -> None:
    v = FailingLlm("a", [mode])
    turns = call([v])
    assert turns[0]["contacts"] == FAILURES[mode][0]
    for t in turns:
        assert t["requests"] == (2 if mode == "hang" else 1) and t["contacts"][0] <= BOUND["single"]
        # the final failure, as before: nothing invented, one counted error, the turn ends silent
        assert t["text"] == "" and t["errors"] == 1 and t["silent"]


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_a_primary_and_its_secondary_are_contacted_at_most_once_each_per_turn(mode: str) -> None:
    p, s = FailingLlm("a", [mode]), FailingLlm("b", [mode])
    turns = call([p, s])
    assert turns[0]["contacts"] == FAILURES[mode][1]
    for t in turns:
        assert t["requests"] == 1 and all(n <= BOUND["secondary"] for n in t["contacts"])
        assert t["text"] == "" and t["errors"] == 1 and t["silent"]


def test_a_reissue_that_succeeds_answers_the_turn() -> None:
    v = FailingLlm("a", ["error", "ok"])
    [t] = call([v], turns=1)
    assert t["contacts"] == (2,) and t["text"] == ANSWER and t["errors"] == 0
    p, s = FailingLlm("a", ["hang"]), FailingLlm("b", ["ok"])
    [t] = call([p, s], turns=1)
    assert t["contacts"] == (1, 1) and t["text"] == ANSWER


def test_a_tool_turn_contacts_the_vendor_at_most_twice_per_model_request() -> None:
    v = FailingLlm("a", ["tool", "error"])  # the tool round's request answers, the next one fails
    [t] = call([v], turns=1)
    assert t["requests"] == 2 and t["contacts"] == (3,)
    assert t["contacts"][0] <= BOUND["single"] * t["requests"]
    assert t["errors"] == 1 and t["text"] == ""


@pytest.mark.parametrize("mode", ["error", "429"])
def test_the_runner_itself_makes_one_request_per_round(mode: str) -> None:
    """Without the layer a failing vendor is contacted once per turn: the round has no retry
    of a failure of its own, so the layer's bound is the whole bound."""
    v = FailingLlm("a", [mode])
    for t in call([v], layered=False):
        assert t["contacts"] == (1,) and t["requests"] == 1 and t["errors"] == 1 and t["silent"]


def test_a_silent_vendor_is_re_issued_once_by_the_round_and_a_second_silence_ends_the_turn() -> None:
    """No event within the first-token timeout: with or without the layer (a single vendor,
    which the layer never re-issues a silent request to), the round re-issues it once; the
    second silence ends the turn, silent (2 contacts: the single vendor's bound)."""
    for layered in (True, False):
        v = FailingLlm("a", ["hang"])
        for t in call([v], layered=layered):
            assert t["contacts"] == (2,) and t["requests"] == 2 and t["errors"] == 1 and t["silent"]


def test_a_silent_request_re_issued_by_the_round_answers_the_turn() -> None:
    v = FailingLlm("a", ["hang", "ok"])
    [t] = call([v], turns=1)
    assert t["contacts"] == (2,) and t["requests"] == 2 and t["text"] == ANSWER and t["errors"] == 0
