"""ResilientTts: a TtsProvider whose sessions re-speak unheard utterances and refresh when idle.

Invariants:

* ``connect`` is one operation of :mod:`.core`. The session it returns
  forwards the stage's text, flushes and cancels to the provider session;
  its reader hands the provider's events on in order, as they arrive (no hop
  through another task: 50 audio events a second per call), and ONE relay
  task handles the session's end, recoveries and the idle refresh; events of
  a cancelled utterance other than its ``TtsCancelled`` are dropped.
* Each open utterance keeps its text (at most ``tts_max_text`` characters,
  ``tts_max_utterances`` utterances). When the provider session dies (its
  events end, a send fails or hangs), and every open utterance is unheard
  (no audio and no word timing yet) and kept whole, the relay connects a new
  session (the other leg first, paid, under the attempt timeout) and
  re-speaks them there: their text, and their flush when the stage had sent
  it. The stage sees nothing but the audio arriving later. When an open
  utterance was partly heard (or not kept whole) the session fails as
  before: its events end with ``TtsClosed`` and the stage marks the open
  utterances lost (resuming exactly would need word timings that may lag
  the audio).
* Cancelled ids: the last ``cancelled_memory`` (64) are remembered, and text
  or flushes that arrive for them later are dropped, so a cancelled
  utterance never re-opens (it would be re-spoken by the next recovery after
  the stage was told it was cancelled, and block the idle refresh).
* Idle refresh: a session with nothing in flight for ``idle_refresh`` (80 %)
  of its provider's ``idle_limit()`` connects a new session of the same leg
  in the background; it is swapped in while nothing is in flight (a refresh
  that completes during an utterance waits as a standby until the utterance
  ends) and the old one is closed. Nothing is in flight at the swap, so
  nothing is heard; the next turn never pays a connect.
* Stage calls never wait for a recovery: during one, text and flushes are
  only recorded (and go out with the re-speak).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from brisvox.providers.base import (
    ProviderError,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsEvent,
    TtsFlushed,
    TtsProvider,
    TtsSession,
    TtsWord,
)
from brisvox.providers.resilience.core import (
    DEFAULT,
    PROBE,
    SKIP,
    STOP,
    Legs,
    Resilience,
    ResilienceConfig,
    as_provider_error,
    close_quietly,
)
from brisvox.providers.scripted_session import EventQueue

_SWAP = "\x00swap"


@dataclass(slots=True)
class _Utt:
    history: list[str] = field(default_factory=list)  # every text (for a re-speak)
    pending: list[str] = field(default_factory=list)  # not yet sent to the current session
    size: int = 0
    kept: bool = True  # the history is whole (within the bounds)
    opened: bool = False  # the current session has seen its first text
    flushed: bool = False
    flush_sent: bool = False
    started: bool = False  # audio or a word timing came: partly heard


class ResilientTts:
    """One call's TTS (its budget and counters); ``stats()`` reads the counters."""

    def __init__(self, primary: TtsProvider, secondary: TtsProvider | None = None, pkey: str = "",
                 skey: str = "", *, resilience: Resilience | None = None,
                 config: ResilienceConfig | None = None) -> None:
        res = resilience or DEFAULT
        self.cfg = config or res.config
        self.legs: Legs[TtsProvider] = Legs("tts", primary, secondary, pkey or primary.name,
                                            skey or (secondary.name if secondary else ""), res, self.cfg)
        self.name = primary.name if secondary is None else f"{primary.name}+{secondary.name}"
        self.primary = primary
        self.secondary = secondary
        self.sessions: list[ResilientTtsSession] = []

    def idle_limit(self) -> float | None:
        known = [x for x in (leg.provider.idle_limit() for leg in self.legs.legs) if x is not None]
        return min(known) if known else None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.legs.warm(timeout)

    async def connect(self, config: TtsConfig, timeout: float) -> ResilientTtsSession:  # noqa: ASYNC109
        i, inner = await self.legs.connect(lambda p, t: p.connect(config, t), timeout)
        s = ResilientTtsSession(self, config, i, inner)
        self.sessions = [x for x in self.sessions if not x.closed][-3:] + [s]
        return s

    def stats(self) -> dict[str, int]:
        return self.legs.st.as_dict()


