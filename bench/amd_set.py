"""The labelled set of call openings that ``python -m bench amd`` measures the AMD detector on.

Owns the GENERATOR (the audio is never committed): :func:`build` writes, for one
``seed``, a directory of openings (8 kHz int16 ``.npy``, as a telephone line
delivers them) and ``manifest.json`` with each opening's label (``human``,
``machine``, ``ivr``, ``fax``, ``uncertain``), the true beep onset and
greeting end (ms from the answer), the words with their times (an oracle
transcript), the voice, the line and the codec. The same seed gives the same
set, sample for sample, on a machine with the same espeak-ng and Piper voice:
every random choice comes from ``numpy.random.default_rng(seed)``, and Piper
runs with its noise scales at 0 (its sampling noise is not seeded).

What an opening is (the answered call's first seconds, 3-24 s):

* ``human``: a person's reply ("hello?", "yes, speaking", "hi, who's this?"...)
  after 0.1-0.6 s, or after 0.8-1.4 s of silence ("silence then hello"), then
  the silence of someone waiting (sometimes a second "hello?").
* ``machine``: a voicemail greeting of 2-20 s (sentences with 0.15-0.55 s
  pauses), with a beep (70 %: 400-2000 Hz, 200-1000 ms, 0.2-1.0 s after the
  greeting) or without one, then the silence of the recording.
* ``ivr``: a menu ("thank you for calling..., for sales press 1...").
* ``fax``: the answer tone (2100 Hz, 2.6-4 s) then V.21 flags, or the CNG
  cadence (1100 Hz, 0.5 s on, 3 s off).
* ``uncertain``: silence alone (dead air).

Voices: espeak-ng (several voices, 140-230 words per minute; a subprocess:
GPL, kept out of our processes) and the local Piper voice (joe, through
:class:`workers.local_tts.PiperRunner`, at three speeds) when its model is
installed (``brisvox models install``). The line: a level of -26..-16 dBFS,
white or pink noise at a random SNR (none, 30, 20, 15, 10 dB), then G.711
mu-law or A-law (:mod:`brisvox.wire.g711`, the project's codec) or linear.

Cached: TTS phrases in ``<out>/tts/`` by (engine, voice, rate, text); a set
is rebuilt when its recipe changed (the key is in its manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import wave
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from brisvox.wire.g711 import PCMA, PCMU

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "amd"
RATE = 8000
VERSION = 2  # 2: no greeting shorter than 2 s
TRIM = 0.01 * 32768  # -40 dBFS: a phrase's first and last samples above it bound its speech

ESPEAK_VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb+m3", "en-us+m7", "en-gb-x-rp+f2", "en-029")
ESPEAK_RATES = (140, 170, 200, 230)
PIPER_SPEEDS = (0.85, 1.0, 1.2)
SNRS = (None, 30, 20, 15, 10)
CODECS = ("PCMU", "PCMA", "linear")

HUMAN = ("Hello?", "Yes, speaking.", "Hi, who's this?", "Hello.", "Yeah?", "Hi.", "Good morning.",
         "Yes?", "Hello, who is calling?", "Speaking.", "Hello, yes?", "Hey.", "Hi there.", "Yep?")
NAMES = ("Alex Morgan", "Jamie", "Chris Walker", "Dana", "Sam Patel", "Taylor Reed", "Jordan", "Pat Kelly")
OPENERS = ("Hi, you've reached {n}.", "Hello, this is {n}.", "You have reached the voicemail of {n}.",
           "Hey, it's {n}.", "Hi, this is {n}'s phone.", "Thanks for calling {n}.",
           "The person you are calling is not available.", "Hello, you've reached the desk of {n}.")
BODIES = ("I can't take your call right now.", "I'm away from my desk at the moment.", "Sorry I missed you.",
          "I'm not available to take your call.", "I'm either on the other line or away from the phone.",
          "I'm out of the office until Monday.", "Your call is very important to me.")
CLOSERS = ("Please leave a message after the tone.", "Leave your name and number and I'll get back to you "
           "as soon as I can.", "Leave a message and I'll call you back.", "At the tone, please record "
           "your message.", "Please leave a brief message.", "Leave a message.")
EXTRAS = ("You can also reach me by email.", "If this is urgent, please call my office number instead.",
          "I check my messages every day.", "Have a great day.", "Thank you.", "Talk to you soon.")
COMPANIES = ("Acme Insurance", "City Dental", "Northwind Bank", "Blue Sky Travel", "the county clerk's office")
MENU = ("Please listen carefully, as our menu options have changed.", "For sales, press 1.",
        "For support, press 2.", "For billing, press 3.", "To speak to an operator, press 0.",
        "To repeat this menu, press 9.", "Para español, oprima el dos.")


def _key(seed: int, n: int, voices: list[str]) -> str:
    recipe = [VERSION, seed, n, voices, ESPEAK_VOICES, ESPEAK_RATES, PIPER_SPEEDS, SNRS, CODECS, HUMAN, OPENERS,
              BODIES, CLOSERS, EXTRAS, MENU]
    return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]


class Voices:
    """TTS phrases at 8 kHz int16, trimmed to their speech, cached on disk."""

    def __init__(self, cache: Path, piper: tuple[Path, Path] | None) -> None:
        self.cache = cache
        self.cache.mkdir(parents=True, exist_ok=True)
        self.piper_files = piper
        self._piper: Any = None
        self._espeak_v = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True,
                                        timeout=10).stdout.strip()

    def names(self) -> list[str]:
        out = [f"espeak:{v}@{r}" for v in ESPEAK_VOICES for r in ESPEAK_RATES]
        if self.piper_files is not None:
            out += [f"piper:joe@{s}" for s in PIPER_SPEEDS]
        return out

    def say(self, voice: str, text: str) -> np.ndarray:
        tag = hashlib.sha256(f"{voice}|{text}|{self._espeak_v}".encode()).hexdigest()[:20]
        f = self.cache / f"{tag}.npy"
        if f.is_file():
            return np.load(f)
        engine, rest = voice.split(":", 1)
        name, rate = rest.split("@")
        x = self._espeak(name, int(rate), text) if engine == "espeak" else self._piper_say(text, float(rate))
        loud = np.nonzero(np.abs(x.astype(np.int32)) > TRIM)[0]
        if len(loud) == 0:
            raise RuntimeError(f"{voice} produced silence for {text!r}")
        x = x[loud[0] : loud[-1] + 1]
        tmp = f.with_suffix(".tmp.npy")
        np.save(tmp, x)
        os.replace(tmp, f)
        return x

    def _espeak(self, name: str, wpm: int, text: str) -> np.ndarray:
        with tempfile.TemporaryDirectory(prefix="bvamd") as td:
            w = Path(td) / "say.wav"
            subprocess.run(["espeak-ng", "-v", name, "-s", str(wpm), "-w", str(w), text], check=True, timeout=60,
                           capture_output=True)
            with wave.open(str(w)) as r:
                sr = r.getframerate()
                x = np.frombuffer(r.readframes(r.getnframes()), dtype="<i2")
        return _to8k(x, sr)

    def _piper_say(self, text: str, speed: float) -> np.ndarray:
        from workers.local_tts import RATE as PIPER_RATE
        from workers.local_tts import PiperRunner

        if self._piper is None:
            assert self.piper_files is not None
            self._piper = PiperRunner(*self.piper_files)
        pcm = np.concatenate(list(self._piper.synthesize(text, speed, noise=(0.0, 0.0))))
        return _to8k(pcm, PIPER_RATE)

    def close(self) -> None:
        if self._piper is not None:
            self._piper.close()


def _to8k(x: np.ndarray, sr: int) -> np.ndarray:
    y = soxr.resample(x.astype(np.float32), sr, RATE, quality="HQ")
    return np.clip(np.round(y), -32768, 32767).astype(np.int16)


def _piper_files() -> tuple[Path, Path] | None:
    from workers.models import models_dir

    d = models_dir()
    m, c = d / "piper" / "en_US-joe-medium.onnx", d / "piper" / "en_US-joe-medium.onnx.json"
    return (m, c) if m.is_file() and c.is_file() else None


def _sil(s: float) -> np.ndarray:
    return np.zeros(int(round(s * RATE)), dtype=np.float32)


def _tone(hz: float, s: float, level: float = 0.3) -> np.ndarray:
    n = int(round(s * RATE))
    t = np.arange(n) / RATE
    ramp = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (0.004 * RATE))  # 4 ms edges
    return (level * 32768 * np.sin(2 * np.pi * hz * t) * ramp).astype(np.float32)


class _Track:
    """An opening under construction: float samples, words with their times."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.n = 0
        self.words: list[dict[str, Any]] = []
        self.speech_end = -1

    def add(self, x: np.ndarray) -> int:
        start = self.n
        self.parts.append(x.astype(np.float32))
        self.n += len(x)
        return start

    def say(self, v: Voices, voice: str, text: str) -> None:
        x = v.say(voice, text)
        s = self.add(x)
        self.words.append({"start_ms": s * 1000 // RATE, "end_ms": self.n * 1000 // RATE, "text": text})
        self.speech_end = self.n * 1000 // RATE

    @property
    def ms(self) -> int:
        return self.n * 1000 // RATE

    def audio(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.float32)


def _human(rng: np.random.Generator, v: Voices, voice: str) -> tuple[_Track, dict[str, Any]]:
    t = _Track()
    late = rng.random() < 0.2
    lead = rng.uniform(0.8, 1.4) if late else rng.uniform(0.1, 0.6)
    t.add(_sil(lead))
    t.say(v, voice, str(rng.choice(HUMAN)))
    t.add(_sil(rng.uniform(1.6, 2.6)))
    if rng.random() < 0.3:
        t.say(v, voice, "Hello?")
        t.add(_sil(1.5))
    return t, {"variant": "silence_then_hello" if late else "reply", "lead_ms": int(lead * 1000)}


def _machine(rng: np.random.Generator, v: Voices, voice: str) -> tuple[_Track, dict[str, Any]]:
    t = _Track()
    target = rng.uniform(2.0, 20.0)
    t.add(_sil(rng.uniform(0.05, 0.5)))
    name = str(rng.choice(NAMES))
    start = t.ms
    if target < 3.0:  # the shortest greetings: an opener and a short closer (about 2-3 s)
        sentences = [str(rng.choice(OPENERS)).format(n=name), str(rng.choice(CLOSERS[-2:]))]
    else:
        sentences = [str(rng.choice(OPENERS)).format(n=name), str(rng.choice(BODIES))]
        extras = list(rng.permutation(EXTRAS))
        sentences.append(str(rng.choice(CLOSERS)))
        sentences_est = 1.0 * sum(len(s) for s in sentences) / 14.0  # ~14 characters a second
        while extras and sentences_est < target:
            e = str(extras.pop())
            sentences.insert(-1, e)
            sentences_est += len(e) / 14.0
    for i, s in enumerate(sentences):
        if i:
            t.add(_sil(rng.uniform(0.15, 0.55)))
        t.say(v, voice, s)
    meta: dict[str, Any] = {"greeting_ms": t.ms - start, "greeting_end_ms": t.ms, "beep_ms": -1}
    if rng.random() < 0.7:
        t.add(_sil(rng.uniform(0.2, 1.0)))
        hz = float(rng.uniform(400, 2000))
        dur = float(rng.uniform(0.2, 1.0))
        meta.update(beep_ms=t.add(_tone(hz, dur, float(rng.uniform(0.1, 0.5)))) * 1000 // RATE,
                    beep_hz=round(hz, 1), beep_len_ms=int(dur * 1000))
    t.add(_sil(rng.uniform(3.0, 4.0)))
    return t, meta


def _ivr(rng: np.random.Generator, v: Voices, voice: str) -> tuple[_Track, dict[str, Any]]:
    t = _Track()
    t.add(_sil(rng.uniform(0.05, 0.5)))
    t.say(v, voice, f"Thank you for calling {rng.choice(COMPANIES)}.")
    items = [MENU[0]] if rng.random() < 0.5 else []
    items += [str(m) for m in rng.permutation(MENU[1:])[: int(rng.integers(2, 5))]]
    for m in items:
        t.add(_sil(rng.uniform(0.2, 0.6)))
        t.say(v, voice, m)
    t.add(_sil(2.0))
    return t, {}


def _fax(rng: np.random.Generator) -> tuple[_Track, dict[str, Any]]:
    t = _Track()
    t.add(_sil(rng.uniform(0.0, 1.0)))
    if rng.random() < 0.5:
        t.add(_tone(2100.0, rng.uniform(2.6, 4.0), 0.2))
        t.add(_sil(0.075))
        flags = np.concatenate([_tone(1650.0 if b else 1850.0, 1 / 300, 0.2) for b in rng.integers(0, 2, 300)])
        t.add(flags)
        variant = "ced"
    else:
        for _ in range(3):
            t.add(_tone(1100.0, 0.5, 0.2))
            t.add(_sil(3.0))
        variant = "cng"
    return t, {"variant": variant}


def _line(rng: np.random.Generator, x: np.ndarray, speechy: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """Level, noise at a random SNR, then G.711 (or linear): what the worker would read."""
    level_db = float(rng.uniform(-26, -16))
    active = x[np.abs(x) > TRIM]
    rms = float(np.sqrt(np.mean(active.astype(np.float64) ** 2))) if len(active) else 0.0
    y = x.astype(np.float64) * ((32768 * 10 ** (level_db / 20) / rms) if rms > 0 and speechy else 1.0)
    snr = SNRS[int(rng.integers(0, len(SNRS)))]
    kind = "white" if rng.random() < 0.5 else "pink"
    ref = 32768 * 10 ** (level_db / 20)
    sigma = ref / 10 ** (snr / 20) if snr is not None else 6.0
    noise = rng.normal(0.0, 1.0, len(y))
    if kind == "pink":  # 1/f power (shaped in the frequency domain): more energy low, like a line's hum
        spec = np.fft.rfft(noise)
        spec[1:] /= np.sqrt(np.arange(1, len(spec)))
        spec[0] = 0.0
        noise = np.fft.irfft(spec, len(noise))
        noise /= max(1e-9, float(np.std(noise)))
    y = y + sigma * noise
    pcm = np.clip(np.round(y), -32768, 32767).astype(np.int16)
    codec = CODECS[int(rng.integers(0, len(CODECS)))]
    if codec != "linear":
        c = PCMU if codec == "PCMU" else PCMA
        pcm = c.decode(c.encode(pcm)).astype(np.int16)
    return pcm, {"level_db": round(level_db, 1), "snr_db": snr, "noise": kind, "codec": codec}


MIX = (("human", 100), ("machine", 120), ("ivr", 25), ("fax", 25), ("uncertain", 30))


def build(seed: int, out: Path = OUT, force: bool = False, scale: float = 1.0) -> dict[str, Any]:
    """The set of ``seed`` in ``out/seed<seed>/`` (built if missing or stale); returns its manifest.
    ``scale`` multiplies every class's count (the default: 300 openings)."""
    d = out / f"seed{seed}"
    piper = _piper_files()
    v = Voices(out / "tts", piper)
    voices = v.names()
    n_total = sum(max(1, round(n * scale)) for _, n in MIX)
    key = _key(seed, n_total, voices)
    man_path = d / "manifest.json"
    if not force and man_path.is_file():
        man = json.loads(man_path.read_text())
        if man.get("key") == key:
            man["dir"] = str(d)
            return man
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    items: list[dict[str, Any]] = []
    try:
        for label, n in MIX:
            for i in range(max(1, round(n * scale))):
                voice = voices[int(rng.integers(0, len(voices)))]
                if label == "human":
                    t, meta = _human(rng, v, voice)
                elif label == "machine":
                    t, meta = _machine(rng, v, voice)
                elif label == "ivr":
                    t, meta = _ivr(rng, v, voice)
                elif label == "fax":
                    t, meta = _fax(rng)
                    voice = ""
                else:
                    t = _Track()
                    t.add(_sil(float(rng.uniform(4.0, 6.0))))
                    meta, voice = {}, ""
                pcm, line = _line(rng, t.audio(), label not in ("fax", "uncertain"))
                name = f"{label}-{i:03d}"
                np.save(d / f"{name}.npy", pcm)
                items.append({"name": name, "label": label, "voice": voice, "ms": len(pcm) * 1000 // RATE,
                              "words": t.words, "speech_end_ms": t.speech_end, **meta, **line})
    finally:
        v.close()
    man = {"key": key, "seed": seed, "rate": RATE, "piper": piper is not None, "openings": items}
    tmp = man_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(man, indent=1))
    os.replace(tmp, man_path)
    man["dir"] = str(d)
    return man


def load(man: dict[str, Any], item: dict[str, Any]) -> np.ndarray:
    return np.load(Path(man["dir"]) / f"{item['name']}.npy")
