"""Call telemetry: fixed-bucket histograms per process, summed by the supervisor, typed on /metrics."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from brisvox.agent.host.call_metrics import HISTOGRAMS, CallMetrics
from brisvox.daemon import telemetry
from brisvox.daemon.metrics import render
from brisvox.runtime.histogram import LATENCY_BUCKETS, Histogram, merge, merge_all, valid_wire
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


def test_a_call_record_feeds_every_histogram_and_the_end_reason():
    m = CallMetrics()
    rec = {"end_reason": "hangup", "clock_offset_s": 100.0,
           "turns": [{"voice_to_voice_ms": 640.0, "first_token_ms": 210.0, "t_first_token": 5.0,
                      "t_first_audio": 5.25, "t_interrupted": 9.0},
                     {"voice_to_voice_ms": None, "first_token_ms": None}]}
    m.observe_record(rec, clears_ns=[int(108.0e9), int(109.12e9)])  # the first is before the barge-in
    snap = m.snapshot()
    assert set(snap["hist"]) == set(HISTOGRAMS)
    assert {k: w["count"] for k, w in snap["hist"].items()} == {
        "turn_latency": 1, "llm_first_token": 1, "tts_first_audio": 1, "barge_in_stop": 1}
    assert abs(snap["hist"]["barge_in_stop"]["sum"] - 0.12) < 1e-6
    assert abs(snap["hist"]["turn_latency"]["sum"] - 0.64) < 1e-9
    m.observe_record({"end_reason": "stage_failed:tts", "turns": []})
    assert m.snapshot()["end_reasons"] == {"hangup": 1, "stage_failed:tts": 1}


def snapshot(*agents: dict) -> dict:
    children = [{"role": "agent", "index": i, "name": f"agent-{i}", "state": "ready", "stats": s}
                for i, s in enumerate(agents)]
    children.append({"role": "gateway", "index": 0, "name": "gateway-0", "state": "ready",
                     "stats": {"telemetry": {"end_reasons": {"ignored": 5}}}})  # only agents count
    return {"daemon": {"uptime_s": 1.0, "state": "running", "ready": True, "calls": 0}, "children": children}


def test_metrics_sums_the_agents_and_types_the_families():
    a, b = CallMetrics(), CallMetrics()
    a.observe_record({"end_reason": "hangup", "turns": [{"voice_to_voice_ms": 300.0}]})
    b.observe_record({"end_reason": "hangup", "turns": [{"voice_to_voice_ms": 900.0}, {"voice_to_voice_ms": 40.0}]})
    b.observe_record({"end_reason": "caller_left", "turns": []})
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
    snap = snapshot({"telemetry": CallMetrics().snapshot()})
    snap["daemon"]["pss_bytes"] = 1
    snap["children"][0].update(pid=1, restarts=0, boot_failures=0, hung=0, memory_restarts=0, pss_bytes=1)
    fams = parse(render(snap))
    exposed = set(fams) | {n for f in fams.values() for (n, _) in f["samples"]}
    used = {m for e in exprs for m in re.findall(r"\bbrisvox_[a-z_]+", e)}
    assert used and used <= exposed, used - exposed
    assert any("histogram_quantile(0.95" in e and "brisvox_turn_latency_seconds_bucket" in e for e in exprs)
