"""``python -m bench denoise``: what ``[audio] denoise`` costs and what it buys, per model.

Fixtures are GENERATED here (never committed), from one seed: sentences spoken by
espeak-ng (the TTS helpers of :mod:`bench.amd_set`, cached under
``bench/out/denoise/tts``), mixed at 0, 5, 10 and 20 dB SNR with four noises:

* ``babble``: four other voices saying other sentences at once (overlapping TTS),
* ``pink`` (1/f) and ``brown`` (1/f^2) noise,
* ``tone``: a 450 Hz hum with its harmonics (a line's interference),

then G.711 mu-law (:mod:`brisvox.wire.g711`, the project's codec), at 8 kHz as a
telephone line delivers them. The audio goes through what a worker runs: the
project's resampler to 16 kHz (:func:`workers.resample.stream`), the call's
:class:`workers.denoise.Denoiser` (off, rnnoise, deepfilter), then

* **false starts**: the worker's Silero VAD (:class:`workers.vad.SileroBatch`)
  with the default ``[vad]`` state machine (:class:`workers.vad.VadStream`) over
  noise alone, at the level the noise has in the SNR's mix; speech starts per
  minute of noise. A false barge-in is the same event while the bot speaks (the
  worker's VAD does not know who speaks), so the figure is both.
* **WER**: the local STT (:class:`workers.local_stt.WhisperRunner`, Whisper
  tiny.en) on each sentence with 0.4 s of noise around it, against the text.
* **CPU** per call-second of the denoiser (resampling included, tick thread
  time) and **added latency**: the model's algorithmic delay plus the framing,
  measured as the mean and the maximum the denoiser holds while 20 ms frames
  arrive.

``--quick``: 2 sentences and 10 s of noise per cell (109 s on 2 cores shared at a load
of 4-6); the full run: 6 sentences, 30 s of noise per cell (about 4 CPU-minutes: 696 s
at that load). The figures and what they decided: docs/BENCHMARKS.md, "Noise suppression".
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from bench.amd_set import TRIM, Voices
from brisvox.wire.g711 import PCMU
from workers.config import VadConfig
from workers.denoise import Denoiser, make_model
from workers.local_stt import WhisperRunner
from workers.models import locate
from workers.resample import RATE16, stream
from workers.vad import WINDOW, SileroBatch, VadStream

Row = tuple[str, float | int | str, str, str]

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "denoise"
RATE = 8000
SEED = 7
MODES = ("off", "rnnoise", "deepfilter")
NOISES = ("babble", "pink", "brown", "tone")
SNRS = (0, 5, 10, 20)
LEVEL_DB = -20.0  # speech level (active RMS, dBFS) on the line

SENTENCES = (
    "I would like to book a table for two tonight.",
    "My account number is four five seven two.",
    "Can you move my appointment to Friday morning?",
    "The delivery never arrived at my house.",
    "Please send the invoice to my email address.",
    "I need to cancel my subscription today.",
)
BABBLE = (
    "The weather has been very cold this week.", "She said the meeting was moved to the afternoon.",
    "We drove to the coast and stayed by the sea.", "He forgot his keys again at the office.",
    "The children are playing in the garden.", "Prices at the market went up last month.",
    "They are painting the kitchen a bright yellow.", "Our train was late by almost an hour.",
)
SPEAKER = "espeak:en-us@170"
BABBLERS = ("espeak:en-gb@160", "espeak:en-us+f3@180", "espeak:en-gb+m3@150", "espeak:en-us+m7@200")


def _rms(x: np.ndarray) -> float:
    active = x[np.abs(x) > TRIM] if np.any(np.abs(x) > TRIM) else x
    return float(np.sqrt(np.mean(active.astype(np.float64) ** 2))) + 1e-9


def _unit(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) / max(1e-9, float(np.std(x)))


def noise(kind: str, n: int, rng: np.random.Generator, voices: Voices) -> np.ndarray:
    """``n`` samples of noise at unit RMS (babble: RMS of its active part)."""
    if kind == "babble":
        out = np.zeros(n)
        for v in BABBLERS:
            pos = int(rng.integers(0, RATE))
            while pos < n:
                s = voices.say(v, BABBLE[int(rng.integers(0, len(BABBLE)))]).astype(np.float64)
                s = s[: n - pos]
                out[pos : pos + len(s)] += s / _rms(s)
                pos += len(s) + int(rng.integers(RATE // 10, RATE // 2))
        return out / _rms(out)
    if kind == "tone":
        t = np.arange(n) / RATE
        x = np.zeros(n)
        for h in (1, 2, 3):
            x += np.sin(2 * np.pi * 450 * h * t + rng.uniform(0, 6.3)) / h
        return _unit(x)
    w = rng.normal(0.0, 1.0, n)
    spec = np.fft.rfft(w)
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    spec /= f ** (0.5 if kind == "pink" else 1.0)
    spec[0] = 0.0
    return _unit(np.fft.irfft(spec, n))


def line(x: np.ndarray) -> np.ndarray:
    """What the worker reads: clipped to int16, through G.711 mu-law."""
    pcm = np.clip(np.round(x), -32768, 32767).astype(np.int16)
    return PCMU.decode(PCMU.encode(pcm)).astype(np.int16)


def to16(x8: np.ndarray) -> np.ndarray:
    rs = stream(RATE, RATE16)
    assert rs is not None
    return np.concatenate([rs.resample_chunk(x8, last=False), rs.resample_chunk(x8[:0], last=True)])


class Chain:
    """One call's path through a mode: 20 ms frames in, denoised in16 out, its CPU counted."""

    def __init__(self, mode: str) -> None:
        self.den = Denoiser(make_model(mode)) if mode != "off" else None
        self.cpu_ns = 0
        self.audio_s = 0.0
        self.held: list[int] = []

    def run(self, x16: np.ndarray) -> np.ndarray:
        if self.den is None:
            return x16
        out, fed, got = [], 0, 0
        for i in range(0, len(x16), 320):
            t0 = time.thread_time_ns()
            y = self.den.process(x16[i : i + 320])
            self.cpu_ns += time.thread_time_ns() - t0
            fed += len(x16[i : i + 320])
            got += len(y)
            self.held.append(fed - got)
            out.append(y)
        out.append(self.den.flush())
        self.audio_s += len(x16) / RATE16
        return np.concatenate(out)

    def close(self) -> None:
        if self.den is not None:
            self.den.close()


