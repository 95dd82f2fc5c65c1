"""Scripted STT and TTS: timing-faithful STAND-INS for streaming speech services (no model, no key).

These are not speech recognition or synthesis. They reproduce the TIMING of
a streaming STT and a streaming TTS vendor, so the engine can be measured
under load (``configs/agents/bench.toml``, the load benchmark against Pipecat,
docs/BENCHMARKS.md)
with the real local VAD and Smart Turn in the workers and nothing else that
costs CPU. The scripted LLM is :class:`brisvox.providers.scripted_llm.ScriptedLlm`.

* :class:`ScriptedStt` (``provider = "scripted_stt"``): caller speech is
  gated by energy with the line-scripted STT's threshold
  (:class:`brisvox.providers.scripted_session.ScriptedSttSession`), per 20 ms window. While
  the caller speaks, an interim transcript (``text``) every ``interim_ms`` of
  speech, delivered ``interim_delay_ms`` after the window that completed it
  was spoken, as a streaming STT's interims are. It takes its audio in
  batches (``audio_batch``, 80 ms): the interims are timed from the audio's
  own end, so batching moves no transcript. An interim is the turn's final
  text, or with ``interim_lag_words`` = k that text less its last k words
  (a streaming STT whose partial lags its final by a word: what a
  speculative start on the partial then misses). Each ``finalize()`` is answered
  ``final_ms`` later by exactly one final (``text`` when speech came since
  the previous finalize, else empty).
  ``text`` may use ``{n}``, the number of the finalize.
* :class:`ScriptedTts` (``provider = "scripted_tts"``): one context per
  utterance; its first audio ``first_audio_ms`` after its first text, then
  exactly ``answer_ms`` of :func:`answer_tone` (whatever the text) in
  ``chunk_ms`` chunks at real time, kept ``lead_ms`` ahead of real time; word
  timings spread evenly over the answer once the context is flushed;
  ``TtsFlushed`` after the last chunk; ``cancel`` is immediate. Audio is
  produced at the rate the stage asks for (the tts ring's rate); the chunks
  are pushed by a loop timer callback (no task per context).
* :func:`read_timing`: the timing keys of a workload file (the format of
  ``bench/workload.toml``, whose parser ``bench/workload.py`` owns the schema;
  brisvox does not import ``bench``). Every provider option not given takes
  the value of :data:`DEFAULTS`, which equal ``bench/workload.toml``'s (a
  unit test holds them equal).

Time: every delay is a timer of the running loop, whose clock is the injected
one (virtual time in tests).
Invariants: exactly one final per finalize, in order; nothing of a context
follows its ``TtsCancelled``; every timer of a session ends at ``close``.
"""

from __future__ import annotations

import asyncio
import os
import tomllib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import (
    ProviderError,
    SttClosed,
    SttConfig,
    SttEvent,
    Transcript,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsEvent,
    TtsFlushed,
    TtsWord,
)
from brisvox.providers.scripted_session import EventQueue, ScriptedSttSession

MIN_SPEECH_SAMPLES = 1600  # 100 ms at 16 kHz of gated speech makes a turn's final non-empty
GATE_SAMPLES = 320  # the energy gate's window: 20 ms at 16 kHz
GATE_PEAK = 400  # a window whose peak |sample| exceeds this is speech (as in ScriptedSttSession)
AUDIO_BATCH_S = 0.08  # ScriptedStt.audio_batch: the actor flushes at most a worker tick (20 ms) later,
# so a batch is at most ~100 ms old: within interim_delay_ms, and every interim stays on time
MAX_TIMERS = 64


@dataclass(frozen=True, slots=True)
class ScriptedTiming:
    """Milliseconds, as in ``bench/workload.toml`` (``[stt]``, ``[llm]``, ``[tts]``)."""

    final_ms: int = 150  # [stt] final_after_finalize_ms
    first_token_ms: int = 300  # [llm] first_token_ms
    answer_text: str = "Sure, I can help with that. Let me check what we have available for you."
    first_audio_ms: int = 80  # [tts] first_audio_ms
    answer_ms: int = 2000  # [tts] answer_ms
    chunk_ms: int = 20  # [tts] chunk_ms
    lead_ms: int = 100  # [tts] lead_ms