class ResilientTtsSession:
    def __init__(self, owner: ResilientTts, config: TtsConfig, leg: int, inner: TtsSession) -> None:
        self.owner = owner
        self.config = config
        self.cfg = owner.cfg
        self.legs = owner.legs
        self.clock = owner.legs.clock
        self.leg = leg
        self.inner: TtsSession | None = inner
        self.sample_rate = inner.sample_rate
        self.utts: dict[int, _Utt] = {}
        self.cancelled: deque[int] = deque()
        self._cancelled_set: set[int] = set()
        self.closed = False
        self.dead = False
        self.recovering = False
        self._failed: str = ""  # a send to the current session failed
        self._out = EventQueue((TtsClosed,))
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._healthy = False
        self._since = self.clock.now()
        self.idle_since: float | None = self._since
        self._standby: tuple[int, TtsSession] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._task = asyncio.get_running_loop().create_task(self._relay(), name="tts-resilience")

    # -- the stage's side ------------------------------------------------------------
    def _utt(self, context: int) -> _Utt:
        u = self.utts.get(context)
        if u is None:
            u = self.utts[context] = _Utt(kept=len(self.utts) < self.cfg.tts_max_utterances)
            self.idle_since = None
        return u

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed or self.dead:
            raise ProviderError("closed")
        if context in self._cancelled_set:
            self.legs.count("late_dropped")
            return
        u = self._utt(context)
        u.pending.append(text)
        u.size += len(text)
        if u.kept:
            if u.size <= self.cfg.tts_max_text:
                u.history.append(text)
            else:
                u.kept, u.history = False, []
        await self._push(context, u, timeout)

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed or self.dead:
            raise ProviderError("closed")
        if context in self._cancelled_set:
            self.legs.count("late_dropped")
            return
        u = self._utt(context)
        u.flushed = True
        await self._push(context, u, timeout)

    def cancel(self, context: int) -> None:
        if context not in self._cancelled_set:
            self.cancelled.append(context)
            self._cancelled_set.add(context)
            if len(self.cancelled) > self.cfg.cancelled_memory:
                self._cancelled_set.discard(self.cancelled.popleft())
        self.utts.pop(context, None)
        inner = self.inner
        if inner is not None and not self.recovering and not self._failed and not self.dead:
            inner.cancel(context)  # answered by the provider's TtsCancelled
        elif not self.closed:
            self._out.push(TtsCancelled(context))
        self._became_idle()

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._out.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            return
        self.closed = True
        self._wake.set()
        for t in (self._task, self._refresh):
            if t is not None and not t.done():
                t.cancel()
                await asyncio.wait([t], timeout=timeout)
        to = min(timeout, self.cfg.close_timeout)
        if self._standby is not None:
            await close_quietly(self._standby[1], to)
            self._standby = None
        if self.inner is not None:
            await close_quietly(self.inner, to)
        self._out.push(TtsClosed(""))

    async def _push(self, context: int, u: _Utt, timeout: float) -> None:  # noqa: ASYNC109
        """Send what the current session has not seen of ``u`` (never waits for a recovery)."""
        if self.recovering or self._failed or self.inner is None:
            return
        inner = self.inner
        async with self._lock:
            if inner is not self.inner or self.recovering or self._failed or context in self._cancelled_set:
                return
            try:
                async with self.clock.timeout(timeout * 0.75):
                    while u.pending:
                        await inner.send_text(context, u.pending[0], continue_=u.opened, timeout=timeout)
                        u.opened = True
                        u.pending.pop(0)
                    if u.flushed and not u.flush_sent:
                        await inner.flush(context, timeout)
                        u.flush_sent = True
            except (ProviderError, TimeoutError, OSError):
                if inner is self.inner:
                    self._failed = "send"
                    self._wake.set()

    def _became_idle(self) -> None:
        if not self.utts and self.idle_since is None:
            self.idle_since = self.clock.now()
            self._wake.set()

    # -- the relay task --------------------------------------------------------------
    async def _relay(self) -> None:
        while True:
            why = await self._drive()
            if self.closed:
                return
            if why == _SWAP:
                continue
            if not await self._recover(why):
                self.dead = True
                self._out.push(TtsClosed(why))
                return

    def _refresh_due(self) -> float | None:
        frac = self.cfg.idle_refresh
        if frac <= 0 or self.idle_since is None or self._standby is not None:
            return None
        if self._refresh is not None and not self._refresh.done():
            return None
        limit = self.legs.legs[self.leg].provider.idle_limit()
        return None if limit is None else self.idle_since + frac * limit

    async def _drive(self) -> str:
        inner = self.inner
        assert inner is not None
        evq: deque[TtsEvent] = deque()
        wake = self._wake

        async def read() -> None:
            try:
                async for ev in inner.events():
                    if isinstance(ev, TtsClosed):
                        evq.append(ev)
                        wake.set()
                        return
                    self._on_event(ev)  # in order, without a hop through the relay (the hot path)
            except (ProviderError, OSError) as e:
                evq.append(TtsClosed(type(e).__name__))
            else:
                evq.append(TtsClosed("ended"))
            wake.set()

        reader = asyncio.get_running_loop().create_task(read(), name="tts-resilience-reader")
        try:
            while True:
                while evq:
                    ev = evq.popleft()
                    if isinstance(ev, TtsClosed):
                        return ev.error or "closed"
                    self._on_event(ev)
                if self.closed:
                    return ""
                if self._failed:
                    return self._failed
                if self._standby is not None and not self.utts:
                    self._swap()
                    return _SWAP
                due = self._refresh_due()
                if due is not None and self.clock.now() >= due:
                    self._refresh = asyncio.get_running_loop().create_task(self._refresh_main(),
                                                                           name="tts-refresh")
                    continue
                if evq:
                    continue
                wake.clear()
                try:
                    async with asyncio.timeout_at(due):  # the loop's clock, as the injected one
                        await wake.wait()
                except TimeoutError:
                    pass
        finally:
            reader.cancel()
            await asyncio.wait([reader], timeout=0.5)

    def _on_event(self, ev: TtsEvent) -> None:
        ctx = getattr(ev, "context", None)
        if isinstance(ev, TtsCancelled):
            self._out.push(ev)
            return
        if ctx in self._cancelled_set:
            return
        if not self._healthy:
            self._healthy = True
            self.legs.legs[self.leg].breaker.healthy()
        if isinstance(ev, TtsAudio | TtsWord):
            u = self.utts.get(ev.context)
            if u is not None:
                u.started = True
        elif isinstance(ev, TtsFlushed):
            self.utts.pop(ev.context, None)
            self._out.push(ev)
            self._became_idle()
            return
        self._out.push(ev)

    def _swap(self) -> None:
        assert self._standby is not None
        old = self.inner
        self.leg, self.inner = self._standby
        self._standby = None
        self.sample_rate = self.inner.sample_rate
        self._healthy = False
        self._since = self.idle_since = self.clock.now()
        self.legs.count("refreshes")
        if old is not None:
            asyncio.get_running_loop().create_task(close_quietly(old, self.cfg.close_timeout), name="tts-close-old")

    async def _refresh_main(self) -> None:
        legs = self.legs
        leg = legs.legs[self.leg]
        adm = legs.admit(self.leg, paid=False)
        if adm in (SKIP, STOP):
            self.idle_since = self.clock.now()
            return
        i = self.leg
        try:
            async with self.clock.timeout(self.cfg.attempt_timeout):
                session = await leg.provider.connect(self.config, self.cfg.attempt_timeout)
        except asyncio.CancelledError:
            if adm == PROBE:
                leg.breaker.release()
            raise
        except (ProviderError, TimeoutError, OSError) as e:
            if as_provider_error(e).kind != "bad_request":
                leg.breaker.failure()
            legs.count("refresh_failures")
            self.idle_since = self.clock.now()  # try again one period later
            self._wake.set()
            return
        leg.breaker.connected(adm == PROBE)
        if self.closed:
            await close_quietly(session, self.cfg.close_timeout)
            return
        self._standby = (i, session)
        self._wake.set()

    async def _recover(self, why: str) -> bool:
        legs = self.legs
        if any(u.started or not u.kept for u in self.utts.values()):
            return False  # partly heard: the stage marks it lost
        leg = legs.legs[self.leg]
        if not self._healthy and self.clock.now() - self._since < self.cfg.healthy_after:
            leg.breaker.failure()
            legs.count("failures")
        self.recovering = True
        try:
            old, self.inner = self.inner, None
            if old is not None:
                await close_quietly(old, self.cfg.close_timeout)
            if self._standby is not None:
                (i, inner), self._standby = self._standby, None
            else:
                try:
                    i, inner = await legs.connect(lambda p, t: p.connect(self.config, t), None, failed=self.leg)
                except ProviderError:
                    legs.count("recovery_failures")
                    return False
            self.leg, self.inner = i, inner
            self.sample_rate = inner.sample_rate
            self._failed = ""
            self._healthy = False
            self._since = self.clock.now()
            for u in self.utts.values():
                u.opened, u.flush_sent, u.pending = False, False, list(u.history)
        finally:
            self.recovering = False
        legs.count("recoveries")
        legs.count("respoken", len(self.utts))
        for ctx, u in list(self.utts.items()):
            await self._push(ctx, u, self.cfg.attempt_timeout)
        return True
