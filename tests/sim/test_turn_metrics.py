"""Per-turn telemetry on virtual time: each turn reaches the process's histograms when it
ends (while the call goes on), never twice, and every LLM round is timed by its number."""

from __future__ import annotations

from typing import Any

import pytest

from brisvox.agent.host.call_metrics import METRICS
from brisvox.providers.s2s.scripted import S2sCall, S2sReply, ScriptedS2s
from brisvox.sim.harness import SimCall, simulate
from brisvox.sim.scenarios import s02, s03, s05, s06, s08, s09, s10
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.test_s2s_stage import _tools, s2s_cfg


def counts() -> dict[str, int]:
    return {k: w["count"] for k, w in METRICS.snapshot()["hist"].items()}


def delta(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: now[k] - before[k] for k in now}


def run_observed(call: Any) -> tuple[Any, list[dict[str, int]], dict[str, int]]:
    """The call with the host's report cadence (``observe_turns`` every 0.5 s of call time):
    the histogram counts seen at each look, and after the hang-up (all relative to before)."""
    before = counts()
    seen: list[dict[str, int]] = []

    def look(_t: float, actor: Any) -> None:
        actor.observe_turns()
        seen.append(delta(counts(), before))

    call.probe, call.probe_every = look, 0.5
    res = run_virtual(lambda: simulate(call))
    return res, seen, delta(counts(), before)


def test_three_turns_are_on_the_histograms_one_by_one_during_the_call_and_the_hang_up_adds_none():
    call, _ = s03()
    res, seen, after = run_observed(call)
    assert len(res.record["turns"]) == 3
    during = [d["turn_latency"] for d in seen]
    assert during == sorted(during) and 1 in during and 2 in during  # one by one, as each ended
    assert during[-1] == 3  # all three before the hang-up
    assert after["turn_latency"] == 3 and after["llm_first_token"] == 3 and after["llm_round"] == 3
    assert after["tts_first_audio"] == 3


def test_a_barge_in_stop_is_counted_during_the_call_once_its_clear_was_applied():
    call, _ = s02()
    res, seen, after = run_observed(call)
    assert res.interrupts == 1
    assert seen[-1]["barge_in_stop"] == 1 == after["barge_in_stop"]
    assert after["turn_latency"] == len([t for t in res.record["turns"] if t["voice_to_voice_ms"] is not None])


@pytest.mark.parametrize("scenario", [s02, s05, s06, s08, s09, s10], ids=lambda f: f.__name__)
def test_what_the_turns_fed_while_the_call_went_on_is_what_its_record_lists(scenario):
    """Barge-ins, an STT death, a failed LLM request, a tool call, a backchannel, a slow tool:
    each figure the record has was on the histograms before the hang-up, once."""
    call, _ = scenario()
    res, seen, after = run_observed(call)
    turns = res.record["turns"]
    rounds = [r for t in turns for r in t["llm_rounds"]]
    want = {
        "turn_latency": sum(t["voice_to_voice_ms"] is not None for t in turns),
        "llm_first_token": sum(r["first_token_ms"] is not None for r in rounds),
        "llm_round": sum(r["llm_ms"] is not None for r in rounds),
    }
    assert {k: after[k] for k in want} == want
    assert {k: seen[-1][k] for k in want} == want  # all of it before the hang-up
    assert after["barge_in_stop"] == seen[-1]["barge_in_stop"] <= res.interrupts


def test_a_tool_turn_times_both_model_rounds_and_the_filler_round_between_is_not_one():
    call, _ = s08()
    res, _, after = run_observed(call)
    (turn,) = res.record["turns"]
    rounds = turn["llm_rounds"]
    assert turn["rounds"] == len(rounds) == 2 and turn["rounds_dropped"] == 0
    assert all(r["t_llm_done"] is not None and r["llm_ms"] > 0 and r["first_token_ms"] > 0 for r in rounds)
    assert turn["t_llm_done"] == rounds[-1]["t_llm_done"]
    assert after["llm_round"] == 2 and after["llm_first_token"] == 2 and after["turn_latency"] == 1


def test_the_s2s_actor_times_every_response_and_counts_a_tool_chain_turn_only_once_it_is_answered():
    """Turn 1 is a chain of three responses (two call tools, silently: the call is idle
    between them); it is counted when its answer is complete, with all three rounds."""
    _, reg = _tools()
    replies = [S2sReply("", calls=(S2sCall("get_weather", {"city": "A"}),)),
               S2sReply("", calls=(S2sCall("get_weather", {"city": "B"}),)),
               S2sReply("done planning"), S2sReply("sunny tomorrow")]
    call = SimCall(steps=[Utter("plan my evening", at=0.5), Utter("and tomorrow", after_bot_done=1.0)], llm=[],
                   s2s=lambda vocab: ScriptedS2s(vocab, replies), actor=s2s_cfg("provider"), registry=reg)
    res, seen, after = run_observed(call)
    first, second = [t for t in res.record["turns"] if t["llm_rounds"]]
    assert [r["round"] for r in first["llm_rounds"]] == [0, 1, 2] and len(second["llm_rounds"]) == 1
    rounds = first["llm_rounds"]
    assert all(r["t_llm_done"] is not None and r["llm_ms"] >= 0 for r in rounds)
    assert rounds[0]["first_token_ms"] is None and rounds[2]["first_token_ms"] is not None  # only the spoken one
    assert rounds[0]["t_request"] < rounds[1]["t_request"] < rounds[2]["t_request"]
    assert first["t_answered"] >= rounds[2]["t_llm_done"]
    want = {"turn_latency": 2, "llm_first_token": 2, "llm_round": 4, "tts_first_audio": 2}
    assert {k: seen[-1][k] for k in want} == want  # before the hang-up
    assert {k: after[k] for k in want} == want
