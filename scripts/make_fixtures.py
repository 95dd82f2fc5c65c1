#!/usr/bin/env python3
"""Generate the speech fixtures the worker tests and benchmarks use.

Owns ``tests/fixtures/generated/`` (gitignored): WAV files of espeak-ng
phrases separated by known silences, at 16 kHz and 8 kHz, plus
``manifest.json`` with the true speech boundaries of each phrase (sample
positions at 16 kHz).

How a fixture is made: each phrase is synthesised with ``espeak-ng`` (a
subprocess: GPL, kept out of our processes), resampled to 16 kHz with
``sox``, trimmed to its first and last sample above -40 dBFS (so the
boundaries are known to the sample), and placed between silences of known
length. A little Gaussian noise (sigma 8 LSB, fixed seed) is added so
silence is not digital zero. The 8 kHz version is made from the 16 kHz one
by sox, without dither (``-D``: sox dithers with a random seed by default, so every
clone made different clips).

Cached by content: a fixture is rebuilt only when its recipe, this script's
version or the espeak-ng version changed (the key is stored in the manifest).

Usage: ``python scripts/make_fixtures.py [--out DIR] [--force]``; tests call
:func:`ensure`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

VERSION = 2  # 2: sox without dither (the same clips on every machine)
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "generated"
VOICE = "en-us+m3"
SPEED = 170
NOISE_SIGMA = 8.0
TRIM_LEVEL = 0.01  # -40 dBFS

# name -> parts: ("sil", seconds) or ("say", text)
FIXTURES: dict[str, list[tuple[str, float | str]]] = {
    "vad_dialog": [
        ("sil", 0.6),
        ("say", "I would like to book a table for two people tonight"),
        ("sil", 1.0),
        ("say", "Can you tell me what time you close tonight?"),
        ("sil", 1.2),
        ("say", "Thank you very much"),
        ("sil", 0.8),
    ],
    "turn_complete": [
        ("sil", 0.5),
        ("say", "Can you tell me what time you close tonight?"),
        ("sil", 1.0),
    ],
    "turn_trailing": [
        ("sil", 0.5),
        ("say", "My phone number is five five five, uh,"),
        ("sil", 1.0),
    ],
}


def _espeak_version() -> str:
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def _key(name: str, espeak: str) -> str:
    recipe = json.dumps([VERSION, espeak, VOICE, SPEED, NOISE_SIGMA, TRIM_LEVEL, FIXTURES[name]])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def _say(text: str, tmp: Path) -> np.ndarray:
    """espeak-ng -> sox 16 kHz -> float32, trimmed to the speech."""
    raw = tmp / "say.wav"
    wav16 = tmp / "say16.wav"
    subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(SPEED), "-w", str(raw), text],
                   check=True, timeout=60, capture_output=True)
    subprocess.run(["sox", "-D", str(raw), "-r", "16000", "-b", "16", "-c", "1", str(wav16)],
                   check=True, timeout=60, capture_output=True)
    x, sr = sf.read(wav16, dtype="float32")
    assert sr == 16000
    loud = np.nonzero(np.abs(x) > TRIM_LEVEL)[0]
    if len(loud) == 0:
        raise RuntimeError(f"espeak-ng produced silence for {text!r}")
    return x[loud[0] : loud[-1] + 1]


def _build(name: str, out: Path, tmp: Path) -> dict:
    rng = np.random.default_rng(sum(map(ord, name)))
    pieces: list[np.ndarray] = []
    segments: list[list[int]] = []
    texts: list[str] = []
    pos = 0
    for kind, val in FIXTURES[name]:
        if kind == "sil":
            n = int(round(float(val) * 16000))
            pieces.append(np.zeros(n, dtype=np.float32))
        else:
            x = _say(str(val), tmp)
            n = len(x)
            pieces.append(x)
            segments.append([pos, pos + n])
            texts.append(str(val))
        pos += n
    audio = np.concatenate(pieces) * 32767.0
    audio += rng.normal(0.0, NOISE_SIGMA, len(audio))
    pcm = np.clip(np.round(audio), -32768, 32767).astype(np.int16)
    f16 = out / f"{name}.16k.wav"
    f8 = out / f"{name}.8k.wav"
    t16, t8 = tmp / f16.name, tmp / f8.name
    sf.write(t16, pcm, 16000, subtype="PCM_16")
    subprocess.run(["sox", "-D", str(t16), "-r", "8000", str(t8)], check=True, timeout=60, capture_output=True)
    os.replace(t16, f16)  # readers never see a partial file (tmp is on the same filesystem)
    os.replace(t8, f8)
    return {
        "file16": f16.name,
        "file8": f8.name,
        "samples16": int(len(pcm)),
        "segments16": segments,
        "texts": texts,
    }


def ensure(out: Path = OUT, force: bool = False) -> dict:
    """Build what is missing or stale; return the manifest (name -> entry, entry has ``dir``).

    One builder at a time (an flock on ``out/.lock``): parallel test processes
    wait for each other, and files appear under their names only when whole.
    """
    out.mkdir(parents=True, exist_ok=True)
    man_path = out / "manifest.json"
    espeak = _espeak_version()
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            manifest = json.loads(man_path.read_text()) if man_path.is_file() else {}
        except ValueError:
            manifest = {}
        changed = False
        with tempfile.TemporaryDirectory(prefix=".bvfix", dir=out) as td:
            for name in FIXTURES:
                key = _key(name, espeak)
                entry = manifest.get(name)
                ok = (not force and entry is not None and entry.get("key") == key
                      and (out / entry["file16"]).is_file() and (out / entry["file8"]).is_file())
                if ok:
                    continue
                entry = _build(name, out, Path(td))
                entry["key"] = key
                manifest[name] = entry
                changed = True
        if changed:
            tmp = man_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
            os.replace(tmp, man_path)
    for entry in manifest.values():
        entry["dir"] = str(out)
    return manifest


def load(name: str, rate: int = 16000, out: Path = OUT) -> tuple[np.ndarray, dict]:
    """(int16 samples at ``rate``, manifest entry) of one fixture, building it if needed."""
    entry = ensure(out)[name]
    f = entry["file16"] if rate == 16000 else entry["file8"]
    if rate not in (8000, 16000):
        raise ValueError("fixtures exist at 8000 and 16000 Hz")
    x, sr = sf.read(out / f, dtype="int16")
    assert sr == rate
    return x, entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    man = ensure(a.out, a.force)
    for name, e in man.items():
        print(f"{name}: {e['samples16'] / 16000:.2f} s, speech {e['segments16']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
