"""The one retry policy: backoff with a cap, jitter, attempt budgets, Retry-After, deadlines.

Every retry and reconnect of brisvox is decided here; the callers do the I/O:
the provider resilience layer (:mod:`brisvox.providers.resilience`), the STT,
TTS and S2S stages' reconnects, the summarizer's breaker and the Twilio REST
client. Pure policy: no clock is read and nothing sleeps, but in
:func:`retry_call`, which sleeps through the sleep it is given. Imports
nothing of brisvox (``brisvox.runtime`` is the bottom layer).

* :class:`RetryPolicy` (frozen): the delay before retry ``n`` (1: the first
  retry) is ``min(cap, base * multiplier ** (n - 1))`` (``multiplier`` 1: a
  fixed delay), with ``jitter`` ``"none"`` (that delay), ``"full"``
  (uniform in [0, that delay]) or ``"decorrelated"`` (uniform in
  [base, 3 x the previous delay], capped; the first previous is ``base``).
  ``max_attempts`` bounds one operation's attempts, the first included
  (None: unbounded). A server's ``Retry-After`` is waited, never less, when
  it is at most ``retry_after_max`` (None: any); a longer one is not
  waited: the operation gives up.
* :class:`Attempts`: one operation's attempts under a policy (what a loop
  holds): after each failure :meth:`Attempts.next_delay` says how long to
  wait before the next attempt, or None (give up: attempts spent, the
  Retry-After too long, or the wait would reach the deadline).
* :class:`RetryBudget`: tokens spent by retries, refilled one every
  ``refill`` seconds (a token bucket) or only by :meth:`RetryBudget.reset`
  (a budget of consecutive attempts, granted afresh by an event).
* :func:`parse_retry_after`: an HTTP ``Retry-After`` (delta seconds or an
  HTTP date) in seconds.

Invariants: every delay is in [0, ``cap``] (a honoured Retry-After may be
longer, at most ``retry_after_max``); no wait ends at or past a deadline;
randomness comes only from the injected source (``random``: a callable
returning floats in [0, 1), e.g. ``random.Random(seed).random``), so tests
are deterministic; times are passed in (seconds on the caller's clock).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

Jitter = Literal["none", "full", "decorrelated"]
Random = Callable[[], float]  # floats in [0, 1)
JITTERS = ("none", "full", "decorrelated")
_EPS = 1e-9
T = TypeVar("T")


def _system_random() -> float:
    import random

    return random.random()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """See the module docstring. ``cap`` is finite; ``multiplier`` at least 1."""

    base: float = 0.2
    multiplier: float = 2.0
    cap: float = 60.0
    jitter: Jitter = "none"
    max_attempts: int | None = None
    retry_after_max: float | None = None

    def __post_init__(self) -> None:
        if not (self.base >= 0.0 and math.isfinite(self.base)):
            raise ValueError("base: a finite number of seconds, at least 0")
        if not (self.cap >= 0.0 and math.isfinite(self.cap)):
            raise ValueError("cap: a finite number of seconds, at least 0")
        if not (self.multiplier >= 1.0 and math.isfinite(self.multiplier)):
            raise ValueError("multiplier: a finite number, at least 1")
        if self.jitter not in JITTERS:
            raise ValueError(f"jitter: one of {', '.join(JITTERS)}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts: at least 1 (None: unbounded)")
        if self.retry_after_max is not None and not self.retry_after_max >= 0.0:
            raise ValueError("retry_after_max: at least 0 (None: any)")

    def backoff(self, retry: int) -> float:
        """The delay before retry ``retry`` (1: the first) without jitter: exponential, capped."""
        n = max(1, retry) - 1
        if n == 0 or self.multiplier == 1.0 or self.base == 0.0 or self.base >= self.cap:
            return min(self.cap, self.base)
        grow = n * math.log(self.multiplier)
        if grow > math.log(self.cap) - math.log(self.base) + 1.0:
            return self.cap  # far past the cap: the power is not computed (it could overflow)
        try:
            return min(self.cap, self.base * self.multiplier ** n)
        except OverflowError:  # a tiny base: the power alone is out of range, the product is not
            return min(self.cap, math.exp(math.log(self.base) + grow))

    def delay(self, retry: int, random: Random | None = None, previous: float | None = None) -> float:
        """The (jittered) delay before retry ``retry``; ``previous``: the delay before the
        retry before it (decorrelated jitter only; None: the first retry)."""
        if self.jitter == "none":
            return self.backoff(retry)
        r = min(1.0, max(0.0, (random or _system_random)()))
        if self.jitter == "full":
            return self.backoff(retry) * r
        prev = self.base if previous is None else previous
        hi = max(self.base, 3.0 * prev)
        return min(self.cap, self.base + (hi - self.base) * r)

    def honour_retry_after(self, retry_after: float | None, delay: float = 0.0) -> float | None:
        """The wait before a retry whose own delay is ``delay`` when the server asked for
        ``retry_after`` (None: it did not): never less than either; None (give up) when
        ``retry_after`` is over ``retry_after_max``."""
        if retry_after is None:
            return delay
        if self.retry_after_max is not None and retry_after > self.retry_after_max:
            return None
        return max(delay, retry_after)

    def may_attempt(self, made: int) -> bool:
        """May another attempt follow ``made`` attempts?"""
        return self.max_attempts is None or made < self.max_attempts

    def attempts(self, random: Random | None = None) -> Attempts:
        """The attempts of one operation (its first is being made)."""
        return Attempts(self, random)


def fits(now: float, wait: float, deadline: float | None) -> bool:
    """Does a wait of ``wait`` from ``now`` end before ``deadline`` (None: no deadline)?"""
    return deadline is None or now + wait < deadline


class Attempts:
    """One operation's attempts under ``policy``.

    Invariants: ``made`` counts the attempts granted, the first included (1 at
    the start: the first attempt needs no grant); :meth:`next_delay` grants
    the next one (``made`` + 1) with its wait, or returns None and grants
    nothing; at most ``policy.max_attempts`` are ever granted; the decorrelated
    jitter's previous delay is this object's.
    """

    __slots__ = ("made", "policy", "_previous", "_random")

    def __init__(self, policy: RetryPolicy, random: Random | None = None) -> None:
        self.policy = policy
        self.made = 1
        self._random = random
        self._previous: float | None = None

    @property
    def retries(self) -> int:
        """Attempts granted after the first."""
        return self.made - 1

    def next_delay(self, retry_after: float | None = None, *, now: float = 0.0,
                   deadline: float | None = None) -> float | None:
        """After a failed attempt: the wait before the next one, or None (no next attempt:
        ``max_attempts`` made, ``retry_after`` over ``retry_after_max``, or the wait would
        end at or past ``deadline``, a time on the clock of ``now``)."""
        p = self.policy
        if not p.may_attempt(self.made):
            return None
        d = p.delay(self.made, self._random, self._previous)
        wait = p.honour_retry_after(retry_after, d)
        if wait is None or not fits(now, wait, deadline):
            return None
        self._previous = d
        self.made += 1
        return wait


class RetryBudget:
    """``capacity`` tokens a retry takes one of. With ``refill`` (seconds) one comes back
    every ``refill`` seconds, counted from when a token was taken from the full budget (a
    token bucket); without, only :meth:`reset` (an event granting a fresh budget) refills.

    Invariants: 0 <= tokens <= capacity; times are passed in (``now``, ignored without
    ``refill``), never read; a ``now`` earlier than the refill mark (a clock of another
    loop: tests) is a new world: the budget is full.
    """

    __slots__ = ("capacity", "refill", "tokens", "_t")

    def __init__(self, capacity: int, refill: float | None = None) -> None:
        if capacity < 0:
            raise ValueError("capacity: at least 0")
        if refill is not None and not refill > 0.0:
            raise ValueError("refill: seconds, more than 0 (None: no refill)")
        self.capacity = capacity
        self.refill = refill
        self.tokens = capacity
        self._t: float | None = None

    def _update(self, now: float) -> None:
        if self.refill is None:
            return
        if self._t is None or self.tokens >= self.capacity:
            self._t = now
        elif now < self._t:
            self.tokens, self._t = self.capacity, now
        else:
            n = int((now - self._t) / self.refill + _EPS)
            if n:
                self.tokens = min(self.capacity, self.tokens + n)
                self._t = now if self.tokens >= self.capacity else self._t + n * self.refill

    def level(self, now: float = 0.0) -> int:
        """The tokens there are at ``now``."""
        self._update(now)
        return self.tokens

    def available(self, now: float = 0.0) -> bool:
        self._update(now)
        return self.tokens >= 1

    def take(self, now: float = 0.0) -> bool:
        """Take one token; False (nothing taken) when there is none."""
        self._update(now)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def reset(self) -> None:
        """A fresh budget: full at once."""
        self.tokens = self.capacity
        self._t = None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds of an HTTP ``Retry-After`` (delta seconds or an HTTP date; ``now``: the wall
    clock's epoch seconds, None: read it), at least 0; None if absent or bad."""
    if not value:
        return None
    v = value.strip()
    if v.isdigit():
        return float(v)
    try:
        from email.utils import parsedate_to_datetime

        when = parsedate_to_datetime(v).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if now is None:
        import time

        now = time.time()
    return max(0.0, when - now)


async def retry_call(policy: RetryPolicy, attempt: Callable[[], Awaitable[tuple[bool, T]]], *,
                     sleep: Callable[[float], Awaitable[object]],
                     retry_after: Callable[[T], float | None] | None = None,
                     on_retry: Callable[[float], object] | None = None,
                     random: Random | None = None, now: Callable[[], float] | None = None,
                     deadline: float | None = None) -> T:
    """Run ``attempt`` (it returns (again?, result)) until it needs no retry or
    :meth:`Attempts.next_delay` says no; the last result. Before each retry ``on_retry``
    hears the wait, then ``sleep`` sleeps it. ``now`` (with ``deadline``): the clock."""
    tries = policy.attempts(random)
    while True:
        again, result = await attempt()
        if not again:
            return result
        t = now() if now is not None else 0.0
        wait = tries.next_delay(retry_after(result) if retry_after is not None else None, now=t,
                                deadline=deadline)
        if wait is None:
            return result
        if on_retry is not None:
            on_retry(wait)
        await sleep(wait)
