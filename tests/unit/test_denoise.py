"""The per-call denoiser (workers/denoise.py) with the real RNNoise library: state per call,
chunking, exact positions, fail-open; and the attach refusing an unknown ``denoise``."""

from __future__ import annotations

import logging

import numpy as np

from workers.denoise import Denoiser, RnnoiseModel

RATE = 16_000


def signal(seed: int, seconds: float = 1.5) -> np.ndarray:
    """A voiced-like signal (harmonics switching on and off) in noise."""
    rng = np.random.default_rng(seed)
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    f0 = 140 + 40 * seed
    voiced = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in range(1, 8)) * (np.sin(2 * np.pi * 3 * t) > 0)
    return np.clip(4000 * voiced + rng.normal(0, 400, n), -32768, 32767).astype(np.int16)


def run(d: Denoiser, x: np.ndarray, sizes: list[int]) -> np.ndarray:
    out, i, k = [], 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        out.append(d.process(x[i : i + n]))
        i += n
        k += 1
    return np.concatenate(out)


def test_odd_chunk_sizes_give_the_same_output_as_one_chunk_and_hold_at_most_max_hold():
    x = signal(0)
    whole = Denoiser(RnnoiseModel()).process(x)
    d = Denoiser(RnnoiseModel())
    out, held = [], 0
    for i, n in enumerate([1, 7, 333, 161, 2, 999, 13] * 40):
        start = sum(([1, 7, 333, 161, 2, 999, 13] * 40)[:i])
        if start >= len(x):
            break
        out.append(d.process(x[start : start + n]))
        held = max(held, min(start + n, len(x)) - sum(len(o) for o in out))
    chunked = np.concatenate(out)
    assert len(chunked) == len(whole) >= len(x) - d.max_hold
    assert np.array_equal(chunked, whole)
    assert 0 < held <= d.max_hold
    assert not np.array_equal(whole, x[: len(whole)])  # it did change the audio


def test_output_is_time_aligned_with_the_input():
    """The model's delay (320 samples) is dropped: a burst comes out where it went in (within 1 ms)."""
    x = np.zeros(RATE, dtype=np.int16)
    x[6000:9000] = signal(1, 3000 / RATE)[:3000] * 3
    y = Denoiser(RnnoiseModel()).process(x).astype(np.float64)
    env_in = np.convolve(np.abs(x[: len(y)].astype(np.float64)), np.ones(160), "same")
    env_out = np.convolve(np.abs(y), np.ones(160), "same")
    c = np.correlate(env_out, env_in, "full")
    assert abs(int(np.argmax(c)) - (len(y) - 1)) <= 16


def test_two_calls_interleaved_give_what_each_gives_alone():
    a, b = signal(0), signal(2)
    alone_a = run(Denoiser(RnnoiseModel()), a, [320])
    alone_b = run(Denoiser(RnnoiseModel()), b, [320])
    da, db = Denoiser(RnnoiseModel()), Denoiser(RnnoiseModel())
    ga, gb = [], []
    for i in range(0, len(a), 320):  # one tick: both calls' frames
        ga.append(da.process(a[i : i + 320]))
        gb.append(db.process(b[i : i + 320]))
    assert np.array_equal(np.concatenate(ga), alone_a)
    assert np.array_equal(np.concatenate(gb), alone_b)


class BreaksAfter:
    """The real RNNoise that raises from its ``n``-th frame on (a model fault)."""

    def __init__(self, n: int) -> None:
        self.inner = RnnoiseModel()
        self.delay48 = self.inner.delay48
        self.frames = 0
        self.n = n

    def process(self, frame: np.ndarray, out: np.ndarray) -> None:
        self.frames += 1
        if self.frames >= self.n:
            raise RuntimeError("injected model fault")
        self.inner.process(frame, out)

    def close(self) -> None:
        self.inner.close()


