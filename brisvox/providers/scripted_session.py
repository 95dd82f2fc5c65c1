"""The event queue of scripted provider sessions, and an STT that answers from a line script.

Owns two pieces the scripted providers and the simulation share (``brisvox/sim``
imports them from here; production code never imports the simulation):

* :class:`EventQueue`: one session's events for its one consumer, in order
  (every scripted and fake session's ``events()``).
* :class:`ScriptedLinesStt` and its :class:`ScriptedSttSession`: the answer
  to a Finalize that follows speech is the next line of the script, the
  speech gated by energy (a peak above 400), so it works through G.711 and
  resampling where the word codec's exact sample values do not survive. The
  STT of the agent process's ``[agents] providers = "scripted"`` (the daemon
  system tests); the session is also the base of
  :class:`brisvox.providers.scripted_speech.ScriptedSttStream`.

Invariants: nothing is yielded after a closing event; a closed session
refuses audio and Finalize with ``ProviderError("closed")``.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from brisvox.providers.base import ProviderError, SttClosed, SttConfig, SttEvent, Transcript


class EventQueue:
    """A session's events for its one consumer, in order; the iterator ends after a
    closing event. The consumer parks on a bare future that ``push`` resolves (no
    Event waiter list): the scripted speech providers use it for every 20 ms TTS
    chunk of every call under load."""

    __slots__ = ("_q", "_closing", "_waiter", "closed")

    def __init__(self, closing: tuple[type, ...]) -> None:
        self._q: deque[Any] = deque()
        self._closing = closing
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def push(self, ev: Any) -> None:
        if self.closed:
            return
        self._q.append(ev)
        if isinstance(ev, self._closing):
            self.closed = True
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def iterate(self) -> AsyncIterator[Any]:
        q = self._q
        while True:
            while q:
                ev = q.popleft()
                yield ev
                if isinstance(ev, self._closing):
                    return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = fut
            try:
                await fut
            finally:
                if self._waiter is fut:
                    self._waiter = None


# --- an STT scripted by lines (real audio paths: daemon system tests) ---------------


class ScriptedSttSession:
    """Transcribes by script: the answer to a Finalize that follows speech is the
    next line of the script (energy-gated, so it works through G.711 and
    resampling where the sim codec's exact sample values do not survive)."""

    def __init__(self, prov: ScriptedLinesStt) -> None:
        self.prov = prov
        self.events_q = EventQueue((SttClosed,))
        self.speech = 0  # speech samples since the last finalize
        self.closed = False

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        x = np.frombuffer(pcm, dtype=np.int16)
        if len(x) and int(np.abs(x.astype(np.int32)).max()) > 400:
            self.speech += len(x)

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        text = ""
        if self.speech >= 1600 and self.prov.lines:
            text = self.prov.lines.popleft()
        self.speech = 0
        delay = self.prov.rng.uniform(0.06, 0.18)

        def fire() -> None:
            if not self.closed:
                self.events_q.push(Transcript(text, is_final=True, speech_final=True, from_finalize=True))

        asyncio.get_running_loop().call_later(delay, fire)

    def events(self) -> AsyncIterator[SttEvent]:
        return self.events_q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if not self.closed:
            self.closed = True
            self.events_q.push(SttClosed(""))


class ScriptedLinesStt:
    name = "scripted-stt"

    def __init__(self, lines: list[str], seed: int = 1) -> None:
        self.lines = deque(lines)
        self.rng = random.Random(seed)

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: SttConfig, timeout: float) -> ScriptedSttSession:  # noqa: ASYNC109
        await asyncio.sleep(0.01)
        return ScriptedSttSession(self)