DEFAULTS = ScriptedTiming()
_FILE_KEYS = {  # ScriptedTiming field -> (table, key) of a workload file
    "final_ms": ("stt", "final_after_finalize_ms"),
    "first_token_ms": ("llm", "first_token_ms"),
    "answer_text": ("llm", "answer_text"),
    "first_audio_ms": ("tts", "first_audio_ms"),
    "answer_ms": ("tts", "answer_ms"),
    "chunk_ms": ("tts", "chunk_ms"),
    "lead_ms": ("tts", "lead_ms"),
}


def timing_path(option: Any) -> Path | None:
    """The ``timing_file`` option with ``$VARS`` expanded; None when empty or naming an
    unset variable (then the options and :data:`DEFAULTS` apply)."""
    if not option:
        return None
    expanded = os.path.expandvars(str(option)).strip()
    if not expanded or "$" in expanded:
        return None
    return Path(expanded).expanduser()


def read_timing(path: str | os.PathLike[str]) -> ScriptedTiming:
    """The scripted timing of a workload file (raises ProviderError naming the key)."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ProviderError("bad_request", f"timing_file {p}: {e.strerror or e}", retryable=False) from None
    except tomllib.TOMLDecodeError as e:
        raise ProviderError("bad_request", f"timing_file {p}: {e}", retryable=False) from None
    got: dict[str, Any] = {}
    for name, (table, key) in _FILE_KEYS.items():
        value = doc.get(table, {}).get(key) if isinstance(doc.get(table), dict) else None
        if value is None:
            continue
        want = str if name == "answer_text" else int
        if type(value) is not want:
            raise ProviderError("bad_request", f"timing_file {p}: {table}.{key}: expected {want.__name__}",
                                retryable=False)
        got[name] = value
    return replace(DEFAULTS, **got)


def timing(options: Mapping[str, Any]) -> ScriptedTiming:
    """Timing for one provider leg: the file's (when ``timing_file`` names one), else the
    leg's own ``*_ms`` options over :data:`DEFAULTS`."""
    path = timing_path(options.get("timing_file"))
    if path is not None:
        return read_timing(path)
    names = {f.name for f in fields(ScriptedTiming)}
    return replace(DEFAULTS, **{k: v for k, v in options.items() if k in names})


@lru_cache(maxsize=8)
def _answer_chunks(rate: int, ms: int, chunk_ms: int) -> tuple[bytes, ...]:
    """:func:`answer_tone` cut in ``chunk_ms`` PCM16 chunks (computed once per rate)."""
    audio = answer_tone(rate, ms)
    step = max(1, rate * chunk_ms // 1000)
    return tuple(audio[i:i + step].tobytes() for i in range(0, len(audio), step))


def answer_tone(rate: int, ms: int) -> np.ndarray:
    """The scripted answer: ``ms`` of int16 speech-like audio (two harmonic tones under a
    4 Hz syllable envelope, never below -40 dBFS, so every 20 ms frame is non-silent at a
    client). The same signal as ``bench/workload.py``'s ``bot_audio``. Deterministic."""
    n = rate * ms // 1000
    t = np.arange(n, dtype=np.float64) / rate
    tone = 0.6 * np.sin(2 * np.pi * 220.0 * t) + 0.3 * np.sin(2 * np.pi * 660.0 * t)
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t) ** 2
    return np.round(tone * envelope * 0.5 * 32767.0).astype(np.int16)


# --- STT -------------------------------------------------------------------------------------


class _Timers:
    """The call_later handles of one session (bounded; all cancelled at close). The
    loop's own timers: the injected clock is the loop's (virtual time in tests)."""

    __slots__ = ("handles",)

    def __init__(self) -> None:
        self.handles: list[asyncio.TimerHandle] = []

    def later(self, delay: float, fn: Any) -> None:
        loop = asyncio.get_running_loop()
        self.handles.append(loop.call_later(max(0.0, delay), fn))
        if len(self.handles) > MAX_TIMERS:
            self.handles = [h for h in self.handles if not h.cancelled() and h.when() >= loop.time()]

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()
        self.handles.clear()


_WINDOWS: dict[int, tuple[np.ndarray, list[int]]] = {}


def _windows(n: int) -> tuple[np.ndarray, list[int]]:
    """The gate windows of an ``n``-sample chunk: their starts (for ``reduceat``) and
    ends (cached: a call's chunks come in a few sizes)."""
    hit = _WINDOWS.get(n)
    if hit is None:
        starts = np.arange(0, n, GATE_SAMPLES)
        hit = (starts, [min(s + GATE_SAMPLES, n) for s in starts.tolist()])
        if len(_WINDOWS) < 256:
            _WINDOWS[n] = hit
    return hit