def test_a_failing_model_fails_open_to_raw_audio_counted_and_logged_once(caplog):
    x = signal(0)
    fails: list[Exception] = []
    d = Denoiser(BreaksAfter(20), "call-1", on_fail=fails.append)
    ref = Denoiser(RnnoiseModel()).process(x[:320 * 5])
    with caplog.at_level(logging.ERROR, logger="brisvox.workers"):
        out = run(d, x, [320])
    assert len(out) == len(x)  # every sample came out: positions stay exact
    assert d.failed and len(fails) == 1
    assert len([r for r in caplog.records if "denoise failed" in r.getMessage()]) == 1
    k = len(ref) - 320  # before the fault: denoised, exactly as a healthy model
    assert np.array_equal(out[:k], ref[:k])
    assert np.array_equal(out[-8000:], x[-8000:])  # after it: the raw audio, unchanged


def test_flush_hands_back_the_held_samples_raw_and_positions_stay_exact():
    x = signal(0)
    d = Denoiser(RnnoiseModel())
    first = d.process(x[:5000])
    held = d.flush()
    assert len(first) + len(held) == 5000
    assert np.array_equal(held, x[len(first) : 5000])
    after = d.process(x[5000:])
    assert len(after) >= len(x) - 5000 - d.max_hold


def test_attach_refuses_an_unknown_denoise_with_a_clear_error(short_tmp, shm_clean):
    from ipc.frames import AttachCall, ErrorReply
    from workers.call_table import AttachedCalls
    from workers.config import VadConfig, WorkersConfig
    from workers.harness import close_rings, create_call_rings
    from workers.stats import TickStats

    rings = create_call_rings(shm_clean, "c", 8000, 16000, seconds=1.0)
    calls = AttachedCalls(0, WorkersConfig(max_calls=2), VadConfig(), TickStats(), on_detach=lambda c: None)

    class Slots:
        def reset(self, slot: int) -> None:
            pass

    calls.load(Slots(), 2)  # type: ignore[arg-type]
    try:
        got = calls.attach(AttachCall(call_id="c", subscriber="s", instance=shm_clean, call_rate=8000,
                                      tts_rate=16000, denoise="speex"))
        assert isinstance(got, ErrorReply) and got.kind == "bad_params"
        assert "denoise 'speex'" in got.detail and "rnnoise" in got.detail
        assert not calls.calls and len(calls.free_slots) == 2
        ok = calls.attach(AttachCall(call_id="c", subscriber="s", instance=shm_clean, call_rate=8000,
                                     tts_rate=16000, denoise="rnnoise"))
        assert not isinstance(ok, ErrorReply)
        c = calls.calls["c"]
        assert c.inp.denoise is not None and not c.native8 and c.hold16 >= c.inp.denoise.max_hold
        calls.detach("c")
    finally:
        calls.close()
        close_rings(rings)


def test_agent_file_refuses_an_unknown_denoise():
    from brisvox.agent.definition import DEFAULT_DENOISE, parse
    from brisvox.agent.file_model import AgentFile
    from brisvox.config.schema import failures

    base = {"system_prompt": "hi", "stt": {"provider": "local_whisper"}, "llm": {"provider": "scripted"},
            "tts": {"provider": "local_piper"}}
    errs = failures(AgentFile, {**base, "audio": {"denoise": "speex"}})[1]
    assert [(list(p), m) for p, m in errs] == [(["audio", "denoise"], "expected one of 'off', 'rnnoise', 'deepfilter', got 'speex'")]
    assert not failures(AgentFile, {**base, "audio": {"denoise": "deepfilter"}})[1]
    assert parse({**base, "audio": {"denoise": "deepfilter"}}, "a.toml").denoise == "deepfilter"
    assert parse(base, "a.toml").denoise == DEFAULT_DENOISE




