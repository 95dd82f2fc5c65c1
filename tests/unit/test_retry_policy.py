"""The one retry policy (brisvox/runtime/retry.py): backoff, jitter, budgets, Retry-After, deadlines.

* Backoff: ``base * multiplier ** (n - 1)`` capped, exact; a fixed delay with multiplier 1;
  no overflow however many retries.
* Jitter only from the injected source: full in [0, backoff], decorrelated in
  [base, 3 x previous] capped; hypothesis: every delay in [0, cap].
* Attempts: at most ``max_attempts`` granted; a Retry-After is waited (never less) when at
  most ``retry_after_max`` and gives up when longer; no wait reaches a deadline.
* RetryBudget: one token back per ``refill`` exactly (a token bucket), or only by reset.
* Retry-After parsing: delta seconds and HTTP dates.
* The adopters' numbers: the STT/TTS/S2S reconnects, the summarizer's breaker, the
  resilience layer's Retry-After rule.
"""

from __future__ import annotations

import asyncio
import math
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.runtime.retry import (
    Attempts,
    RetryBudget,
    RetryPolicy,
    fits,
    parse_retry_after,
    retry_call,
)


def fixed(r: float):
    return lambda: r


# -- backoff -----------------------------------------------------------------------------------


def test_backoff_is_exponential_and_capped_exactly() -> None:
    p = RetryPolicy(base=0.5, multiplier=2.0, cap=5.0)
    assert [p.backoff(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert p.backoff(0) == p.backoff(-3) == 0.5  # "before the first retry" is the first retry
    assert p.backoff(10**9) == 5.0  # no overflow
    assert RetryPolicy(base=1.0, multiplier=1.0).backoff(50) == 1.0  # a fixed delay
    assert RetryPolicy(base=3.0, cap=2.0).backoff(1) == 2.0  # the cap bounds the first too
    assert RetryPolicy(base=0.0).backoff(7) == 0.0


@pytest.mark.parametrize("kw", [dict(base=-1.0), dict(cap=math.inf), dict(cap=-0.1), dict(multiplier=0.5),
                                dict(jitter="some"), dict(max_attempts=0), dict(retry_after_max=-1.0),
                                dict(base=math.nan)])
def test_a_bad_policy_is_refused(kw) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kw)


def test_jitter_comes_only_from_the_injected_source() -> None:
    full = RetryPolicy(base=1.0, cap=10.0, jitter="full")
    assert full.delay(3, fixed(0.25)) == 1.0  # a quarter of 4 s
    assert full.delay(3, fixed(0.0)) == 0.0
    dec = RetryPolicy(base=1.0, cap=10.0, jitter="decorrelated")
    assert dec.delay(1, fixed(0.5)) == 2.0  # in [1, 3]: the first previous is base
    assert dec.delay(2, fixed(0.5), previous=2.0) == 3.5  # in [1, 6]
    assert dec.delay(9, fixed(0.99), previous=8.0) == 10.0  # capped
    a, b = (RetryPolicy(base=0.1, jitter="full").attempts(random.Random(7).random) for _ in range(2))
    assert [a.next_delay() for _ in range(5)] == [b.next_delay() for _ in range(5)]  # seeded: the same


@settings(max_examples=300, deadline=None)
@given(base=st.floats(0.0, 100.0), mult=st.floats(1.0, 10.0), cap=st.floats(0.0, 1000.0),
       jitter=st.sampled_from(["none", "full", "decorrelated"]), retry=st.integers(-5, 10**6),
       r=st.floats(0.0, 1.0, exclude_max=True), previous=st.none() | st.floats(0.0, 1e6))
def test_every_delay_is_within_zero_and_the_cap(base, mult, cap, jitter, retry, r, previous) -> None:
    p = RetryPolicy(base=base, multiplier=mult, cap=cap, jitter=jitter)
    d = p.delay(retry, fixed(r), previous)
    assert 0.0 <= d <= cap
    if jitter == "none":
        assert d == min(cap, base) or retry > 1
    if jitter == "decorrelated" and base <= cap:
        assert d >= base


@settings(max_examples=200, deadline=None)
@given(base=st.floats(0.001, 100.0), mult=st.floats(1.0, 10.0), cap=st.floats(0.0, 1000.0),
       n=st.integers(1, 5000))
def test_backoff_never_shrinks(base, mult, cap, n) -> None:
    p = RetryPolicy(base=base, multiplier=mult, cap=cap)
    assert p.backoff(n) <= p.backoff(n + 1) <= cap


# -- attempts, Retry-After, deadlines ----------------------------------------------------------


def test_attempts_grant_at_most_max_attempts() -> None:
    a = RetryPolicy(base=0.25, multiplier=1.0, max_attempts=4).attempts()
    waits = [a.next_delay() for _ in range(5)]
    assert waits == [0.25, 0.25, 0.25, None, None] and a.made == 4 and a.retries == 3
    assert RetryPolicy(max_attempts=1).attempts().next_delay() is None


@settings(max_examples=200, deadline=None)
@given(max_attempts=st.none() | st.integers(1, 30), calls=st.integers(0, 60))
def test_attempts_never_grant_more_than_the_policy_allows(max_attempts, calls) -> None:
    a = Attempts(RetryPolicy(base=0.01, max_attempts=max_attempts), random.Random(1).random)
    granted = sum(1 for _ in range(calls) if a.next_delay() is not None)
    assert granted == (calls if max_attempts is None else min(calls, max_attempts - 1)) == a.retries


def test_retry_after_is_waited_never_less_and_given_up_when_too_long() -> None:
    p = RetryPolicy(base=0.2, multiplier=1.0, retry_after_max=2.0)
    assert p.honour_retry_after(None, 0.2) == 0.2
    assert p.honour_retry_after(1.5, 0.2) == 1.5
    assert p.honour_retry_after(0.1, 0.2) == 0.2  # never earlier than our own delay either
    assert p.honour_retry_after(2.0, 0.2) == 2.0  # at most retry_after_max: waited
    assert p.honour_retry_after(2.5, 0.2) is None  # longer: give up
    assert RetryPolicy().honour_retry_after(3600.0) == 3600.0  # no maximum: any
    a = p.attempts()
    assert a.next_delay(5.0) is None and a.made == 1  # a give-up grants nothing
    assert a.next_delay(1.0) == 1.0 and a.made == 2


def test_no_wait_reaches_the_deadline() -> None:
    p = RetryPolicy(base=1.0, multiplier=2.0, cap=10.0)
    a = p.attempts()
    assert a.next_delay(now=100.0, deadline=102.5) == 1.0
    assert a.next_delay(now=101.0, deadline=102.5) is None  # 2 s would end at 103
    assert a.next_delay(now=100.0, deadline=102.0) is None  # ending AT the deadline: no time left to try
    assert a.next_delay(now=100.0, deadline=102.01) == 2.0
    assert a.next_delay(3.0, now=0.0, deadline=3.0) is None  # a Retry-After counts too
    assert fits(0.0, 5.0, None) and not fits(1.0, 0.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(now=st.floats(0.0, 1e6), left=st.floats(0.0, 100.0), ra=st.none() | st.floats(0.0, 50.0),
       jitter=st.sampled_from(["none", "full", "decorrelated"]), r=st.floats(0.0, 1.0, exclude_max=True))
def test_a_granted_wait_ends_before_the_deadline(now, left, ra, jitter, r) -> None:
    a = RetryPolicy(base=0.5, cap=30.0, jitter=jitter).attempts(fixed(r))
    for _ in range(8):
        w = a.next_delay(ra, now=now, deadline=now + left)
        if w is not None:
            assert now + w < now + left and w >= (ra or 0.0)


# -- the budget --------------------------------------------------------------------------------


def test_the_budget_refills_one_token_per_refill_exactly() -> None:
    b = RetryBudget(3, 20.0)
    out = [b.take(0.0), b.take(0.0), b.take(0.0), b.take(0.0), b.available(19.999), b.take(20.0),
           b.available(20.0), b.level(60.0), b.take(160.0), b.level(160.0)]
    assert out == [True, True, True, False, False, True, False, 2, True, 2]
    assert b.level(10.0) == 3  # a clock before the refill mark: a new world, full


def test_without_refill_only_a_reset_refills() -> None:
    b = RetryBudget(2)
    assert [b.take(), b.take(), b.take(), b.level(1e9)] == [True, True, False, 0]
    b.reset()
    assert b.level() == 2 and not RetryBudget(0).available()
    with pytest.raises(ValueError):
        RetryBudget(-1)
    with pytest.raises(ValueError):
        RetryBudget(1, 0.0)


@settings(max_examples=300, deadline=None)
@given(cap=st.integers(0, 20), refill=st.floats(0.01, 100.0), k=st.integers(0, 25), dt=st.floats(0.0, 5000.0))
def test_a_burst_comes_back_one_token_per_refill(cap, refill, k, dt) -> None:
    b = RetryBudget(cap, refill)
    taken = sum(1 for _ in range(k) if b.take(10.0))
    assert taken == min(k, cap)
    assert b.level(10.0 + dt) == min(cap, cap - taken + int(dt / refill + 1e-9))


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 10), refill=st.floats(0.1, 10.0),
       ops=st.lists(st.tuples(st.floats(0.0, 30.0), st.booleans()), max_size=40))
