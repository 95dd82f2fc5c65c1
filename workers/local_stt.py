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
Single-threaded use only (one lane thread).
"""

from __future__ import annotations

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


def voiced(samples: np.ndarray) -> np.ndarray:
    """The part of ``samples`` between the first and the last frame above the energy floor."""
    n = len(samples) // FRAME
    if n == 0:
        return samples[:0]
    x = samples[: n * FRAME].astype(np.float32).reshape(n, FRAME) / 32768.0
    rms = np.sqrt(np.mean(x * x, axis=1) + 1e-12)
    loud = np.nonzero(20.0 * np.log10(rms) > FLOOR_DBFS)[0]
    if len(loud) == 0:
        return samples[:0]
    lo = max(0, loud[0] * FRAME - PAD)
    hi = min(len(samples), (loud[-1] + 1) * FRAME + PAD)
    return samples[lo:hi]


@dataclass(frozen=True, slots=True)
class SttOutcome:
    text: str
    audio_s: float
    took_s: float


class WhisperRunner:
    def __init__(self, model_dir: Path, threads: int = 1) -> None:
        self.model_dir = Path(model_dir)
        self.threads = threads
        self.model: Any = None
        self.load_s = 0.0

    def load(self) -> None:
        if self.model is not None:
            return
        t0 = time.perf_counter()
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(self.model_dir), device="cpu", compute_type="int8",
                                  cpu_threads=self.threads, num_workers=1)
        self.load_s = time.perf_counter() - t0

    def transcribe(self, samples: np.ndarray, language: str = "en", max_tokens: int = 96) -> SttOutcome:
        self.load()
        t0 = time.perf_counter()
        x = voiced(samples[-MAX_SAMPLES:])
        if len(x) < MIN_SAMPLES:
            return SttOutcome("", len(x) / RATE, time.perf_counter() - t0)
        audio = x.astype(np.float32) / 32768.0
        segments, _info = self.model.transcribe(
            audio, language=language or "en", task="transcribe", beam_size=1, best_of=1, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
            max_new_tokens=max(1, min(max_tokens, 220)), no_repeat_ngram_size=3,
            compression_ratio_threshold=2.4, no_speech_threshold=0.6, suppress_blank=True,
        )
        text = " ".join(s.text.strip() for s in segments).strip()
        return SttOutcome(text, len(x) / RATE, time.perf_counter() - t0)
