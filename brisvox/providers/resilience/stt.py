"""ResilientStt: an SttProvider whose sessions survive a death mid-call.

Invariants:

* ``connect`` is one operation of :mod:`.core` (primary, then the secondary
  or the primary again). The session it returns is a relay. While the relay
  task waits with nothing queued, the stage's audio goes straight to the
  provider session (the hot path: 50 chunks a second per call, no hop
  through another task); during a recovery or a replay, or behind a queued
  Finalize, audio and Finalizes are queued and the ONE relay task sends them
  in order. The provider's events are handed on unchanged and in order as
  they arrive; the relay task handles the session's end and the recovery.
* The window: the relay keeps the audio sent since the last final segment
  plus the ``stt_replay_tail`` (1 s) before it, at most ``stt_replay``
  (4 s, whole chunks: about 128 KiB at 16 kHz). The tail is there because
  providers send a final segment hundreds of ms after the audio it covers;
  cutting the window at the final would lose the words of that lag on a
  recovery (a word at the edge may be transcribed twice instead). A
  ``speech_final`` segment (the provider saw the utterance end, a Finalize's
  answer among them) empties it.
* A session that dies (its events end, a send fails or hangs past the
  attempt timeout) is recovered in place: a new session from the other leg
  first (the failed leg last), each attempt paid and under the attempt
  timeout; the window is replayed into it, then the Finalizes the dead
  session still owed the stage are sent again. So the stage's Finalize
  accounting stays exact: every Finalize it sent is answered exactly once
  and no answer it did not ask for reaches it (the relay sends no Finalize of
  its own: one in the middle of an utterance would split a word). Audio that
  arrives during the recovery queues behind the replay.
* A recovery that fails (no leg, no token) ends the session's events with
  ``SttClosed``: the stage's own rules take over (synthetic answers, its
  reconnect). ``close`` by the stage never recovers.
* Breaker verdicts: a connect (probation for a probe); the first transcript
  or ``healthy_after`` alive proves the session healthy; a death before that
  counts as a failure of its leg.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

from brisvox.providers.base import (
    ProviderError,
    SttClosed,
    SttConfig,
    SttEvent,
    SttProvider,
    SttSession,
    Transcript,
)
from brisvox.providers.resilience.core import (
    DEFAULT,
    Legs,
    Resilience,
    ResilienceConfig,
    close_quietly,
    connect_with,
)
from brisvox.providers.scripted_session import EventQueue

_FINALIZE = object()


class AudioWindow:
    """The rolling replay window, in whole chunks (``(pcm, span)``; span: in16 positions or None)."""

    def __init__(self, rate: int, max_s: float, tail_s: float) -> None:
        self.rate = rate
        self.max = int(max_s * rate)
        self.tail = int(tail_s * rate)
        self.chunks: deque[tuple[int, bytes, tuple[int, int] | None]] = deque()  # (start sample, pcm, span)
        self.pos = 0  # samples ever added
        self.samples = 0  # samples held

    def add(self, pcm: bytes, span: tuple[int, int] | None = None) -> None:
        n = len(pcm) // 2
        self.chunks.append((self.pos, pcm, span))
        self.pos += n
        self.samples += n
        while self.samples > self.max and self.chunks:
            self._drop()

    def _drop(self) -> None:
        _, pcm, _ = self.chunks.popleft()
        self.samples -= len(pcm) // 2

    def final_segment(self) -> None:
        """A final segment arrived: keep only the tail before the audio sent so far."""
        cut = self.pos - self.tail
        while self.chunks and self.chunks[0][0] + len(self.chunks[0][1]) // 2 <= cut:
            self._drop()

    def clear(self) -> None:
        self.chunks.clear()
        self.samples = 0

    @property
    def ms(self) -> int:
        return self.samples * 1000 // self.rate if self.rate else 0


class ResilientStt:
    """One call's STT (its budget and counters); ``stats()`` reads the counters."""

    def __init__(self, primary: SttProvider, secondary: SttProvider | None = None, pkey: str = "",
                 skey: str = "", *, resilience: Resilience | None = None,
                 config: ResilienceConfig | None = None,
                 own: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})) -> None:
        res = resilience or DEFAULT
        self.cfg = config or res.config
        self.legs: Legs[SttProvider] = Legs("stt", primary, secondary, pkey or primary.name,
                                            skey or (secondary.name if secondary else ""), res, self.cfg,
                                            own)
        self.name = primary.name if secondary is None else f"{primary.name}+{secondary.name}"
        self.primary = primary
        self.secondary = secondary
        self.sessions: list[ResilientSttSession] = []  # the call's relays (tests read them)
        batch = getattr(primary, "audio_batch", None)
        if batch:
            self.audio_batch = batch

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.legs.warm(timeout)

    async def connect(self, config: SttConfig, timeout: float) -> ResilientSttSession:  # noqa: ASYNC109
        i, inner = await self.legs.connect(connect_with(config), timeout)
        cls = SpanRelay if hasattr(inner, "note_span") else ResilientSttSession
        s = cls(self, config, i, inner)
        self.sessions = [x for x in self.sessions if not x.closed][-3:] + [s]
        return s

    def stats(self) -> dict[str, int]:
        return self.legs.st.as_dict()


