"""The registry, the failover layer and the scripted LLM.

* Registry: every provider name of the schema builds from a definition, keys
  read from the given environment only; a missing key is ``auth`` naming the
  variable; an unknown option is refused; local providers need a worker
  channel; a leg with a secondary is wrapped.
* Breaker: opens after 5 failures, half-opens after the window with ONE
  probe, closes on probation.
* LLM failover: a request that fails before content goes to the secondary
  (one request each); after content the error passes through (no second
  request); ``bad_request`` never fails over; an open breaker skips the
  primary for free.
* STT/TTS connect failover: the primary's failure or hang moves to the
  secondary within the attempt timeout.
* ScriptedLlm: rules by regular expression, multi-step tool rounds with the
  previous round's results, text streamed word by word, deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import pytest

from brisvox.agent.definition import ProviderDef
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmMessage,
    LlmRequest,
    LlmToolCall,
    ProviderError,
    SttConfig,
    TextDelta,
    ToolCallDelta,
)
from brisvox.providers.registry import CallEnv, build
from brisvox.providers.resilience import DEFAULT, Breaker, ResilientLlm, ResilientStt
from brisvox.providers.scripted_llm import ScriptedLlm
from brisvox.providers.worker_jobs import JobRouter

ENV = {k: "k" for k in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "DEEPGRAM_API_KEY",
                        "CARTESIA_API_KEY", "ELEVENLABS_API_KEY", "OPENROUTER_API_KEY", "GROQ_API_KEY")}


class Chan(JobRouter):
    def worker_of(self, call_id: str) -> int:
        return 0

    def in16_pos(self, call_id: str) -> int:
        return 0


@pytest.mark.parametrize("stage,provider", [
    ("stt", "local_whisper"), ("stt", "deepgram"),
    ("llm", "local_llm"), ("llm", "scripted"), ("llm", "openai"), ("llm", "ollama"), ("llm", "vllm"),
    ("llm", "openrouter"), ("llm", "groq"), ("llm", "anthropic"), ("llm", "gemini"),
    ("tts", "local_piper"), ("tts", "espeak"), ("tts", "cartesia"), ("tts", "elevenlabs"), ("tts", "openai_tts"),
])
def test_registry_builds_every_provider(stage: str, provider: str) -> None:
    p = build(stage, ProviderDef(provider), CallEnv("c1", Chan(), env=ENV))
    assert p.name == provider or provider in p.name


def test_registry_key_from_env_only() -> None:
    with pytest.raises(ProviderError) as e:
        build("llm", ProviderDef("anthropic", api_key_env="MY_KEY"), CallEnv("c", env={"ANTHROPIC_API_KEY": "x"}))
    assert e.value.kind == "auth" and "MY_KEY" in str(e.value)
    p = build("llm", ProviderDef("anthropic", api_key_env="MY_KEY"), CallEnv("c", env={"MY_KEY": "secret"}))
    assert p._auth == {"x-api-key": "secret"}
    assert build("llm", ProviderDef("ollama"), CallEnv("c", env={})).name == "ollama"  # no key needed


def test_registry_refuses_unknown_options_and_missing_worker() -> None:
    with pytest.raises(ProviderError, match="speeed"):
        build("tts", ProviderDef("espeak", options={"speeed": 1}), CallEnv("c", env={}))
    with pytest.raises(ProviderError, match="inference worker"):
        build("llm", ProviderDef("local_llm"), CallEnv("c", None, env={}))


def test_registry_wraps_a_secondary() -> None:
    p = build("llm", ProviderDef("openai", secondary=ProviderDef("scripted")), CallEnv("c", env=ENV))
    from brisvox.providers.resilience import ResilientLlm

    assert isinstance(p, ResilientLlm) and p.name == "openai+scripted" and p.secondary is not None


def test_breaker_cycle() -> None:
    b = Breaker(threshold=2, open_for=10.0)
    assert b.allow(0.0)
    b.failure(0.0)
    b.failure(1.0)
    assert b.state == "open" and not b.allow(5.0)
    assert b.allow(11.5) and b.state == "half_open"
    assert not b.allow(11.6)  # one probe at a time
    b.success()
    assert b.state == "closed" and b.failures == 1
    b.failure(12.0)  # probation: the next failure re-opens at once
    assert b.state == "open"


class FakeLlm:
    def __init__(self, name: str, events: list[Any], hang: bool = False) -> None:
        self.name = name
        self.events = events
        self.hang = hang
        self.requests = 0

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    def stream(self, request: LlmRequest) -> Any:
        self.requests += 1
        return _S(list(self.events), self.hang)


class _S:
    def __init__(self, evs: list[Any], hang: bool) -> None:
        self.evs = evs
        self.hang = hang

    def __aiter__(self) -> _S:
        return self

    async def __anext__(self) -> Any:
        if self.hang:
            await asyncio.sleep(100)
        if not self.evs:
            raise StopAsyncIteration
        ev = self.evs.pop(0)
        if isinstance(ev, Exception):
            raise ev
        return ev

    async def aclose(self) -> None:
        return None


REQ = LlmRequest((LlmMessage("user", "hi"),))


def two_leg_llm(primary: Any, secondary: Any, pkey: str, skey: str, first_event_timeout: float = 4.0) -> ResilientLlm:
    """The layer's LLM wrapper over a primary and a secondary leg, with the first-event timeout."""
    return ResilientLlm(primary, secondary, pkey, skey,
                        config=replace(DEFAULT.config, llm_attempt_timeout=first_event_timeout))


