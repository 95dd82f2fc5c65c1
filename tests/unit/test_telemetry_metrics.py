"""Call telemetry: fixed-bucket histograms per process, summed by the supervisor, typed on /metrics."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from brisvox.agent.conversation.timeline import MAX_ROUNDS, Timeline
from brisvox.agent.host.call_metrics import CallMetrics, TurnMeter
from brisvox.daemon import telemetry
from brisvox.daemon.metrics import render
from brisvox.runtime.histogram import LATENCY_BUCKETS, Histogram, merge, merge_all, valid_wire
from brisvox.runtime.loop_probe import LoopProbe
from tests.system.daemon_promparse import parse, value

values = st.lists(st.floats(min_value=0.0, max_value=30.0, allow_nan=False), max_size=60)


def hist_of(vs: list[float]) -> Histogram:
    h = Histogram()
    for v in vs:
        h.observe(v)
    return h


def test_buckets_are_cumulative_and_le_is_inclusive():
    h = hist_of([0.025, 0.026, 0.4, 11.0])
    w = h.wire()
    assert w["le"] == list(LATENCY_BUCKETS)
    assert w["counts"][0] == 1  # 0.025 <= le 0.025
    assert w["counts"][1] == 2
    assert w["counts"][LATENCY_BUCKETS.index(0.4)] == 3
    assert w["counts"][-2] == 3 and w["counts"][-1] == 4 == w["count"]  # 11 s only in +Inf
    assert abs(w["sum"] - 11.451) < 1e-9
    assert valid_wire(w)


@given(values, values, values)
def test_merge_is_the_histogram_of_all_observations_in_any_order(a, b, c):
    whole = hist_of(a + b + c).wire()
    parts = [hist_of(a).wire(), hist_of(b).wire(), hist_of(c).wire()]
    random.Random(len(a)).shuffle(parts)
    got = merge_all(parts)
    assert got is not None
    assert got["counts"] == whole["counts"] and got["count"] == whole["count"]
    assert abs(got["sum"] - whole["sum"]) < 1e-6
    assert all(x <= y for x, y in zip(got["counts"], got["counts"][1:], strict=False))


def test_bad_wire_histograms_are_dropped_and_bounds_must_match():
    good = hist_of([0.3]).wire()
    bad = [None, 3, {"le": [1.0], "counts": [1], "sum": 1, "count": 1},  # counts one short
           {"le": [1.0], "counts": [2, 1], "sum": 1, "count": 1},  # not cumulative
           {"le": [1.0], "counts": [1, 1], "sum": "x", "count": 1}]
    assert merge_all([*bad, good]) == merge(None, good)
    other = Histogram((1.0, 2.0)).wire()
    assert merge(merge(None, good), other)["counts"] == good["counts"]  # a mismatch leaves the left side


def turn_at(tl: Timeline, epoch: int, t0: float, *, v2v: float | None = None, ttft: float | None = None,
            audio_after_token: float | None = None) -> None:
    """One released turn at ``t0``: speech end, turn end, one LLM round, first audio."""
    tl.speech_start(epoch, t0 - 1.0)
    tl.speech_end(epoch, t0)
    tl.turn_end(epoch, t0 + 0.1)
    if ttft is not None:
        tl.llm_request(epoch, t0 + 0.1, 0)
        tl.llm_first_token(epoch, t0 + 0.1 + ttft, 0)
        tl.llm_done(epoch, t0 + 0.1 + ttft + 0.5, 0)
    tl.answered(epoch, t0 + 0.1 + (ttft or 0.0) + 0.5)
    if v2v is not None:
        tl.first_audio_out(epoch, t0 + v2v)
    elif audio_after_token is not None and ttft is not None:
        tl.first_audio_out(epoch, t0 + 0.1 + ttft + audio_after_token)


def test_each_turn_feeds_every_histogram_once_when_it_ends_and_the_hang_up_adds_the_end_reason():
    m, tl = CallMetrics(), Timeline()
    meter = TurnMeter(tl, m)
    count = lambda: {k: w["count"] for k, w in m.snapshot()["hist"].items()}  # noqa: E731
    turn_at(tl, 1, 10.0, ttft=0.21, audio_after_token=0.25)
    assert meter.poll(idle=False) == 0  # the newest turn, the bot still answering: not ended
    assert meter.poll(idle=True) == 1  # idle again: its answer played
    assert count() == {"turn_latency": 1, "llm_first_token": 1, "llm_round": 1, "tts_first_audio": 1,
                       "barge_in_stop": 0}
    snap = m.snapshot()["hist"]
    assert abs(snap["turn_latency"]["sum"] - 0.56) < 1e-9
    assert abs(snap["llm_first_token"]["sum"] - 0.21) < 1e-9
    assert abs(snap["llm_round"]["sum"] - 0.71) < 1e-9
    assert abs(snap["tts_first_audio"]["sum"] - 0.25) < 1e-9
    # a barge-in on turn 2: counted at once; its stop waits for the Clear the gateway applied
    turn_at(tl, 2, 20.0, ttft=0.1, v2v=0.5)
    tl.interrupt(2, 3, 21.0)
    meter.clear_applied(20.9)  # a Clear before the barge-in: not its stop
    assert meter.poll(idle=False) == 1
    assert count()["barge_in_stop"] == 0 and count()["turn_latency"] == 2
    meter.clear_applied(21.12)
    assert meter.poll(idle=False) == 0
    assert count()["barge_in_stop"] == 1 and abs(m.snapshot()["hist"]["barge_in_stop"]["sum"] - 0.12) < 1e-6
    # turn 3 in progress when a 4th begins: 3 ended (the conversation moved on)
    turn_at(tl, 3, 30.0, ttft=0.2, v2v=0.6)
    tl.speech_start(4, 31.0)
    assert meter.poll(idle=False) == 1
    assert meter.poll(idle=True) == 0  # turn 4 was never released: nothing to count yet
    assert count()["turn_latency"] == 3
    # the hang-up: the rest, each turn once
    tl.turn_end(4, 32.0)
    m.observe_end("hangup")
    assert meter.poll(idle=True, final=True) == 1
    assert meter.poll(idle=True, final=True) == 0
    assert count()["turn_latency"] == 3 and meter.turns == 4  # turn 4 had no audio: no latency
    m.observe_end("stage_failed:tts")
    assert m.snapshot()["end_reasons"] == {"hangup": 1, "stage_failed:tts": 1}


def test_an_idle_call_between_two_rounds_of_an_answer_has_not_ended_its_turn():
    """A tool phase (or an S2S tool chain) can leave the call idle with the answer half done."""
    m, tl = CallMetrics(), Timeline()
    meter = TurnMeter(tl, m)
    tl.speech_end(1, 10.0)
    tl.turn_end(1, 10.1)
    tl.llm_request(1, 10.1, 0)  # calls a tool, says nothing
    tl.llm_done(1, 10.3, 0)
    assert meter.poll(idle=True) == 0
    tl.llm_request(1, 11.0, 1)  # the tool's result in, the spoken round
    tl.llm_first_token(1, 11.2, 1)
    tl.llm_done(1, 11.6, 1)
    tl.first_audio_out(1, 11.4)
    tl.answered(1, 11.6)
    assert meter.poll(idle=False) == 0  # complete, still playing
    assert meter.poll(idle=True) == 1
    snap = m.snapshot()["hist"]
    assert snap["llm_round"]["count"] == 2 and snap["llm_first_token"]["count"] == 1
    assert abs(snap["tts_first_audio"]["sum"] - 0.2) < 1e-9  # from the turn's first token, round 1's
    assert abs(snap["turn_latency"]["sum"] - 1.4) < 1e-9
    assert tl.turn_latencies()[0]["first_token_ms"] is None  # the first round's: it had none


def test_every_llm_round_is_timed_by_its_number_up_to_32_and_the_rest_are_counted_dropped():
    tl = Timeline()
    tl.turn_end(1, 1.0)
    tl.llm_request(1, 1.0, 0)  # round 0 fails before its first token
    tl.llm_done(1, 1.5, 0)
    tl.llm_request(1, 2.0, 1)  # a filler line took round 1's number: round 2 is the model's again
    tl.llm_request(1, 3.0, 2)
    tl.llm_first_token(1, 3.25, 2)
    tl.llm_done(1, 4.0, 2)
    t = tl.turns[1]
    assert t.rounds[0].first_token is None and t.rounds[2].first_token == 3.25  # not round 0's
    assert t.llm_done() is None  # round 1 has not ended
    tl.llm_done(1, 2.5, 1)
    assert t.llm_done() == 4.0
    row = tl.turn_latencies()[0]
    assert row["first_token_ms"] is None and row["t_llm_done"] == 4.0 and row["rounds"] == 3
    assert [(r["round"], r["first_token_ms"], r["llm_ms"]) for r in row["llm_rounds"]] == [
        (0, None, 500.0), (1, None, 500.0), (2, 250.0, 1000.0)]
    for k in range(3, 40):
        tl.llm_request(1, 10.0 + k, k)
        tl.llm_first_token(1, 10.1 + k, k)
        tl.llm_done(1, 10.2 + k, k)
    assert len(t.rounds) == MAX_ROUNDS == 32 and t.rounds_dropped == 40 - 32
    m = CallMetrics()
    TurnMeter(tl, m).poll(idle=True, final=True)
    snap = m.snapshot()
    assert snap["hist"]["llm_round"]["count"] == 32 and snap["hist"]["llm_first_token"]["count"] == 30
    assert snap["llm_rounds_dropped"] == 8
    fams = parse(render(snapshot({"telemetry": snap})))
    assert value(fams, "brisvox_llm_rounds_dropped_total") == 8
    assert value(fams, "brisvox_llm_round_seconds_count") == 32


def metrics_of(*turn_lists: list[tuple[int, float]]) -> CallMetrics:
    """A CallMetrics fed one call per list of (epoch, voice-to-voice seconds) turns."""
    m = CallMetrics()
    for turns in turn_lists:
        tl = Timeline()
        for epoch, v2v in turns:
            turn_at(tl, epoch, 0.0, v2v=v2v)  # from 0: the figure exactly (a bucket bound is inclusive)
        TurnMeter(tl, m).poll(idle=True, final=True)
    return m


def snapshot(*agents: dict) -> dict:
    children = [{"role": "agent", "index": i, "name": f"agent-{i}", "state": "ready", "stats": s}
                for i, s in enumerate(agents)]
    children.append({"role": "gateway", "index": 0, "name": "gateway-0", "state": "ready",
                     "stats": {"telemetry": {"end_reasons": {"ignored": 5}}}})  # only agents count
    return {"daemon": {"uptime_s": 1.0, "state": "running", "ready": True, "calls": 0}, "children": children}


def test_metrics_sums_the_agents_and_types_the_families():
    a, b = metrics_of([(1, 0.3)]), metrics_of([(1, 0.9), (2, 0.04)], [])
    a.observe_end("hangup")
    b.observe_end("hangup")
    b.observe_end("caller_left")
    sa, sb = a.snapshot(), b.snapshot()
    sa["providers"] = [["llm", "openai", "failures", 2], ["llm", "openai", "retries", 1]]
    sb["providers"] = [["llm", "openai", "failures", 1], ["tts", "cartesia", "request_errors", 4], ["x", "y"]]
    text = render(snapshot({"telemetry": sa, "ticks": 1}, {"telemetry": sb}))
    fams = parse(text)
    assert "# TYPE brisvox_turn_latency_seconds histogram" in text
    for name in ("brisvox_turn_latency_seconds", "brisvox_llm_first_token_seconds",
                 "brisvox_tts_first_audio_seconds", "brisvox_barge_in_stop_seconds"):
        assert fams[name]["type"] == "histogram"
    assert fams["brisvox_calls_ended_total"]["type"] == "counter"
    assert fams["brisvox_provider_errors_total"]["type"] == "counter"
    assert value(fams, "brisvox_turn_latency_seconds_count") == 3
    assert abs(value(fams, "brisvox_turn_latency_seconds_sum") - 1.24) < 1e-9
    assert value(fams, "brisvox_turn_latency_seconds_bucket", le="0.05") == 1
    assert value(fams, "brisvox_turn_latency_seconds_bucket", le="0.3") == 2
    assert value(fams, "brisvox_turn_latency_seconds_bucket", le="1.0") == 3
    assert value(fams, "brisvox_turn_latency_seconds_bucket", le="+Inf") == 3
    buckets = [v for (n, _), v in fams["brisvox_turn_latency_seconds"]["samples"].items() if n.endswith("_bucket")]
    assert buckets == sorted(buckets)  # cumulative
    assert value(fams, "brisvox_calls_ended_total", reason="hangup") == 2
    assert value(fams, "brisvox_calls_ended_total", reason="caller_left") == 1
    assert value(fams, "brisvox_provider_errors_total", stage="llm", provider="openai", kind="failures") == 3
    assert value(fams, "brisvox_provider_errors_total", stage="tts", provider="cartesia", kind="request_errors") == 4
    assert value(fams, "brisvox_provider_retries_total", stage="llm", provider="openai") == 1
    # the telemetry entry is not flattened into the untyped per-child gauges
    assert not [k for k in fams["brisvox_child_stat"]["samples"] if "telemetry" in str(k)]
    assert value(fams, "brisvox_child_stat", role="agent", index="0", stat="ticks") == 1


def test_every_family_is_there_before_the_first_call_and_bad_reports_are_dropped():
    fams = parse(render(snapshot({"telemetry": {"hist": {"turn_latency": {"le": "x"}}, "end_reasons": [],
                                                "providers": "no"}}, {})))
    assert value(fams, "brisvox_turn_latency_seconds_count") == 0
    assert value(fams, "brisvox_barge_in_stop_seconds_bucket", le="+Inf") == 0
    assert fams["brisvox_calls_ended_total"]["samples"] == {}
    assert telemetry.aggregate([None, 5, {"hist": 3}])["end_reasons"] == {}


def test_the_grafana_dashboard_queries_only_metrics_the_daemon_exposes():
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).parents[2] / "deploy/grafana/brisvox.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    snap = snapshot({"telemetry": CallMetrics().snapshot(), "loop": LoopProbe("agent-0").snapshot()})
    snap["daemon"]["pss_bytes"] = 1
    snap["children"][0].update(pid=1, restarts=0, boot_failures=0, hung=0, memory_restarts=0, pss_bytes=1)
    fams = parse(render(snap))
    exposed = set(fams) | {n for f in fams.values() for (n, _) in f["samples"]}
    used = {m for e in exprs for m in re.findall(r"\bbrisvox_[a-z_]+", e)}
    assert used and used <= exposed, used - exposed
    assert any("histogram_quantile(0.95" in e and "brisvox_turn_latency_seconds_bucket" in e for e in exprs)
