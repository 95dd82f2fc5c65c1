"""The LLM runner's retry rule on virtual time: a request error (400/401/403/404/413/422,
``retryable`` False) is never retried; a ``Retry-After`` is waited for when it is short, and a
long one ends the turn without a retry; an ordinary failure is retried after ``retry_delay``."""

from __future__ import annotations

from typing import Any

import pytest

from brisvox.agent.pipeline.llm_policy import LlmRunnerConfig, retry_wait
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.clock import CLOCK
from brisvox.providers.base import Done, LlmError, LlmRequest, ProviderError, TextDelta
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
        n = len(self.at)
        first = self.first

        class S:
            def __aiter__(self) -> Any:
                return self._gen()

            async def _gen(self) -> Any:
                if n == 1:
                    if isinstance(first, ProviderError):
                        raise first
                    yield first
                    return
                yield TextDelta("hello there")
                yield Done()

            async def aclose(self) -> None:
                pass

        return S()


def run(first: Any) -> tuple[str, list[float], int]:
    async def main() -> tuple[str, list[float], int]:
        llm = FlakyLlm(first)
        async with Rig(llm, ToolRegistry()) as rig:
            text = await rig.turn(1, "hi")
            return text, [t - llm.at[0] for t in llm.at], rig.runner.st.retries

    return run_virtual(main)


@pytest.mark.parametrize("first", [LlmError("bad_request", "400", retryable=False),
                                   ProviderError("auth", "401", retryable=False)], ids=["400-event", "401-raised"])
def test_a_request_error_is_never_retried(first: Any) -> None:
    text, at, retries = run(first)
    assert (text, len(at), retries) == ("", 1, 0)


def test_an_ordinary_failure_is_retried_after_the_retry_delay() -> None:
    text, at, retries = run(LlmError("server", "503"))
    assert text == "hello there" and retries == 1
    assert at[1] == pytest.approx(LlmRunnerConfig().retry_delay)


def test_a_short_retry_after_is_waited_for() -> None:
    text, at, retries = run(ProviderError("rate_limited", "429", retry_after=1.5))
    assert text == "hello there" and retries == 1 and at[1] == pytest.approx(1.5)


def test_a_long_retry_after_ends_the_turn_without_a_retry() -> None:
    text, at, retries = run(LlmError("rate_limited", "429", retry_after=30.0))
    assert (text, len(at), retries) == ("", 1, 0)


def test_the_rule_itself() -> None:
    cfg = LlmRunnerConfig(retry_delay=0.2, retry_after_max=2.0)
    assert retry_wait(False, None, cfg) is None
    assert retry_wait(True, None, cfg) == 0.2
    assert retry_wait(True, 0.05, cfg) == 0.2
    assert retry_wait(True, 2.0, cfg) == 2.0
    assert retry_wait(True, 2.5, cfg) is None