def two_leg_stt(primary: Any, secondary: Any, pkey: str, skey: str, attempt_timeout: float = 2.0) -> ResilientStt:
    return ResilientStt(primary, secondary, pkey, skey, config=replace(DEFAULT.config, attempt_timeout=attempt_timeout))


def run_stream(p: Any) -> list[Any]:
    async def main() -> list[Any]:
        s = p.stream(REQ)
        out = [e async for e in s]
        await s.aclose()
        return out

    return asyncio.run(main())


def fresh(name: str) -> None:
    for k in list(DEFAULT.breakers):
        if name in k:
            del DEFAULT.breakers[k]


@pytest.mark.parametrize("first", [LlmError("server", "500"), ProviderError("connect", "refused"), "hang"])
def test_llm_fails_over_before_content(first: Any) -> None:
    fresh("pA")
    prim = FakeLlm("a", [] if first == "hang" else [first], hang=first == "hang")
    sec = FakeLlm("b", [TextDelta("hi"), Done()])
    p = two_leg_llm(prim, sec, "pA", "sA", first_event_timeout=0.1)
    assert run_stream(p) == [TextDelta("hi"), Done()]
    assert (prim.requests, sec.requests) == (1, 1)


def test_llm_no_failover_after_content_or_on_bad_request() -> None:
    fresh("pB")
    prim = FakeLlm("a", [TextDelta("partial"), LlmError("closed", "cut")])
    sec = FakeLlm("b", [TextDelta("x"), Done()])
    assert run_stream(two_leg_llm(prim, sec, "pB", "sB")) == [TextDelta("partial"), LlmError("closed", "cut")]
    assert sec.requests == 0
    prim = FakeLlm("a", [LlmError("bad_request", "400", False)])
    assert run_stream(two_leg_llm(prim, sec, "pB2", "sB2"))[0].kind == "bad_request"
    assert sec.requests == 0


def test_open_breaker_skips_the_primary() -> None:
    fresh("pC")
    prim = FakeLlm("a", [LlmError("server", "500")])
    sec = FakeLlm("b", [TextDelta("ok"), Done()])
    for _ in range(5):  # five calls (a wrapper is one call: its own retry budget)
        run_stream(two_leg_llm(prim, sec, "pC", "sC"))
    assert prim.requests == 5 and DEFAULT.breaker("llm:pC").state == "open"
    run_stream(two_leg_llm(prim, sec, "pC", "sC"))
    assert prim.requests == 5 and sec.requests == 6  # no request to an open primary


class FakeStt:
    def __init__(self, name: str, fail: str = "") -> None:
        self.name = name
        self.fail = fail
        self.connects = 0

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: SttConfig, timeout: float) -> Any:  # noqa: ASYNC109
        self.connects += 1
        if self.fail == "hang":
            await asyncio.sleep(100)
        if self.fail:
            raise ProviderError(self.fail, "x")
        return _Sess(f"session-of-{self.name}")


class _Sess:
    def __init__(self, name: str) -> None:
        self.name = name

    async def events(self) -> Any:
        await asyncio.sleep(100)
        yield None

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        return None


@pytest.mark.parametrize("fail", ["connect", "hang"])
def test_stt_connect_fails_over(fail: str) -> None:
    fresh("pD")
    prim, sec = FakeStt("a", fail), FakeStt("b")
    p = two_leg_stt(prim, sec, "pD" + fail, "sD", attempt_timeout=0.1)

    async def main() -> str:
        s = await p.connect(SttConfig(), 2.0)
        await s.close(0.1)
        return s.inner.name  # the relay over the secondary's session

    assert asyncio.run(main()) == "session-of-b" and prim.connects == 1


