"""The real models on generated speech: batched Silero, VAD boundaries, Whisper features, Smart Turn.

Needs the model files (``brisvox models install``, run by ``make install``)
and espeak-ng + sox for the fixtures (``scripts/make_fixtures.py``).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

from ipc.codec import encode
from ipc.frames import AmdStart, AttachCall, Attached, SmartTurnRequest, SmartTurnResult, WorkerTick
from workers import mel
from workers.config import VadConfig, WorkersConfig
from workers.core import Worker, WorkerModels
from workers.harness import close_rings, create_call_rings
from workers.models import locate
from workers.smart_turn import SmartTurnModel
from workers.vad import WINDOW, SileroBatch

ROOT = Path(__file__).resolve().parents[2]


def _fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


FIX = _fixtures()


@pytest.fixture(scope="module")
def silero_path() -> Path:
    return locate("silero_vad")


@pytest.fixture(scope="module")
def smart() -> SmartTurnModel:
    return SmartTurnModel(locate("smart_turn"))


# -- batched Silero ------------------------------------------------------------------------------


def test_batched_vad_equals_unbatched_per_call_runs(silero_path):
    """Five calls that join and leave at different windows: batch rows never mix state."""
    x, _ = FIX.load("vad_dialog", 16000)
    n_calls = 5
    offsets = [0, 7_000, 21_000, 40_000, 64_000]
    starts = [0, 3, 11, 12, 30]  # window index at which each call joins
    lengths = [200, 180, 120, 150, 90]
    wins = [[(x[o + i * WINDOW : o + (i + 1) * WINDOW].astype(np.float32) / 32768.0) for i in range(L)]
            for o, L in zip(offsets, lengths, strict=True)]
    batched = SileroBatch(silero_path, capacity=16)
    got: list[list[float]] = [[] for _ in range(n_calls)]
    slots = [9, 2, 15, 4, 7]  # arbitrary, non-contiguous slots
    for t in range(max(s + L for s, L in zip(starts, lengths, strict=True))):
        rows = [c for c in range(n_calls) if starts[c] <= t < starts[c] + lengths[c]]
        if not rows:
            continue
        sl = np.array([slots[c] for c in rows], dtype=np.intp)
        w = np.stack([wins[c][t - starts[c]] for c in rows])
        p = batched.run(sl, w)
        for c, pr in zip(rows, p, strict=True):
            got[c].append(float(pr))
    worst = 0.0
    for c in range(n_calls):
        alone = SileroBatch(silero_path, capacity=1)
        ref = [float(alone.run(np.array([0]), w[None])[0]) for w in wins[c]]
        worst = max(worst, float(np.max(np.abs(np.array(ref) - np.array(got[c])))))
        assert max(ref) > 0.9 and min(ref) < 0.1  # the fixture really has speech and silence
    assert worst < 1e-5


# -- the worker core with the real model: boundaries ----------------------------------------------


class CoreRig:
    """An in-process worker with the real models, fed frame by frame, driven tick by tick."""

    def __init__(self, tmp: Path, inst: str, rate: int, smart_turn: bool = False,
                 vad: VadConfig | None = None) -> None:
        import zmq

        from ipc.bus import endpoint, make_socket

        self.inst = inst
        self.rate = rate
        models = WorkerModels(silero=locate("silero_vad"), smart_turn=locate("smart_turn") if smart_turn else None)
        from workers.config import SmartTurnConfig

        # job_nice 0: the lane's priority is not what these tests judge, and at nice 10 beside three
        # busy test workers a Smart Turn analysis ran past its 1000 ms deadline
        self.w = Worker(0, endpoint(tmp, "w0"), models, WorkersConfig(max_calls=4, job_nice=0), vad or VadConfig(),
                        SmartTurnConfig(enabled=smart_turn))
        self.w.load()
        self.w.bind()
        self.ctx = zmq.Context()
        self.sub = make_socket(self.ctx, zmq.DEALER, identity=b"sub")
        self.sub.connect(self.w.endpoint)
        self.rings = create_call_rings(inst, "c", rate, 16000, seconds=16.0)

    def request(self, frame):
        from ipc.codec import decode

        self.sub.send(encode(frame, cid=1))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            self.w.sock.poll(50)
            self.w.dispatch.drain_inbox(self.w.sock)
            self.w.dispatch.send_job_results()
            if self.sub.poll(20):
                f = decode(self.sub.recv())
                if not isinstance(f, WorkerTick):
                    return f
        raise TimeoutError

    def play(self, x: np.ndarray, denoise: str = "off", amd: dict | None = None) -> list[dict]:
        """Attach call "c", play ``x`` a 20 ms frame per tick, return the tick events. ``amd``:
        an AmdStart's fields (but the call and position): detection from the first sample."""
        from ipc.codec import decode

        att = self.request(AttachCall(call_id="c", subscriber="sub", instance=self.inst, call_rate=self.rate,
                                      tts_rate=16000, denoise=denoise))
        assert isinstance(att, Attached)
        den = self.w.calls["c"].inp.denoise
        if den is not None and den.pending is not None:  # the model loads on its own thread (raw audio
            assert den.pending.wait(60)  # meanwhile); this rig plays faster than real time: wait for it
        if amd is not None:  # not answered: handled when the inbox is drained
            self.sub.send(encode(AmdStart(call_id="c", in16_pos=att.in16_pos, **amd)))
            assert self.w.sock.poll(5000)
            self.w.dispatch.drain_inbox(self.w.sock)
            assert self.w.calls["c"].amd_start is not None
        step = self.rate // 50
        events = []
        for k in range(0, len(x) - step + 1, step):
            self.rings["in"].write(x[k : k + step])
            self.w.realtime.tick()
            while self.sub.poll(0):
                f = decode(self.sub.recv())
                if isinstance(f, WorkerTick):
                    events.extend(f.events)
        # the last ticks' frames may still be on their way (the socket is async): take them too,
        # until nothing more comes for 200 ms (a busy CI core once lost the final stop here)
        while self.sub.poll(200):
            f = decode(self.sub.recv())
            if isinstance(f, WorkerTick):
                events.extend(f.events)
        return events

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()
        self.w.close()
        close_rings(self.rings)


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("name", ["vad_dialog", "turn_complete", "turn_trailing"])
def test_vad_events_fall_within_one_window_of_the_true_boundaries(short_tmp, shm_clean, rate, name):
    x, entry = FIX.load(name, rate)
    rig = CoreRig(short_tmp, shm_clean, rate)
    try:
        events = rig.play(x)
    finally:
        rig.close()
    segs = entry["segments16"]
    assert [e["kind"] for e in events] == ["start", "stop"] * len(segs)
    for (s, t), start, stop in zip(segs, events[0::2], events[1::2], strict=True):
        assert abs(start["pos"] - s) <= WINDOW, (start, s)
        assert abs(stop["pos"] - t) <= WINDOW, (stop, t)
        # the stop is decided after min_silence of audio, never earlier
        assert stop["at"] - stop["pos"] >= 200 * 16