class ScriptedSttStream(ScriptedSttSession):
    """One call's scripted STT session (the sim's energy gate, the workload's timing)."""

    def __init__(self, prov: ScriptedStt) -> None:
        super().__init__(prov)  # type: ignore[arg-type]  # only events_q/speech/closed are used
        self.events_q = EventQueue((SttClosed,))
        self.cfg = prov
        self.timers = _Timers()
        self.finalizes = 0
        self.next_interim = prov.interim_samples

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        """Count gated speech per ``GATE_SAMPLES`` window (the sim's threshold: a window
        whose peak exceeds ``GATE_PEAK`` is speech) and schedule an interim for every
        ``interim_ms`` of speech. The chunk's last sample is taken as "now" (the stage
        sends audio as soon as it is read, or in batches of at most ``audio_batch``), so
        an interim is due ``interim_delay_ms`` after the window that completed it was
        spoken, however the audio was batched."""
        if self.closed:
            raise ProviderError("closed")
        x = np.frombuffer(pcm, dtype=np.int16)
        n = len(x)
        if not n:
            return
        starts, ends = _windows(n)
        peaks_hi = np.maximum.reduceat(x, starts).tolist()
        peaks_lo = np.minimum.reduceat(x, starts).tolist()
        step = self.cfg.interim_samples
        prev = 0
        for hi, lo, end in zip(peaks_hi, peaks_lo, ends, strict=True):
            size = end - prev
            prev = end
            if hi <= GATE_PEAK and lo >= -GATE_PEAK:
                continue
            self.speech += size
            if step <= 0 or self.speech < self.next_interim:
                continue
            self.next_interim = (self.speech // step + 1) * step
            self._interim_later(self.cfg.interim_delay - (n - end) / 16000.0)

    def _interim_later(self, delay: float) -> None:
        text = self.cfg.interim_text(self.finalizes + 1)
        if not text:  # a lag of the whole text: no interim at all
            return

        def fire() -> None:
            if not self.closed:
                self.events_q.push(Transcript(text, is_final=False))

        self.timers.later(delay, fire)

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self.finalizes += 1
        text = self.cfg.text.format(n=self.finalizes) if self.speech >= MIN_SPEECH_SAMPLES else ""
        self.speech = 0
        self.next_interim = self.cfg.interim_samples

        def fire() -> None:
            if not self.closed:
                self.events_q.push(Transcript(text, is_final=True, speech_final=True, from_finalize=True))

        self.timers.later(self.cfg.final_delay, fire)

    def events(self) -> AsyncIterator[SttEvent]:
        return self.events_q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self.timers.cancel()
        await super().close(timeout)


class ScriptedStt:
    """``scripted_stt``: see the module docstring."""

    name = "scripted_stt"

    def __init__(self, *, final_ms: float = DEFAULTS.final_ms, interim_ms: float = 100.0,
                 interim_delay_ms: float = 100.0, text: str = "caller turn {n}", interim_lag_words: int = 0,
                 clock: Clock = CLOCK) -> None:
        if isinstance(interim_lag_words, bool) or not isinstance(interim_lag_words, int) or interim_lag_words < 0:
            raise ProviderError("bad_request", "scripted_stt: interim_lag_words must be an integer >= 0",
                                retryable=False)
        self.final_delay = final_ms / 1000.0
        self.interim_samples = int(16000 * interim_ms / 1000.0)
        self.interim_delay = interim_delay_ms / 1000.0
        self.text = text
        self.interim_lag_words = interim_lag_words
        self.clock = clock
        self.sessions = 0
        # the actor may hand this much caller audio over at once (it does not need every
        # tick's audio promptly: interims are timed from the audio's own positions)
        self.audio_batch = AUDIO_BATCH_S if self.interim_delay >= AUDIO_BATCH_S + 0.02 else 0.0

    def interim_text(self, n: int) -> str:
        """The interim of the ``n``-th turn: its final text less ``interim_lag_words`` words."""
        text = self.text.format(n=n)
        if not self.interim_lag_words:
            return text
        words = text.split()
        return " ".join(words[:max(0, len(words) - self.interim_lag_words)])

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: SttConfig, timeout: float) -> ScriptedSttStream:  # noqa: ASYNC109
        self.sessions += 1
        return ScriptedSttStream(self)


