"""The shared workload of the side-by-side load benchmark: parsing and per-call plans.

Owns ``bench/workload.toml``'s schema (one frozen dataclass per table, unknown
or mistyped keys are errors), the per-call plan derived from it (which line
each turn says, on which turns the caller barges in and when, when the call
starts), and the bot's answer audio that every scripted TTS plays.

Three programs import this module, so it depends only on the standard library
and numpy (both the project venv and ``bench/.venv-pipecat`` have them):
the load generator (``bench/loadgen``), the Pipecat server
(``bench/pipecat/server.py``) and brisvox's scripted agent.

Invariants: a plan is a pure function of (workload, call index, number of
calls); every call has at least one turn; a barge-in never falls on the last
turn (the barge-in is the next line); barge-in offsets lie in
``[after_ms, after_ms + spread_ms]``.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_PATH = Path(__file__).with_name("workload.toml")

SAMPLE_RATE = 8000  # Twilio Media Streams: mu-law, 8 kHz, mono
FRAME_MS = 20  # one telephony frame
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000


class WorkloadError(ValueError):
    """The workload file is malformed (the message names the key)."""


@dataclass(frozen=True, slots=True)
class CallerSpec:
    voice: str
    words_per_minute: int
    peak_dbfs: float
    lines: tuple[str, ...]
    lead_in_ms: int
    pause_after_bot_ms: int
    response_timeout_ms: int
    tail_ms: int


@dataclass(frozen=True, slots=True)
class SttSpec:
    final_after_finalize_ms: int


@dataclass(frozen=True, slots=True)
class LlmSpec:
    first_token_ms: int
    answer_text: str


@dataclass(frozen=True, slots=True)
class TtsSpec:
    first_audio_ms: int
    answer_ms: int
    chunk_ms: int
    lead_ms: int


@dataclass(frozen=True, slots=True)
class BargeInSpec:
    first: int  # 1-based turn whose answer is interrupted first; 0 disables barge-ins
    every: int
    after_ms: int
    spread_ms: int


@dataclass(frozen=True, slots=True)
class LoadSpec:
    turns_per_call: int
    min_turn_samples: int
    min_turn_samples_quick: int
    start_stagger_ms: int
    ramp_max_ms: int
    pipecat_calls: tuple[int, ...]
    pipecat_calls_quick: tuple[int, ...]
    brisvox_calls: tuple[int, ...]
    brisvox_calls_quick: tuple[int, ...]
    run_timeout_s: int


@dataclass(frozen=True, slots=True)
class MeasureSpec:
    late_frame_ms: int
    hold_margin_ms: int


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What one call does. ``barge_in_ms[k]`` is None, or the delay after the
    first audio of the answer to turn k at which the caller starts line k+1."""

    index: int
    start_ms: int
    lines: tuple[str, ...]
    barge_in_ms: tuple[int | None, ...]

    @property
    def turns(self) -> int:
        return len(self.lines)


@dataclass(frozen=True, slots=True)
class Workload:
    caller: CallerSpec
    stt: SttSpec
    llm: LlmSpec
    tts: TtsSpec
    barge_in: BargeInSpec
    load: LoadSpec
    measure: MeasureSpec
    source: str = ""

    def turns_for(self, n_calls: int, quick: bool = False) -> int:
        """Turns per call at ``n_calls`` concurrent calls (enough samples at N=1)."""
        if n_calls < 1:
            raise ValueError("n_calls must be >= 1")
        need = self.load.min_turn_samples_quick if quick else self.load.min_turn_samples
        return max(self.load.turns_per_call, math.ceil(need / n_calls))

    def stagger_ms(self, n_calls: int) -> int:
        if n_calls <= 1:
            return 0
        return min(self.load.start_stagger_ms, self.load.ramp_max_ms // (n_calls - 1))

    def plan(self, index: int, n_calls: int, quick: bool = False) -> CallPlan:
        """The plan of call ``index`` (0-based) among ``n_calls``."""
        turns = self.turns_for(n_calls, quick)
        lines = self.caller.lines
        said = tuple(lines[(index + k) % len(lines)] for k in range(turns))
        b = self.barge_in
        offset = 0 if n_calls <= 1 else round(b.spread_ms * (index % n_calls) / (n_calls - 1))
        barge: list[int | None] = []
        for k in range(1, turns + 1):  # 1-based turn numbers
            hit = b.first > 0 and k >= b.first and (k - b.first) % b.every == 0 and k < turns
            barge.append(b.after_ms + offset if hit else None)
        return CallPlan(index=index, start_ms=index * self.stagger_ms(n_calls), lines=said,
                        barge_in_ms=tuple(barge))


def bot_audio(sample_rate: int, ms: int) -> np.ndarray:
    """The bot's answer: ``ms`` of int16 speech-like audio (two harmonic tones
    under a 4 Hz syllable envelope, never below -40 dBFS so every 20 ms frame
    of it is recognisably non-silent at the client). Deterministic."""
    n = sample_rate * ms // 1000
    t = np.arange(n, dtype=np.float64) / sample_rate
    tone = 0.6 * np.sin(2 * np.pi * 220.0 * t) + 0.3 * np.sin(2 * np.pi * 660.0 * t)
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t) ** 2
    return np.round(tone * envelope * 0.5 * 32767.0).astype(np.int16)


