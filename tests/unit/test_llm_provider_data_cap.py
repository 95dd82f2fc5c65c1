"""A response's provider round-trip data (``Done.provider_data``) is bounded before it enters
the call's context: kept up to 32 KiB of JSON and up to half a message's allowance
(``max_message_tokens * 2`` bytes), dropped above either and counted
(``provider_data_oversized``); the response itself goes on. Both bounds are tested at the
byte they start at, through the LlmRunner (its model round) on virtual time."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from brisvox.agent.conversation.context import AssistantMessage
from brisvox.agent.conversation.request import (
    PROVIDER_DATA_MAX_BYTES,
    RequestConfig,
    WindowConfig,
    provider_data_fits,
    provider_data_limit,
)
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.providers.base import Done, LlmRequest, ProviderData, TextDelta
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.runner_rig import Rig

WRAP = len(b'{"sig":""}')


def data_of(size: int) -> dict[str, str]:
    """Provider data whose JSON is exactly ``size`` bytes."""
    pd = {"sig": "x" * (size - WRAP)}
    assert len(orjson.dumps(pd)) == size
    return pd


class DataLlm:
    """Answers every request with text and ``data`` as Done.provider_data (or a ProviderData event)."""

    name = "data"

    def __init__(self, data: Any, as_event: bool = False) -> None:
        self.data = data
        self.as_event = as_event
        self.requests: list[LlmRequest] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        pass

    def stream(self, request: LlmRequest) -> Any:
        self.requests.append(request)
        return self._gen()

    async def _gen(self) -> Any:
        yield TextDelta("fine, thanks")
        if self.as_event:
            yield ProviderData(self.data)
            yield Done()
        else:
            yield Done(provider_data=self.data)


def one_turn(data: Any, window: WindowConfig, as_event: bool = False) -> tuple[Any, int, str, str]:
    """(the provider data of the answer in the context, provider_data_oversized, the provider
    data the next request would send back with it, what the turn said)."""
    async def main() -> tuple[Any, int, str, str]:
        llm = DataLlm(data, as_event)
        async with Rig(llm, ToolRegistry(), request=RequestConfig(window=window)) as rig:
            said = await rig.turn(1, "how are you")
            runner = rig.runner
            answer = next(m for m in runner.ctx.messages if isinstance(m, AssistantMessage))
            nxt = runner.summarizer.build(runner.ctx, [])  # the runner's own request builder
            sent = next(m for m in nxt.messages if m.role == "assistant")
            return answer.provider_data, runner.st.provider_data_oversized, sent.provider_data, said

    return run_virtual(main)


def test_the_limit_is_32_kib_and_half_a_message_allowance() -> None:
    assert PROVIDER_DATA_MAX_BYTES == 32768
    assert provider_data_limit(WindowConfig(max_tokens=0)) == 32768  # no budget: 32 KiB alone
    assert provider_data_limit(WindowConfig(max_tokens=100_000)) == 32768
    assert provider_data_limit(WindowConfig(max_tokens=16_000)) == 32000  # the default window
    assert provider_data_limit(WindowConfig(max_tokens=1000)) == 2000
    assert provider_data_fits(data_of(2000), 2000) and not provider_data_fits(data_of(2001), 2000)


@pytest.mark.parametrize("as_event", [False, True])
def test_32_kib_is_kept_one_byte_more_is_dropped(as_event: bool) -> None:
    window = WindowConfig(max_tokens=0)
    kept = data_of(32768)
    pd, oversized, sent, said = one_turn(kept, window, as_event)
    assert (pd, oversized, said) == (kept, 0, "fine, thanks")
    assert orjson.loads(sent) == kept  # it goes back to the model with the message
    pd, oversized, sent, said = one_turn(data_of(32769), window, as_event)
    assert (pd, oversized, sent, said) == (None, 1, "", "fine, thanks")


def test_half_a_message_allowance_is_kept_one_byte_more_is_dropped() -> None:
    window = WindowConfig(max_tokens=1000)  # max_message_tokens 1000: 2000 bytes
    kept = data_of(2000)
    pd, oversized, sent, _ = one_turn(kept, window)
    assert (pd, oversized) == (kept, 0) and orjson.loads(sent) == kept
    pd, oversized, sent, said = one_turn(data_of(2001), window)
    assert (pd, oversized, sent, said) == (None, 1, "", "fine, thanks")
