"""The shared parts of the resilience layer: config, retry buckets, breakers, legs and attempts.

Owns the rules every resilient wrapper (STT, LLM, TTS) applies to an
operation (a connect, a request or a mid-call recovery):

* Legs: a primary and an optional secondary, each a provider instance, the
  process-wide :class:`Breaker` of its key and its own session settings
  (:attr:`VendorLeg.own`: the voice, model and language of that leg's agent-file
  table). A leg's connect always gets the call's session config with the leg's
  own settings in place (:meth:`VendorLeg.configure`): a secondary never
  receives the primary's voice or model. An operation tries the legs
  in order (:meth:`Legs.order`): a connect or request tries the primary,
  then the secondary; without a secondary it tries the primary twice (a
  single blip is recovered for every agent); a recovery tries the other leg
  first and the leg that just failed last (without a secondary: the primary
  once). A leg whose breaker refuses is skipped for free
  (``breaker_refusals``); when every leg refuses, the operation fails with
  ``ProviderError("unavailable")``.
* Budget: the first attempt of a connect or request is free; every further
  attempt and every attempt of a recovery takes one token from the call's
  bucket (3, one back per 20 s) AND the process bucket (50, one back per
  100 ms), both on the injected clock (:class:`Bucket`: a
  :class:`brisvox.runtime.retry.RetryBudget`). No token: the operation ends
  with its last error (``budget_refusals``). Attempts follow one another at
  once (no backoff); the only wait is a same-leg ``Retry-After``
  (:attr:`ResilienceConfig.retry`, a :class:`brisvox.runtime.retry.RetryPolicy`).
* Timeouts: an attempt that another attempt follows, and every recovery
  attempt, runs under ``attempt_timeout`` (2 s); the last attempt of a
  connect runs under what is left of the caller's timeout.
* Breaker (:class:`Breaker`): consecutive provider failures of a leg across
  all calls open it after ``threshold`` (5) for ``open_for`` (30 s); then one
  probe is let through (half-open) and every other attempt is refused. A
  probe that connected (STT, TTS) or produced a first event (LLM) closes it
  on probation: the count is set one short of the threshold, so other calls
  are admitted at once and the next failure re-opens it; a session or
  response proving healthy (a first event, 10 s alive, a Done) resets the
  count. A probe that ends without a verdict (cancelled, a request error,
  closed before its first event) releases its permit: the next caller probes.
* Request errors (``bad_request``: HTTP 400/404/413/422) and cancellations
  are never counted and never retried: another attempt would be refused the
  same way.

Counters: every wrapper has its own :class:`ResilienceStats` (one call) and
adds the same counts to the process-wide :data:`STATS` as ``<stage>.<name>``;
failures, request errors and retries also go to :data:`PROVIDER_STATS` by
(stage, provider of the leg, name): ``brisvox_provider_*_total`` on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import ProviderError
from brisvox.runtime.retry import RetryBudget, RetryPolicy

STATS: Counter[str] = Counter()
# per provider (the leg key's provider name): (stage, provider, "failures" | "retries" | "request_errors")
PROVIDER_STATS: Counter[tuple[str, str, str]] = Counter()
NOT_COUNTED = {"bad_request"}


@dataclass(frozen=True, slots=True)
class ResilienceConfig:
    """The layer's bounds (seconds unless named otherwise)."""

    attempt_timeout: float = 2.0
    llm_attempt_timeout: float = 4.0  # no first LLM event this long: fail over (only with a secondary)
    retry_after_max: float = 2.0  # the longest Retry-After waited on the same leg
    call_tokens: int = 3
    call_refill: float = 20.0
    process_tokens: int = 50
    process_refill: float = 0.1
    breaker_threshold: int = 5
    breaker_open_for: float = 30.0
    healthy_after: float = 10.0  # a session alive this long proved healthy without an event
    stt_replay: float = 4.0  # the STT window's bound
    stt_replay_tail: float = 1.0  # audio kept from before the last final segment
    stt_max_queued: int = 256  # audio chunks queued for the relay
    tts_max_text: int = 4096  # characters kept per utterance for a re-speak
    tts_max_utterances: int = 8  # open utterances kept for a re-speak
    cancelled_memory: int = 64
    idle_refresh: float = 0.8  # refresh an idle TTS session after this share of its idle_limit (0: never)
    close_timeout: float = 1.0

    @property
    def retry(self) -> RetryPolicy:
        """The timing of the layer's attempts: a re-issue or a failover goes at once (no
        backoff: the legs and the budget bound the attempts); a same-leg ``Retry-After`` is
        waited when at most ``retry_after_max``, else the operation gives up."""
        return RetryPolicy(base=0.0, multiplier=1.0, cap=0.0, retry_after_max=self.retry_after_max)