def test_the_budget_stays_within_zero_and_its_capacity(cap, refill, ops) -> None:
    b, now = RetryBudget(cap, refill), 0.0
    for dt, take in ops:
        before = b.level(now)
        now += dt
        after = b.level(now)
        assert 0 <= after <= cap and after - before <= int(dt / refill + 1e-9) + 1
        if take:
            assert b.take(now) == (after >= 1)


# -- Retry-After -------------------------------------------------------------------------------


def test_retry_after_in_seconds_and_as_an_http_date() -> None:
    assert parse_retry_after("2") == 2.0 and parse_retry_after(" 120 ") == 120.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0  # past: at once
    assert parse_retry_after("soon") is None and parse_retry_after("") is None and parse_retry_after(None) is None
    assert parse_retry_after("-3") is None and parse_retry_after("1.5") is None  # not delta-seconds


# -- the async helper --------------------------------------------------------------------------


def test_retry_call_sleeps_through_the_injected_sleep() -> None:
    slept: list[float] = []
    heard: list[float] = []
    answers = [(True, "503"), (True, "503"), (False, "200")]

    async def attempt() -> tuple[bool, str]:
        return answers.pop(0)

    async def sleep(s: float) -> None:
        slept.append(s)

    p = RetryPolicy(base=0.2, multiplier=1.0, max_attempts=3)
    got = asyncio.run(retry_call(p, attempt, sleep=sleep, on_retry=heard.append))
    assert got == "200" and slept == heard == [0.2, 0.2]
    answers[:] = [(True, "a"), (True, "b"), (True, "c")]
    slept.clear()
    assert asyncio.run(retry_call(p, attempt, sleep=sleep)) == "c" and slept == [0.2, 0.2]
    # Retry-After from the result, and the deadline on the given clock
    answers[:] = [(True, "1.0"), (True, "9.0")]
    slept.clear()
    got = asyncio.run(retry_call(RetryPolicy(base=0.1, retry_after_max=5.0), attempt, sleep=sleep,
                                 retry_after=float))
    assert got == "9.0" and slept == [1.0]
    answers[:] = [(True, "x"), (True, "y")]
    slept.clear()
    got = asyncio.run(retry_call(RetryPolicy(base=1.0), attempt, sleep=sleep, now=lambda: 10.0, deadline=10.5))
    assert got == "x" and slept == []