# --- parsing ------------------------------------------------------------------------

_TABLES: dict[str, type] = {
    "caller": CallerSpec,
    "stt": SttSpec,
    "llm": LlmSpec,
    "tts": TtsSpec,
    "barge_in": BargeInSpec,
    "load": LoadSpec,
    "measure": MeasureSpec,
}


def _coerce(where: str, want: Any, value: Any) -> Any:
    if want in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkloadError(f"{where}: expected an integer, got {value!r}")
        if value < 0:
            raise WorkloadError(f"{where}: must be >= 0, got {value}")
        return value
    if want in ("float", float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WorkloadError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if want in ("str", str):
        if not isinstance(value, str) or not value.strip():
            raise WorkloadError(f"{where}: expected a non-empty string, got {value!r}")
        return value
    if want == "tuple[str, ...]":
        if not isinstance(value, list) or not value:
            raise WorkloadError(f"{where}: expected a non-empty list of strings")
        return tuple(_coerce(f"{where}[{i}]", str, v) for i, v in enumerate(value))
    if want == "tuple[int, ...]":
        if not isinstance(value, list) or not value:
            raise WorkloadError(f"{where}: expected a non-empty list of integers")
        out = tuple(_coerce(f"{where}[{i}]", int, v) for i, v in enumerate(value))
        if any(v < 1 for v in out):
            raise WorkloadError(f"{where}: call counts must be >= 1")
        return out
    raise AssertionError(f"unhandled field type {want!r}")  # pragma: no cover


def _table(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise WorkloadError(f"[{name}]: missing or not a table")
    known = {f.name: f.type for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise WorkloadError(f"[{name}]: unknown key(s) {', '.join(unknown)}")
    missing = sorted(set(known) - set(raw))
    if missing:
        raise WorkloadError(f"[{name}]: missing key(s) {', '.join(missing)}")
    return cls(**{k: _coerce(f"{name}.{k}", t, raw[k]) for k, t in known.items()})


def parse(text: str, source: str = "<string>") -> Workload:
    """Parse and validate a workload from TOML text."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise WorkloadError(f"{source}: {e}") from None
    unknown = sorted(set(doc) - set(_TABLES))
    if unknown:
        raise WorkloadError(f"{source}: unknown table(s) {', '.join(unknown)}")
    parts = {name: _table(name, cls, doc.get(name)) for name, cls in _TABLES.items()}
    wl = Workload(**parts, source=source)
    _check(wl)
    return wl


def _check(wl: Workload) -> None:
    if wl.tts.chunk_ms < FRAME_MS or wl.tts.chunk_ms % FRAME_MS:
        raise WorkloadError(f"tts.chunk_ms: must be a multiple of {FRAME_MS}")
    if wl.tts.answer_ms < wl.tts.chunk_ms:
        raise WorkloadError("tts.answer_ms: shorter than one chunk")
    if wl.barge_in.first and wl.barge_in.every < 1:
        raise WorkloadError("barge_in.every: must be >= 1 when barge-ins are on")
    if wl.barge_in.first and wl.barge_in.after_ms + wl.barge_in.spread_ms >= wl.tts.answer_ms:
        raise WorkloadError("barge_in: after_ms + spread_ms must fall inside the answer")
    if wl.load.turns_per_call < 1:
        raise WorkloadError("load.turns_per_call: must be >= 1")
    if not 20 <= wl.caller.words_per_minute <= 600:
        raise WorkloadError("caller.words_per_minute: out of range 20..600")
    if not -40.0 <= wl.caller.peak_dbfs <= 0.0:
        raise WorkloadError("caller.peak_dbfs: out of range -40..0")


def load(path: str | Path | None = None) -> Workload:
    """Load ``bench/workload.toml`` (or ``path``)."""
    p = Path(path) if path else DEFAULT_PATH
    return parse(p.read_text(), source=str(p))
