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

Two implementations of the same features:

* :func:`log_mel`: the float64 reference, a pure function (allocates its
  buffers per call).
* :class:`LogMel`: what the worker runs. Same steps with preallocated work
  buffers (reused: no page faults per analysis), the STFT in float64 (a
  float32 FFT loses the quiet bins that the 80 dB floor keeps) and the power
  spectrum and mel filtering in float32 (the pairing of real and imaginary
  parts is folded into the filter matrix: one square, one sgemm). The window
  is left-padded with zeros, and after normalisation the padding is the
  constant ``c = -mean / std``: every STFT frame lying wholly inside it has the
  power spectrum ``c^2 |rfft(hann)|^2``, so its mel row is computed once and
  broadcast (exact). Within ~1e-5 of :func:`log_mel` (tests bound it).

Invariants: :func:`log_mel` is a pure function of its input; the filter bank
and window are built once at import (float64) and never mutated. A
:class:`LogMel` owns mutable buffers: one instance per thread.
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


# -- the worker's extractor -----------------------------------------------------------------------

_PAD = N_FFT // 2
_N_BINS = N_FFT // 2 + 1
# the mel filters with each row doubled: [re0^2, im0^2, re1^2, im1^2, ...] @ _FILTERS2 == power @ _FILTERS
_FILTERS2 = np.repeat(_FILTERS, 2, axis=0).astype(np.float32)
_FILTERS2.setflags(write=False)
# mel row of a frame of the constant 1.0 (scaled by c^2 for the padding's constant c)
_CONST_MEL = (np.abs(np.fft.rfft(_WINDOW)) ** 2) @ _FILTERS
_CONST_MEL.setflags(write=False)


def constant_frames(n_audio: int) -> int:
    """How many leading STFT frames lie wholly inside the zero padding of ``n_audio`` samples.

    Frame ``t`` covers padded samples ``[t*HOP, t*HOP + N_FFT)``, i.e. window
    samples ``t*HOP - 200 .. t*HOP + 199`` (negative indices reflect: ``-j`` is
    sample ``j``). The padding is window samples ``0 .. pad - 1``.
    """
    pad = WINDOW_SAMPLES - min(n_audio, WINDOW_SAMPLES)
    if pad <= _PAD:  # the reflection of frame 0 reaches into the audio
        return 0
    # t*HOP + 199 <= pad - 1  <=>  t <= (pad - 200) / HOP
    return min(N_FRAMES, (pad - _PAD) // HOP + 1)


class LogMel:
    """The worker's Smart Turn features: same result as :func:`log_mel`, reused buffers.

    Not thread-safe (the buffers): one instance per thread.
    """

    def __init__(self) -> None:
        self._x = np.empty(WINDOW_SAMPLES + 2 * _PAD, dtype=np.float64)  # reflect-padded window
        self._frames = np.empty((N_FRAMES, N_FFT), dtype=np.float64)
        self._spec = np.empty((N_FRAMES, _N_BINS), dtype=np.complex128)
        self._sq = np.empty((N_FRAMES, 2 * _N_BINS), dtype=np.float32)
        self._mel = np.empty((N_FRAMES, N_MELS), dtype=np.float32)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """Features ``[80, 800]`` float32 (a new array) for 16 kHz int16 or float ``audio``."""
        a = np.asarray(audio)
        n = min(len(a), WINDOW_SAMPLES)
        pad = WINDOW_SAMPLES - n
        x = self._x
        body = x[_PAD + pad : _PAD + WINDOW_SAMPLES]  # the audio part of the window
        if n:
            body[:] = a[len(a) - n :]
            if a.dtype == np.int16:
                body *= 1.0 / 32768.0
        # mean and variance over the whole padded window (the zeros count)
        total = float(body.sum())
        mean = total / WINDOW_SAMPLES
        body -= mean
        ss = float(np.dot(body, body)) + pad * mean * mean
        inv_std = 1.0 / np.sqrt(ss / WINDOW_SAMPLES + NORM_EPS)
        body *= inv_std
        c = -mean * inv_std  # the padding's value after normalisation
        x[_PAD : _PAD + pad] = c
        # reflect padding, 200 samples each side (window sample j <-> padded index j + 200)
        x[:_PAD] = x[2 * _PAD : _PAD : -1]
        x[_PAD + WINDOW_SAMPLES :] = x[_PAD + WINDOW_SAMPLES - 2 : WINDOW_SAMPLES - 2 : -1]
        t0 = constant_frames(n)
        mel = self._mel
        if t0 < N_FRAMES:
            k = N_FRAMES - t0
            view = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[t0 * HOP :: HOP][:k]
            frames = self._frames[:k]
            np.multiply(view, _WINDOW, out=frames)
            spec = self._spec[:k]
            np.fft.rfft(frames, axis=1, out=spec)
            sq = self._sq[:k]
            np.square(spec.view(np.float64), out=sq, casting="same_kind")
            np.matmul(sq, _FILTERS2, out=mel[t0:])
        if t0:
            mel[:t0] = (c * c) * _CONST_MEL
        np.maximum(mel, MEL_FLOOR, out=mel)
        np.log10(mel, out=mel)
        np.maximum(mel, mel.max() - 8.0, out=mel)
        mel += 4.0
        mel *= 0.25
        return np.ascontiguousarray(mel.T)
