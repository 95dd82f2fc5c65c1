"""The load bench's latency breakdown: the join of client stamps with call records, the steps."""

from __future__ import annotations

import tomllib

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
