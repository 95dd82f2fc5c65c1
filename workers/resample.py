"""Streaming rate conversion between rings, both directions, with exact positions.

Owns the two per-call converters of the worker's realtime lane:

* :class:`InputChain` -- the ``in`` ring (call rate) to the ``in16`` ring
  (16 kHz). It reads what the gateway published, resamples with a stateful
  ``soxr.ResampleStream`` (quality ``QQ``: output on every call, no added
  delay), writes ``in16`` and hands the new samples to the VAD.
* :class:`OutputChain` -- the ``tts`` ring (TTS rate) to the ``out`` ring
  (call rate), cutting the stream at utterance boundaries and at epoch cuts.

Position invariants (positions are absolute sample counts since the call started,
so a position means the same in every process):

* ``in16`` sample ``k`` is the caller audio at time ``k / 16000`` s, i.e. at
  ``in`` position ``k * rate / 16000``. QQ has zero delay (its first output
  sample is the first input sample), so this holds while the stream is
  continuous; at a gap (the reader was overrun) the converter flushes,
  writes zeros for the lost span and restarts, so it holds again after it.
  The writer may trail by the few samples QQ holds back for interpolation,
  and, with a :class:`workers.denoise.Denoiser` between the resampler and
  ``in16`` (``[audio] denoise``), by what the denoiser holds
  (:attr:`~workers.denoise.Denoiser.max_hold` at most; its delay is dropped,
  so in16 sample ``k`` is still the audio at time ``k``). At a gap the
  denoiser's held samples are written raw before the zeros.
* With a denoiser, the resampler's own output (the in16 stream as it was before
  noise suppression) is also kept, by in16 position, for the last ``PRE_S``
  seconds (:attr:`InputChain.pre`, a :class:`SampleHistory`): what answering-
  machine detection reads for its tone tests (a suppressor removes steady
  tones: the voicemail beep, fax CNG, answer tones). Its sample ``k`` is the
  audio at in16 position ``k`` too (it runs ahead of ``in16`` by exactly what
  the denoiser holds; at a gap it gets the same zeros).
* :func:`resume_in_pos` inverts the map, so a worker that takes over a
  call (re-attach after a worker death) continues ``in16`` without a seam.
* On the output side every utterance starts a fresh stream: its first
  ``out`` sample is the utterance's first ``tts`` sample, so the reported
  ``out_pos`` is exact and word offsets measured from it stay valid. A
  boundary learnt late (the audio was already converted) is placed by the
  same linear map of the running segment.
* An announced utterance start is placed (and reported) only once some of
  its own audio was converted: when the core reports it, the ``out`` ring
  already holds the utterance's first samples, so the gateway can release its
  first frame at once. :meth:`OutputChain.next_start` tells the core which
  boundary is still waiting for audio.

Neither class does ZeroMQ I/O; they return what the core must send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import soxr

from ipc.ring import Ring

if TYPE_CHECKING:
    from workers.denoise import Denoiser

RATE16 = 16_000
QUALITY = "QQ"
PRE_S = 4  # seconds of pre-denoise in16 kept (the VAD, hence AMD, lags at most PEND_S = 2 s behind)


def in16_pos_for(in_pos: int, rate: int) -> int:
    """in16 position of the caller audio at ``in`` position ``in_pos``."""
    return (in_pos * RATE16) // rate


def resume_in_pos(in16_pos: int, rate: int) -> int:
    """Smallest ``in`` position whose in16 position is at or after ``in16_pos``."""
    return -((-in16_pos * rate) // RATE16)


def stream(src: int, dst: int) -> soxr.ResampleStream | None:
    """The project's streaming resampler (soxr QQ, int16, mono); None when the rates match."""
    if src == dst:
        return None
    return soxr.ResampleStream(src, dst, 1, dtype="int16", quality=QUALITY)


