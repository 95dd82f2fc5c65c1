"""Silero's native 8 kHz mode (``[vad] native_8k``, the default for 8 kHz calls) with the real model.

The 8 kHz path's equivalents of the checks in ``test_worker_models.py``:
batched runs give the same probabilities as one unbatched run per call
(within 1e-5), and the worker core's start/stop events fall within one
window of the fixtures' true boundaries in both VAD modes of an 8 kHz call
(native 8 kHz on the ``in`` samples, 16 kHz on in16), the same fixtures
as the 16 kHz path. Needs the model files and the generated fixtures.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_worker_models import FIX, CoreRig
from workers.config import VadConfig
from workers.models import locate
from workers.vad import WINDOW, WINDOW8, SileroBatch


def test_batched_native_8k_vad_equals_unbatched_per_call_runs():
    """Five 8 kHz calls joining and leaving at different windows, on arbitrary slots, with
    16 kHz rows of other calls in between (a slot's state never leaks across rates)."""
    x, _ = FIX.load("vad_dialog", 8000)
    x16, _ = FIX.load("vad_dialog", 16000)
    path = locate("silero_vad")
    offsets = [0, 3_500, 10_500, 20_000, 32_000]
    starts = [0, 3, 11, 12, 30]
    lengths = [200, 180, 120, 150, 90]
    wins = [[x[o + i * WINDOW8 : o + (i + 1) * WINDOW8].astype(np.float32) / 32768.0 for i in range(n)]
            for o, n in zip(offsets, lengths, strict=True)]
    batched = SileroBatch(path, capacity=16)
    slots = [9, 2, 15, 4, 7]
    got: list[list[float]] = [[] for _ in slots]
    for t in range(max(s + n for s, n in zip(starts, lengths, strict=True))):
        rows = [c for c in range(len(slots)) if starts[c] <= t < starts[c] + lengths[c]]
        if rows:
            p = batched.run(np.array([slots[c] for c in rows], dtype=np.intp),
                            np.stack([wins[c][t - starts[c]] for c in rows]))
            for c, pr in zip(rows, p, strict=True):
                got[c].append(float(pr))
        # a 16 kHz call on slots 0 and 1 runs in between
        w16 = x16[t * WINDOW : (t + 1) * WINDOW].astype(np.float32)[None] / 32768.0
        if len(w16[0]) == WINDOW:
            batched.run(np.array([0], dtype=np.intp), w16)
    worst = 0.0
    for c in range(len(slots)):
        alone = SileroBatch(path, capacity=1)
        ref = [float(alone.run(np.array([0]), w[None])[0]) for w in wins[c]]
        worst = max(worst, float(np.max(np.abs(np.array(ref) - np.array(got[c])))))
        assert max(ref) > 0.9 and min(ref) < 0.1  # the fixture really has speech and silence
    assert worst < 1e-5


@pytest.mark.parametrize("native", [True, False], ids=["native8k", "in16"])
@pytest.mark.parametrize("name", ["vad_dialog", "turn_complete", "turn_trailing"])
def test_8k_call_events_fall_within_one_window_of_the_true_boundaries(short_tmp, shm_clean, name, native):
    x, entry = FIX.load(name, 8000)
    rig = CoreRig(short_tmp, shm_clean, 8000, vad=VadConfig(native_8k=native))
    try:
        events = rig.play(x)
        assert rig.w.calls["c"].win == (WINDOW8 if native else WINDOW)
    finally:
        rig.close()
    segs = entry["segments16"]
    assert [e["kind"] for e in events] == ["start", "stop"] * len(segs)
    for (s, t), start, stop in zip(segs, events[0::2], events[1::2], strict=True):
        assert abs(start["pos"] - s) <= WINDOW, (start, s)
        assert abs(stop["pos"] - t) <= WINDOW, (stop, t)
        assert stop["at"] - stop["pos"] >= 200 * 16