def test_input_chain_with_denoise_keeps_in16_on_the_time_grid_across_a_gap(shm_clean):
    """in16 never runs ahead of the audio it stands for: after an overrun of the ``in`` ring
    the denoiser's held samples go out (raw) before the gap's zeros, not after them."""
    from workers.harness import close_rings, create_call_rings
    from workers.resample import InputChain, in16_pos_for

    rings = create_call_rings(shm_clean, "g", 8000, 16000, seconds=1.0)
    try:
        d = Denoiser(RnnoiseModel())
        inp = InputChain(rings["in"], rings["in16"], 8000, denoise=d)
        x8 = signal(3, 4.0)[::2]  # 8 kHz
        lag: list[int] = []
        gaps = 0
        pos = 0
        for chunk in (160, 160, 160, 9000, 160, 160, 12000, 160, 160, 160, 160):  # two overruns
            rings["in"].write(x8[pos : pos + chunk])
            pos += chunk
            inp.step()
            gaps += inp.gap >= 0
            lag.append(in16_pos_for(inp.in_pos, 8000) - inp.out_pos)
        assert gaps == 2
        assert all(0 <= k <= d.max_hold + 4 for k in lag), lag
    finally:
        close_rings(rings)


def test_sample_history_answers_spans_by_position_only_while_it_holds_them():
    from workers.resample import SampleHistory

    h = SampleHistory(100, start_pos=1000)
    x = np.arange(1000, 1370, dtype=np.int16)  # sample value == its position
    for n in (30, 1, 77, 0, 13, 99, 150):  # wraps, one chunk longer than the capacity
        h.write(x[h.write_pos - 1000 : h.write_pos - 1000 + n])
    assert h.write_pos == 1370
    got = h.read(1290, 1370)
    assert got is not None and np.array_equal(got, np.arange(1290, 1370))
    got = h.read(1275, 1277)
    assert got is not None and list(got) == [1275, 1276]
    assert h.read(1269, 1300) is None  # overwritten
    assert h.read(1360, 1371) is None  # not written yet
    assert h.read(1300, 1300) is None
    fresh = SampleHistory(64)
    fresh.write(np.arange(1, 41, dtype=np.int16))
    got = fresh.read(-8, 8)  # before the stream's first sample: zeros, as the in16 ring pads
    assert got is not None and list(got) == [0] * 8 + list(range(1, 9))
    fresh.write(np.ones(40, dtype=np.int16))
    assert fresh.read(-8, 8) is None  # its slots now hold later samples


def test_input_chain_keeps_the_pre_denoise_stream_by_in16_position_across_gaps(shm_clean):
    """``pre`` is exactly the in16 a chain without denoise writes from the same input (gaps
    included), ahead of the denoised in16 by at most what the denoiser holds: AMD's tone tests
    read the line's audio at the VAD window's own positions."""
    from workers.harness import close_rings, create_call_rings
    from workers.resample import InputChain

    den_rings = create_call_rings(shm_clean, "p", 8000, 16000, seconds=1.0)
    off_rings = create_call_rings(shm_clean, "q", 8000, 16000, seconds=1.0)
    try:
        d = Denoiser(RnnoiseModel())
        inp = InputChain(den_rings["in"], den_rings["in16"], 8000, denoise=d)
        off = InputChain(off_rings["in"], off_rings["in16"], 8000)
        assert off.pre is None and inp.pre is not None
        x8 = signal(4, 4.0)[::2]
        pos = gaps = 0
        for chunk in (160, 160, 160, 9000, 160, 160, 12000, 160, 160, 160, 160, 320):  # two overruns
            for r in (den_rings, off_rings):
                r["in"].write(x8[pos : pos + chunk])
            pos += chunk
            inp.step()
            off.step()
            gaps += inp.gap >= 0
            assert inp.gap == off.gap
            assert inp.pre.write_pos == off.out_pos
            assert 0 <= inp.pre.write_pos - inp.out_pos <= d.max_hold
            end = off.out_pos
            start = max(0, end - 4000)
            want = off_rings["in16"].read_range(start, end).samples
            assert np.array_equal(inp.pre.read(start, end), want)
        assert gaps == 2
    finally:
        close_rings(den_rings)
        close_rings(off_rings)
