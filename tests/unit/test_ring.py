"""Ring protocol: wrap-around, overrun accounting, cut floor, attach checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipc.ring import Ring, RingError, instance_id, list_segments, ring_name, sweep_orphans


@pytest.fixture
def ring(shm_clean):
    r = Ring.create(ring_name(shm_clean, "t1", "in"), 256, 8000)
    yield r
    r.close()
    r.unlink()


def counter(start: int, n: int) -> np.ndarray:
    return (np.arange(start, start + n) % 32768).astype(np.int16)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 400)), min_size=1, max_size=40))
def test_reader_sees_every_sample_or_counts_it_lost(shm_clean, ops):
    name = ring_name(shm_clean, "prop", "in")
    r = Ring.create(name, 256, 16000)
    try:
        rd = r.reader(0)
        written = 0
        seen_end = 0
        lost_total = 0
        for n_write, n_read in ops:
            r.write(counter(written, n_write))
            written += n_write
            res = rd.read(n_read)
            assert res.start == seen_end + res.lost
            np.testing.assert_array_equal(res.samples, counter(res.start, len(res.samples)))
            # what was lost is exactly what fell out of the ring
            assert res.start >= written - r.capacity or res.lost == 0
            lost_total += res.lost
            seen_end = res.end
        res = rd.read()
        lost_total += res.lost
        np.testing.assert_array_equal(res.samples, counter(res.start, len(res.samples)))
        assert res.end == written
        assert lost_total == rd.lost
    finally:
        r.close()
        r.unlink()


def test_wraparound_exact(ring):
    rd = ring.reader(0)
    for i in range(10):
        ring.write(counter(i * 100, 100))
        res = rd.read()
        assert res.lost == 0 and res.start == i * 100
        np.testing.assert_array_equal(res.samples, counter(i * 100, 100))


def test_overrun_skips_forward_and_counts(ring):
    rd = ring.reader(0)
    ring.write(counter(0, 1000))
    res = rd.read()
    assert res.lost == 1000 - 256
    assert res.start == 744 and res.end == 1000
    np.testing.assert_array_equal(res.samples, counter(744, 256))


def test_chunk_larger_than_ring_keeps_tail(ring):
    ring.write(counter(0, 600))
    assert ring.write_pos == 600
    res = ring.read_range(0, 600)
    assert res.start == 344 and res.lost == 344
    np.testing.assert_array_equal(res.samples, counter(344, 256))


def test_cut_floor_skips_and_only_rises(ring):
    rd = ring.reader(0)
    ring.write(counter(0, 100))
    assert ring.cut(80) == 80
    assert ring.cut(50) == 80
    res = rd.read()
    assert res.skipped == 80 and res.lost == 0 and res.start == 80
    np.testing.assert_array_equal(res.samples, counter(80, 20))
    ring.write(counter(100, 10))
    assert ring.cut_at_write() == 110
    assert len(rd.read().samples) == 0


def test_readers_are_independent(ring):
    a, b = ring.reader(0), ring.reader(0)
    ring.write(counter(0, 50))
    assert len(a.read(20).samples) == 20
    assert len(b.read().samples) == 50
    assert a.read().start == 20


def test_read_range_history(ring):
    ring.write(counter(0, 300))
    res = ring.read_range(100, 200)
    assert res.start == 100 and res.lost == 0
    np.testing.assert_array_equal(res.samples, counter(100, 100))
    res = ring.read_range(250, 10_000)  # end clamps to the write position
    assert res.end == 300


def test_attach_checks(ring, shm_clean):
    other = Ring.attach(ring.name, rate=8000)
    ring.write(counter(0, 5))
    assert other.write_pos == 5
    other.close()
    with pytest.raises(RingError, match="rate"):
        Ring.attach(ring.name, rate=16000)
    with pytest.raises(RingError, match="does not exist"):
        Ring.attach(ring_name(shm_clean, "nope", "in"))
    with pytest.raises(RingError):
        Ring.attach("not-a-brisvox-name")


def test_attach_rejects_bad_magic(shm_clean):
    from ipc.ring import SHM_DIR

    name = ring_name(shm_clean, "bad", "in")
    (SHM_DIR / name).write_bytes(b"\x00" * 4096)
    (SHM_DIR / name).chmod(0o600)  # ours and private: the magic is what is wrong
    try:
        with pytest.raises(RingError, match="magic"):
            Ring.attach(name)
    finally:
        (SHM_DIR / name).unlink()


def test_create_refuses_bad_capacity_and_existing(ring):
    with pytest.raises(RingError):
        Ring.create(ring_name("1-1", "x", "in"), 300, 8000)
    with pytest.raises(FileExistsError):
        Ring.create(ring.name, 256, 8000)


def test_sweep_removes_only_dead_instances(shm_clean):
    dead = "999999999-00000001"
    mine = Ring.create(ring_name(shm_clean, "s", "in"), 256, 8000)
    orphan = Ring.create(ring_name(dead, "s", "in"), 256, 8000)
    orphan.close()
    try:
        removed = sweep_orphans()
        assert orphan.name in removed
        assert mine.name in list_segments(instance_id())
    finally:
        mine.close()
        mine.unlink()
