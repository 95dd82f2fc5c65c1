"""bench/workload.py: the shared workload parses strictly and plans calls as documented."""

from __future__ import annotations

import numpy as np
import pytest

from bench import workload
from bench.workload import FRAME_SAMPLES, WorkloadError


@pytest.fixture(scope="module")
def text() -> str:
    return workload.DEFAULT_PATH.read_text()


def test_default_file_parses_with_the_documented_numbers(text: str) -> None:
    wl = workload.parse(text)
    assert wl.stt.final_after_finalize_ms == 150
    assert wl.llm.first_token_ms == 300
    assert wl.tts.first_audio_ms == 80 and wl.tts.answer_ms == 2000
    assert wl.load.pipecat_calls[0] == 1 and wl.load.brisvox_calls[0] == 1
    assert len(wl.caller.lines) >= 2


@pytest.mark.parametrize("edit, where", [
    (("first_token_ms = 300", "first_token_ms = 300\nsurprise = 1"), "unknown key"),
    (("first_token_ms = 300", ""), "missing key"),
    (("first_token_ms = 300", "first_token_ms = \"fast\""), "llm.first_token_ms"),
    (("first_token_ms = 300", "first_token_ms = -5"), "llm.first_token_ms"),
    (("chunk_ms = 20", "chunk_ms = 30"), "tts.chunk_ms"),
    (("after_ms = 600", "after_ms = 1900"), "barge_in"),
    (("[measure]", "[bogus]\nx = 1\n[measure]"), "unknown table"),
])
def test_malformed_files_name_the_key(text: str, edit: tuple[str, str], where: str) -> None:
    old, new = edit
    assert old in text
    with pytest.raises(WorkloadError, match=where):
        workload.parse(text.replace(old, new, 1))


def test_turns_give_the_single_call_baseline_enough_samples(text: str) -> None:
    wl = workload.parse(text)
    assert wl.turns_for(1) == wl.load.min_turn_samples
    assert wl.turns_for(1, quick=True) == wl.load.min_turn_samples_quick
    assert wl.turns_for(100) == wl.load.turns_per_call
    with pytest.raises(ValueError):
        wl.turns_for(0)


def test_plans_barge_in_inside_the_answer_and_never_on_the_last_turn(text: str) -> None:
    wl = workload.parse(text)
    b = wl.barge_in
    for n in (1, 2, 7, 30, 200):
        starts = []
        for i in range(n):
            p = wl.plan(i, n)
            starts.append(p.start_ms)
            assert p.turns == wl.turns_for(n) == len(p.barge_in_ms)
            assert p.barge_in_ms[-1] is None
            hits = [k + 1 for k, v in enumerate(p.barge_in_ms) if v is not None]
            assert hits == [k for k in range(b.first, p.turns, b.every)]
            for v in p.barge_in_ms:
                assert v is None or b.after_ms <= v <= b.after_ms + b.spread_ms
            assert p.lines[0] == wl.caller.lines[i % len(wl.caller.lines)]
        assert starts == sorted(starts) and starts[-1] <= wl.load.ramp_max_ms


def test_barge_ins_can_be_turned_off(text: str) -> None:
    wl = workload.parse(text.replace("first = 2", "first = 0", 1))
    assert all(v is None for v in wl.plan(0, 1).barge_in_ms)


def test_bot_audio_is_deterministic_and_never_silent() -> None:
    a = workload.bot_audio(8000, 2000)
    assert a.dtype == np.int16 and len(a) == 16000
    assert np.array_equal(a, workload.bot_audio(8000, 2000))
    frames = a.reshape(-1, FRAME_SAMPLES).astype(np.float64)
    rms_dbfs = 20 * np.log10(np.sqrt((frames**2).mean(axis=1)) / 32768)
    assert rms_dbfs.min() > -40
