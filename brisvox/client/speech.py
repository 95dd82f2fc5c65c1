"""The caller's lines for ``brisvox call``: WAV files, or text spoken by a local voice.

Owns turning a line into int16 samples at the call's rate, and finding where
its speech starts and ends (the client measures "caller stopped" from the
last loud sample, not from the end of the file):

* a WAV (any rate, mono or the first channel) is read with soundfile and
  resampled with soxr (VHQ: offline, quality over delay);
* a text is synthesized by the Piper joe voice through the worker's Piper
  host (:class:`workers.api.PiperRunner`, a subprocess: piper-tts is
  GPL and stays out of this process), or by espeak-ng run as a subprocess
  when Piper or its model is not installed (or ``voice="espeak"``).

Invariants: every subprocess is bounded in time (``SYNTH_TIMEOUT_S``) and
closed; a :class:`Voice` is reused for all lines of a call and closed once.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SYNTH_TIMEOUT_S = 60.0
PIPER_RATE = 22_050
FRAME_S = 0.020
LOUD_DBFS = -45.0  # a 20 ms frame above this RMS level is speech (bot or caller)


class SpeechError(RuntimeError):
    """A line could not be read or synthesized."""


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """int16 -> int16 at ``dst`` Hz (soxr VHQ; clipped)."""
    if src == dst or len(x) == 0:
        return np.asarray(x, dtype=np.int16)
    import soxr

    y = soxr.resample(x.astype(np.float32) / 32768.0, src, dst, quality="VHQ")
    return (np.clip(y, -1.0, 1.0) * 32767.0).astype(np.int16)


def frame_dbfs(x: np.ndarray) -> float:
    """RMS level of a block of int16 samples in dBFS (-inf for digital silence)."""
    if len(x) == 0:
        return float("-inf")
    f = x.astype(np.float32) / 32768.0
    ms = float(np.mean(f * f))
    return 10.0 * np.log10(ms) if ms > 0 else float("-inf")


def is_loud(x: np.ndarray) -> bool:
    return frame_dbfs(x) > LOUD_DBFS


def speech_bounds(x: np.ndarray, rate: int) -> tuple[int, int]:
    """(first, end) sample of the loud part, in 20 ms frames; (0, 0) when all quiet."""
    n = int(rate * FRAME_S)
    frames = len(x) // n
    if frames == 0:
        return 0, 0
    f = x[: frames * n].astype(np.float32).reshape(frames, n) / 32768.0
    ms = np.mean(f * f, axis=1)
    with np.errstate(divide="ignore"):
        db = 10.0 * np.log10(ms)
    loud = np.nonzero(db > LOUD_DBFS)[0]
    if len(loud) == 0:
        return 0, 0
    return int(loud[0]) * n, int(loud[-1] + 1) * n


def read_wav(path: str | Path, rate: int) -> np.ndarray:
    """A WAV file as int16 mono at ``rate``."""
    import soundfile as sf

    try:
        data, src = sf.read(str(path), dtype="int16", always_2d=True)
    except (OSError, RuntimeError) as e:
        raise SpeechError(f"cannot read {path}: {e}") from None
    return resample(np.ascontiguousarray(data[:, 0]), int(src), rate)


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    import soundfile as sf

    sf.write(str(path), np.asarray(samples, dtype=np.int16), rate, subtype="PCM_16")


def _wav_bytes_to_pcm(data: bytes) -> tuple[np.ndarray, int]:
    import soundfile as sf

    x, rate = sf.read(io.BytesIO(data), dtype="int16", always_2d=True)
    return np.ascontiguousarray(x[:, 0]), int(rate)


@dataclass(frozen=True, slots=True)
class Line:
    """One caller line: samples at the call rate and where its speech is."""

    label: str  # the text, or the file name
    samples: np.ndarray
    speech_start: int
    speech_end: int
    text: str = ""  # the text when synthesized ("" for a file)


def make_line(label: str, samples: np.ndarray, rate: int, text: str = "") -> Line:
    lo, hi = speech_bounds(samples, rate)
    return Line(label, samples, lo, hi, text)


class Voice:
    """Synthesizes the caller's texts: Piper (``piper``), espeak-ng (``espeak``) or ``auto``."""

    def __init__(self, kind: str = "auto", models_dir: str | None = None, espeak_voice: str = "en-us",
                 wpm: int = 165) -> None:
        if kind not in ("auto", "piper", "espeak"):
            raise SpeechError(f"unknown voice {kind!r} (piper, espeak or auto)")
        self.kind = kind
        self.models_dir = models_dir
        self.espeak_voice = espeak_voice
        self.wpm = wpm
        self._piper: Any = None
        self.used = ""

    def _piper_runner(self) -> Any:
        if self._piper is None:
            from workers.api import PiperRunner, locate

            self._piper = PiperRunner(locate("piper_joe", self.models_dir),
                                      locate("piper_joe_config", self.models_dir))
        return self._piper

    def synthesize(self, text: str, rate: int) -> np.ndarray:
        if self.kind in ("auto", "piper"):
            try:
                pcm = self._piper_say(text)
                self.used = "piper"
                return resample(pcm, PIPER_RATE, rate)
            except Exception as e:  # noqa: BLE001 - a missing model or package: fall back (auto)
                if self.kind == "piper":
                    raise SpeechError(f"Piper could not speak the line: {e}") from None
        pcm, src = self._espeak_say(text)
        self.used = "espeak"
        return resample(pcm, src, rate)

    def _piper_say(self, text: str) -> np.ndarray:
        chunks = list(self._piper_runner().synthesize(text))
        if not chunks:
            raise SpeechError("Piper produced no audio")
        return np.concatenate(chunks).astype(np.int16)

    def _espeak_say(self, text: str) -> tuple[np.ndarray, int]:
        exe = shutil.which("espeak-ng")
        if exe is None:
            raise SpeechError("no local voice: install the Piper model (brisvox models install) "
                              "or espeak-ng (Debian package espeak-ng)")
        try:
            out = subprocess.run([exe, "--stdout", "-v", self.espeak_voice, "-s", str(self.wpm), "--", text],
                                 capture_output=True, timeout=SYNTH_TIMEOUT_S, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            raise SpeechError(f"espeak-ng failed: {e}") from None
        return _wav_bytes_to_pcm(out.stdout)

    def close(self) -> None:
        if self._piper is not None:
            self._piper.close()
            self._piper = None


def pad(x: np.ndarray, rate: int, lead_s: float = 0.0, tail_s: float = 0.0) -> np.ndarray:
    z = np.zeros
    return np.concatenate([z(int(rate * lead_s), np.int16), x.astype(np.int16), z(int(rate * tail_s), np.int16)])