# -- Whisper log-mel features -------------------------------------------------------------------


def reference_log_mel(audio: np.ndarray) -> np.ndarray:
    """Straightforward float64 Whisper log-mel, frame by frame, filter by filter."""
    x = np.zeros(128_000)
    a = audio.astype(np.float64) / (32768.0 if audio.dtype == np.int16 else 1.0)
    a = a[-128_000:]
    x[128_000 - len(a) :] = a
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    xp = np.concatenate([x[1:201][::-1], x, x[-201:-1][::-1]])  # reflect padding, 200 each side
    win = np.array([0.5 - 0.5 * np.cos(2 * np.pi * i / 400) for i in range(400)])

    def hz2mel(f: float) -> float:
        return 3 * f / 200 if f < 1000 else 15 + np.log(f / 1000) / (np.log(6.4) / 27)

    def mel2hz(m: float) -> float:
        return 200 * m / 3 if m < 15 else 1000 * np.exp((m - 15) * np.log(6.4) / 27)

    edges = [mel2hz(hz2mel(0) + i * (hz2mel(8000) - hz2mel(0)) / 81) for i in range(82)]
    freqs = [k * 8000 / 200 for k in range(201)]
    fb = np.zeros((80, 201))
    for m in range(80):
        lo, c, hi = edges[m], edges[m + 1], edges[m + 2]
        for k, f in enumerate(freqs):
            w = max(0.0, min((f - lo) / (c - lo), (hi - f) / (hi - c)))
            fb[m, k] = w * 2 / (hi - lo)
    out = np.zeros((80, 800))
    for t in range(800):
        frame = xp[t * 160 : t * 160 + 400] * win
        spec = np.fft.rfft(frame)
        power = np.abs(spec) ** 2
        out[:, t] = np.log10(np.maximum(fb @ power, 1e-10))
    out = np.maximum(out, out.max() - 8.0)
    return (out + 4.0) / 4.0


