"""bench/loadgen/stats.py: the client's playout model, turn bookkeeping and summaries."""

from __future__ import annotations

import pytest

from bench.loadgen.stats import CallResult, Playout, Turn, percentile, summarize


def test_percentile_interpolates_and_handles_edges() -> None:
    assert percentile([], 95) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    assert percentile([5, 1, 3], 0) == 1 and percentile([5, 1, 3], 100) == 5


def test_playout_counts_lateness_against_a_zero_buffer_player() -> None:
    p = Playout()
    assert p.add(9.0, 0.02, speech=False) == 0.0 and p.t_first is None  # silence before the answer
    assert p.add(10.0, 0.04, True) == 0.0  # the first frame is never late
    assert p.add(10.03, 0.04, True) == 0.0  # early: buffered (due at 10.04)
    assert p.add(10.10, 0.04, True) == pytest.approx(0.02)  # due 10.08: 20 ms late, clock restarts
    assert p.play_end == pytest.approx(10.14)
    assert p.add(10.101, 0.04, True) == 0.0  # due 10.14
    assert p.frames == 4 and p.speech_s == pytest.approx(0.16)


def test_barge_in_records_clear_last_audio_and_what_was_heard() -> None:
    t = Turn(index=0, barge_in_ms=800, t_speech_end=1.0)
    arrivals = [1.7 + i * 0.015 for i in range(20)]  # 20 ms frames every 15 ms: ahead of real time
    for a in arrivals[:14]:
        t.on_frame(a, 0.02, True)
    t.on_barge(1.9)  # the caller starts talking
    for a in arrivals[14:]:
        t.on_frame(a, 0.02, True)
    assert t.t_last_after_barge == pytest.approx(1.7 + 19 * 0.015)
    t.on_clear(2.2)
    assert t.heard_after_barge_s == pytest.approx(2.1 - 1.9)  # the buffer ran dry at 2.1 before the clear
    t.on_frame(2.25, 0.02, True)
    assert t.frames_after_clear == 1
    assert t.latency_s == pytest.approx(0.7)


def test_a_barge_in_without_clear_hears_everything_buffered() -> None:
    t = Turn(index=0, barge_in_ms=600, t_speech_end=1.0)
    t.on_frame(1.5, 0.02, True)
    t.on_barge(1.51)
    t.on_frame(1.52, 1.0, True)
    t.finish_barge()
    assert t.heard_after_barge_s == pytest.approx(1.52 - 1.51 + 1.0, abs=1e-6)


def _turn(k: int, end: float, first: float | None, frames: int = 100, barge: tuple | None = None) -> Turn:
    t = Turn(index=k, barge_in_ms=None if barge is None else 700, t_speech_end=end)
    if first is not None:
        for i in range(frames):
            t.on_frame(first + i * 0.02, 0.02, True)
    if barge:
        t.on_barge(barge[0])
        if barge[1] is not None:
            t.on_clear(barge[1])
    return t


def test_summary_aggregates_latencies_and_judges_answers() -> None:
    c1 = CallResult(index=0, t_connect=0.0, t_end=20.0, turns=[
        _turn(0, 1.0, 1.8),
        _turn(1, 5.0, 5.7, frames=40, barge=(6.4, 6.65)),
        _turn(2, 9.0, None),  # unanswered
        Turn(index=3, barge_in_ms=None),  # never spoken: not counted
    ])
    c2 = CallResult(index=1, t_connect=0.5, t_end=19.0, turns=[
        _turn(0, 1.0, 1.9, frames=90),  # 200 ms of the answer never came
        _turn(1, 5.0, 5.6, frames=40, barge=(6.3, None)),  # no clear
    ])
    s = summarize([c1, c2], late_frame_ms=20, answer_ms=2000)
    assert s["turns"] == 5 and s["unanswered"] == 1
    assert s["turn_ms"]["n"] == 4 and s["turn_ms"]["p50"] == pytest.approx(750.0)
    by_turn = s["turn_ms_by_turn"]  # turn 0: 800 and 900 ms; turn 1: 700 and 600 ms; turn 2 unanswered
    assert sorted(by_turn) == ["0", "1"]
    assert by_turn["0"]["n"] == 2 and by_turn["0"]["max"] == pytest.approx(900.0)
    assert by_turn["1"]["n"] == 2 and by_turn["1"]["max"] == pytest.approx(700.0)
    assert s["barge_ins"] == 2 and s["clears_missing"] == 1
    assert s["clear_ms"]["p50"] == pytest.approx(250.0)
    assert s["short_answers"] == 1 and s["missing_ms"] == pytest.approx(200.0)
    assert s["late_frames"] == 0 and s["max_late_ms"] == 0.0
    assert s["call_seconds"] == pytest.approx(38.5)
    assert s["window"] == {"first_connect": 0.0, "last_end": 20.0, "all_active_start": 0.5,
                           "all_active_end": 19.0}
