"""The per-call VAD state machine, its parameters, fail-open health and boundary refinement (pure logic)."""

from __future__ import annotations

import numpy as np
import pytest

from workers.vad import (
    WINDOW,
    VadHealth,
    VadParams,
    VadStream,
    refine_start,
    refine_stop,
)


def run(stream: VadStream, probs: list[float], first_end: int = WINDOW) -> list[tuple[str, int, int]]:
    out = []
    for i, p in enumerate(probs):
        ev = stream.push(p, first_end + i * WINDOW)
        if ev is not None:
            out.append((ev.kind, ev.pos, ev.at))
    return out


def test_start_is_backdated_to_the_first_speech_window_and_waits_for_min_speech():
    s = VadStream(VadParams(min_speech_ms=96, min_silence_ms=200))
    # windows end at 512, 1024, ...; speech from window 3 (starts at 1024)
    evs = run(s, [0.0, 0.1, 0.9, 0.9, 0.9, 0.9])
    assert evs == [("start", 1024, 1024 + 3 * WINDOW)]  # 96 ms = 1536 samples = 3 windows
    assert s.speaking


def test_a_blip_shorter_than_min_speech_is_not_a_start():
    s = VadStream(VadParams(min_speech_ms=96))
    assert run(s, [0.9, 0.9, 0.1, 0.0, 0.0]) == []
    assert not s.speaking


def test_hysteresis_band_keeps_a_candidate_alive():
    s = VadStream(VadParams(threshold=0.5, neg_threshold=0.35, min_speech_ms=96))
    evs = run(s, [0.9, 0.4, 0.4])  # 0.4 is between neg and threshold: the run goes on
    assert evs == [("start", 0, 3 * WINDOW)]


def test_stop_is_dated_to_the_last_speech_window_after_min_silence():
    p = VadParams(min_speech_ms=0, min_silence_ms=200)  # 3200 samples: 7 windows of silence
    s = VadStream(p)
    probs = [0.9, 0.9, 0.9] + [0.0] * 8
    evs = run(s, probs)
    assert evs[0] == ("start", 0, WINDOW)
    last_speech = 3 * WINDOW
    kind, pos, at = evs[1]
    assert kind == "stop" and pos == last_speech
    assert at - pos >= p.min_silence_samples and at - pos < p.min_silence_samples + WINDOW
    assert len(evs) == 2


def test_speech_inside_the_silence_window_resets_it():
    s = VadStream(VadParams(min_speech_ms=0, min_silence_ms=200))
    evs = run(s, [0.9] + [0.0] * 5 + [0.9] + [0.0] * 8)
    assert [e[0] for e in evs] == ["start", "stop"]
    assert evs[1][1] == 7 * WINDOW  # dated to the second burst


def test_hysteresis_band_holds_the_stop_until_real_silence():
    s = VadStream(VadParams(threshold=0.5, neg_threshold=0.35, min_speech_ms=0, min_silence_ms=64))
    evs = run(s, [0.9] + [0.4] * 6 + [0.1])
    assert evs == [("start", 0, WINDOW), ("stop", WINDOW, 8 * WINDOW)]


def test_finish_closes_speech_in_progress_and_only_then():
    s = VadStream(VadParams(min_speech_ms=0))
    assert s.finish(100) is None
    run(s, [0.9, 0.9])
    ev = s.finish(5000)
    assert ev is not None and (ev.kind, ev.pos, ev.at) == ("stop", 2 * WINDOW, 5000)
    assert not s.speaking and s.finish(6000) is None


