"""The bot's audio as the caller heard it, on the call's timeline (``brisvox call --record``).

Owns one mono PCM16 track at the call's rate whose sample ``i`` is what the
caller heard at ``t0 + i / rate``: each received frame plays at its arrival
time, or right after the previous frame if that is still playing (a
playout buffer); a gap of more than ``max_drift_s`` between the previous
frame's end and an arrival is filled with silence, so the track stays
aligned with the caller's clock; a ``clear`` drops everything that had not
played yet at that moment (what a phone does with Twilio's ``clear``).

Invariants: the track only grows except at a clear, which truncates it to
the clear's time and never below what already played; bounded by
``max_seconds`` (later audio is counted in ``dropped``, not stored).
"""

from __future__ import annotations

import numpy as np


class PlayoutRecorder:
    def __init__(self, rate: int, t0: float = 0.0, max_drift_s: float = 0.06, max_seconds: float = 3600.0) -> None:
        self.rate = rate
        self.t0 = t0
        self.max_drift = int(max_drift_s * rate)
        self.max_samples = int(max_seconds * rate)
        self.buf = np.zeros(rate * 10, dtype=np.int16)
        self.n = 0  # samples in the track
        self.dropped = 0
        self.cut_samples = 0  # buffered audio a clear dropped

    def _at(self, now: float) -> int:
        return max(0, int(round((now - self.t0) * self.rate)))

    def _ensure(self, n: int) -> None:
        if n > len(self.buf):
            new = np.zeros(max(n, 2 * len(self.buf)), dtype=np.int16)
            new[: self.n] = self.buf[: self.n]
            self.buf = new

    def on_audio(self, pcm: np.ndarray, now: float) -> None:
        at = self._at(now)
        start = self.n if at - self.n <= self.max_drift else at
        end = start + len(pcm)
        if end > self.max_samples:
            self.dropped += len(pcm)
            return
        self._ensure(end)
        self.buf[self.n:start] = 0
        self.buf[start:end] = pcm
        self.n = end

    def on_clear(self, now: float) -> None:
        at = self._at(now)
        if at < self.n:
            self.cut_samples += self.n - at
            self.n = at

    def track(self, until: float | None = None) -> np.ndarray:
        """The whole track (to ``until`` if given, padded with silence to it)."""
        n = self.n if until is None else max(self.n, self._at(until))
        self._ensure(n)
        self.buf[self.n:n] = 0
        return self.buf[:n].copy()

    def segment(self, t_from: float, t_to: float) -> np.ndarray:
        a = min(self._at(t_from), self.n)
        b = min(self._at(t_to), self.n)
        return self.buf[a:b].copy()
