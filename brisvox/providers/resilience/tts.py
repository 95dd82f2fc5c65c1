"""ResilientTts: a TtsProvider whose sessions re-speak unheard utterances and refresh when idle.

Invariants:

* ``connect`` is one operation of :mod:`.core`. The session it returns
  forwards the stage's text, flushes and cancels to the provider session.
  Its ``events()`` is a generator that runs in the CONSUMER'S task (the
  stage's reader): it iterates the current provider session's events itself
  and hands them on in order, as they arrive, with no hop through another
  task (50 audio events a second per call); events of a cancelled utterance
  other than its ``TtsCancelled`` are dropped. When a provider session's
  events end, the generator handles the end right there: after ``close`` it
  yields ``TtsClosed("")`` (exactly once) and ends; when the session was
  replaced (an idle refresh's swap) it goes on with the new one; otherwise
  it runs the recovery (below) in the consumer's task and goes on with the
  new session, or yields ``TtsClosed(why)`` and ends when it fails. One
  relay task is left, for the idle refresh only.
* Ending a wait: a failed send, a swap and ``close`` end the consumer's wait
  on the provider session at once (the generator cancels the consumer's
  task at that one await and takes the cancellation back, the pattern of
  ``asyncio.timeout``; a cancellation from outside still propagates), so no
  recovery waits for a dead or hung session's events to end. ``close`` also
  ends a wait for a recovery's connect.
* Side events (a ``TtsCancelled`` the wrapper answers itself: a cancel
  during a recovery, after a failed send or after the death) go into a side
  queue that the generator drains before it (re)enters a provider session's
  events and after each of their events. One is never pushed while the
  consumer waits on a live session: during a recovery the consumer is inside
  it; a failed send ended the wait (or the consumer, not waiting, sees the
  failure before its next wait); after the death the consumer is ending.
* Each open utterance keeps its text (at most ``tts_max_text`` characters,
  ``tts_max_utterances`` utterances). When the provider session dies (its
  events end, a send fails or hangs), and every open utterance is unheard
  (no audio and no word timing yet) and kept whole, a new session is
  connected (the other leg first, paid, under the attempt timeout; or the
  idle refresh's standby when one is ready) and the open utterances are
  re-spoken there: their text, and their flush when the stage had sent it.
  The stage sees nothing but the audio arriving later. When an open
  utterance was partly heard (or not kept whole) the session fails as
  before: its events end with ``TtsClosed`` and the stage marks the open
  utterances lost (resuming exactly would need word timings that may lag
  the audio).
* Cancelled ids: the last ``cancelled_memory`` (64) are remembered, and text
  or flushes that arrive for them later are dropped, so a cancelled
  utterance never re-opens (it would be re-spoken by the next recovery after
  the stage was told it was cancelled, and block the idle refresh).
* Idle refresh (the relay task): a session with nothing in flight for
  ``idle_refresh`` (80 %) of its provider's ``idle_limit()`` connects a new
  session of the same leg in the background; it is swapped in while nothing
  is in flight and no recovery runs (a refresh that completes during an
  utterance waits as a standby until the utterance ends) and the old one is
  closed in the background. Nothing is in flight at the swap, so nothing is
  heard; the next turn never pays a connect.
* Stage calls never wait for a recovery: during one, text and flushes are
  only recorded (and go out with the re-speak).
* Breaker verdicts: a connect (probation for a probe); the first event
  (other than a ``TtsCancelled`` or one of a cancelled utterance) proves a
  session healthy; a death before that and before ``healthy_after`` counts
  as a failure of its leg.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    connect_with,
)

_RECOVERING = object()  # what the consumer waits on during a recovery's connect


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
                 config: ResilienceConfig | None = None,
                 own: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})) -> None:
        res = resilience or DEFAULT
        self.cfg = config or res.config
        self.legs: Legs[TtsProvider] = Legs("tts", primary, secondary, pkey or primary.name,
                                            skey or (secondary.name if secondary else ""), res, self.cfg,
                                            own)
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
        i, inner = await self.legs.connect(connect_with(config), timeout)
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
        self._side: deque[TtsEvent] = deque()  # events of the wrapper's own, for the consumer
        self._ended = False  # the consumer was handed the last event (a TtsClosed)
        self._consumer: asyncio.Task[object] | None = None  # the task iterating events()
        self._waiting: object = None  # what the consumer waits on: a provider session, _RECOVERING
        self._kicked = False  # the consumer's task was cancelled to end that wait
        self._cancel_base = 0  # the consumer task's cancelling() count when it started iterating
        self._bg: set[asyncio.Task[None]] = set()  # background closes (referenced until done)
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
            self._side_push(TtsCancelled(context))
        self._became_idle()

    def events(self) -> AsyncIterator[TtsEvent]:
        """The session's events, in order, iterated in the caller's task. Called once."""
        return self._events()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            return
        self.closed = True
        self._kick(None)  # the consumer ends now (yields TtsClosed("")), even during a recovery
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

    async def _push(self, context: int, u: _Utt, timeout: float) -> None:  # noqa: ASYNC109
        """Send what the current session has not seen of ``u`` (never waits for a recovery)."""
        if self.recovering or self._failed or self.inner is None or self.closed:
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
                    if not self._kick(inner) and self._waiting is inner:
                        # a cancellation from outside is under way (it ends the wait); close the
                        # session anyway, so that its events end whatever the consumer does
                        self._background(close_quietly(inner, self.cfg.close_timeout), "tts-close-failed")

    def _became_idle(self) -> None:
        if not self.utts and self.idle_since is None:
            self.idle_since = self.clock.now()
            self._wake.set()

    def _side_push(self, ev: TtsEvent) -> None:
        if self._ended:
            return
        # the consumer never waits on a live session with a side event pending (module doc)
        assert self._waiting is None or self._waiting is _RECOVERING or self._kicked or self._outside_cancel(), \
            "a side event while the consumer waits on a live session"
        self._side.append(ev)

    def _background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    # -- ending the consumer's wait ----------------------------------------------------
    def _kick(self, on: object) -> bool:
        """End the consumer's wait on ``on`` (None: on anything): cancel its task at that
        one await; the generator takes the cancellation back (:meth:`_unkick`). Not when a
        cancellation from outside is under way (it ends the wait itself). True: kicked."""
        t = self._consumer
        w = self._waiting
        if t is None or w is None or (on is not None and w is not on):
            return False
        if self._kicked:
            return True
        if t is asyncio.current_task() or t.done() or self._outside_cancel():
            return False
        self._kicked = True
        t.cancel()
        return True

    def _outside_cancel(self) -> bool:
        t = self._consumer
        return t is not None and t.cancelling() > self._cancel_base + self._kicked

    def _unkick(self) -> None:
        """Take a kick's cancellation back; a cancellation from outside as well propagates."""
        self._kicked = False
        t = self._consumer
        assert t is not None
        if t.uncancel() > self._cancel_base:
            raise asyncio.CancelledError

    # -- the consumer's task ---------------------------------------------------------
    async def _events(self) -> AsyncIterator[TtsEvent]:
        if self._ended:
            return
        task = asyncio.current_task()
        assert task is not None
        self._consumer = task
        self._cancel_base = task.cancelling()
        side = self._side
        try:
            while True:
                while side:
                    yield side.popleft()
                if self.closed:
                    break
                inner = self.inner
                why = self._failed or "closed"  # no session: a recovery was cut short (cancelled)
                if inner is not None:
                    why = ""
                    it = inner.events().__aiter__()
                    try:
                        while not (self.closed or self._failed or inner is not self.inner):
                            self._waiting = inner
                            try:
                                ev = await it.__anext__()
                            except StopAsyncIteration:
                                why = "ended"
                                break
                            except (ProviderError, OSError) as e:
                                why = type(e).__name__
                                break
                            except asyncio.CancelledError:
                                if not self._kicked:
                                    raise
                                self._unkick()
                                break
                            finally:
                                self._waiting = None
                            if self._kicked:  # the session swallowed the kick
                                self._unkick()
                                break
                            if isinstance(ev, TtsClosed):
                                why = ev.error or "closed"
                                break
                            out = self._filter(ev)
                            if out is not None:
                                yield out
                            while side:
                                yield side.popleft()
                    finally:
                        aclose = getattr(it, "aclose", None)
                        if aclose is not None:
                            try:
                                await aclose()
                            except (ProviderError, OSError, RuntimeError):
                                pass
                    if self.closed:
                        break
                    if self.inner is not None and inner is not self.inner:
                        continue  # swapped by the refresh: go on with the new session
                why = self._failed or why
                if await self._recover(why):
                    continue
                if self.closed:
                    break
                self.dead = True
                self._wake.set()  # the relay ends
                while side:
                    yield side.popleft()
                self._ended = True
                yield TtsClosed(why)
                return
            while side:
                yield side.popleft()
            self._ended = True
            yield TtsClosed("")
        finally:
            self._waiting = None
            if self._consumer is task:
                self._consumer = None

    def _filter(self, ev: TtsEvent) -> TtsEvent | None:
        """The bookkeeping of one provider event; the event to hand on, or None (dropped)."""
        if isinstance(ev, TtsCancelled):
            return ev
        ctx = getattr(ev, "context", None)
        if ctx in self._cancelled_set:
            return None
        if not self._healthy:
            self._healthy = True
            self.legs.legs[self.leg].breaker.healthy()
        if isinstance(ev, (TtsAudio, TtsWord)):
            u = self.utts.get(ev.context)
            if u is not None:
                u.started = True
        elif isinstance(ev, TtsFlushed):
            self.utts.pop(ev.context, None)
            self._became_idle()
        return ev

    # -- the relay task: the idle refresh ------------------------------------------------
    def _live(self) -> bool:
        return self.inner is not None and not self.recovering and not self._failed and not self.dead

    async def _relay(self) -> None:
        wake = self._wake
        while not self.closed and not self.dead:
            if self._standby is not None and not self.utts and self._live():
                self._swap()
                continue
            due = self._refresh_due()
            if due is not None and self.clock.now() >= due:
                self._refresh = asyncio.get_running_loop().create_task(self._refresh_main(), name="tts-refresh")
                continue
            wake.clear()
            try:
                async with asyncio.timeout_at(due):  # the loop's clock, as the injected one
                    await wake.wait()
            except TimeoutError:
                pass

    def _refresh_due(self) -> float | None:
        frac = self.cfg.idle_refresh
        if frac <= 0 or self.idle_since is None or self._standby is not None or not self._live():
            return None
        if self._refresh is not None and not self._refresh.done():
            return None
        limit = self.legs.legs[self.leg].provider.idle_limit()
        return None if limit is None else self.idle_since + frac * limit

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
            self._kick(old)  # the consumer goes on with the new session at once
            self._background(close_quietly(old, self.cfg.close_timeout), "tts-close-old")

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
                session = await leg.provider.connect(leg.configure(self.config), self.cfg.attempt_timeout)
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

    # -- the recovery (in the consumer's task) ---------------------------------------------
    async def _recover(self, why: str) -> bool:
        legs = self.legs
        if any(u.started or not u.kept for u in self.utts.values()):
            return False  # partly heard: the stage marks it lost
        leg = legs.legs[self.leg]
        if not self._healthy and self.clock.now() - self._since < self.cfg.healthy_after:
            leg.breaker.failure()
            legs.count_leg(leg, "failures")
        self.recovering = True
        try:
            old, self.inner = self.inner, None
            if old is not None:
                await close_quietly(old, self.cfg.close_timeout)
            if self.closed:
                return False
            if self._standby is not None:
                (i, inner), self._standby = self._standby, None
            else:
                self._waiting = _RECOVERING  # close() ends this wait
                try:
                    i, inner = await legs.connect(connect_with(self.config), None, failed=self.leg)
                except ProviderError:
                    legs.count("recovery_failures")
                    return False
                except asyncio.CancelledError:
                    if not self._kicked:
                        raise
                    self._unkick()
                    return False
                finally:
                    self._waiting = None
                if self._kicked:
                    self._unkick()
                if self.closed:
                    await close_quietly(inner, self.cfg.close_timeout)
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
        self._wake.set()  # the relay looks again (a standby, the refresh's due time)
        legs.count("recoveries")
        legs.count("respoken", len(self.utts))
        for ctx, u in list(self.utts.items()):
            await self._push(ctx, u, self.cfg.attempt_timeout)
        return True
