"""The simulation's STT: it transcribes the words the received audio really carries.

Owns :class:`FakeStt`, implementing ``brisvox/providers/base.py`` exactly as
a real adapter must, so the pipeline under test is the production one: it
decodes the word codec (:mod:`brisvox.providers.word_codec`) of the audio it
received, an interim after each completed word (latency 80-200 ms), the
answer to each Finalize after 60-180 ms. Faults per session
(:class:`SttFault`): die after some seconds of audio, never answer a
Finalize, refuse connects. Its timing comes from one ``random.Random(seed)``.

The simulation's LLM and TTS (:class:`~brisvox.providers.seeded_fakes.FakeLlm`,
:class:`~brisvox.providers.seeded_fakes.FakeTts` and the script types) and
the line-scripted STT live in ``brisvox/providers`` (``seeded_fakes``,
``scripted_session``), because the agent process's ``[agents] providers =
"scripted"`` uses them too and production never imports ``brisvox.sim``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from brisvox.providers.base import ProviderError, SttClosed, SttConfig, SttEvent, Transcript
from brisvox.providers.scripted_session import EventQueue
from brisvox.providers.word_codec import Decoder, Vocab

# --- STT -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SttFault:
    die_after_audio: float | None = None  # seconds of audio, then the session dies
    hang_finalize: bool = False  # never answer a Finalize
    refuse_connect: bool = False
    final_delay: float | None = None  # answer every Finalize this late (default: 60-180 ms)


@dataclass(slots=True)
class SttProbe:
    sessions: int = 0
    connects: int = 0
    warms: int = 0
    finalizes: int = 0
    audio_samples: int = 0
    # (session, first audio sample index of a finalize) for ordering checks
    finalize_after_samples: list[int] = field(default_factory=list)


class FakeSttSession:
    def __init__(self, prov: FakeStt, index: int, fault: SttFault) -> None:
        self.prov = prov
        self.index = index
        self.fault = fault
        self.events_q = EventQueue((SttClosed,))
        self.dec = Decoder(prov.vocab)
        self.words: list[str] = []  # since the last final
        self.gen = 0
        self.samples = 0
        self.closed = False
        self._handles: list[asyncio.TimerHandle] = []

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        h = asyncio.get_running_loop().call_later(delay, fn)
        self._handles.append(h)
        if len(self._handles) > 64:
            self._handles = [x for x in self._handles if not x.cancelled()][-64:]

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        samples = np.frombuffer(pcm, dtype=np.int16)
        self.samples += len(samples)
        self.prov.probe.audio_samples += len(samples)
        fa = self.fault.die_after_audio
        if fa is not None and self.samples >= fa * 16000:
            self._die("died")
            return
        for w in self.dec.feed(samples):
            self.words.append(w)
            text = " ".join(self.words)
            gen = self.gen
            delay = self.prov.rng.uniform(0.08, 0.2)

            def fire(text: str = text, gen: int = gen) -> None:
                if gen == self.gen and not self.closed:
                    self.events_q.push(Transcript(text, is_final=False))

            self._later(delay, fire)

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self.prov.probe.finalizes += 1
        self.prov.probe.finalize_after_samples.append(self.prov.probe.audio_samples)
        if self.fault.hang_finalize:
            return
        words = list(self.words)
        p = self.dec.pending()
        if p is not None:
            words.append(p)
            self.dec.close_run()
        self.words = []
        self.gen += 1
        text = " ".join(words)
        delay = self.prov.rng.uniform(0.06, 0.18)
        if self.fault.final_delay is not None:
            delay = self.fault.final_delay

        def fire() -> None:
            if not self.closed:
                self.events_q.push(Transcript(text, is_final=True, speech_final=True, from_finalize=True))

        self._later(delay, fire)

    def _die(self, why: str) -> None:
        if not self.closed:
            self.closed = True
            for h in self._handles:
                h.cancel()
            self.events_q.push(SttClosed(why))

    def events(self) -> AsyncIterator[SttEvent]:
        return self.events_q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self._die("")


class FakeStt:
    name = "fake-stt"

    def __init__(self, vocab: Vocab, seed: int = 1, faults: list[SttFault] | None = None,
                 connect_delay: float = 0.05) -> None:
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.faults = list(faults or [])
        self.connect_delay = connect_delay
        self.probe = SttProbe()
        self.live: list[FakeSttSession] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        self.probe.warms += 1
        await asyncio.sleep(0.01)

    async def connect(self, config: SttConfig, timeout: float) -> FakeSttSession:  # noqa: ASYNC109
        self.probe.connects += 1
        fault = self.faults[self.probe.sessions] if self.probe.sessions < len(self.faults) else SttFault()
        await asyncio.sleep(self.connect_delay)
        if fault.refuse_connect:
            self.probe.sessions += 1
            raise ProviderError("connect", "refused")
        s = FakeSttSession(self, self.probe.sessions, fault)
        self.probe.sessions += 1
        self.live = [x for x in self.live if not x.closed] + [s]
        return s
