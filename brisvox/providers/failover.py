"""Failover to an agent leg's ``secondary`` provider, with a process-wide circuit breaker per leg.

Owns the part of the resilience layer (recover from a provider's failure in
place or on a secondary provider) the registry wires for an agent's
``[stt|llm|tts].secondary``:

* :class:`Breaker`: consecutive failures of a leg across ALL calls of the
  process open it after ``threshold`` (5) for ``open_for`` (30 s); then one
  probe is let through (half-open); a probe that succeeds closes it on
  probation (one failure re-opens it at once), a success resets it. A probe
  that ends without a verdict (cancelled by a barge-in or a hang-up, or its
  stream closed before the first event) releases its permit, so the next
  caller probes; a probe never wedges the breaker half-open.
  Request errors (``bad_request``: HTTP 400/404/413/422) and cancellations
  are not counted and never fail over: the secondary would refuse the same
  request.
* LLM: a request that fails BEFORE any content (an LlmError or a
  ProviderError as the first event, or no event within
  ``first_event_timeout``) is re-issued once to the other leg; after content
  nothing is retried (the caller may have heard it).
* STT / TTS: ``connect`` tries the primary within ``attempt_timeout`` and
  then the secondary with what is left of the caller's timeout; a leg whose
  breaker is open is skipped for free.
* ``warm`` warms both legs (failures counted, never raised for the
  secondary).

Not here (the resilience layer's remaining parts): replaying the open
utterance's audio into a new STT session, re-speaking unheard TTS
utterances, the idle refresh of a TTS socket. The stages' own reconnect
rules cover those deaths (the STT stage answers the open Finalizes and
reconnects; the TTS stage marks the open utterances lost and reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import (
    LlmError,
    LlmEvent,
    LlmProvider,
    LlmRequest,
    ProviderError,
    SttConfig,
    SttProvider,
    SttSession,
    TtsConfig,
    TtsProvider,
    TtsSession,
)

STATS: Counter[str] = Counter()
NOT_COUNTED = {"bad_request"}


class Breaker:
    """Times are read from ``clock`` (the running loop's: virtual in the simulator)."""

    def __init__(self, threshold: int = 5, open_for: float = 30.0, clock: Clock = CLOCK) -> None:
        self.clock = clock
        self.threshold = threshold
        self.open_for = open_for
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    def allow(self, now: float | None = None) -> bool:
        now = self.clock.now() if now is None else now
        if self.opened_at is None:
            return True
        if now - self.opened_at < self.open_for or self.probing:
            return False
        self.probing = True  # half-open: this caller is the probe
        return True

    def release(self) -> None:
        """The probe ended without a verdict: the breaker stays open and the next caller probes."""
        self.probing = False

    def success(self) -> None:
        if self.probing:  # closed on probation: the next failure re-opens at once
            self.failures = self.threshold - 1
        else:
            self.failures = 0
        self.opened_at = None
        self.probing = False

    def failure(self, now: float | None = None) -> None:
        now = self.clock.now() if now is None else now
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = now
            self.probing = False

    @property
    def state(self) -> str:
        return "closed" if self.opened_at is None else ("half_open" if self.probing else "open")


BREAKERS: dict[str, Breaker] = {}


def breaker(key: str) -> Breaker:
    b = BREAKERS.get(key)
    if b is None:
        b = BREAKERS[key] = Breaker()
    return b


def leg_key(leg: Any) -> str:
    return f"{leg.provider}|{leg.base_url}|{leg.model}|{leg.voice}"


class _Legs:
    def __init__(self, stage: str, primary: Any, secondary: Any, pkey: str, skey: str) -> None:
        self.stage = stage
        self.legs = [(primary, breaker(f"{stage}:{pkey}")), (secondary, breaker(f"{stage}:{skey}"))]
        self.name = f"{primary.name}+{secondary.name}"

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        async def one(p: Any, i: int) -> None:
            try:
                await p.warm(timeout)
            except (ProviderError, TimeoutError, OSError):
                STATS[f"{self.stage}.warm_failures"] += 1
                if i == 0:
                    raise

        results = await asyncio.gather(*(one(p, i) for i, (p, _) in enumerate(self.legs)), return_exceptions=True)
        if isinstance(results[0], BaseException):
            raise results[0]

    def admit(self, i: int, tried: int) -> tuple[bool, bool]:
        """May leg ``i`` be tried now, and is this attempt its breaker's half-open probe?
        (The breaker is asked only here, at the attempt.) The last leg is tried when nothing
        else was, whatever its breaker says."""
        _, b = self.legs[i]
        probe = b.opened_at is not None and not b.probing
        if b.allow():
            return True, probe
        if i == len(self.legs) - 1 and tried == 0:
            STATS[f"{self.stage}.all_open"] += 1
            return True, False
        STATS[f"{self.stage}.skipped_open"] += 1
        return False, False


C = TypeVar("C", SttConfig, TtsConfig)
S = TypeVar("S", SttSession, TtsSession)


class _SessionLegs(_Legs, Generic[C, S]):
    """STT / TTS: a session from the first leg that connects (see :func:`_connect`)."""

    def __init__(self, stage: str, primary: Any, secondary: Any, pkey: str, skey: str,
                 attempt_timeout: float) -> None:
        super().__init__(stage, primary, secondary, pkey, skey)
        self.attempt_timeout = attempt_timeout

    async def connect(self, config: C, timeout: float) -> S:  # noqa: ASYNC109
        s: S = await _connect(self, lambda p, t: p.connect(config, t), timeout, self.attempt_timeout)
        return s


class FailoverStt(_SessionLegs[SttConfig, SttSession]):
    def __init__(self, primary: SttProvider, secondary: SttProvider, pkey: str, skey: str,
                 attempt_timeout: float = 2.0) -> None:
        super().__init__("stt", primary, secondary, pkey, skey, attempt_timeout)


class FailoverTts(_SessionLegs[TtsConfig, TtsSession]):
    def __init__(self, primary: TtsProvider, secondary: TtsProvider, pkey: str, skey: str,
                 attempt_timeout: float = 2.0) -> None:
        super().__init__("tts", primary, secondary, pkey, skey, attempt_timeout)

    def idle_limit(self) -> float | None:
        limits = [p.idle_limit() for p, _ in self.legs]
        known = [x for x in limits if x is not None]
        return min(known) if known else None


async def _connect(legs: _Legs, fn: Any, timeout: float, attempt: float) -> Any:  # noqa: ASYNC109
    clock = CLOCK
    deadline = clock.now() + timeout
    last: ProviderError | None = None
    tried = 0
    n = len(legs.legs)
    for i, (p, b) in enumerate(legs.legs):
        allowed, probe = legs.admit(i, tried)
        if not allowed:
            continue
        tried += 1
        left = deadline - clock.now()
        if left <= 0:
            if probe:
                b.release()
            break
        t = min(left, attempt) if i < n - 1 else left
        try:
            async with asyncio.timeout(t):
                got = await fn(p, t)
        except asyncio.CancelledError:
            if probe:
                b.release()
            raise
        except (ProviderError, TimeoutError, OSError) as e:
            err = e if isinstance(e, ProviderError) else ProviderError("timeout" if isinstance(e, TimeoutError)
                                                                       else "connect", str(e)[:200])
            if err.kind not in NOT_COUNTED:
                b.failure()
            elif probe:  # a bad request says nothing of the leg: the next caller probes
                b.release()
            STATS[f"{legs.stage}.failures"] += 1
            last = err
            if i < n - 1:
                STATS[f"{legs.stage}.failovers"] += 1
            continue
        b.success()
        return got
    raise last or ProviderError("timeout", f"{legs.stage}: no leg connected in {timeout:g}s")


class FailoverLlm(_Legs):
    def __init__(self, primary: LlmProvider, secondary: LlmProvider, pkey: str, skey: str,
                 first_event_timeout: float = 4.0) -> None:
        super().__init__("llm", primary, secondary, pkey, skey)
        self.first_event_timeout = first_event_timeout

    def stream(self, request: LlmRequest) -> _FailoverStream:
        return _FailoverStream(self, request)


class _FailoverStream:
    def __init__(self, owner: FailoverLlm, request: LlmRequest) -> None:
        self.owner = owner
        self.request = request
        self._i = -1
        self._tried = 0
        self._cur: Any = None
        self._breaker: Breaker | None = None
        self._probe = False  # this stream holds its breaker's half-open permit, no verdict yet
        self._content = False
        self._closed = False

    def __aiter__(self) -> AsyncIterator[LlmEvent]:
        return self

    def _open_next(self) -> bool:
        legs = self.owner.legs
        while self._i + 1 < len(legs):
            self._i += 1
            allowed, self._probe = self.owner.admit(self._i, self._tried)
            if allowed:
                self._tried += 1
                p, self._breaker = legs[self._i]
                self._cur = p.stream(self.request)
                return True
        return False

    async def __anext__(self) -> LlmEvent:
        if self._closed:
            raise StopAsyncIteration
        if self._content:
            ev: LlmEvent = await self._cur.__anext__()
            return ev
        while True:
            if self._cur is None and not self._open_next():
                self._closed = True
                return LlmError("connect", "no LLM leg could be tried")
            last = self._i == len(self.owner.legs) - 1
            try:
                if last:
                    ev = await self._cur.__anext__()
                else:
                    async with asyncio.timeout(self.owner.first_event_timeout):
                        ev = await self._cur.__anext__()
            except StopAsyncIteration:
                ev = LlmError("truncated", "empty stream")
            except TimeoutError:
                ev = LlmError("timeout", "no first event in time")
            except ProviderError as e:
                ev = LlmError(e.kind, e.detail, e.retryable)
            except asyncio.CancelledError:
                self._release_probe()
                raise
            assert self._breaker is not None
            probe, self._probe = self._probe, False  # a verdict follows, but for a request error
            if isinstance(ev, LlmError):
                if ev.kind in NOT_COUNTED:
                    if probe:  # a bad request says nothing of the leg: the next caller probes
                        self._breaker.release()
                    self._closed = True  # the stream ends after an error
                    return ev
                self._breaker.failure()
                STATS["llm.failures"] += 1
                if last:
                    self._closed = True
                    return ev
                STATS["llm.failovers"] += 1
                with contextlib.suppress(Exception):
                    await self._cur.aclose()
                self._cur = None
                continue
            self._breaker.success()
            self._content = True
            return ev

    def _release_probe(self) -> None:
        if self._probe and self._breaker is not None:
            self._breaker.release()
        self._probe = False

    async def aclose(self) -> None:
        self._release_probe()  # closed before the first event: the probe gave no verdict
        self._closed = True
        if self._cur is not None:
            with contextlib.suppress(Exception):
                await self._cur.aclose()


def wrap(stage: str, primary: Any, secondary: Any, pkey: str, skey: str) -> Any:
    if stage == "stt":
        return FailoverStt(primary, secondary, pkey, skey)
    if stage == "tts":
        return FailoverTts(primary, secondary, pkey, skey)
    return FailoverLlm(primary, secondary, pkey, skey)