def test_scripted_llm_rules_and_tool_rounds() -> None:
    llm = ScriptedLlm([
        {"match": r"weather in (?P<city>[a-z]+)", "steps": [
            {"tools": [{"name": "get_weather", "arguments": {"city": "{city}"}}]},
            {"reply": "It is {r[0][temp]} degrees in {city}."}]},
        {"match": ".*", "reply": "You said: {text}"},
    ])

    async def collect(msgs: tuple[LlmMessage, ...]) -> list[Any]:
        s = llm.stream(LlmRequest(msgs))
        return [e async for e in s]

    first = asyncio.run(collect((LlmMessage("user", "What's the weather in paris?"),)))
    calls = [e for e in first if isinstance(e, ToolCallDelta)]
    assert "".join(c.arguments for c in calls) == '{"city":"paris"}' and calls[0].name == "get_weather"
    assert isinstance(first[-1], Done) and first[-1].stop_reason == "tool_calls"
    second = asyncio.run(collect((
        LlmMessage("user", "What's the weather in paris?"),
        LlmMessage("assistant", "", (LlmToolCall("t1.0", "get_weather", '{"city":"paris"}'),)),
        LlmMessage("tool", '{"temp": 18}', call_id="t1.0"))))
    assert "".join(e.text for e in second if isinstance(e, TextDelta)) == "It is 18 degrees in paris."
    other = asyncio.run(collect((LlmMessage("user", "hello there"),)))
    texts = [e.text for e in other if isinstance(e, TextDelta)]
    assert texts == ["You ", "said: ", "hello ", "there"]


def _elapsed_open(key: str) -> Breaker:
    """A breaker that opened long enough ago for its next caller to be the half-open probe
    (breakers read the running loop's clock: asyncio's default loop runs on time.monotonic)."""
    import time

    b = DEFAULT.breaker(key)
    b.failures, b.opened_at, b.probing = b.threshold, time.monotonic() - 3600.0, False
    return b


def test_a_cancelled_llm_probe_releases_its_permit() -> None:
    """A barge-in or hang-up while the probe waits for its first event must not leave the
    breaker half-open for the life of the process: the next call probes the primary again."""
    fresh("pE")
    b = _elapsed_open("llm:pE")
    prim = FakeLlm("a", [], hang=True)
    sec = FakeLlm("b", [TextDelta("ok"), Done()])

    async def main() -> None:
        s = two_leg_llm(prim, sec, "pE", "sE", first_event_timeout=30.0).stream(REQ)
        t = asyncio.ensure_future(s.__anext__())
        await asyncio.sleep(0.05)
        assert b.state == "half_open" and prim.requests == 1  # this call is the probe
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await s.aclose()

    asyncio.run(main())
    import time

    assert b.state == "open" and b.allow(time.monotonic())  # released: the next caller is the probe


def test_an_llm_probe_closed_before_its_first_event_releases_its_permit() -> None:
    fresh("pF")
    b = _elapsed_open("llm:pF")
    prim = FakeLlm("a", [], hang=True)

    async def main() -> None:
        s = two_leg_llm(prim, FakeLlm("b", [Done()]), "pF", "sF", first_event_timeout=30.0).stream(REQ)
        t = asyncio.ensure_future(s.__anext__())
        await asyncio.sleep(0.05)
        await s.aclose()  # the runner closes the stream (the turn was abandoned)
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t

    asyncio.run(main())
    assert b.state == "open" and not b.probing


def test_a_bad_request_probe_and_a_cancelled_connect_probe_release_their_permits() -> None:
    fresh("pG")
    b = _elapsed_open("llm:pG")
    run_stream(two_leg_llm(FakeLlm("a", [LlmError("bad_request", "400", False)]),
                                    FakeLlm("b", [Done()]), "pG", "sG"))
    assert b.state == "open" and not b.probing  # a bad request is no verdict on the leg
    fresh("pH")
    bs = _elapsed_open("stt:pH")

    async def main() -> None:
        p = two_leg_stt(FakeStt("a", "hang"), FakeStt("b"), "pH", "sH", attempt_timeout=30.0)
        t = asyncio.ensure_future(p.connect(SttConfig(), 60.0))
        await asyncio.sleep(0.05)
        assert bs.state == "half_open"
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())
    assert bs.state == "open" and not bs.probing


def test_a_breaker_runs_on_the_loops_clock_so_the_simulator_can_drive_it() -> None:
    """30 s of open breaker pass in no wall time on the virtual loop."""
    import time

    from brisvox.sim.vloop import run_virtual

    async def main() -> tuple[bool, bool]:
        b = Breaker(threshold=2, open_for=30.0)
        b.failure()
        b.failure()
        before = b.allow()
        await asyncio.sleep(31.0)  # virtual
        return before, b.allow()

    t0 = time.monotonic()
    assert run_virtual(main) == (False, True)
    assert time.monotonic() - t0 < 5.0
