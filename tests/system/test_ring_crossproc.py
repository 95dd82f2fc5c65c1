"""The audio ring across two real processes: every sample read is right, every loss is counted.

A forked child is the single writer: 60 s of 16 kHz audio in 20 ms frames,
about 20x faster than real time, each sample a hash of its absolute position
(so a stale sample from any earlier lap of the ring cannot pass for a fresh
one). The parent reads with its own cursor and deliberately stalls twice for
longer than the ring holds. It checks that each read starts exactly ``lost``
samples after the previous one ended, that every sample it got is the one
written at that position, and that read + lost == written at the end.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from ipc.ring import Ring, instance_id, list_segments, ring_name

pytestmark = pytest.mark.system

RATE = 16_000
SECONDS = 60
FRAME = 320  # 20 ms
CAPACITY = 1 << 14  # ~1 s of audio, ~50 ms at the test's write speed
SPEEDUP = 20
_A = np.uint64(0x9E3779B97F4A7C15)


def expected(start: int, n: int) -> np.ndarray:
    pos = np.arange(start, start + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return ((pos * _A) >> np.uint64(48)).astype(np.uint16).view(np.int16)


def writer(name: str) -> None:
    ring = Ring.attach(name, rate=RATE)
    total = RATE * SECONDS
    period = FRAME / RATE / SPEEDUP
    t0 = time.monotonic()
    for i, start in enumerate(range(0, total, FRAME)):
        ring.write(expected(start, FRAME))
        delay = t0 + (i + 1) * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    ring.mark_closed()
    ring.close()


def test_child_writes_60s_parent_verifies_every_sample_and_counts_losses():
    # (not the shm_clean fixture: it also flags segments that tests running in parallel create)
    inst = instance_id()
    name = ring_name(inst, "xproc", "in16")
    ring = Ring.create(name, CAPACITY, RATE)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            writer(name)
            code = 0
        finally:
            os._exit(code)
    try:
        total = RATE * SECONDS
        rd = ring.reader(0)
        pos = 0
        got = lost = reads = 0
        stalls = {total // 3: False, 2 * total // 3: False}
        stall_losses = []
        t_end = time.monotonic() + 60
        while time.monotonic() < t_end:
            res = rd.read(4096)
            reads += 1
            assert res.skipped == 0
            assert res.start == pos + res.lost, (res.start, pos, res.lost)
            np.testing.assert_array_equal(res.samples, expected(res.start, len(res.samples)))
            pos = res.end
            got += len(res.samples)
            lost += res.lost
            for mark, done in stalls.items():
                if not done and pos >= mark:
                    stalls[mark] = True
                    # stall until the writer has lapped us at least twice (however slow the host)
                    lap_deadline = time.monotonic() + 20
                    while ring.write_pos < pos + 2 * CAPACITY and time.monotonic() < lap_deadline:
                        time.sleep(0.01)
                    after = rd.read(4096)
                    assert after.start == pos + after.lost
                    np.testing.assert_array_equal(after.samples, expected(after.start, len(after.samples)))
                    stall_losses.append(after.lost)
                    pos = after.end
                    got += len(after.samples)
                    lost += after.lost
            if ring.closed and pos == ring.write_pos:
                break
            if not len(res.samples):
                time.sleep(0.0005)
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0
        assert pos == ring.write_pos == total
        assert got + lost == total
        assert rd.lost == lost
        assert len(stall_losses) == 2 and all(n >= CAPACITY for n in stall_losses), stall_losses
        assert got > total // 2  # the reader kept up outside the stalls
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        ring.close()
        ring.unlink()
    assert list_segments(inst) == []