def _processor(rs: soxr.ResampleStream | None) -> Any:
    """The stream's C entry point for ``[n, 1]`` int16 input, skipping the
    wrapper's per-call checks (measured 2.7 -> 2.2 us per 20 ms frame); the
    public method when this soxr version has no such attribute."""
    proc = getattr(rs, "_process", None)
    if rs is None:
        return None
    if proc is None:
        return lambda x2, last: rs.resample_chunk(x2[:, 0], last)[:, None]
    return proc


class SampleHistory:
    """The last ``capacity`` samples of a stream, by absolute position (a plain array, local
    to the tick thread; not a shared ring). ``write_pos`` is the position after the last
    sample written; :meth:`read` answers a span only when all of it is still held."""

    __slots__ = ("buf", "capacity", "write_pos")

    def __init__(self, capacity: int, start_pos: int = 0) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.buf = np.zeros(capacity, dtype=np.int16)
        self.capacity = capacity
        self.write_pos = start_pos

    def write(self, x: np.ndarray) -> None:
        n = len(x)
        if n == 0:
            return
        cap = self.capacity
        if n >= cap:  # only the last `capacity` samples can be kept; the position takes all of them
            x = x[n - cap :]
        m = len(x)
        i = (self.write_pos + n - m) % cap
        first = min(m, cap - i)
        self.buf[i : i + first] = x[:first]
        if first < m:
            self.buf[: m - first] = x[first:]
        self.write_pos += n

    def read(self, start: int, end: int) -> np.ndarray | None:
        """A copy of the samples at positions ``[start, end)``; None when some of them are not
        written yet or no longer held (or the span is empty or longer than the capacity).
        Positions before the first one written (negative ones too: the VAD's first window may
        start a few samples before the stream) read as zeros, as the in16 ring pads them."""
        if not (start < end <= self.write_pos) or start < self.write_pos - self.capacity:
            return None
        cap = self.capacity
        i = start % cap
        n = end - start
        if i + n <= cap:
            return self.buf[i : i + n].copy()
        return np.concatenate((self.buf[i:], self.buf[: n - (cap - i)]))