class Bucket:
    """``capacity`` tokens, one back every ``refill`` seconds of ``clock`` (the refill
    clock starts when a token is taken from a full bucket): a
    :class:`~brisvox.runtime.retry.RetryBudget` read on ``clock``."""

    def __init__(self, capacity: int, refill: float, clock: Clock = CLOCK) -> None:
        self.capacity = capacity
        self.refill = refill
        self.clock = clock
        self._budget = RetryBudget(capacity, refill)

    def level(self) -> int:
        """The tokens there are now."""
        return self._budget.level(self.clock.now())

    def available(self) -> bool:
        return self._budget.available(self.clock.now())

    def take(self) -> bool:
        return self._budget.take(self.clock.now())


class Budget:
    """A call's retry budget: its own bucket and the process bucket, taken together."""

    def __init__(self, call: Bucket, process: Bucket) -> None:
        self.call = call
        self.process = process

    def available(self) -> bool:
        return self.call.available() and self.process.available()

    def take(self) -> bool:
        if not self.available():
            return False
        self.call.take()
        self.process.take()
        return True


class Breaker:
    """Times are read from ``clock`` (the running loop's: virtual in the simulator)."""

    def __init__(self, threshold: int = 5, open_for: float = 30.0, clock: Clock = CLOCK) -> None:
        self.clock = clock
        self.threshold = threshold
        self.open_for = open_for
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False
        self._waiters: list[asyncio.Future[None]] = []

    async def wait_verdict(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait (at most ``timeout``) until the probe in flight has its verdict or is released."""
        if not self.probing:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

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
        self._wake()

    def success(self) -> None:
        """A verdict for the leg: a probe closes on probation (the next failure re-opens at
        once), any other success resets the count."""
        if self.probing:
            self.failures = self.threshold - 1
        else:
            self.failures = 0
        self.opened_at = None
        self.probing = False
        self._wake()

    def connected(self, probe: bool) -> None:
        """A session connected: a probe closes the breaker on probation; others change nothing
        (a session that dies before it proved healthy still counts)."""
        if probe:
            self.success()

    def healthy(self) -> None:
        if self.opened_at is None:
            self.failures = 0

    def failure(self, now: float | None = None) -> None:
        now = self.clock.now() if now is None else now
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = now
            self.probing = False
            self._wake()

    @property
    def state(self) -> str:
        return "closed" if self.opened_at is None else ("half_open" if self.probing else "open")


class Resilience:
    """The process-wide state: one breaker per leg key and the process retry bucket."""

    def __init__(self, config: ResilienceConfig | None = None, clock: Clock = CLOCK) -> None:
        self.config = config or ResilienceConfig()
        self.clock = clock
        self.breakers: dict[str, Breaker] = {}
        self.bucket = Bucket(self.config.process_tokens, self.config.process_refill, clock)

    def breaker(self, key: str) -> Breaker:
        b = self.breakers.get(key)
        if b is None:
            b = self.breakers[key] = Breaker(self.config.breaker_threshold, self.config.breaker_open_for, self.clock)
        return b

    def budget(self, config: ResilienceConfig) -> Budget:
        return Budget(Bucket(config.call_tokens, config.call_refill, self.clock), self.bucket)


DEFAULT = Resilience()


@dataclass(slots=True)
class ResilienceStats:
    """One wrapper's (one call's) counters; the same names as ``<stage>.<name>`` in STATS."""

    attempts: int = 0
    retries: int = 0  # attempts that took a token
    failures: int = 0
    failovers: int = 0
    request_errors: int = 0
    recoveries: int = 0
    recovery_failures: int = 0
    replayed_ms: int = 0
    respoken: int = 0
    refreshes: int = 0
    refresh_failures: int = 0
    budget_refusals: int = 0
    breaker_refusals: int = 0
    retry_after_waits: int = 0
    retry_after_giveups: int = 0
    late_dropped: int = 0
    audio_dropped: int = 0
    warm_failures: int = 0
    no_tools_answers: int = 0  # LLM: a request with tools answered "not now" after a failover to a tool-less leg

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


P = TypeVar("P")
T = TypeVar("T")
C = TypeVar("C")


@dataclass(slots=True)
class VendorLeg(Generic[P]):
    provider: P
    breaker: Breaker
    key: str
    own: Mapping[str, Any] = field(default_factory=dict)  # session-config fields this leg sets itself

    def configure(self, config: C) -> C:
        """The call's session config as this leg connects with it (its own fields replaced)."""
        return dataclasses.replace(config, **self.own) if self.own else config  # type: ignore[type-var]


