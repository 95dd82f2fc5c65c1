"""Fault proxies and the resilience layer around the simulator's providers (tests only).

* :class:`Switch`: one provider leg's outage state, shared across calls:
  ``down`` (connects and requests fail), ``hang`` (they never answer).
* :class:`LegStt` / :class:`LegLlm` / :class:`LegTts`: a leg over the sim's
  fake provider of one call, counting every contact (connect or request) in
  a :class:`Contacts` shared across calls; one-shot mid-call faults
  (``kill_stt_after_interim``, ``fail_llm_first``, ``kill_tts_before_audio``).
* :func:`run_layered`: :func:`brisvox.sim.harness.simulate` with the actor's
  providers replaced by whatever ``layer(stt, llm, tts)`` returns (the sim
  builds its fakes per call; the layer wraps them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from brisvox.agent.conversation.context import AssistantMessage, UserMessage
from brisvox.providers.base import LlmError, LlmRequest, ProviderError, Transcript, TtsClosed
from brisvox.sim import harness
from brisvox.sim.harness import SimCall, SimResult


@dataclass
class Switch:
    down: bool = False
    hang: bool = False


@dataclass
class Contacts:
    n: int = 0
    times: list[float] = field(default_factory=list)

    def hit(self) -> None:
        self.n += 1
        self.times.append(asyncio.get_running_loop().time())


async def _outage(sw: Switch) -> None:
    if sw.hang:
        await asyncio.sleep(3600.0)
    if sw.down:
        raise ProviderError("connect", "refused (outage)")


class _KillAfterInterim:
    """An STT session that dies right after its first interim."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        await self.inner.send_audio(pcm, timeout)

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.inner.finalize(timeout)

    async def events(self) -> AsyncIterator[Any]:
        async for ev in self.inner.events():
            yield ev
            if isinstance(ev, Transcript) and not ev.is_final:
                self.inner._die("died")

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.inner.close(timeout)


class LegStt:
    def __init__(self, fake: Any, sw: Switch, contacts: Contacts, name: str,
                 kill_after_interim: bool = False) -> None:
        self.fake, self.sw, self.contacts, self.name = fake, sw, contacts, name
        self.kill = kill_after_interim

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    async def connect(self, config: Any, timeout: float) -> Any:  # noqa: ASYNC109
        self.contacts.hit()
        await _outage(self.sw)
        s = await self.fake.connect(config, timeout)
        if self.kill:
            self.kill = False
            return _KillAfterInterim(s)
        return s


class _ErrorStream:
    def __init__(self, ev: LlmError | None, delay: float) -> None:
        self.ev, self.delay = ev, delay

    def __aiter__(self) -> _ErrorStream:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(self.delay)
        ev, self.ev = self.ev, None
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def aclose(self) -> None:
        self.ev = None


class LegLlm:
    def __init__(self, fake: Any, sw: Switch, contacts: Contacts, name: str, fail_first: int = 0) -> None:
        self.fake, self.sw, self.contacts, self.name = fake, sw, contacts, name
        self.fail_first = fail_first

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    def stream(self, request: LlmRequest) -> Any:
        self.contacts.hit()
        if self.sw.hang:
            return _ErrorStream(None, 3600.0)
        if self.sw.down or self.fail_first > 0:
            self.fail_first -= 1
            return _ErrorStream(LlmError("server", "HTTP 503"), 0.3)
        return self.fake.stream(request)


class LegTts:
    def __init__(self, fake: Any, sw: Switch, contacts: Contacts, name: str,
                 kill_before_audio: bool = False) -> None:
        self.fake, self.sw, self.contacts, self.name = fake, sw, contacts, name
        self.kill = kill_before_audio

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    async def connect(self, config: Any, timeout: float) -> Any:  # noqa: ASYNC109
        self.contacts.hit()
        await _outage(self.sw)
        s = await self.fake.connect(config, timeout)
        if self.kill:
            self.kill = False
            s.send_text = _dies_after_text(s)
        return s


def _dies_after_text(s: Any) -> Callable[..., Any]:
    orig = s.send_text

    async def send_text(context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        await orig(context, text, continue_=continue_, timeout=timeout)
        s._die("died")  # before the first audio (the fake waits 80-160 ms before it)
        assert s.events_q.closed and isinstance(s.events_q._q[-1], TtsClosed)

    return send_text


Layer = Callable[[Any, Any, Any], tuple[Any, Any, Any]]


@contextlib.contextmanager
def layered(layer: Layer) -> Iterator[None]:
    real = harness.CallActor

    def make(*a: Any, stt: Any, llm: Any, tts: Any, **kw: Any) -> Any:
        s, m, t = layer(stt, llm, tts)
        return real(*a, stt=s, llm=m, tts=t, **kw)

    harness.CallActor = make  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        harness.CallActor = real  # type: ignore[misc]


async def run_layered(call: SimCall, layer: Layer | None) -> SimResult:
    if layer is None:
        return await harness.simulate(call)
    with layered(layer):
        return await harness.simulate(call)


def conversation(res: SimResult) -> tuple[list[tuple[str, str]], list[str]]:
    """(the context's user and assistant messages, the bot words that reached the wire)."""
    msgs = [("user", m.content) if isinstance(m, UserMessage) else ("assistant", m.text)
            for m in res.actor.context if isinstance(m, UserMessage | AssistantMessage)]
    w = res.platform.wire
    words = [x for u in w.order for x, _, _ in w.utts[u].words]
    return msgs, words
