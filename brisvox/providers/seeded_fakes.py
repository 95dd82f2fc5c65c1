"""Scripted LLM and TTS with realistic, seeded timing (the simulation's and ``providers = "scripted"``'s).

Owns two providers that implement ``brisvox/providers/base.py`` exactly as a
real adapter must, so the pipeline under test is the production one. The
simulation (``brisvox/sim/harness.py``) runs every call with them, and the
agent process's ``[agents] providers = "scripted"`` gives them to every call
(with :class:`brisvox.providers.scripted_session.ScriptedLinesStt`):

* :class:`FakeLlm`: a list of scripted :class:`LlmScript` responses (or
  callables building one from the request), consumed one per request; time
  to first token 250-500 ms, deltas every 20-50 ms; tool calls streamed as
  fragments; errors and stalls. Every request is recorded.
* :class:`FakeTts`: one context per utterance; first audio 80-160 ms after
  its first text, then audio at about 4x real time in 200 ms pieces, word
  timings, Flushed after the last piece, Cancelled on cancel. The audio is
  the word codec (:mod:`brisvox.providers.word_codec`), so a listener can
  decode exactly which words it heard. Faults: die after some seconds of
  audio, no word timings.

All timing comes from one ``random.Random(seed)`` per provider, so two runs
with the same seeds are identical.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from brisvox.providers.base import (
    Done,
    LlmError,
    LlmEvent,
    LlmRequest,
    ProviderError,
    TextDelta,
    ToolCallDelta,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsEvent,
    TtsFlushed,
    TtsWord,
    Usage,
)
from brisvox.providers.scripted_session import EventQueue
from brisvox.providers.word_codec import Vocab, encode, word_seconds

# --- LLM -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Say:
    text: str


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Fail:
    kind: str = "server"
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class Stall:
    seconds: float


@dataclass(frozen=True, slots=True)
class Crash:
    """The adapter raises an unexpected exception (a bug, not a ProviderError)."""


@dataclass(frozen=True, slots=True)
class LlmScript:
    """One response: steps in order. ``ttft`` overrides the seeded time to first token."""

    steps: tuple[Say | Call | Fail | Stall | Crash, ...]
    ttft: float | None = None


Responder = LlmScript | Callable[[LlmRequest], LlmScript]


@dataclass(slots=True)
class LlmProbe:
    warms: int = 0
    requests: list[LlmRequest] = field(default_factory=list)
    count: int = 0
    request_times: list[float] = field(default_factory=list)
    closed_early: int = 0


class FakeLlmStream:
    def __init__(self, prov: FakeLlm, script: LlmScript) -> None:
        self.prov = prov
        self.script = script
        self._gen: AsyncGenerator[LlmEvent, None] = self._run()
        self._closed = False

    async def _run(self) -> AsyncGenerator[LlmEvent, None]:
        rng = self.prov.rng
        ttft = self.script.ttft if self.script.ttft is not None else rng.uniform(0.25, 0.5)
        await asyncio.sleep(ttft)
        index = 0
        out_tokens = 0
        for step in self.script.steps:
            if isinstance(step, Stall):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, Crash):
                raise RuntimeError("scripted adapter bug")
            elif isinstance(step, Fail):
                yield LlmError(step.kind, "scripted failure", step.retryable)
                return
            elif isinstance(step, Say):
                words = step.text.split(" ")
                i = 0
                while i < len(words):
                    n = rng.randint(1, 3)
                    piece = " ".join(words[i : i + n])
                    if i + n < len(words):
                        piece += " "
                    i += n
                    out_tokens += 1
                    yield TextDelta(piece)
                    await asyncio.sleep(rng.uniform(0.02, 0.05))
            elif isinstance(step, Call):
                args = orjson.dumps(step.args).decode()
                cut = max(1, len(args) // 2)
                yield ToolCallDelta(index, id=f"call_{index}", name=step.name, arguments=args[:cut])
                await asyncio.sleep(rng.uniform(0.02, 0.05))
                yield ToolCallDelta(index, arguments=args[cut:])
                index += 1
        yield Usage(input_tokens=100, output_tokens=out_tokens)
        yield Done("tool_calls" if index else "stop")

    def __aiter__(self) -> FakeLlmStream:
        return self

    async def __anext__(self) -> LlmEvent:
        if self._closed:
            raise StopAsyncIteration
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.prov.probe.closed_early += 1
            await self._gen.aclose()


class FakeLlm:
    name = "fake-llm"

    def __init__(self, script: list[Responder], seed: int = 2, default: Responder | None = None) -> None:
        self.script = deque(script)
        self.default: Responder = default or LlmScript((Say("Okay."),))
        self.rng = random.Random(seed)
        self.probe = LlmProbe()

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        self.probe.warms += 1

    def stream(self, request: LlmRequest) -> FakeLlmStream:
        if len(self.probe.requests) >= 8:  # bounded: a long call keeps the recent ones
            del self.probe.requests[:4]
        self.probe.requests.append(request)
        self.probe.request_times.append(asyncio.get_running_loop().time())
        self.probe.count += 1
        r = self.script.popleft() if self.script else self.default
        script = r(request) if callable(r) else r
        return FakeLlmStream(self, script)


# --- TTS -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TtsFault:
    die_after_audio: float | None = None  # seconds of audio produced by the session
    no_words: bool = False
    refuse_connect: bool = False


@dataclass(slots=True)
class TtsProbe:
    warms: int = 0
    connects: int = 0
    sessions: int = 0
    contexts: int = 0
    cancels: int = 0
    texts: list[tuple[int, str]] = field(default_factory=list)


class FakeTtsSession:
    PIECE = 0.2  # seconds of audio per event
    SPEED = 4.0  # times real time

    def __init__(self, prov: FakeTts, fault: TtsFault, rate: int) -> None:
        self.prov = prov
        self.fault = fault
        self.sample_rate = rate
        self.events_q = EventQueue((TtsClosed,))
        self._work: deque[tuple[str, int, Any]] = deque()  # ("text", ctx, str) | ("flush", ctx, None)
        self._cancelled: set[int] = set()
        self._offsets: dict[int, int] = {}  # ctx -> samples produced
        self._parity: dict[int, int] = {}
        self._wake = asyncio.Event()
        self._produced = 0.0
        self.closed = False
        self._task = asyncio.get_running_loop().create_task(self._synth(), name="fake-tts")

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        if not continue_:
            self.prov.probe.contexts += 1
        texts = self.prov.probe.texts
        if len(texts) >= 4096:
            del texts[:2048]
        texts.append((context, text))
        self._work.append(("text", context, text))
        self._wake.set()

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self._work.append(("flush", context, None))
        self._wake.set()

    def cancel(self, context: int) -> None:
        if self.closed:
            return
        self.prov.probe.cancels += 1
        if len(self._cancelled) > 64:
            self._cancelled.clear()  # old contexts: their work was skipped long ago
        self._cancelled.add(context)
        self._offsets.pop(context, None)
        self._parity.pop(context, None)
        self.events_q.push(TtsCancelled(context))

    def events(self) -> AsyncIterator[TtsEvent]:
        return self.events_q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self._die("")

    def _die(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.events_q.push(TtsClosed(why))
        t = self._task
        if t is not asyncio.current_task():
            t.cancel()

    async def _synth(self) -> None:
        rng = self.prov.rng
        vocab = self.prov.vocab
        rate = self.sample_rate
        started: set[int] = set()
        while not self.closed:
            if not self._work:
                self._wake.clear()
                await self._wake.wait()
                continue
            kind, ctx, text = self._work.popleft()
            if ctx in self._cancelled:
                continue
            if kind == "flush":
                self.events_q.push(TtsFlushed(ctx))
                self._offsets.pop(ctx, None)
                self._parity.pop(ctx, None)
                started.discard(ctx)
                continue
            words = text.split()
            if not words:
                continue
            if ctx not in started:
                started.add(ctx)
                await asyncio.sleep(rng.uniform(0.08, 0.16))
            else:
                await asyncio.sleep(rng.uniform(0.01, 0.03))
            parity = self._parity.get(ctx, 0)
            samples, spans = encode(vocab, words, rate, parity)
            self._parity[ctx] = (parity + len(words)) % 2
            base = self._offsets.get(ctx, 0)
            if not self.fault.no_words:
                for sp in spans:
                    if ctx in self._cancelled or self.closed:
                        break
                    self.events_q.push(TtsWord(ctx, sp.word, (base + sp.start) / rate, (base + sp.end) / rate))
            piece = int(self.PIECE * rate)
            for a in range(0, len(samples), piece):
                if ctx in self._cancelled or self.closed:
                    break
                chunk = samples[a : a + piece]
                fa = self.fault.die_after_audio
                if fa is not None and self._produced + len(chunk) / rate > fa:
                    self._die("died")
                    return
                self._produced += len(chunk) / rate
                self.events_q.push(TtsAudio(ctx, chunk.tobytes()))
                self._offsets[ctx] = self._offsets.get(ctx, 0) + len(chunk)
                await asyncio.sleep(len(chunk) / rate / self.SPEED)


class FakeTts:
    name = "fake-tts"

    def __init__(self, vocab: Vocab, seed: int = 3, faults: list[TtsFault] | None = None, rate: int = 24000) -> None:
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.faults = list(faults or [])
        self.rate = rate
        self.probe = TtsProbe()

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        self.probe.warms += 1

    async def connect(self, config: TtsConfig, timeout: float) -> FakeTtsSession:  # noqa: ASYNC109
        self.probe.connects += 1
        fault = self.faults[self.probe.sessions] if self.probe.sessions < len(self.faults) else TtsFault()
        self.probe.sessions += 1
        await asyncio.sleep(0.05)
        if fault.refuse_connect:
            raise ProviderError("connect", "refused")
        return FakeTtsSession(self, fault, self.rate)


def speech_seconds(text: str) -> float:
    """How long the fake TTS takes to speak ``text``."""
    return sum(word_seconds(w) for w in text.split())