OK, PROBE, SKIP, STOP = 0, 1, 2, 3


class Legs(Generic[P]):
    """One call's legs of one stage, its budget and its counters."""

    def __init__(self, stage: str, primary: P, secondary: P | None, pkey: str, skey: str,
                 resilience: Resilience, config: ResilienceConfig,
                 own: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})) -> None:
        self.stage = stage
        self.res = resilience
        self.cfg = config
        self.clock = resilience.clock
        self.legs: list[VendorLeg[P]] = [VendorLeg(primary, resilience.breaker(f"{stage}:{pkey}"), pkey,
                                                   dict(own[0]))]
        if secondary is not None:
            self.legs.append(VendorLeg(secondary, resilience.breaker(f"{stage}:{skey}"), skey, dict(own[1])))
        self.budget = resilience.budget(config)
        self.st = ResilienceStats()

    def count(self, name: str, n: int = 1) -> None:
        setattr(self.st, name, getattr(self.st, name) + n)
        STATS[f"{self.stage}.{name}"] += n

    def count_leg(self, leg: VendorLeg[P], name: str) -> None:
        """:meth:`count`, and the same per provider (:data:`PROVIDER_STATS`)."""
        self.count(name)
        PROVIDER_STATS[(self.stage, leg.key.split("|", 1)[0], name)] += 1

    def order(self, failed: int | None) -> list[int]:
        if failed is None:
            return [0, 1] if len(self.legs) == 2 else [0, 0]
        return [1 - failed, failed] if len(self.legs) == 2 else [0]

    async def admit_waiting(self, i: int, paid: bool) -> int:
        """:meth:`admit`, but an attempt refused only because another call's probe is in
        flight waits for that probe's verdict (at most ``attempt_timeout``) and asks again:
        a probe that connects lets the others in at once (probation). With a secondary
        there is no wait: the other leg is tried instead."""
        b = self.legs[i].breaker
        if len(self.legs) == 1 and b.probing and b.opened_at is not None:
            await b.wait_verdict(self.cfg.attempt_timeout)
        return self.admit(i, paid)

    def admit(self, i: int, paid: bool) -> int:
        """May an attempt on leg ``i`` start now? OK / PROBE (it holds the half-open
        permit) / SKIP (its breaker refuses) / STOP (no token for a paid attempt)."""
        if paid and not self.budget.available():
            self.count("budget_refusals")
            return STOP
        b = self.legs[i].breaker
        probe = b.opened_at is not None and not b.probing
        if not b.allow():
            self.count("breaker_refusals")
            STATS[f"{self.stage}.skipped_open"] += 1
            return SKIP
        if paid:
            self.budget.take()
            self.count_leg(self.legs[i], "retries")
        self.count("attempts")
        return PROBE if probe else OK

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        async def one(p: Any, i: int) -> None:
            try:
                await p.warm(timeout)
            except (ProviderError, TimeoutError, OSError):
                self.count("warm_failures")
                if i == 0:
                    raise

        results = await asyncio.gather(*(one(leg.provider, i) for i, leg in enumerate(self.legs)),
                                       return_exceptions=True)
        if isinstance(results[0], BaseException):
            raise results[0]

    async def connect(self, fn: Callable[[VendorLeg[P], float], Awaitable[T]],  # noqa: ASYNC109
                      timeout: float | None, failed: int | None = None) -> tuple[int, T]:
        """Run one connect (``failed`` None) or recovery (``failed`` = the leg that died):
        the first leg that connects, as (leg index, session). ``fn`` connects one leg
        (with :meth:`VendorLeg.configure` of the call's session config)."""
        clock = self.clock
        recovery = failed is not None
        deadline = None if timeout is None else clock.now() + timeout
        order = self.order(failed)
        last: ProviderError | None = None
        tried = 0
        for pos, i in enumerate(order):
            adm = await self.admit_waiting(i, paid=recovery or tried > 0)
            if adm == STOP:
                break
            if adm == SKIP:
                continue
            leg = self.legs[i]
            probe = adm == PROBE
            tried += 1
            if tried > 1:
                self.count("failovers")
            more = pos < len(order) - 1
            t = self.cfg.attempt_timeout if (recovery or more or deadline is None) else float("inf")
            if deadline is not None:
                t = min(t, deadline - clock.now())
            if t <= 0:
                if probe:
                    leg.breaker.release()
                break
            try:
                async with clock.timeout(t):
                    got = await fn(leg, t)
            except asyncio.CancelledError:
                if probe:
                    leg.breaker.release()
                raise
            except (ProviderError, TimeoutError, OSError) as e:
                err = as_provider_error(e)
                if err.kind in NOT_COUNTED:
                    if probe:
                        leg.breaker.release()
                    self.count_leg(leg, "request_errors")
                    raise err from None
                leg.breaker.failure()
                self.count_leg(leg, "failures")
                last = err
                continue
            leg.breaker.connected(probe)
            return i, got
        if last is None and tried == 0:
            STATS[f"{self.stage}.all_open"] += 1
            raise ProviderError("unavailable", f"{self.stage}: no leg may be tried now")
        raise last or ProviderError("timeout", f"{self.stage}: no leg connected in time")


