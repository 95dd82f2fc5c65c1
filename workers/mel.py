"""Whisper log-mel features for Smart Turn v3, in numpy.

Owns the exact feature pipeline the Smart Turn v3.2 model was trained on
(Whisper's feature extractor with an 8 s window):

1. 16 kHz mono audio, the last 8 s (128,000 samples); shorter audio is
   left-padded with zeros (the turn's end stays at the right edge).
2. Normalised over the whole padded window: ``(x - mean) / sqrt(var + 1e-7)``.
3. STFT: n_fft 400, hop 160, periodic Hann window, centred frames with
   reflect padding of 200 samples each side, power spectrum ``|X|^2``
   (201 bins).
4. 80 triangular mel filters on the Slaney mel scale from 0 to 8 kHz with
   Slaney area normalisation; ``log10(max(mel, 1e-10))``.
5. Dynamic-range floor at ``max - 8``, then ``(x + 4) / 4``; the last frame is
   dropped: 80 x 800 float32.

Invariants: :func:`log_mel` is a pure function of its input; the filter bank
and window are built once at import (float64) and never mutated. The work
buffers are float64, so the result matches a float64 reference to ~1e-6.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16_000
WINDOW_SAMPLES = 8 * SAMPLE_RATE  # 128,000
N_FFT = 400
HOP = 160
N_MELS = 80
N_FRAMES = WINDOW_SAMPLES // HOP  # 800 (the 801st centred frame is dropped)
MEL_FLOOR = 1e-10
NORM_EPS = 1e-7


def hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    lin = f * 3.0 / 200.0
    log_part = 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(f >= 1000.0, log_part, lin)


def mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    lin = m * 200.0 / 3.0
    log_part = 1000.0 * np.exp((m - 15.0) * (np.log(6.4) / 27.0))
    return np.where(m >= 15.0, log_part, lin)


def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, sr: int = SAMPLE_RATE) -> np.ndarray:
    """``[n_fft//2 + 1, n_mels]`` Slaney-normalised triangular filters (0 .. sr/2)."""
    n_bins = n_fft // 2 + 1
    bin_hz = np.linspace(0.0, sr / 2.0, n_bins)
    edges = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sr / 2.0)), n_mels + 2))
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bin_hz[:, None] - lower[None, :]) / (centre - lower)[None, :]
    falling = (upper[None, :] - bin_hz[:, None]) / (upper - centre)[None, :]
    fb = np.maximum(0.0, np.minimum(rising, falling))
    fb *= (2.0 / (upper - lower))[None, :]
    return fb


def hann_periodic(n: int = N_FFT) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


_FILTERS = mel_filters()
_FILTERS.setflags(write=False)
_WINDOW = hann_periodic()
_WINDOW.setflags(write=False)


def fit_window(audio: np.ndarray) -> np.ndarray:
    """Last 8 s of ``audio`` as float64, left-padded with zeros to 128,000 samples.

    int16 input is scaled to [-1, 1).
    """
    x = np.asarray(audio)
    scale = 1.0 / 32768.0 if x.dtype == np.int16 else 1.0
    out = np.zeros(WINDOW_SAMPLES, dtype=np.float64)
    n = min(len(x), WINDOW_SAMPLES)
    if n:
        out[WINDOW_SAMPLES - n :] = x[len(x) - n :]
        if scale != 1.0:
            out *= scale
    return out


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Smart Turn input features ``[80, 800]`` float32 for 16 kHz ``audio``."""
    x = fit_window(audio)
    x -= x.mean()
    x /= np.sqrt(x.var() + NORM_EPS)
    pad = N_FFT // 2
    padded = np.pad(x, (pad, pad), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]  # [801, 400] view
    spec = np.fft.rfft(frames * _WINDOW, axis=1)  # [801, 201]
    power = spec.real**2 + spec.imag**2
    mel = power[:-1] @ _FILTERS  # [800, 80]; the last centred frame is dropped
    np.maximum(mel, MEL_FLOOR, out=mel)
    logm = np.log10(mel)
    np.maximum(logm, logm.max() - 8.0, out=logm)
    logm += 4.0
    logm /= 4.0
    return np.ascontiguousarray(logm.T, dtype=np.float32)
