"""The retry rule a turn of the LLM runner meets, on virtual time. The runner has no retry of
its own (one request per round): the resilience layer around the call's LLM re-issues a
request that failed before its first event. Through the layer: a request error
(``bad_request``, 400/404/413/422) is never retried; a ``Retry-After`` is waited for when it is
short (never earlier), and a long one ends the turn without a retry; an ordinary failure is
re-issued at once. Without the layer nothing is retried. The contact bound per configuration:
tests/unit/test_llm_contact_bound.py."""

from __future__ import annotations

from typing import Any

import pytest

from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.clock import CLOCK
from brisvox.providers.base import Done, LlmError, LlmRequest, ProviderError, TextDelta
from brisvox.providers.resilience import Resilience, ResilientLlm
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.runner_rig import Rig


class FlakyLlm:
    """Fails its first request with ``first`` (an LlmError event, or a ProviderError raised),
    then answers."""

    name = "flaky"

    def __init__(self, first: Any) -> None:
        self.first = first
        self.at: list[float] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        pass

    def stream(self, request: LlmRequest) -> Any:
        self.at.append(CLOCK.now())
        return self._gen(len(self.at))

    async def _gen(self, n: int) -> Any:  # an async generator: its own iterator, with aclose
        if n == 1:
            if isinstance(self.first, ProviderError):
                raise self.first
            yield self.first
            return
        yield TextDelta("hello there")
        yield Done()


def run(first: Any, layered: bool = True) -> tuple[str, list[float], int]:
    """(what the turn said, each request's time after the first, the runner's errors)."""
    async def main() -> tuple[str, list[float], int]:
        llm = FlakyLlm(first)
        provider: Any = ResilientLlm(llm, resilience=Resilience()) if layered else llm
        async with Rig(provider, ToolRegistry()) as rig:
            text = await rig.turn(1, "hi")
            return text, [t - llm.at[0] for t in llm.at], rig.runner.st.errors

    return run_virtual(main)


def test_a_request_error_is_never_retried() -> None:
    text, at, errors = run(LlmError("bad_request", "400", retryable=False))
    assert (text, len(at), errors) == ("", 1, 1)


def test_an_ordinary_failure_is_reissued_at_once() -> None:
    text, at, errors = run(LlmError("server", "503"))
    assert text == "hello there" and errors == 0 and at == [0.0, 0.0]


def test_a_short_retry_after_is_waited_for() -> None:
    text, at, errors = run(ProviderError("rate_limited", "429", retry_after=1.5))
    assert text == "hello there" and errors == 0 and at[1] == pytest.approx(1.5)


def test_a_long_retry_after_ends_the_turn_without_a_retry() -> None:
    text, at, errors = run(LlmError("rate_limited", "429", retry_after=30.0))
    assert (text, len(at), errors) == ("", 1, 1)


@pytest.mark.parametrize("first", [LlmError("server", "503"), ProviderError("rate_limited", "429", retry_after=1.5)],
                         ids=["503-event", "429-raised"])
def test_the_runner_alone_does_not_retry(first: Any) -> None:
    text, at, errors = run(first, layered=False)
    assert (text, len(at), errors) == ("", 1, 1)