def connect_with(config: Any) -> Callable[[VendorLeg[Any], float], Awaitable[Any]]:
    """A :meth:`Legs.connect` function: connect a leg with ``config`` and that leg's own settings."""
    return lambda leg, t: leg.provider.connect(leg.configure(config), t)


def as_provider_error(e: BaseException) -> ProviderError:
    if isinstance(e, ProviderError):
        return e
    if isinstance(e, TimeoutError):
        return ProviderError("timeout", "attempt timed out")
    return ProviderError("connect", str(e)[:200])


async def close_quietly(session: Any, timeout: float) -> None:  # noqa: ASYNC109
    """``session.close`` bounded by ``timeout``; never raises (a cancellation still propagates)."""
    try:
        async with asyncio.timeout(timeout):
            await session.close(timeout)
    except (TimeoutError, ProviderError, OSError):
        pass
    except Exception:  # noqa: BLE001 - a broken adapter's close must not break the relay
        pass


def leg_key(leg: Any) -> str:
    """The breaker key of an agent definition's provider leg."""
    return f"{leg.provider}|{leg.base_url}|{leg.model}|{leg.voice}"


def leg_own(stage: str, leg: Any) -> dict[str, Any]:
    """The session-config fields an agent definition's provider leg sets itself: an STT
    leg its model and language, a TTS leg its voice, model and language (an empty voice
    or model: the adapter's own default, never another leg's). An LLM leg's model and
    options live in its adapter: nothing to replace."""
    if stage == "stt":
        return {"model": leg.model, "language": leg.language}
    if stage == "tts":
        return {"voice": leg.voice, "model": leg.model, "language": leg.language}
    return {}