# -- the adopters' numbers ---------------------------------------------------------------------


def test_the_adopters_keep_their_numbers() -> None:
    from brisvox.agent.pipeline.cascade.stt_stage import SttStageConfig
    from brisvox.agent.pipeline.cascade.tts_stage import TtsStageConfig
    from brisvox.agent.pipeline.llm.summarizer import SummaryConfig
    from brisvox.agent.pipeline.s2s.stage import S2sStageConfig
    from brisvox.providers.resilience import ResilienceConfig

    assert [SttStageConfig().reconnect_policy.delay(n) for n in (1, 2, 3)] == [1.0, 1.0, 1.0]
    assert [TtsStageConfig().reconnect_policy.delay(n) for n in (1, 2, 3, 4)] == [1.0] * 4
    s2s = S2sStageConfig().reconnect_policy.attempts()
    assert [s2s.next_delay() for _ in range(4)] == [0.25, 0.25, 0.25, None]  # 3 reconnects per call
    summ = SummaryConfig().backoff
    assert [summ.backoff(n) for n in (1, 2, 3, 4)] == [16.0, 32.0, 60.0, 60.0]
    res = ResilienceConfig().retry
    assert res.delay(1) == 0.0 and res.honour_retry_after(2.0) == 2.0 and res.honour_retry_after(2.01) is None


def test_the_policy_imports_nothing_of_brisvox() -> None:
    code = ("import sys, brisvox.runtime.retry; "
            "print(sorted(m for m in sys.modules if m.startswith('brisvox')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['brisvox', 'brisvox.runtime', 'brisvox.runtime.retry']"
