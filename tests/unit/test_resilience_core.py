"""The resilience layer's rules on virtual time: buckets, breakers, attempts, LLM re-issue.

* Buckets: a call's 3 tokens come back one per 20 s, the process's 50 one per
  100 ms, to the exact virtual instant; a further attempt takes one from both.
* Breaker: probation (a probe that connects lets the next call in at once,
  the next failure re-opens it); a probe in flight makes a single-leg caller
  wait for its verdict instead of refusing it.
* Not counted, not retried: request errors (``bad_request``) and cancellations.
* A hung connect fails over at exactly the 2 s attempt timeout.
* LLM: re-issued before content (to the primary again without a secondary),
  never after; ``Retry-After`` waited on the same leg when at most 2 s,
  not waited (immediate failover) when a secondary exists, given up when longer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brisvox.providers.base import (
    Done,
    LlmError,
    LlmMessage,
    LlmRequest,
    ProviderError,
    SttConfig,
    TextDelta,
)
from brisvox.providers.resilience import (
    Bucket,
    Budget,
    Resilience,
    ResilienceConfig,
    ResilientLlm,
    ResilientStt,
)
from brisvox.sim.vloop import run_virtual

REQ = LlmRequest((LlmMessage("user", "hi"),))


def vrun(main: Any) -> Any:
    return run_virtual(main)


def test_call_bucket_refills_one_token_per_20_s_exactly() -> None:
    async def main() -> list[Any]:
        b = Bucket(3, 20.0)
        out = [b.take(), b.take(), b.take(), b.take()]  # the fourth is refused
        await asyncio.sleep(19.999)
        out.append(b.available())
        await asyncio.sleep(0.001)  # t = 20.000
        out += [b.take(), b.available()]
        await asyncio.sleep(40.0)  # t = 60: two more (one per 20 s since t = 20)
        out += [b.level()]
        await asyncio.sleep(100.0)  # capped at the capacity
        out += [b.take(), b.level()]
        return out

    assert vrun(main) == [True, True, True, False, False, True, False, 2, True, 2]


def test_process_bucket_refills_one_per_100_ms_and_a_retry_takes_from_both() -> None:
    async def main() -> list[Any]:
        proc = Bucket(50, 0.1)
        calls = [Budget(Bucket(3, 20.0), proc) for _ in range(20)]
        taken = sum(1 for c in calls for _ in range(3) if c.take())
        out: list[Any] = [taken, proc.level()]  # 50 of the 60 call tokens: the process bucket is the limit
        await asyncio.sleep(0.0999)
        out.append(proc.available())
        await asyncio.sleep(0.0001)
        out.append(proc.level())
        await asyncio.sleep(0.3)  # three more
        out.append(proc.level())
        spent = calls[0]
        out.append(spent.take())  # its own bucket is empty: refused, the process token stays
        out.append(proc.level())
        return out

    assert vrun(main) == [50, 0, False, 1, 4, False, 4]


class Stt:
    def __init__(self, name: str, mode: str = "ok", delay: float = 0.05) -> None:
        self.name, self.mode, self.delay = name, mode, delay
        self.connects: list[float] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: SttConfig, timeout: float) -> Any:  # noqa: ASYNC109
        self.connects.append(asyncio.get_running_loop().time())
        if self.mode == "hang":
            await asyncio.sleep(3600)
        await asyncio.sleep(self.delay)
        if self.mode != "ok":
            raise ProviderError(self.mode, "x")
        from tests.unit.test_resilience_sessions import SttSess

        return SttSess()


def _res(**kw: Any) -> Resilience:
    return Resilience(ResilienceConfig(**kw))


def test_a_hung_connect_fails_over_at_exactly_the_attempt_timeout() -> None:
    async def main() -> tuple[float, float, str]:
        prim, sec = Stt("a", "hang"), Stt("b")
        w = ResilientStt(prim, sec, resilience=_res())
        t0 = asyncio.get_running_loop().time()
        s = await w.connect(SttConfig(), 5.0)
        await s.close(0.1)
        return prim.connects[0] - t0, sec.connects[0] - t0, s.inner.name

    assert vrun(main) == (0.0, 2.0, "sess")


def test_without_a_secondary_a_failed_connect_is_retried_once_on_the_primary() -> None:
    async def main() -> tuple[int, dict[str, int]]:
        prim = Stt("a", "connect")
        w = ResilientStt(prim, resilience=_res())
        with pytest.raises(ProviderError):
            await w.connect(SttConfig(), 5.0)
        return len(prim.connects), w.stats()

    n, st = vrun(main)
    assert n == 2 and st["attempts"] == 2 and st["failures"] == 2


def test_failures_and_retries_are_counted_per_provider_for_metrics() -> None:
    from brisvox.providers.resilience import PROVIDER_STATS

    before = dict(PROVIDER_STATS)

    async def main() -> None:
        w = ResilientStt(Stt("a", "connect"), pkey="deepgramx|https://x|nova|", resilience=_res())
        with pytest.raises(ProviderError):
            await w.connect(SttConfig(), 5.0)

    vrun(main)
    delta = {k: n - before.get(k, 0) for k, n in PROVIDER_STATS.items() if n != before.get(k, 0)}
    assert delta == {("stt", "deepgramx", "failures"): 2, ("stt", "deepgramx", "retries"): 1}


def test_request_errors_are_not_counted_and_not_retried() -> None:
    async def main() -> tuple[int, int, int, str]:
        res = _res()
        prim, sec = Stt("a", "bad_request"), Stt("b")
        w = ResilientStt(prim, sec, resilience=res)
        with pytest.raises(ProviderError) as e:
            await w.connect(SttConfig(), 5.0)
        b = res.breaker("stt:a")
        return len(prim.connects), len(sec.connects), b.failures, e.value.kind

    assert vrun(main) == (1, 0, 0, "bad_request")


def test_a_cancelled_connect_is_not_counted_and_a_cancelled_probe_releases_its_permit() -> None:
    async def main() -> tuple[int, str, bool]:
        res = _res(breaker_threshold=1, breaker_open_for=10.0)
        b = res.breaker("stt:a")
        b.failure()
        await asyncio.sleep(11.0)  # half-open: the next caller probes
        w = ResilientStt(Stt("a", "hang"), resilience=res)
        t = asyncio.ensure_future(w.connect(SttConfig(), 5.0))
        await asyncio.sleep(0.5)
        assert b.state == "half_open"
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return b.failures, b.state, b.allow()

    assert vrun(main) == (1, "open", True)  # no count for the cancel; the next caller probes


def test_breaker_probation_admits_the_next_call_and_one_failure_reopens() -> None:
    async def main() -> list[Any]:
        res = _res(breaker_threshold=3, breaker_open_for=30.0)
        prim = Stt("a", "connect")
        for _ in range(2):  # two calls, two attempts each: open after 3 failures
            with pytest.raises(ProviderError):
                await ResilientStt(prim, resilience=res).connect(SttConfig(), 5.0)
        b = res.breaker("stt:a")
        out: list[Any] = [b.state, len(prim.connects)]
        with pytest.raises(ProviderError) as e:  # open: refused for free
            await ResilientStt(prim, resilience=res).connect(SttConfig(), 5.0)
        out += [e.value.kind, len(prim.connects)]
        await asyncio.sleep(30.0)
        prim.mode = "ok"
        # two calls at once, no secondary: the second waits for the probe's verdict
        s1, s2 = await asyncio.gather(*(ResilientStt(prim, resilience=res).connect(SttConfig(), 5.0)
                                        for _ in range(2)))
        out += [b.state, b.failures, len(prim.connects)]
        b.failure()  # on probation: one failure re-opens
        out.append(b.state)
        for s in (s1, s2):
            await s.close(0.1)
        return out

    assert vrun(main) == ["open", 3, "unavailable", 3, "closed", 2, 5, "open"]


class Llm:
    def __init__(self, name: str, script: list[list[Any]], ttft: float = 0.3) -> None:
        self.name, self.script, self.ttft = name, script, ttft
        self.times: list[float] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    def stream(self, request: LlmRequest) -> Any:
        self.times.append(asyncio.get_running_loop().time())
        evs = self.script.pop(0) if self.script else [TextDelta("ok"), Done()]
        return _S(list(evs), self.ttft)


class _S:
    def __init__(self, evs: list[Any], ttft: float) -> None:
        self.evs, self.ttft, self.first = evs, ttft, True

    def __aiter__(self) -> _S:
        return self

    async def __anext__(self) -> Any:
        if self.first:
            self.first = False
            await asyncio.sleep(self.ttft)
        if not self.evs:
            raise StopAsyncIteration
        ev = self.evs.pop(0)
        if ev == "hang":
            await asyncio.sleep(3600)
        return ev

    async def aclose(self) -> None:
        return None


def collect(w: ResilientLlm) -> Any:
    async def main() -> list[Any]:
        s = w.stream(REQ)
        out = [e async for e in s]
        await s.aclose()
        return out

    return main


def test_llm_reissues_before_content_on_the_primary_when_there_is_no_secondary() -> None:
    prim = Llm("a", [[LlmError("server", "503")], [TextDelta("hi"), Done()]])
    w = ResilientLlm(prim, resilience=_res())
    assert vrun(collect(w)) == [TextDelta("hi"), Done()]
    assert len(prim.times) == 2 and w.stats()["failovers"] == 1


def test_llm_never_retries_after_content_nor_a_bad_request() -> None:
    prim = Llm("a", [[TextDelta("part"), LlmError("closed", "cut")]])
    w = ResilientLlm(prim, resilience=_res())
    assert vrun(collect(w)) == [TextDelta("part"), LlmError("closed", "cut")]
    prim = Llm("a", [[LlmError("bad_request", "HTTP 422", False)]])
    res = _res()
    w = ResilientLlm(prim, resilience=res)
    assert vrun(collect(w))[0].kind == "bad_request"
    assert len(prim.times) == 1 and res.breaker("llm:a").failures == 0 and w.stats()["request_errors"] == 1


@pytest.mark.parametrize("after,retried", [(1.5, True), (2.0, True), (5.0, False)])
def test_retry_after_is_waited_on_the_same_leg(after: float, retried: bool) -> None:
    prim = Llm("a", [[LlmError("rate_limited", "HTTP 429", True, after)], [TextDelta("hi"), Done()]])
    w = ResilientLlm(prim, resilience=_res())
    got = vrun(collect(w))
    if retried:
        assert got == [TextDelta("hi"), Done()]
        assert prim.times[1] - prim.times[0] == pytest.approx(0.3 + after, abs=1e-9)  # never earlier
    else:  # longer than retry_after_max: no retry at all, the error goes to the caller
        assert got[0].kind == "rate_limited" and len(prim.times) == 1
        assert w.stats()["retry_after_giveups"] == 1


def test_retry_after_with_a_secondary_fails_over_at_once() -> None:
    prim = Llm("a", [[LlmError("rate_limited", "HTTP 429", True, 30.0)]])
    sec = Llm("b", [])
    w = ResilientLlm(prim, sec, resilience=_res())
    assert vrun(collect(w)) == [TextDelta("ok"), Done()]
    assert sec.times[0] - prim.times[0] == pytest.approx(0.3, abs=1e-9)


def test_llm_hung_first_event_fails_over_at_the_llm_attempt_timeout() -> None:
    prim = Llm("a", [["hang"]])
    sec = Llm("b", [])
    w = ResilientLlm(prim, sec, resilience=_res())
    assert vrun(collect(w)) == [TextDelta("ok"), Done()]
    assert sec.times[0] - prim.times[0] == 4.0


def test_llm_retries_stop_when_the_call_budget_is_spent() -> None:
    prim = Llm("a", [[LlmError("server", "503")]] * 10)
    res = _res(breaker_threshold=100)
    w = ResilientLlm(prim, resilience=res)

    async def main() -> list[int]:
        n = []
        for _ in range(4):  # four requests of one call: 3 tokens, so 3 re-issues in all
            s = w.stream(REQ)
            _ = [e async for e in s]
            n.append(len(prim.times))
        return n

    assert vrun(main) == [2, 4, 6, 7]
    assert w.stats()["budget_refusals"] == 1


def test_the_layer_reads_retry_after_from_http() -> None:
    from brisvox.providers import http

    e = http.status_error(429, b"", http.parse_retry_after("2"))
    assert e.kind == "rate_limited" and e.retry_after == 2.0
    assert http.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert http.parse_retry_after("soon") is None and http.status_error(422).retryable is False
