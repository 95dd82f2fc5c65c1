"""Voice activity detection: the per-call state machine, its health, and the batched Silero run.

Owns three things, each testable without processes:

* :class:`VadParams` -- thresholds and durations of one call's VAD.
* :class:`VadStream` -- the per-call state machine. It consumes one speech
  probability per 512-sample window (32 ms at 16 kHz) and *returns* events
  (:class:`VadEvent`); it does no I/O. Positions are in16 sample positions.
* :class:`VadHealth` -- the fail-open logic (docs/CONFIGURATION.md, ``[vad]``):
  consecutive failures spanning a window of audio time fail the call's VAD
  open (audio keeps flowing, no VAD events are sent); a recovery probe runs
  every ``recovery_interval`` of audio.
* :class:`SileroBatch` -- one Silero ONNX run for many calls: a batch row
  per call, one state row per call (slot), 64 samples of context; or, for
  8 kHz calls, the model's native 8 kHz mode (256-sample windows, the same
  32 ms, 32 samples of context, about 40 % less CPU per window).

Invariants of :class:`VadStream`:

* ``start.pos`` is the first sample of the first speech window of the run
  (backdated); a start is only emitted once speech lasted ``min_speech``.
* ``stop.pos`` is one past the last speech sample (the end of the last window
  at or above ``threshold``), emitted once ``min_silence`` of audio followed
  it; it is never later than the window that decided it (``at``).
* With an end hint (:meth:`VadStream.speech_ended_at`: the signal's own end of
  speech, from :func:`refine_stop`, inside the current silence) the silence is
  counted from the hinted position, not from the end of Silero's last speech
  window: Silero's probability lingers for one to four windows after the voice
  stops, and the stop window (``min_silence``) is a span of the caller's
  silence. The stop then carries the hinted ``pos`` (``refined``) and is
  decided at the first window end ``>= pos + min_silence``. A speech window
  after the hint drops it (the silence starts again from that window).
* Every start is followed by exactly one stop before the next start;
  :meth:`VadStream.finish` (a gap, a detach, a failure) closes speech in
  progress with a stop dated to the last speech.

Invariants of :class:`SileroBatch`: row ``i`` of a run only ever sees slot
``slots[i]``'s state and context, so batching gives the same probabilities
as one unbatched run per call (checked to 1e-5 by the tests). A slot serves
one rate for its life (reset before reuse): the window width of a run (512 or
256 samples) picks the rate.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

RATE = 16_000
WINDOW = 512  # samples per Silero window at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window prepended to each input
RATE8 = 8_000
WINDOW8 = 256  # the same 32 ms in Silero's native 8 kHz mode
CONTEXT8 = 32
STATE_DIM = 128

IDLE = 0
CANDIDATE = 1
SPEAKING = 2


@dataclass(frozen=True, slots=True)
class VadParams:
    """One call's VAD tuning. Durations are in milliseconds of audio."""

    threshold: float = 0.5  # a window at or above this is speech
    neg_threshold: float = -1.0  # below this is silence; < 0 means threshold - 0.15
    min_speech_ms: int = 96  # speech must last this long before a start is emitted
    min_silence_ms: int = 200  # silence after the last speech before a stop is emitted
    fall_delay_ms: int = 0  # > 0: a "falling" event once silence lasted this long (early analysis)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        neg = self.neg
        if not 0.0 <= neg <= self.threshold:
            raise ValueError(f"neg_threshold must be in [0, threshold], got {neg}")
        if not 0 <= self.min_speech_ms <= 5000:
            raise ValueError(f"min_speech_ms must be in [0, 5000], got {self.min_speech_ms}")
        if not 32 <= self.min_silence_ms <= 10_000:
            raise ValueError(f"min_silence_ms must be in [32, 10000], got {self.min_silence_ms}")
        if not 0 <= self.fall_delay_ms < self.min_silence_ms:
            raise ValueError(f"fall_delay_ms must be in [0, min_silence_ms), got {self.fall_delay_ms}")

    @property
    def neg(self) -> float:
        return self.neg_threshold if self.neg_threshold >= 0 else max(0.0, self.threshold - 0.15)

    @property
    def min_speech_samples(self) -> int:
        return self.min_speech_ms * RATE // 1000

    @property
    def min_silence_samples(self) -> int:
        return self.min_silence_ms * RATE // 1000

    @property
    def fall_delay_samples(self) -> int:
        return self.fall_delay_ms * RATE // 1000

    def merged(self, overrides: dict[str, Any] | None) -> VadParams:
        """A copy with ``overrides`` applied; unknown keys or bad types raise ValueError."""
        if not overrides:
            return self
        names = {f.name: f.type for f in fields(self)}
        kw: dict[str, Any] = {}
        for k, v in overrides.items():
            if k not in names:
                raise ValueError(f"unknown vad parameter {k!r}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"vad parameter {k!r} must be a number")
            kw[k] = int(v) if k.endswith("_ms") else float(v)
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        vals.update(kw)
        return VadParams(**vals)


@dataclass(frozen=True, slots=True)
class VadEvent:
    """``kind`` start|stop|falling; ``pos`` the backdated in16 position; ``at``
    the in16 position of the end of the window that decided it. A falling
    event's ``pos`` is exactly the ``pos`` the stop of that fall will carry."""

    kind: str
    pos: int
    at: int
    refined: bool = False  # ``pos`` is the signal's end of speech (an end hint), not a window edge


class VadStream:
    """Per-call VAD state machine (see module docs). Returns events, does no I/O."""

    __slots__ = ("thr", "neg", "min_speech", "min_silence", "fall_delay", "state", "run_start",
                 "last_speech", "fell", "hinted")

    def __init__(self, params: VadParams) -> None:
        self.thr = params.threshold
        self.neg = params.neg
        self.min_speech = params.min_speech_samples
        self.min_silence = params.min_silence_samples
        self.fall_delay = params.fall_delay_samples
        self.state = IDLE
        self.run_start = 0
        self.last_speech = 0
        self.fell = False  # a falling event was sent for the current silence
        self.hinted = False  # last_speech is an end hint (speech_ended_at) for the current silence

    @property
    def speaking(self) -> bool:
        return self.state == SPEAKING

    def hint_due(self, end: int) -> bool:
        """Speaking, in a silence of at least two windows up to ``end`` (enough confirming
        silence for :func:`refine_stop`'s noise floor), and no end hint taken for it yet."""
        return self.state == SPEAKING and not self.hinted and end - self.last_speech >= 2 * WINDOW

    def speech_ended_at(self, pos: int) -> None:
        """The signal's speech ended at ``pos`` (:func:`refine_stop` over the current
        silence): count the silence from there. Ignored unless speaking, and never moves
        the end later than Silero's last speech window or before the run's first window."""
        if self.state != SPEAKING:
            return
        self.hinted = True
        self.last_speech = max(self.run_start + WINDOW, min(self.last_speech, pos))

    def push(self, prob: float, end: int) -> VadEvent | None:
        """Feed the probability of the window ``[end - 512, end)``."""
        st = self.state
        if st == SPEAKING:
            if prob >= self.thr:
                self.last_speech = end
                self.fell = self.hinted = False
            elif prob < self.neg:
                quiet = end - self.last_speech
                if quiet >= self.min_silence:
                    self.state = IDLE
                    hinted, self.fell, self.hinted = self.hinted, False, False
                    return VadEvent("stop", self.last_speech, end, hinted)
                if self.fall_delay and not self.fell and quiet >= self.fall_delay:
                    self.fell = True
                    return VadEvent("falling", self.last_speech, end, self.hinted)
            return None
        if st == IDLE:
            if prob < self.thr:
                return None
            self.state = st = CANDIDATE
            self.run_start = end - WINDOW
            self.last_speech = end
        elif prob < self.neg:
            self.state = IDLE
            return None
        elif prob >= self.thr:
            self.last_speech = end
        if end - self.run_start >= self.min_speech:
            self.state = SPEAKING
            return VadEvent("start", self.run_start, end)
        return None

    def finish(self, at: int) -> VadEvent | None:
        """Close the stream (gap, detach, failure): a stop if speech was in progress."""
        was, hinted = self.state, self.hinted
        self.state = IDLE
        self.fell = self.hinted = False
        if was == SPEAKING:
            return VadEvent("stop", self.last_speech, at, hinted)
        return None


BLOCK = 160  # 10 ms blocks for boundary refinement
REACH = 3 * WINDOW  # how far a boundary may move
# how far an end hint (VadStream.speech_ended_at) may move the stop back: Silero's probability
# stays above the threshold for up to four windows after the voice stops (measured on the load
# bench's caller lines: 70-135 ms after the last loud 10 ms block)
HINT_REACH = 8 * WINDOW
FLOOR_RMS = 30.0  # never call anything below -61 dBFS speech


def _rms(x: np.ndarray) -> float:
    xf = x.astype(np.float32)
    return float(np.sqrt(np.dot(xf, xf) / max(1, len(xf))))


def _block_rms(x: np.ndarray) -> np.ndarray:
    n = len(x) // BLOCK
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    b = x[: n * BLOCK].astype(np.float32).reshape(n, BLOCK)
    return np.sqrt((b * b).mean(axis=1))


def refine_stop(audio: np.ndarray, base: int, pos: int, at: int, reach: int = REACH) -> int:
    """Move a stop from the end of Silero's last speech window back to the signal's end.

    ``audio`` holds in16 samples from position ``base`` and covers
    ``[pos - reach, at)``. The noise floor is the median 10 ms RMS of the
    confirming silence ``[pos, at)``; the stop moves to the end of the last
    10 ms block within ``reach`` before ``pos`` that is 12 dB above it. Silero's
    probability lingers for one or two windows after speech ends; this takes
    that hangover off. Returns ``pos`` when nothing is clearly louder (a noisy
    line): the unrefined stop is still correct, only later.
    """
    silence = _block_rms(audio[max(0, pos - base) : max(0, at - base)])
    if len(silence) < 4:
        return pos
    thr = max(4.0 * float(np.median(silence)), FLOOR_RMS)
    for j in range(reach // BLOCK):
        hi = pos - j * BLOCK
        lo = hi - BLOCK
        if lo < base:
            break
        if _rms(audio[lo - base : hi - base]) > thr:
            return hi
    return pos


def refine_start(audio: np.ndarray, base: int, start: int, reach: int = REACH) -> int:
    """Move a start to the first 10 ms block, within ``reach`` around Silero's
    first speech window, that is 12 dB above the noise before it.

    ``audio`` holds in16 samples from ``base``; the noise floor comes from up
    to 200 ms before ``start - reach``. Returns ``start`` unchanged when there
    is too little history or nothing stands out.
    """
    lo_noise = max(base, start - reach - 3200)
    noise = _block_rms(audio[lo_noise - base : max(lo_noise, start - reach) - base])
    if len(noise) < 5:
        return start
    thr = max(4.0 * float(np.median(noise)), FLOOR_RMS)
    p = start - reach
    limit = min(start + WINDOW, base + len(audio))
    while p + BLOCK <= limit:
        if _rms(audio[p - base : p + BLOCK - base]) > thr:
            return p
        p += BLOCK
    return start


class VadHealth:
    """Fail-open bookkeeping of one call, on audio time (in16 positions).

    ``max_failures`` failed windows in a row that also span ``window`` samples
    of audio fail the call open; then a probe is due every ``recovery``
    samples (0 disables recovery). Pure logic: the caller acts on the
    returned strings ("failed_open", "recovered").
    """

    __slots__ = ("max_failures", "window", "recovery", "streak", "streak_from", "failed_open",
                 "last_probe", "failures", "recoveries")

    def __init__(self, max_failures: int = 5, window: int = RATE, recovery: int = 5 * RATE) -> None:
        self.max_failures = max(1, max_failures)
        self.window = max(0, window)
        self.recovery = max(0, recovery)
        self.streak = 0
        self.streak_from = 0
        self.failed_open = False
        self.last_probe = 0
        self.failures = 0
        self.recoveries = 0

    def on_failure(self, pos: int) -> str | None:
        self.failures += 1
        if self.failed_open:
            self.last_probe = pos
            return None
        if self.streak == 0:
            self.streak_from = pos
        self.streak += 1
        if self.streak >= self.max_failures and pos - self.streak_from >= self.window:
            self.failed_open = True
            self.last_probe = pos
            return "failed_open"
        return None

    def on_success(self, pos: int) -> str | None:
        self.streak = 0
        if self.failed_open:
            self.failed_open = False
            self.recoveries += 1
            return "recovered"
        return None

    def probe_due(self, pos: int) -> bool:
        return self.failed_open and self.recovery > 0 and pos - self.last_probe >= self.recovery


class SileroBatch:
    """One ONNX session, state rows for ``capacity`` slots, one run per call of :meth:`run`.

    ``run(slots, windows)``: ``windows`` is ``[n, 512]`` float32 in [-1, 1) at
    16 kHz, or ``[n, 256]`` at 8 kHz (the model's native 8 kHz mode); returns
    ``n`` probabilities and advances each slot's state and context.
    ``reset(slot)`` gives a slot a fresh stream (zero state and context).
    """

    def __init__(self, path: Path, capacity: int = 256, threads: int = 1) -> None:
        from workers.smart_turn import ort_session

        self.path = path
        self.session = ort_session(path, threads)
        names = [i.name for i in self.session.get_inputs()]
        if names != ["input", "state", "sr"]:
            raise ValueError(f"{path}: unexpected Silero inputs {names}")
        self.capacity = capacity
        self.state = np.zeros((2, capacity, STATE_DIM), dtype=np.float32)
        self.context = np.zeros((capacity, CONTEXT), dtype=np.float32)
        self.context8 = np.zeros((capacity, CONTEXT8), dtype=np.float32)
        self._input = np.zeros((capacity, CONTEXT + WINDOW), dtype=np.float32)
        self._input8 = np.zeros((capacity, CONTEXT8 + WINDOW8), dtype=np.float32)
        self._sr = np.array(RATE, dtype=np.int64)
        self._sr8 = np.array(RATE8, dtype=np.int64)
        self.runs = 0
        self.rows = 0

    def reset(self, slot: int) -> None:
        self.state[:, slot, :] = 0.0
        self.context[slot, :] = 0.0
        self.context8[slot, :] = 0.0

    def run(self, slots: np.ndarray, windows: np.ndarray) -> np.ndarray:
        n = len(slots)
        width = windows.shape[1]
        if width == WINDOW:
            ctx, ctx_n, inp, sr = self.context, CONTEXT, self._input[:n], self._sr
        elif width == WINDOW8:
            ctx, ctx_n, inp, sr = self.context8, CONTEXT8, self._input8[:n], self._sr8
        else:
            raise ValueError(f"Silero windows are {WINDOW} (16 kHz) or {WINDOW8} (8 kHz) samples, got {width}")
        np.take(ctx, slots, axis=0, out=inp[:, :ctx_n])
        inp[:, ctx_n:] = windows
        out, state_n = self.session.run(None, {"input": inp, "state": self.state[:, slots, :], "sr": sr})
        self.state[:, slots, :] = state_n
        ctx[slots] = windows[:, width - ctx_n :]
        self.runs += 1
        self.rows += n
        return out.reshape(n)

    def warm(self) -> None:
        """Run each rate once at batch 1 and at a large batch, so the first tick pays no allocation."""
        for width in (WINDOW, WINDOW8):
            for n in (1, min(64, self.capacity)):
                slots = np.arange(n)
                self.run(slots, np.zeros((n, width), dtype=np.float32))
                for s in slots:
                    self.reset(int(s))