def false_starts(silero: SileroBatch, x16: np.ndarray) -> tuple[int, float]:
    """(speech starts, fraction of the time in speech) of the worker's VAD over ``x16``."""
    silero.reset(0)
    vs = VadStream(VadConfig().params())
    n = speaking = windows = 0
    slot = np.array([0], dtype=np.intp)
    for k in range(0, len(x16) - WINDOW + 1, WINDOW):
        p = float(silero.run(slot, (x16[k : k + WINDOW].astype(np.float32) / 32768.0)[None])[0])
        ev = vs.push(p, k + WINDOW)
        if ev is not None and ev.kind == "start":
            n += 1
        speaking += vs.speaking
        windows += 1
    return n, speaking / max(1, windows)


def _words(s: str) -> list[str]:
    digits = {"0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five", "6": "six",
              "7": "seven", "8": "eight", "9": "nine"}
    s = re.sub(r"\d", lambda m: f" {digits[m.group(0)]} ", s.lower())
    return re.findall(r"[a-z']+", s)


def wer_counts(ref: str, hyp: str) -> tuple[int, int]:
    """(edit distance in words, reference words)."""
    r, h = _words(ref), _words(hyp)
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
            prev, d[j] = d[j], cur
    return d[len(h)], len(r)


def run(quick: bool = False) -> list[Row]:
    t_start = time.perf_counter()
    n_sent = 2 if quick else len(SENTENCES)
    noise_s = 10 if quick else 30
    voices = Voices(OUT / "tts", None)
    silero = SileroBatch(locate("silero_vad"), capacity=1)
    stt = WhisperRunner(locate("whisper_tiny_en").parent)
    stt.load()
    ref = 32768 * 10 ** (LEVEL_DB / 20)
    speech = [voices.say(SPEAKER, s).astype(np.float64) for s in SENTENCES[:n_sent]]
    speech = [s * (ref / _rms(s)) for s in speech]
    pad = int(0.4 * RATE)
    # (mode, noise, snr) -> (starts/min, WER, fraction of the noise the VAD calls speech)
    cells: dict[tuple[str, str, int], tuple[float, float, float]] = {}
    clean: dict[str, float] = {}
    chains = {m: Chain(m) for m in MODES}
    rng = np.random.default_rng(SEED)
    for m in MODES:  # clean speech (no noise): the STT's floor with and without denoise
        errs = words = 0
        for s, text in zip(speech, SENTENCES, strict=False):
            y = chains[m].run(to16(line(np.concatenate([np.zeros(pad), s, np.zeros(pad)]))))
            e, w = wer_counts(text, stt.transcribe(y).text)
            errs, words = errs + e, words + w
        clean[m] = errs / max(1, words)
    for kind in NOISES:
        for snr in SNRS:
            sigma = ref / 10 ** (snr / 20)
            nz = noise(kind, noise_s * RATE, rng, voices) * sigma
            mixes = []
            for s in speech:
                bed = noise(kind, len(s) + 2 * pad, rng, voices) * sigma
                bed[pad : pad + len(s)] += s
                mixes.append(to16(line(bed)))
            nz16 = to16(line(nz))
            for m in MODES:
                starts, speaking = false_starts(silero, chains[m].run(nz16))
                errs = words = 0
                for x16, text in zip(mixes, SENTENCES, strict=False):
                    e, w = wer_counts(text, stt.transcribe(chains[m].run(x16)).text)
                    errs, words = errs + e, words + w
                cells[(m, kind, snr)] = (starts * 60.0 / noise_s, errs / max(1, words), speaking)
    rows: list[Row] = []
    print(f"   {'noise':<7} {'SNR':>4} | " + " | ".join(f"{m + ' starts/min':>21} {'in sp':>5} {'WER':>4}"
                                                         for m in MODES))
    for kind in NOISES:
        for snr in SNRS:
            print(f"   {kind:<7} {snr:>4} | " + " | ".join(
                f"{cells[(m, kind, snr)][0]:>21.1f} {100 * cells[(m, kind, snr)][2]:>4.0f}% "
                f"{100 * cells[(m, kind, snr)][1]:>3.0f}%" for m in MODES), flush=True)
    for m in MODES:
        c = chains[m]
        if m != "off":
            den = c.den
            assert den is not None
            rows.append((f"{m}: CPU per call-second", 100.0 * c.cpu_ns / 1e9 / max(1e-9, c.audio_s), "%", ""))
            rows.append((f"{m}: added latency, algorithmic (model delay)", den.model.delay48 / 48.0, "ms", ""))
            rows.append((f"{m}: added latency, mean held (delay + framing)", 1000.0 * float(np.mean(c.held)) / RATE16,
                         "ms", ""))
            rows.append((f"{m}: added latency, max held", 1000.0 * max(c.held) / RATE16, "ms",
                         f"<= {1000.0 * den.max_hold / RATE16:.1f}"))
        rows.append((f"{m}: WER clean speech", 100.0 * clean[m], "%", ""))
        for snr in SNRS:
            fs = np.mean([cells[(m, k, snr)][0] for k in NOISES])
            we = np.mean([cells[(m, k, snr)][1] for k in NOISES])
            rows.append((f"{m}: {snr} dB SNR, false starts (mean of 4 noises)", float(fs), "/min", ""))
            rows.append((f"{m}: {snr} dB SNR, WER (mean of 4 noises)", 100.0 * float(we), "%", ""))
        for kind in NOISES:
            rows.append((f"{m}: {kind}, false starts (mean of 4 SNRs)",
                         float(np.mean([cells[(m, kind, s)][0] for s in SNRS])), "/min", ""))
            rows.append((f"{m}: {kind}, noise the VAD calls speech (mean of 4 SNRs)",
                         100.0 * float(np.mean([cells[(m, kind, s)][2] for s in SNRS])), "%", ""))
            rows.append((f"{m}: {kind}, WER (mean of 4 SNRs)",
                         100.0 * float(np.mean([cells[(m, kind, s)][1] for s in SNRS])), "%", ""))
        c.close()
    rows.append(("fixtures: sentences x noise seconds per cell", f"{n_sent} x {noise_s}", "", f"seed {SEED}"))
    rows.append(("run time", time.perf_counter() - t_start, "s", ""))
    voices.close()
    return rows
