"""bench/loadgen/pacing.py + the frame cutting in runner: one 20 ms schedule for all calls."""

from __future__ import annotations

import base64

import numpy as np

from bench.loadgen.pacing import Pacer
from bench.loadgen.runner import line_frames
from brisvox.wire import g711


def test_frames_are_due_on_their_deadlines_and_handed_out_once() -> None:
    p = Pacer(t0=100.0, period=0.02)
    assert p.due(99.99) == 0
    assert p.due(100.0) == 1
    assert p.due(100.005) == 0  # frame 1 is due at 100.02
    assert p.due(100.021) == 1
    assert p.next_deadline() == 100.04
    assert p.late_s[0] == 0.0 and abs(p.late_s[1] - 0.001) < 1e-9


def test_a_late_wakeup_sends_the_missed_frames_in_one_burst() -> None:
    p = Pacer(t0=0.0, period=0.02)
    p.due(0.0)
    assert p.due(0.0705) == 3  # frames 1, 2, 3 (due 0.02, 0.04, 0.06)
    assert abs(p.late_s[-1] - 0.0505) < 1e-9  # measured from the oldest missed deadline
    assert p.next_index == 4


def test_falling_too_far_behind_skips_and_counts() -> None:
    p = Pacer(t0=0.0, period=0.02, max_behind_s=0.1)
    p.due(0.0)
    n = p.due(1.0)
    assert p.skipped > 0
    assert n <= 6  # a bounded burst, not 50 frames at once
    assert p.deadline(p.next_index - 1) <= 1.0 + 1e-9 < p.deadline(p.next_index)  # caught up
    total = 1 + n + p.skipped
    assert total == p.next_index


def test_a_line_is_cut_into_20ms_frames_padded_with_silence() -> None:
    samples = (np.arange(330) % 200 * 100).astype(np.int16)
    frames = line_frames(samples)
    raw = [base64.b64decode(f) for f in frames]
    assert [len(r) for r in raw] == [160, 160, 160]
    assert raw[2][10:] == bytes([g711.ULAW_SILENCE]) * 150
    assert b"".join(raw)[:330] == g711.ulaw_encode(samples)