class ResilientSttSession:
    def __init__(self, owner: ResilientStt, config: SttConfig, leg: int, inner: SttSession) -> None:
        self.owner = owner
        self.config = config
        self.cfg = owner.cfg
        self.legs = owner.legs
        self.clock = owner.legs.clock
        self.leg = leg
        self.inner = inner
        self.window = AudioWindow(config.sample_rate, self.cfg.stt_replay, self.cfg.stt_replay_tail)
        self.owed = 0  # Finalizes the current provider session has not answered yet
        self.closed = False  # closed by the stage
        self.dead = False  # recovery failed: the events ended
        self.recovering = False
        self._in: deque[Any] = deque()  # (pcm, span) | _FINALIZE
        self._span: tuple[int, int] | None = None
        self._out = EventQueue((SttClosed,))
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._replay = False
        self._idle = False  # the relay waits with nothing queued: audio may go straight out
        self._failed = ""  # a direct send to the current session failed
        self._healthy = False
        self._since = self.clock.now()
        self._task = asyncio.get_running_loop().create_task(self._relay(), name="stt-resilience")

    # -- the stage's side ------------------------------------------------------------
    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed or self.dead:
            raise ProviderError("closed")
        span, self._span = self._span, None
        if self._idle and not self._in:
            # the hot path (50 chunks a second per call): the relay waits with nothing queued, so
            # send straight to the provider session; a failure wakes the relay to recover, and
            # the chunk is in the window already, so the recovery replays it
            inner = self.inner
            self.window.add(pcm, span)
            self._note_span(inner, span)
            try:
                await inner.send_audio(pcm, min(timeout, self.cfg.attempt_timeout))
            except (ProviderError, TimeoutError, OSError):
                if inner is self.inner and not self._failed:
                    self._failed = "send"
                    self._wake.set()
            return
        if len(self._in) >= self.cfg.stt_max_queued:
            if self.recovering:
                self.legs.count("audio_dropped")
                return
            self._drained.clear()
            try:
                async with self.clock.timeout(timeout):
                    await self._drained.wait()
            except TimeoutError:
                raise ProviderError("timeout", "stt relay backed up") from None
        self._in.append((pcm, span))
        self._wake.set()

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed or self.dead:
            raise ProviderError("closed")
        self._in.append(_FINALIZE)
        self._wake.set()

    def events(self) -> AsyncIterator[SttEvent]:
        return self._out.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            return
        self.closed = True
        self._wake.set()
        t = self._task
        if not t.done():
            t.cancel()
            await asyncio.wait([t], timeout=timeout)
        await close_quietly(self.inner, min(timeout, self.cfg.close_timeout))
        self._out.push(SttClosed(""))

    # -- the relay task --------------------------------------------------------------
    async def _relay(self) -> None:
        while True:
            why = await self._drive()
            if self.closed:
                return
            if not await self._recover(why):
                self.dead = True
                self._out.push(SttClosed(why))
                return

    async def _drive(self) -> str:
        inner = self.inner
        evq: deque[SttEvent] = deque()
        wake = self._wake

        async def read() -> None:
            try:
                async for ev in inner.events():
                    if isinstance(ev, SttClosed):
                        evq.append(ev)
                        wake.set()
                        return
                    self._on_event(ev)  # in order, without a hop through the relay
            except (ProviderError, OSError) as e:
                evq.append(SttClosed(type(e).__name__))
            else:
                evq.append(SttClosed("ended"))
            wake.set()

        reader = asyncio.get_running_loop().create_task(read(), name="stt-resilience-reader")
        send_to = self.cfg.attempt_timeout
        try:
            if self._replay:
                self._replay = False
                try:
                    async with self.clock.timeout(send_to):
                        for _, pcm, span in list(self.window.chunks):
                            self._note_span(inner, span)
                            await inner.send_audio(pcm, send_to)
                        for _ in range(self.owed):
                            await inner.finalize(send_to)
                except (ProviderError, TimeoutError, OSError):
                    return "replay"
            while True:
                while evq:
                    ev = evq.popleft()
                    if isinstance(ev, SttClosed):
                        return ev.error or "closed"
                    self._on_event(ev)
                if self.closed:
                    return ""
                if self._failed:
                    why, self._failed = self._failed, ""
                    return why
                try:
                    while self._in:
                        item = self._in.popleft()
                        async with self.clock.timeout(send_to):
                            if item is _FINALIZE:
                                self.owed += 1  # owed from now: a failed send is sent again after a recovery
                                await inner.finalize(send_to)
                            else:
                                pcm, span = item
                                self.window.add(pcm, span)
                                self._note_span(inner, span)
                                await inner.send_audio(pcm, send_to)
                        if evq:
                            break
                except (ProviderError, TimeoutError, OSError):
                    return "send"
                if not self._in:
                    self._drained.set()
                if evq or self._in or self.closed or self._failed:
                    continue
                wake.clear()
                self._idle = True
                try:
                    await wake.wait()
                finally:
                    self._idle = False
        finally:
            reader.cancel()
            await asyncio.wait([reader], timeout=0.5)

    @staticmethod
    def _note_span(inner: Any, span: tuple[int, int] | None) -> None:
        if span is not None:
            note = getattr(inner, "note_span", None)
            if note is not None:
                note(*span)

    def _on_event(self, ev: SttEvent) -> None:
        assert isinstance(ev, Transcript)
        if not self._healthy:
            self._healthy = True
            self.legs.legs[self.leg].breaker.healthy()
        if ev.speech_final:
            if ev.from_finalize and self.owed > 0:
                self.owed -= 1
            self.window.clear()
        elif ev.is_final:
            self.window.final_segment()
        self._out.push(ev)

    async def _recover(self, why: str) -> bool:
        legs = self.legs
        leg = legs.legs[self.leg]
        if not self._healthy and self.clock.now() - self._since < self.cfg.healthy_after:
            leg.breaker.failure()
            legs.count_leg(leg, "failures")
        self.recovering = True
        try:
            await close_quietly(self.inner, self.cfg.close_timeout)
            try:
                i, inner = await legs.connect(connect_with(self.config), None, failed=self.leg)
            except ProviderError:
                legs.count("recovery_failures")
                return False
        finally:
            self.recovering = False
        legs.count("recoveries")
        legs.count("replayed_ms", self.window.ms)
        self.leg, self.inner = i, inner
        self._healthy = False
        self._since = self.clock.now()
        self._replay = True
        return True


class SpanRelay(ResilientSttSession):
    """The relay of a session that reads caller audio itself (an ``SttSpanSink``): the
    spans are queued with their audio and replayed with it."""

    def note_span(self, start: int, end: int) -> None:
        self._span = (start, end)