def test_every_start_gets_exactly_one_stop_on_random_input():
    rng = np.random.default_rng(7)
    s = VadStream(VadParams())
    probs = np.clip(rng.normal(0.5, 0.4, 5000), 0, 1)
    kinds = [k for k, _, _ in run(s, list(probs))]
    end = s.finish(10**9)
    if end is not None:
        kinds.append("stop")
    assert kinds == ["start", "stop"] * (len(kinds) // 2)
    assert len(kinds) > 10


def test_params_defaults_merge_and_validation():
    p = VadParams()
    assert p.neg == pytest.approx(0.35)
    q = p.merged({"threshold": 0.7, "min_silence_ms": 300})
    assert q.threshold == 0.7 and q.min_silence_ms == 300 and q.neg == pytest.approx(0.55)
    assert p.merged(None) is p
    for bad in ({"threshold": 1.5}, {"nope": 1}, {"threshold": "x"}, {"threshold": True},
                {"neg_threshold": 0.9}, {"min_silence_ms": 1}):
        with pytest.raises(ValueError):
            p.merged(bad)


def test_health_fails_open_only_when_the_streak_spans_the_window():
    h = VadHealth(max_failures=5, window=16000, recovery=80000)
    # 5 failures in 160 ms: a short burst, not enough audio time
    assert [h.on_failure(512 * i) for i in range(5)] == [None] * 5
    assert not h.failed_open
    assert h.on_success(512 * 5) is None and h.streak == 0
    # a streak spanning 1 s of audio fails open once
    results = [h.on_failure(10_000 + 512 * i) for i in range(40)]
    assert results.count("failed_open") == 1 and h.failed_open
    first = results.index("failed_open")
    assert 512 * first >= 16000


def test_health_probes_every_recovery_interval_and_recovers_on_success():
    h = VadHealth(max_failures=1, window=0, recovery=80000)
    assert h.on_failure(1000) == "failed_open"
    assert not h.probe_due(1000 + 79_999)
    assert h.probe_due(1000 + 80_000)
    h.on_failure(81_000)  # a failed probe: next probe one interval later
    assert h.failed_open and not h.probe_due(81_000 + 1000) and h.probe_due(161_000)
    assert h.on_success(161_000) == "recovered"
    assert not h.failed_open and h.recoveries == 1


def test_health_recovery_can_be_disabled():
    h = VadHealth(max_failures=1, window=0, recovery=0)
    h.on_failure(0)
    assert not h.probe_due(10**9)


def _signal(n: int, loud: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(0, 8, n)
    a, b = loud
    x[a:b] += 3000 * np.sin(np.arange(b - a) * 0.3)
    return x.astype(np.int16)


def test_refine_stop_takes_the_silero_hangover_off():
    rng = np.random.default_rng(1)
    x = _signal(20_000, (2000, 10_000), rng)
    # Silero said speech until 11_024 (two windows of hangover), decided at 14_600
    assert abs(refine_stop(x, 0, 11_024, 14_600) - 10_000) <= 160
    # never later than the unrefined stop, and unchanged when nothing stands out
    quiet = rng.normal(0, 8, 20_000).astype(np.int16)
    assert refine_stop(quiet, 0, 11_024, 14_600) == 11_024


def test_refine_start_finds_the_onset_within_reach():
    rng = np.random.default_rng(2)
    x = _signal(20_000, (9_700, 15_000), rng)
    assert abs(refine_start(x, 0, 10_240) - 9_700) <= 160
    # with too little history before the start it does nothing
    assert refine_start(x[9_000:], 9_000, 10_240) == 10_240


def test_falling_is_sent_once_per_fall_and_announces_the_stop_position():
    s = VadStream(VadParams(min_speech_ms=0, min_silence_ms=200, fall_delay_ms=64))
    evs = run(s, [0.9, 0.9] + [0.0] * 3 + [0.9] + [0.0] * 8)
    kinds = [k for k, _, _ in evs]
    assert kinds == ["start", "falling", "falling", "stop"]  # speech resumed after the first fall
    first_fall, second_fall, stop = evs[1], evs[2], evs[3]
    assert first_fall[1] == 2 * WINDOW and second_fall[1] == 6 * WINDOW
    assert stop[1] == second_fall[1] and second_fall[2] < stop[2]
    with pytest.raises(ValueError):
        VadParams(min_silence_ms=200, fall_delay_ms=200)
    assert VadStream(VadParams()).fall_delay == 0  # off by default


def test_an_end_hint_counts_the_stop_window_from_the_signals_end_of_speech():
    """Silero's last speech windows linger after the voice stops; with the signal's own end
    (the hint) the stop comes min_silence after it, carries it, and is flagged refined."""
    p = VadParams(min_speech_ms=0, min_silence_ms=200)
    s = VadStream(p)
    assert run(s, [0.9] * 6) == [("start", 0, WINDOW)]  # speech windows end at 6 * WINDOW
    voice_end = 4 * WINDOW - 200  # two and a half windows of hangover
    assert not s.hint_due(7 * WINDOW) and s.hint_due(8 * WINDOW)  # two windows of silence first
    for end in (7 * WINDOW, 8 * WINDOW):
        assert s.push(0.0, end) is None
    s.speech_ended_at(voice_end)
    assert not s.hint_due(9 * WINDOW)  # one hint per silence
    ev = None
    end = 8 * WINDOW
    while ev is None:
        end += WINDOW
        ev = s.push(0.0, end)
    assert (ev.kind, ev.pos, ev.refined) == ("stop", voice_end, True)
    # decided by the first window end at least min_silence after the voice's end
    assert voice_end + p.min_silence_samples <= ev.at < voice_end + p.min_silence_samples + WINDOW
    # without the hint the same probabilities stop a whole hangover later
    u = VadStream(p)
    evs = run(u, [0.9] * 6 + [0.0] * 8)
    assert evs[1][0] == "stop" and evs[1][2] - ev.at >= 2 * WINDOW


def test_an_end_hint_never_moves_the_end_later_and_speech_after_it_drops_it():
    s = VadStream(VadParams(min_speech_ms=0, min_silence_ms=200))
    run(s, [0.9] * 4 + [0.0] * 2)
    s.speech_ended_at(10 * WINDOW)  # later than Silero's last speech window: ignored
    assert s.last_speech == 4 * WINDOW
    s = VadStream(VadParams(min_speech_ms=0, min_silence_ms=200))
    run(s, [0.9] * 4 + [0.0] * 2)
    s.speech_ended_at(-5)  # before the run: clamped to its first window
    assert s.last_speech == WINDOW
    s.push(0.9, 7 * WINDOW)  # the caller goes on: the silence starts again, no hint
    assert s.last_speech == 7 * WINDOW and not s.hinted
    evs = run(s, [0.0] * 8, first_end=8 * WINDOW)
    assert evs[0][0] == "stop" and evs[0][1] == 7 * WINDOW
    idle = VadStream(VadParams())
    idle.speech_ended_at(100)  # not speaking: nothing to hint
    assert not idle.hinted and idle.last_speech == 0


def test_finish_after_an_end_hint_closes_speech_at_the_hinted_end():
    s = VadStream(VadParams(min_speech_ms=0, min_silence_ms=200))
    run(s, [0.9] * 4 + [0.0] * 2)
    s.speech_ended_at(3 * WINDOW)
    ev = s.finish(7 * WINDOW)
    assert ev is not None and (ev.kind, ev.pos, ev.refined) == ("stop", 3 * WINDOW, True)
