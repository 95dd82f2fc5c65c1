"""The load bench's latency breakdown: the join of client stamps with call records, the steps."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench import breakdown
from bench.bench_load import set_keys


def client(sid: str, *turns: tuple[float | None, float | None]) -> dict:
    return {"stream_sid": sid, "index": 0,
            "turns": [{"k": k, "t_speech_end": a, "t_first_audio": b} for k, (a, b) in enumerate(turns)]}


def rec_turn(se: float, **marks: float | None) -> dict:
    t = {"t_speech_end": se, "t_turn_end": se + 0.3, "verdict_early": False}
    t.update(marks)
    return t


def record(sid: str, offset: float, *turns: dict) -> dict:
    return {"transport_ids": {"streamSid": sid}, "clock_offset_s": offset, "turns": list(turns)}


FULL = {"t_vad_stop": 10.25, "t_verdict": 10.28, "t_stt_final": 10.40, "t_request": 10.41,
        "t_first_token": 10.71, "t_first_audio": 10.80}


def test_steps_of_a_joined_turn_sum_to_its_latency():
    off = 100.0  # the record's marks are on another clock: offset converts them
    marks = {k: v - off for k, v in FULL.items()}
    bd = breakdown.breakdown([client("MZ1", (10.0, 10.86))], [record("MZ1", off, rec_turn(10.01 - off, **marks))])
    assert bd["joined"] == 1 and bd["missed"] == 0
    got = [s["p50"] for s in bd["steps"]]
    assert got == [250.0, 30.0, 120.0, 10.0, 300.0, 90.0, 60.0]
    assert abs(sum(got) - bd["total"]["p50"]) < 0.5 and bd["total"]["p50"] == 860.0


def test_an_early_verdict_adds_nothing_and_a_missing_step_is_na():
    early = dict(FULL, t_verdict=10.20)  # came before the stop (the VAD falling)
    bd = breakdown.breakdown([client("MZ1", (10.0, 10.86))], [record("MZ1", 0.0, rec_turn(10.01, **early))])
    assert bd["steps"][1]["p50"] == 0.0 and bd["early_verdicts"] == 1
    assert bd["steps"][2]["p50"] == 150.0  # STT final after the stop, not after the early verdict
    fixed = dict(FULL, t_verdict=None)  # no Smart Turn
    bd = breakdown.breakdown([client("MZ1", (10.0, 10.86))], [record("MZ1", 0.0, rec_turn(10.01, **fixed))])
    assert bd["steps"][1]["n"] == 0
    rows = breakdown.rows("brisvox N=1:", bd)
    assert rows[1][1] == "n/a" and rows[2][1] == "150.0 / 150.0"
    assert breakdown.rows("brisvox N=1:", None)[0][1] == "n/a"


def test_turns_join_by_stream_sid_and_nearest_speech_end():
    recs = [record("MZ2", 0.0, rec_turn(20.0, **FULL), rec_turn(10.02, **FULL))]
    tl = [client("MZ2", (10.0, 10.9), (30.0, None)), client("MZ9", (5.0, 5.8))]  # unanswered; no record
    joined, missed = breakdown.join(tl, recs)
    assert len(joined) == 1 and joined[0][1] == FULL["t_vad_stop"] and missed == 1
    far = [record("MZ3", 0.0, rec_turn(11.0, **FULL))]  # a second away: no join
    assert breakdown.join([client("MZ3", (10.0, 10.9))], far) == ([], 1)


def test_set_keys_replaces_or_appends_a_section():
    text = '[calls]\nrecords = false  # x\nkeep_days = 30\n\n[agents]\nmax_calls = 4\n'
    out = tomllib.loads(set_keys(set_keys(text, "calls", {"records": True, "path": "/tmp/a b"}),
                                 "vad", {"fall_delay_ms": 100}))
    assert out == {"calls": {"records": True, "path": "/tmp/a b", "keep_days": 30},
                   "agents": {"max_calls": 4}, "vad": {"fall_delay_ms": 100}}


def test_speculation_counters_are_summed_over_the_records():
    def rec(**sp: float) -> dict:
        return {"speculation": dict(sp, hit_rate=0.5),
                "turns": [{"t_turn_end": 1.0}, {"t_turn_end": 2.0}, {"t_turn_end": None}]}

    sp = breakdown.speculation([rec(started=3, hits=1, misses=1, withdrawn=1, head_start_ms=150),
                                rec(started=2, hits=2, head_start_ms=250), {"turns": []}])
    assert (sp["started"], sp["hits"], sp["misses"], sp["withdrawn"]) == (5, 3, 1, 1)
    assert sp["hit_rate"] == 0.75 and sp["turns"] == 4 and sp["wasted"] == 2
    assert sp["wasted_per_turn"] == 0.5 and sp["head_start_ms_mean"] == 133.3
    off = breakdown.speculation([rec()])
    assert off["hit_rate"] is None and off["wasted_per_turn"] == 0.0
    rows = breakdown.speculation_rows("brisvox N=1:", sp)
    assert rows[0][1] == "5 / 3 / 1 / 1 / 0" and rows[1][1] == 0.75 and rows[2][1] == 0.5
    assert breakdown.speculation_rows("brisvox N=1:", off)[1][1] == "n/a"


def test_bench_agents_get_the_speculation_and_interim_lag_asked_for(tmp_path, monkeypatch):
    from bench import bench_load
    from brisvox.agent.definition import load_agent
    from brisvox.agent.pipeline.speculation.policy import SpeculationConfig

    root = Path(__file__).resolve().parents[2]
    src = root / "configs" / "brisvoxd.bench.toml"
    bench_load.derive_agents(src, tmp_path / "agents", "partial", 1)
    bench = tomllib.loads((tmp_path / "agents" / "bench.toml").read_text())
    assert bench["speculation"] == {"enabled": True, "on_partial": True}
    assert bench["stt"]["options"]["interim_lag_words"] == 1
    assert bench["stt"]["options"]["interim_ms"] == 100  # the rest as shipped
    assert "speculation" not in tomllib.loads((tmp_path / "agents" / "booking.toml").read_text())
    monkeypatch.setenv("BRISVOX_BENCH_WORKLOAD", str(root / "bench" / "workload.toml"))
    agent = load_agent(tmp_path / "agents" / "bench.toml")
    assert SpeculationConfig.from_table(agent.speculation).on_partial
    text = bench_load.derive_config(src, tmp_path / "calls", None, tmp_path / "agents")
    assert tomllib.loads(text)["agents"]["agents_dir"] == str(tmp_path / "agents")
    for raw, want in (("", None), ("off", "off"), ("Final", "final")):
        monkeypatch.setenv("BRISVOX_BENCH_SPECULATION", raw)
        assert bench_load.speculation_mode() == want
    monkeypatch.setenv("BRISVOX_BENCH_SPECULATION", "always")
    with pytest.raises(bench_load.harness.ServerError):
        bench_load.speculation_mode()
    monkeypatch.setenv("BRISVOX_BENCH_INTERIM_LAG", "1")
    assert bench_load.interim_lag() == 1


def test_the_early_settings_of_the_derived_bench_config(tmp_path: Path) -> None:
    """The bench config ships early finalize at a 100 ms fall delay; 0 turns it off and keeps
    the fall delay only when the early Smart Turn still needs it; two fall delays are refused."""
    from bench import bench_load
    from brisvox.config.daemon import parse_config

    src = Path(__file__).resolve().parents[2] / "configs" / "brisvoxd.bench.toml"

    def derived(turn: int | None, fin: int | None) -> dict:
        text = bench_load.derive_config(src, tmp_path / "calls", turn, tmp_path, fin)
        parse_config(tomllib.loads(text))  # a config the daemon takes
        return tomllib.loads(text)

    shipped = derived(None, None)
    assert shipped["agents"]["early_finalize"] is True and shipped["vad"]["fall_delay_ms"] == 100
    off = derived(None, 0)
    assert off["agents"]["early_finalize"] is False
    both = derived(60, 60)
    assert both["agents"]["early_smart_turn"] is True and both["vad"]["fall_delay_ms"] == 60
    only_turn = derived(80, 0)
    assert only_turn["agents"]["early_finalize"] is False and only_turn["vad"]["fall_delay_ms"] == 80
    assert derived(0, None)["agents"]["early_finalize"] is True  # the early Smart Turn off, finalize as shipped
    with pytest.raises(bench_load.harness.ServerError):
        derived(60, 100)