@pytest.mark.parametrize("case", ["question", "trailing", "short", "noise", "long"])
def test_smart_turn_features_match_a_float64_reference(case):
    rng = np.random.default_rng(5)
    if case == "question":
        audio = FIX.load("turn_complete", 16000)[0]
    elif case == "trailing":
        audio = FIX.load("turn_trailing", 16000)[0]
    elif case == "short":
        audio = FIX.load("turn_complete", 16000)[0][8000:20000]
    elif case == "noise":
        audio = rng.normal(0, 0.1, 128_000).astype(np.float32)
    else:  # longer than 8 s: only the last 8 s count
        audio = np.concatenate([FIX.load("vad_dialog", 16000)[0]] * 2)
    got = mel.log_mel(audio)
    ref = reference_log_mel(audio)
    assert got.shape == (80, 800) and got.dtype == np.float32
    assert float(np.max(np.abs(got - ref))) < 1e-4


# -- Smart Turn on the fixtures --------------------------------------------------------------------


def _turn_end(name: str, short_tmp: Path, inst: str) -> tuple[np.ndarray, int]:
    x, _ = FIX.load(name, 16000)
    rig = CoreRig(short_tmp, inst, 16000)
    try:
        events = rig.play(x)
    finally:
        rig.close()
    stops = [e for e in events if e["kind"] == "stop"]
    assert len(stops) == 1
    return x, stops[0]["at"]


def test_a_complete_question_scores_above_one_half(smart, short_tmp, shm_clean):
    x, at = _turn_end("turn_complete", short_tmp, shm_clean)
    p = smart.analyze(x[:at]).probability  # the audio up to the VAD stop decision
    assert p > 0.5


def test_a_trailing_off_phrase_scores_below_one_half(smart, short_tmp, shm_clean):
    x, at = _turn_end("turn_trailing", short_tmp, shm_clean)
    p = smart.analyze(x[:at]).probability
    assert p < 0.5


def test_smart_turn_through_the_job_lane_reads_the_in16_ring(short_tmp, shm_clean):
    x, entry = FIX.load("turn_complete", 8000)
    rig = CoreRig(short_tmp, shm_clean, 8000, smart_turn=True)
    try:
        assert rig.w.smart is not None and rig.w.smart.runs >= 1  # warmed before any call
        events = rig.play(x)
        stop = [e for e in events if e["kind"] == "stop"][0]
        reply = rig.request(SmartTurnRequest(call_id="c", end_pos=stop["at"],
                                             deadline_ns=time.monotonic_ns() + 2 * 10**9))
        assert isinstance(reply, SmartTurnResult) and reply.end_pos == stop["at"]
        in16 = rig.rings["in16"].read_range(0, stop["at"]).samples
        # the same file the worker chose at boot (its self-benchmark may pick another candidate than
        # the default file on a loaded host): the job lane must read exactly the ring's samples
        assert reply.probability == pytest.approx(rig.w.smart.analyze(in16).probability, abs=1e-6)
        assert reply.probability > 0.5
    finally:
        rig.close()


def test_warm_up_runs_every_model_before_ready(short_tmp):
    from ipc.bus import endpoint
    from workers.config import SmartTurnConfig

    w = Worker(0, endpoint(short_tmp, "w"), WorkerModels(locate("silero_vad"), locate("smart_turn")),
               WorkersConfig(max_calls=8), VadConfig(), SmartTurnConfig())
    try:
        w.load()
        assert w.silero is not None and w.silero.runs >= 2  # batch 1 and a large batch
        assert w.smart is not None and w.smart.runs == 1
        assert set(w.warm_report) == {"silero_s", "smart_turn_s"}
    finally:
        w.close()