# --- TTS -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Context:
    words: list[str]
    timer: asyncio.TimerHandle | None = None  # the next delivery of audio (loop timer)
    t0: float = 0.0  # loop time of the first audio
    sent: int = 0  # chunks delivered
    flushed: bool = False
    audio_done: bool = False
    words_sent: bool = False


class ScriptedTtsStream:
    """One call's scripted TTS session."""

    def __init__(self, prov: ScriptedTts, rate: int) -> None:
        self.prov = prov
        self.sample_rate = rate
        self.events_q = EventQueue((TtsClosed,))
        self.closed = False
        self._ctx: dict[int, _Context] = {}
        self._chunks = _answer_chunks(rate, prov.answer_ms, prov.chunk_ms)

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        c = self._ctx.get(context)
        if c is None:
            c = self._ctx[context] = _Context([])
            c.timer = asyncio.get_running_loop().call_later(self.prov.first_audio, self._deliver, context, c)
        c.words.extend(text.split())

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        c = self._ctx.get(context)
        if c is None:  # nothing was said: nothing to play
            self.events_q.push(TtsFlushed(context))
            return
        c.flushed = True
        self._send_words(context, c)
        if c.audio_done:
            self._done(context)

    def cancel(self, context: int) -> None:
        c = self._ctx.pop(context, None)
        if c is not None and c.timer is not None:
            c.timer.cancel()
        if not self.closed:
            self.events_q.push(TtsCancelled(context))

    def events(self) -> AsyncIterator[TtsEvent]:
        return self.events_q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            return
        self.closed = True
        for c in self._ctx.values():
            if c.timer is not None:
                c.timer.cancel()
        self._ctx.clear()
        self.events_q.push(TtsClosed(""))

    def _send_words(self, context: int, c: _Context) -> None:
        if c.words_sent or not c.words:
            return
        c.words_sent = True
        span = self.prov.answer_ms / 1000.0 / len(c.words)
        for i, w in enumerate(c.words):
            self.events_q.push(TtsWord(context, w, i * span, (i + 1) * span))

    def _done(self, context: int) -> None:
        if self._ctx.pop(context, None) is not None:
            self.events_q.push(TtsFlushed(context))

    def _deliver(self, context: int, c: _Context) -> None:
        """Loop timer: push every chunk that is due (chunk ``i`` at ``t0 + i * chunk_ms -
        lead_ms``, ``t0`` = the first audio), then re-arm for the next one. A timer
        callback, not a task: one loop timer per chunk and no coroutine to resume."""
        c.timer = None
        if self.closed or self._ctx.get(context) is not c:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if c.sent == 0:
            c.t0 = now
        chunks = self._chunks
        chunk_s, lead = self.prov.chunk_ms / 1000.0, self.prov.lead
        push = self.events_q.push
        i = c.sent
        while i < len(chunks):
            due = c.t0 + i * chunk_s - lead
            if due > now:
                c.sent = i
                c.timer = loop.call_at(due, self._deliver, context, c)
                return
            push(TtsAudio(context, chunks[i]))
            i += 1
        c.sent = i
        c.audio_done = True
        if c.flushed:
            self._done(context)


class ScriptedTts:
    """``scripted_tts``: see the module docstring."""

    name = "scripted_tts"

    def __init__(self, *, first_audio_ms: float = DEFAULTS.first_audio_ms, answer_ms: int = DEFAULTS.answer_ms,
                 chunk_ms: int = DEFAULTS.chunk_ms, lead_ms: float = DEFAULTS.lead_ms, clock: Clock = CLOCK) -> None:
        if chunk_ms <= 0 or answer_ms < chunk_ms:
            raise ProviderError("bad_request", "scripted_tts: need 0 < chunk_ms <= answer_ms", retryable=False)
        self.first_audio = first_audio_ms / 1000.0
        self.answer_ms = int(answer_ms)
        self.chunk_ms = int(chunk_ms)
        self.lead = lead_ms / 1000.0
        self.clock = clock
        self.sessions = 0

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: TtsConfig, timeout: float) -> ScriptedTtsStream:  # noqa: ASYNC109
        self.sessions += 1
        rate = int(config.sample_rate) if config.sample_rate and config.sample_rate > 0 else 16000
        return ScriptedTtsStream(self, rate)
