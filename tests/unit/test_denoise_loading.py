"""Denoise models are built off the worker's tick thread (workers/denoise.py, ``ModelLoader``).

An attach with ``denoise = "deepfilter"`` returns while the model is still loading (the
loader is held on an Event here, in front of the real DeepFilterNet); the tick keeps
serving the other calls meanwhile; the loading call's audio goes out raw with exact
positions and switches to the model once it is there; a load that fails fails open;
at most one load per mode runs at a time, and a spare model is kept for the next call.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from ipc.frames import Attached
from tests.unit.test_denoise import run, signal
from tests.unit.test_worker_core import Rig
from workers.denoise import (
    DeepFilterModel,
    Denoiser,
    ModelLoader,
    ModelSpec,
    PendingModel,
    RnnoiseModel,
)

GATE_S = 20.0  # a gated build gives up after this long (the test fails on its asserts first)


class Gate:
    """A build that waits for ``open()`` before it builds the real model; counts the builds
    and how many ran at once."""

    def __init__(self, build) -> None:
        self.build = build
        self.opened = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started = 0
        self.built: list = []

    def __call__(self):
        with self.lock:
            self.running += 1
            self.started += 1
            self.most = max(self.most, self.running)
        try:
            if not self.opened.wait(GATE_S):
                raise TimeoutError("gate never opened")
            m = self.build()
            self.built.append(m)
            return m
        finally:
            with self.lock:
                self.running -= 1

    def open(self) -> None:
        self.opened.set()


class Closes:
    """The real RNNoise, recording its close."""

    delay48 = RnnoiseModel.delay48

    def __init__(self) -> None:
        self.inner = RnnoiseModel()
        self.closed = False

    def process(self, frame: np.ndarray, out: np.ndarray) -> None:
        self.inner.process(frame, out)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def test_a_loading_model_passes_audio_raw_then_switches_with_exact_positions():
    gate = Gate(RnnoiseModel)
    loader = ModelLoader({"slow": ModelSpec(RnnoiseModel.delay48, gate)}, spare=False)
    try:
        x = signal(0, 3.0)
        got = loader.request("slow")
        assert isinstance(got, PendingModel)
        d = Denoiser(got, "call-1")
        before = run(d, x[:8000], [320])
        assert np.array_equal(before, x[:8000])  # raw, every sample as it came: nothing held
        assert not d.active
        gate.open()
        assert got.wait(GATE_S)
        after = run(d, x[8000:], [320])
        assert d.active and d.pending is None and not d.failed
        # from the switch on: exactly what a denoiser started at that sample gives (framing
        # restarted, the model's delay dropped), so in16 sample k is still input sample k
        assert np.array_equal(after, run(Denoiser(RnnoiseModel()), x[8000:], [320]))
        assert len(x) - d.max_hold <= len(before) + len(after) <= len(x)
        assert not np.array_equal(after, x[8000 : 8000 + len(after)])  # it did denoise
    finally:
        loader.close()


def test_a_load_that_fails_fails_open_counted_and_logged_once(caplog):
    def broken():
        raise OSError("libdeepfilter.so: cannot open shared object file")

    loader = ModelLoader({"deepfilter": ModelSpec(DeepFilterModel.delay48, broken)}, spare=False)
    try:
        fails: list[Exception] = []
        p = loader.request("deepfilter")
        assert isinstance(p, PendingModel) and p.wait(GATE_S)
        d = Denoiser(p, "call-2", on_fail=fails.append)
        x = signal(1)
        with caplog.at_level(logging.ERROR, logger="brisvox.workers"):
            out = run(d, x, [320])
        assert np.array_equal(out, x)  # raw throughout, positions exact
        assert d.failed and [type(e) for e in fails] == [OSError]
        assert len([r for r in caplog.records if "denoise failed" in r.getMessage()]) == 1
    finally:
        loader.close()


def test_one_load_per_mode_at_a_time_then_a_spare_for_the_next_call():
    gate = Gate(Closes)
    loader = ModelLoader({"slow": ModelSpec(Closes.delay48, gate)}, spare=True)
    try:
        asked = [loader.request("slow") for _ in range(3)]
        assert all(isinstance(p, PendingModel) and p.loading for p in asked)
        time.sleep(0.3)
        assert gate.started == 1  # the other two wait in the queue
        gate.open()
        assert all(p.wait(GATE_S) for p in asked if isinstance(p, PendingModel))
        models = [p.take() for p in asked if isinstance(p, PendingModel)]
        assert all(isinstance(m, Closes) for m in models) and len({id(m) for m in models}) == 3
        deadline = time.monotonic() + GATE_S
        while loader.builds("slow") < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loader.builds("slow") == 4 and gate.most == 1  # three asked for, then one spare
        spare = loader.request("slow")
        assert isinstance(spare, Closes)  # the next call starts denoised at once
        for m in [*models, spare]:
            assert isinstance(m, Closes)
            m.close()
    finally:
        loader.close()


def test_a_call_gone_before_its_model_came_has_it_closed_and_a_queued_one_never_built():
    gate = Gate(Closes)
    loader = ModelLoader({"slow": ModelSpec(Closes.delay48, gate)}, spare=False)
    try:
        p, q = loader.request("slow"), loader.request("slow")
        assert isinstance(p, PendingModel) and isinstance(q, PendingModel)
        deadline = time.monotonic() + GATE_S
        while not gate.started and time.monotonic() < deadline:
            time.sleep(0.01)
        Denoiser(p).close()  # the call detached while its model is being built
        Denoiser(q).close()  # and this one while its request waits in the queue
        gate.open()
        while loader.builds("slow") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the loader looks at its queue again (q: nothing to build)
        assert loader.builds("slow") == 1 and gate.started == 1
        assert [m.closed for m in gate.built] == [True]  # nobody took it: closed
        assert p.take() is None and q.take() is None
    finally:
        loader.close()


def test_a_cancelled_pending_model_closes_what_it_is_given():
    p = PendingModel("rnnoise", Closes.delay48)
    p.cancel()
    m = Closes()
    p.deliver(m)
    assert m.closed and p.take() is None
    q = PendingModel("rnnoise", Closes.delay48)
    n = Closes()
    q.deliver(n)
    q.cancel()  # built, never taken: closed now
    assert n.closed


def test_an_inline_mode_builds_on_the_callers_thread_once_its_library_is_loaded():
    loader = ModelLoader({"rnnoise": ModelSpec(RnnoiseModel.delay48, RnnoiseModel, inline=True)})
    try:
        first = loader.request("rnnoise")
        assert isinstance(first, PendingModel)  # the library loads on the loader's thread
        assert first.wait(GATE_S)
        m = first.take()
        assert isinstance(m, RnnoiseModel)
        m.close()
        second = loader.request("rnnoise")
        assert isinstance(second, RnnoiseModel)  # then: made at once (0.03-0.1 ms)
        second.close()
    finally:
        loader.close()


@pytest.fixture
def core(short_tmp, shm_clean):
    r = Rig(short_tmp, shm_clean, native_8k=False)
    yield r
    r.close()


def test_a_deepfilter_attach_does_not_wait_for_the_load_and_the_tick_serves_the_others(core):
    """The real DeepFilterNet behind a held gate: the attach answers at once, the other
    call's audio, positions and VAD events keep coming tick after tick, the loading call's
    in16 keeps up (raw), and after the load its in16 is denoised on the same time grid."""
    gate = Gate(DeepFilterModel)
    core.w.attached.denoise_models.close()
    core.w.attached.denoise_models = ModelLoader({"deepfilter": ModelSpec(DeepFilterModel.delay48, gate)},
                                                spare=False)
    core.call("a")
    core.call("d")
    assert isinstance(core.attach("a"), Attached)
    t0 = time.monotonic()
    assert isinstance(core.attach("d", denoise="deepfilter"), Attached)
    assert time.monotonic() - t0 < 1.0  # answered at once: the load is the loader thread's
    deadline = time.monotonic() + 5.0  # that thread reaches the held build on its own time (a loaded host)
    while gate.running != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert gate.running == 1  # the load is under way and held
    den = core.w.calls["d"].inp.denoise
    assert den is not None and den.pending is not None and den.pending.loading
    assert core.w.stats.denoise_late == 1 and core.w.stats.denoised_calls == 1

    a_pos, d_pos, events, took = [], [], [], []
    for k in range(60):  # 1.2 s of audio, the load held all along
        core.feed("a", loud=10 <= k < 40)
        core.feed("d", loud=True)
        t0 = time.monotonic()
        t = core.tick()
        took.append(time.monotonic() - t0)
        events.extend(t.events)
        a_pos.append(core.w.calls["a"].inp.out_pos)
        d_pos.append(core.w.calls["d"].inp.out_pos)
    assert max(took) < 1.0  # no tick waited for the held load
    # call a's in16 kept up with its audio: at most a VAD window and a frame behind, every tick
    assert all(p >= (k + 1) * 320 - 512 - 320 for k, p in enumerate(a_pos)), a_pos
    assert [(e.call_id, type(e).__name__) for e in events if e.call_id == "a"][:2] == [
        ("a", "SpeechStart"), ("a", "SpeechStop")]
    inp = core.w.calls["d"].inp
    # raw: in16 holds every sample of d converted so far (only the resampler's hold-back)
    assert d_pos[-1] > 40 * 320 and 0 <= 2 * inp.in_pos - inp.out_pos <= 4
    raw16 = core.rings["d"]["in16"].read_range(0, d_pos[-1]).samples.copy()

    gate.open()
    assert den.pending.wait(GATE_S)
    for _ in range(50):
        core.feed("a", loud=False)
        core.feed("d", loud=True)
        core.tick()
    assert den.active and core.w.stats.denoise_failures == 0
    assert 0 <= 2 * inp.in_pos - inp.out_pos <= den.max_hold + 4  # on the time grid after the switch
    assert np.array_equal(core.rings["d"]["in16"].read_range(0, d_pos[-1]).samples, raw16)
    after = core.rings["d"]["in16"].read_range(d_pos[-1], inp.out_pos).samples.astype(np.float64)
    before = raw16[-len(after) :].astype(np.float64)
    # noise in, DeepFilterNet on: the denoised part is far quieter than the raw part was
    assert np.sqrt(np.mean(after**2)) < 0.5 * np.sqrt(np.mean(before**2))


def test_a_failing_load_fails_the_call_open_in_the_worker(core, caplog):
    def broken():
        raise RuntimeError("df_create failed")

    core.w.attached.denoise_models.close()
    core.w.attached.denoise_models = ModelLoader({"deepfilter": ModelSpec(DeepFilterModel.delay48, broken)})
    core.call("d")
    assert isinstance(core.attach("d", denoise="deepfilter"), Attached)
    den = core.w.calls["d"].inp.denoise
    assert den is not None and den.pending is not None and den.pending.wait(GATE_S)
    with caplog.at_level(logging.ERROR, logger="brisvox.workers"):
        for _ in range(10):
            core.feed("d", loud=True)
            core.tick()
    assert den.failed and core.w.stats.denoise_failures == 1
    assert len([r for r in caplog.records if "denoise failed" in r.getMessage()]) == 1
    inp = core.w.calls["d"].inp
    assert inp.out_pos > 0 and 0 <= 2 * inp.in_pos - inp.out_pos <= 4  # raw audio, every sample