class InputChain:
    """``in`` -> ``in16`` for one call. :meth:`step` is called once per tick.

    After a step, ``fresh`` holds the 16 kHz samples produced by it and
    ``raw`` the ``in`` samples it consumed (both valid until the next step;
    ``raw`` feeds the VAD of 8 kHz calls at their own rate), and ``gap`` the
    in16 position where a gap started (-1 if none; then both are empty and
    the stream restarts at ``out_pos`` / ``in_pos``), ``gap_lost`` its length
    in in16 samples. With a denoiser, ``pre`` holds the last ``PRE_S`` s of the
    resampler's output before it (in16 positions; None without a denoiser).
    """

    __slots__ = ("src", "dst", "rate", "rs", "proc", "in_pos", "out_pos", "max_read", "fresh", "raw", "gap",
                 "gap_lost", "lost_total", "_zeros", "denoise", "pre")

    def __init__(self, src: Ring, dst: Ring, rate: int, max_read_s: float = 1.0,
                 denoise: Denoiser | None = None) -> None:
        self.src = src
        self.dst = dst
        self.rate = rate
        self.rs = stream(rate, RATE16)
        self.proc = _processor(self.rs)
        self.out_pos = dst.write_pos
        self.in_pos = resume_in_pos(self.out_pos, rate)
        pad = in16_pos_for(self.in_pos, rate) - self.out_pos
        if pad > 0:
            self.out_pos = dst.write(np.zeros(pad, dtype=np.int16))
        self.max_read = max(1, int(rate * max_read_s))
        self.fresh: np.ndarray = np.zeros(0, dtype=np.int16)
        self.raw: np.ndarray = self.fresh
        self.gap = -1
        self.gap_lost = 0
        self.lost_total = 0
        self._zeros = np.zeros(0, dtype=np.int16)
        self.denoise = denoise  # between the resampler and in16 (None: `[audio] denoise = "off"`)
        # the in16 stream before the denoiser, by in16 position (AMD's tone tests read it)
        self.pre = SampleHistory(PRE_S * RATE16, self.out_pos) if denoise is not None else None

    def step(self) -> int:
        """Convert what arrived; returns the number of in16 samples written."""
        self.gap = -1
        src = self.src
        w = src.write_pos
        pos = self.in_pos
        if w <= pos:
            self.fresh = self.raw = self._zeros
            return 0
        if w - pos > src.capacity:  # overrun: skip to where the audio is safe from the writer
            return self._gap(w - src.capacity + src.capacity // 8)
        end = w if w - pos <= self.max_read else pos + self.max_read
        x = src.copy_range(pos, end)
        if x is None:  # overwritten while we copied: restart where the audio still exists
            return self._gap(src.read_range(pos, end).start)
        self.in_pos = end
        proc = self.proc
        out = x if proc is None else proc(x.reshape(-1, 1), False).reshape(-1)
        if self.pre is not None:
            self.pre.write(out)
        if self.denoise is not None:
            out = self.denoise.process(out)
        n = len(out)
        if n:
            self.out_pos = self.dst.write(out)
        self.fresh = out
        self.raw = x
        return n

    def _gap(self, new_in_pos: int) -> int:
        """The reader was overrun: close the stream, pad the lost span with zeros."""
        if self.rs is not None:
            tail = self.rs.resample_chunk(np.zeros(0, dtype=np.int16), last=True)
            if self.pre is not None:
                self.pre.write(tail)
            if self.denoise is not None:
                tail = self.denoise.process(tail)
            if len(tail):
                self.out_pos = self.dst.write(tail)
            # the audio it held is flushed; what follows is after the gap
        if self.denoise is not None:  # what the denoiser held goes out raw; its framing restarts
            held = self.denoise.flush()
            if len(held):
                self.out_pos = self.dst.write(held)
        gap_at = self.out_pos
        target = in16_pos_for(new_in_pos, self.rate)
        lost16 = max(0, target - self.out_pos)
        if lost16:
            # a chunk longer than the ring keeps its last `capacity` samples and
            # advances the position by all of it: positions stay aligned
            self.out_pos = self.dst.write(np.zeros(lost16, dtype=np.int16))
        if self.pre is not None:  # everything the denoiser had is out: both streams end here
            self.pre.write(np.zeros(max(0, self.out_pos - self.pre.write_pos), dtype=np.int16))
        self.lost_total += new_in_pos - self.in_pos
        self.in_pos = new_in_pos
        self.rs = stream(self.rate, RATE16)
        self.proc = _processor(self.rs)
        self.gap = gap_at
        self.gap_lost = lost16
        self.fresh = self.raw = self._zeros  # the VAD drops its partial window at a gap
        return 0

    def reset_stream(self) -> None:
        self.rs = stream(self.rate, RATE16)
        self.proc = _processor(self.rs)


@dataclass(frozen=True, slots=True)
class UtteranceStart:
    """What the core reports as OutUtterance."""

    utterance: int
    epoch: int
    out_pos: int


class OutputChain:
    """``tts`` -> ``out`` for one call, exact at utterance boundaries.

    ``announce(utterance, epoch, tts_pos)`` registers a boundary;
    ``cut(epoch, tts_pos)`` drops everything before ``tts_pos`` and forgets
    boundaries of epochs up to ``epoch``; ``step()`` converts what arrived and
    returns the utterance starts it placed (a start is placed once audio
    after it exists, never at the very end of what was written).
    """

    __slots__ = ("src", "dst", "src_rate", "dst_rate", "rs", "tts_pos", "seg_tts0", "seg_out0",
                 "pending", "max_read", "cut_epoch", "converted")

    def __init__(self, src: Ring, dst: Ring, src_rate: int, dst_rate: int, max_read_s: float = 1.0) -> None:
        self.src = src
        self.dst = dst
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self.rs = stream(src_rate, dst_rate)
        self.tts_pos = src.write_pos
        self.seg_tts0 = self.tts_pos
        self.seg_out0 = dst.write_pos
        self.pending: list[tuple[int, int, int]] = []  # (tts_pos, utterance, epoch), sorted
        self.max_read = max(1, int(src_rate * max_read_s))
        self.cut_epoch = -1
        self.converted = 0

    def _map(self, tts_pos: int) -> int:
        return self.seg_out0 + ((tts_pos - self.seg_tts0) * self.dst_rate) // self.src_rate

    def announce(self, utterance: int, epoch: int, tts_pos: int) -> UtteranceStart | None:
        """Register an utterance start; returns it at once if that audio was already converted."""
        if epoch <= self.cut_epoch:
            return None
        if tts_pos < self.tts_pos:
            pos = max(self._map(max(tts_pos, self.seg_tts0)), self.seg_out0)
            return UtteranceStart(utterance, epoch, pos)
        self.pending.append((tts_pos, utterance, epoch))
        self.pending.sort()
        return None

    def next_start(self) -> int:
        """The tts position of the first utterance start still waiting for its audio (-1: none)."""
        return self.pending[0][0] if self.pending else -1

    def cut(self, epoch: int, tts_pos: int) -> None:
        """Epochs up to ``epoch`` are dead; ``tts_pos`` is the tts write position when that was
        decided, so everything after it belongs to a newer epoch. If some of that was already
        converted (the frame came late), the running segment is kept: the newer utterance's
        start is then placed exactly by its linear map instead of being lost behind the cut."""
        self.cut_epoch = max(self.cut_epoch, epoch)
        self.pending = [p for p in self.pending if p[2] > epoch and p[0] >= tts_pos]
        if tts_pos < self.tts_pos:
            return
        self.tts_pos = tts_pos
        self._restart()  # drop what the stream held: it belongs to the cut

    def _convert(self, end: int, last: bool) -> None:
        if end > self.tts_pos:
            got = self.src.read_range(self.tts_pos, end)
            if got.lost:  # overrun: restart the segment where the audio still exists
                self.tts_pos = got.start
                self.rs = stream(self.src_rate, self.dst_rate)
                self.seg_tts0 = got.start
                self.seg_out0 = self.dst.write_pos
            x = got.samples
            self.tts_pos = got.start + len(x)
        else:
            x = np.zeros(0, dtype=np.int16)
        if self.rs is None:
            y = x
        else:
            y = self.rs.resample_chunk(x, last=last) if (len(x) or last) else x
        if len(y):
            self.dst.write(y)
            self.converted += len(y)

    def _restart(self) -> None:
        self.rs = stream(self.src_rate, self.dst_rate)
        self.seg_tts0 = self.tts_pos
        self.seg_out0 = self.dst.write_pos

    def step(self) -> list[UtteranceStart]:
        w = self.src.write_pos
        if w <= self.tts_pos:
            return []
        cap = self.src.capacity
        if w - self.tts_pos > cap:  # overrun: what was lost is gone; restart where audio is intact
            self.tts_pos = w - cap + cap // 8
            self._restart()
        end = min(w, self.tts_pos + self.max_read)
        placed: list[UtteranceStart] = []
        while self.pending and self.pending[0][0] < end:  # some of the utterance's own audio is here
            b_pos, utt, epoch = self.pending.pop(0)
            if b_pos < self.tts_pos:  # cannot happen (announce handles the past), keep safe
                placed.append(UtteranceStart(utt, epoch, self._map(b_pos)))
                continue
            self._convert(b_pos, last=True)  # finish the previous utterance, tail included
            self.tts_pos = b_pos
            self._restart()
            placed.append(UtteranceStart(utt, epoch, self.dst.write_pos))
        self._convert(end, last=False)
        return placed
