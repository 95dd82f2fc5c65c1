"""Caller speech for the load generator: espeak-ng + sox into a cache, never downloaded.

Owns turning a line of text into 8 kHz int16 samples whose speech starts at
sample 0 and ends at the last sample (leading/trailing silence trimmed by sox),
peak-normalized to the workload's level, and caching the result by a key of
every input (text, voice, rate, level, tool versions) under the cache dir.

Invariants: the same inputs always give the same file; a cache entry is
written atomically (temp file + rename), so concurrent runs never read a
half-written file; espeak-ng runs as a subprocess (GPL, kept out of process).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE = 8000
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / "out" / "cache" / "speech"
_TIMEOUT_S = 60


class SpeechError(RuntimeError):
    """espeak-ng or sox is missing or failed."""


def _tool_version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SpeechError(f"{tool} is not usable ({e}); install it (Debian: espeak-ng, sox)") from None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else tool


def cache_key(text: str, voice: str, wpm: int, peak_dbfs: float, versions: str) -> str:
    h = hashlib.sha256(f"{text}\x00{voice}\x00{wpm}\x00{peak_dbfs:.2f}\x00{versions}".encode())
    return h.hexdigest()[:24]


def synthesize(text: str, voice: str, wpm: int, peak_dbfs: float,
               cache_dir: Path | None = None) -> np.ndarray:
    """Return ``text`` spoken as int16 samples at 8 kHz, trimmed, from the cache if present."""
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise SpeechError(f"{tool} not found on PATH (Debian packages espeak-ng and sox)")
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    versions = f"{_tool_version('espeak-ng')}|{_tool_version('sox')}"
    path = cache / f"{cache_key(text, voice, wpm, peak_dbfs, versions)}.wav"
    if not path.exists():
        _render(text, voice, wpm, peak_dbfs, path)
    return read_wav(path)


def _render(text: str, voice: str, wpm: int, peak_dbfs: float, path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="bvspeech") as td:
        raw = Path(td) / "espeak.wav"
        out = Path(td) / "out.wav"
        _run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(raw), text])
        # resample to 8 kHz mono 16-bit, trim silence at both ends, normalize peaks
        _run(["sox", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", "-e", "signed-integer",
              str(out), "silence", "1", "0.01", "0.5%", "reverse", "silence", "1", "0.01", "0.5%",
              "reverse", "norm", f"{peak_dbfs:.1f}"])
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp", suffix=".wav")
        os.close(fd)
        shutil.copyfile(out, tmp)
        os.replace(tmp, path)


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SpeechError(f"{cmd[0]} timed out") from None
    if r.returncode != 0:
        raise SpeechError(f"{cmd[0]} failed ({r.returncode}): {r.stderr.strip()[:300]}")


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        if w.getframerate() != SAMPLE_RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SpeechError(f"{path}: not 8 kHz mono 16-bit")
        data = w.readframes(w.getnframes())
    samples = np.frombuffer(data, dtype="<i2").astype(np.int16)
    if samples.size == 0:
        raise SpeechError(f"{path}: no speech after trimming")
    return samples
