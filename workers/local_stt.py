"""Local speech-to-text in an inference worker: Whisper tiny.en through faster-whisper (CTranslate2).

Owns :class:`WhisperRunner`: the model (``WhisperModel(dir, device="cpu",
compute_type="int8", cpu_threads=1)``, loaded lazily on the job-lane thread
that uses it; faster-whisper is imported only then) and one transcription of a
VAD-gated utterance read from the call's in16 ring.

Guards (a click before speech once sent Whisper into a repetition loop): the
utterance is trimmed to its voiced part (20 ms frames above an energy floor,
150 ms kept around it), clips shorter than 0.2 s are not transcribed, at most
30 s are read, decoding is greedy with ``max_new_tokens`` capped, no
conditioning on previous text, a no-repeat-ngram guard and the
compression-ratio / no-speech filters on.
Transcribe while the caller speaks: the actor asks for the utterance so far as
soon as the caller's audio has gone quiet (before the VAD's stop), and again at
the stop. Each call's last transcription is remembered by the ring span of its
voiced part; a request whose voiced part is the same span (the audio after it
stayed below the floor) gets that text back at once, so the final at the stop
costs nothing when the tail was silence, and is exactly what a batch
transcription of it would be (same samples, greedy decoding). One entry per
call, dropped at its detach (:meth:`WhisperRunner.forget`).
Single-threaded use only (one lane thread); ``forget`` may run on any thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RATE = 16_000
MAX_SAMPLES = 30 * RATE
MIN_SAMPLES = RATE // 5
FRAME = 320  # 20 ms
PAD = 150 * RATE // 1000
FLOOR_DBFS = -45.0


def voiced_bounds(samples: np.ndarray) -> tuple[int, int]:
    """``[lo, hi)`` of ``samples`` between the first and the last 20 ms frame above the energy
    floor, widened by :data:`PAD` (``(0, 0)``: nothing above it). Frames are counted from
    ``samples[0]``; an incomplete last frame is not looked at."""
    n = len(samples) // FRAME
    if n == 0:
        return 0, 0
    x = samples[: n * FRAME].astype(np.float32).reshape(n, FRAME) / 32768.0
    rms = np.sqrt(np.mean(x * x, axis=1) + 1e-12)
    loud = np.nonzero(20.0 * np.log10(rms) > FLOOR_DBFS)[0]
    if len(loud) == 0:
        return 0, 0
    return max(0, int(loud[0]) * FRAME - PAD), min(len(samples), (int(loud[-1]) + 1) * FRAME + PAD)


def voiced(samples: np.ndarray) -> np.ndarray:
    """The part of ``samples`` between the first and the last frame above the energy floor."""
    lo, hi = voiced_bounds(samples)
    return samples[lo:hi]


@dataclass(frozen=True, slots=True)
class SttOutcome:
    text: str
    audio_s: float
    took_s: float
    cached: bool = False


class WhisperRunner:
    def __init__(self, model_dir: Path, threads: int = 1) -> None:
        self.model_dir = Path(model_dir)
        self.threads = threads
        self.model: Any = None
        self.load_s = 0.0
        self.cached = 0  # transcriptions answered from a call's previous one
        # call_id -> ((ring lo, ring hi, language, max_tokens) of its last transcription, text): one per call
        self._last: dict[str, tuple[tuple[int, int, str, int], str]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        if self.model is not None:
            return
        t0 = time.perf_counter()
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(self.model_dir), device="cpu", compute_type="int8",
                                  cpu_threads=self.threads, num_workers=1)
        self.load_s = time.perf_counter() - t0

    def transcribe(self, samples: np.ndarray, language: str = "en", max_tokens: int = 96, *, call_id: str = "",
                   at: int = 0) -> SttOutcome:
        """The text of the voiced part of ``samples``. With ``call_id``, ``samples[0]`` is the in16
        position ``at`` of that call's ring: when the voiced part is the same ring span (and the same
        language and token cap) as the call's previous transcription, that text is answered without
        running the model (``cached``): the model would get the same samples and decode greedily."""
        self.load()
        t0 = time.perf_counter()
        at += max(0, len(samples) - MAX_SAMPLES)  # the ring position of the kept tail's first sample
        samples = samples[-MAX_SAMPLES:]
        lo, hi = voiced_bounds(samples)
        x = samples[lo:hi]
        if len(x) < MIN_SAMPLES:
            return SttOutcome("", len(x) / RATE, time.perf_counter() - t0)
        key = (at + lo, at + hi, language, max_tokens)
        if call_id:
            with self._lock:
                hit = self._last.get(call_id)
            if hit is not None and hit[0] == key:
                self.cached += 1
                return SttOutcome(hit[1], len(x) / RATE, time.perf_counter() - t0, cached=True)
        audio = x.astype(np.float32) / 32768.0
        segments, _info = self.model.transcribe(
            audio, language=language or "en", task="transcribe", beam_size=1, best_of=1, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
            max_new_tokens=max(1, min(max_tokens, 220)), no_repeat_ngram_size=3,
            compression_ratio_threshold=2.4, no_speech_threshold=0.6, suppress_blank=True,
        )
        text = " ".join(s.text.strip() for s in segments).strip()
        if call_id:
            with self._lock:
                self._last[call_id] = (key, text)
        return SttOutcome(text, len(x) / RATE, time.perf_counter() - t0)

    def forget(self, call_id: str) -> None:
        """Drop the call's remembered transcription (its detach; any thread)."""
        with self._lock:
            self._last.pop(call_id, None)
