"""A fake LLM vendor that fails on purpose and counts its contacts (one per ``stream`` call).

``plan``: the mode of each contact in order (the last one repeats): ``ok`` (a short answer),
``tool`` (one ``get_customer`` call), ``error`` (an LlmError 503 as the first event), ``raise``
(a ProviderError 503 raised by ``stream`` itself), ``empty`` (a stream that ends with no
event), ``hang`` (no event ever), ``429`` / ``429_long`` (a 429 with ``Retry-After`` 1 s /
30 s), ``bad_request`` (an LlmError 400, not retryable), ``auth`` (a ProviderError 401 raised,
not retryable). Each contact's time (the loop clock) is kept in ``at``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.clock import CLOCK
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmRequest,
    ProviderError,
    TextDelta,
    ToolCallDelta,
)

ANSWER = "Here you are."
EVENTS: dict[str, list[Any]] = {
    "ok": [TextDelta(ANSWER), Done()],
    "tool": [ToolCallDelta(0, "c1", "get_customer", "{}"), Done()],
    "error": [LlmError("server", "HTTP 503")],
    "empty": [],
    "429": [LlmError("rate_limited", "HTTP 429", True, 1.0)],
    "429_long": [LlmError("rate_limited", "HTTP 429", True, 30.0)],
    "bad_request": [LlmError("bad_request", "HTTP 400", False)],
}
RAISED = {"raise": ProviderError("server", "HTTP 503"), "auth": ProviderError("auth", "HTTP 401", retryable=False)}


class FailingLlm:
    def __init__(self, name: str, plan: list[str]) -> None:
        self.name = name
        self.plan = plan
        self.at: list[float] = []

    @property
    def contacts(self) -> int:
        return len(self.at)

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        pass

    def stream(self, request: LlmRequest) -> Any:
        mode = self.plan[min(len(self.at), len(self.plan) - 1)]
        self.at.append(CLOCK.now())
        if mode in RAISED:
            raise RAISED[mode]
        return _Stream(mode)


class _Stream:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.events = list(EVENTS.get(mode, []))

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0.05)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    async def aclose(self) -> None:
        self.events = []
