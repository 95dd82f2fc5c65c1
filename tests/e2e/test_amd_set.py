"""The AMD set generator with the real voices, and the AMD bench over it with the real Silero.

The same seed gives the same set sample for sample (two builds into separate
directories, each synthesizing its own phrases: espeak-ng, and the Piper joe
voice with its noise scales at 0), another seed another set; the manifest's
truth is in the audio (a beep at its frequency where the manifest puts its
onset, none before); and the bench's detector, fed by the worker's Silero in
native 8 kHz mode, answers every opening, the fax tones as fax and dead air as
uncertain. Needs espeak-ng and sox (``make install``); the Piper voice when
installed (``brisvox models install``: the manifest says whether it was used).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import amd_set, bench_amd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCALE = 0.04  # 12 openings: 4 people, 5 machines, 1 IVR, 1 fax, 1 dead line


def _goertzel(x: np.ndarray, hz: float) -> float:
    n = np.arange(len(x))
    return float(np.abs(np.dot(x.astype(np.float64), np.exp(-2j * np.pi * hz * n / amd_set.RATE))) ** 2 / len(x))


def test_same_seed_same_set_and_the_manifest_is_true_to_the_audio(tmp_path: Path) -> None:
    a = amd_set.build(12, tmp_path / "a", scale=SCALE)
    b = amd_set.build(12, tmp_path / "b", scale=SCALE)
    c = amd_set.build(13, tmp_path / "c", scale=SCALE)
    strip = ("dir",)
    assert {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}
    assert [it["label"] for it in a["openings"]] == ["human"] * 4 + ["machine"] * 5 + ["ivr", "fax", "uncertain"]
    if a["piper"]:  # seed 12 draws the Piper voice for 4 openings: its synthesis is deterministic too
        assert sum(it["voice"].startswith("piper:") for it in a["openings"]) == 4
    for it in a["openings"]:
        assert np.array_equal(amd_set.load(a, it), amd_set.load(b, it)), it["name"]
    assert any(not np.array_equal(amd_set.load(a, x), amd_set.load(c, y))
               for x, y in zip(a["openings"], c["openings"], strict=True))
    beeps = [it for it in a["openings"] if it.get("beep_ms", -1) >= 0]
    assert beeps, "seed 12 has beeps"
    for it in beeps:
        x = amd_set.load(a, it)
        s = it["beep_ms"] * amd_set.RATE // 1000
        n = amd_set.RATE // 10  # 100 ms
        during = _goertzel(x[s : s + n], it["beep_hz"])
        before = _goertzel(x[s - n : s], it["beep_hz"])
        assert during > 100 * before, it["name"]
        assert it["greeting_end_ms"] <= it["beep_ms"] - 200
    for it in a["openings"]:
        assert it["ms"] == len(amd_set.load(a, it)) * 1000 // amd_set.RATE
        if it["words"]:
            assert it["speech_end_ms"] == it["words"][-1]["end_ms"] < it["ms"]


def test_the_bench_answers_every_opening_with_the_real_vad(tmp_path: Path) -> None:
    man = amd_set.build(11, tmp_path, scale=SCALE)
    audio = [amd_set.load(man, it) for it in man["openings"]]
    probs = bench_amd.probabilities(audio)
    assert [len(p) for p in probs] == [len(x) // 256 for x in audio]
    for transcripts in (False, True):
        r = bench_amd.evaluate(man, probs, audio, transcripts)
        conf = r["confusion"]
        assert sum(sum(row.values()) for row in conf.values()) == len(audio)
        assert conf["fax"]["fax"] == 1 and conf["uncertain"]["uncertain"] == 1
        assert r["windows"] > 0 and r["us_per_20ms"] > 0
    rows = bench_amd.measure(11, SCALE, show=False, out=tmp_path)
    assert ("openings", 12, "", ">= 200") in rows
