"""A tool agent failing over to an LLM that cannot call tools, on virtual time.

The agent offers ``book_table`` (SideEffect). Turn 1 is answered by the primary; from turn 2
on the primary fails before content and the resilience layer fails over to a secondary that
cannot call tools (``calls_tools = False``, as the local LLM). A model offered no tools can
only claim the booking in words: here it would say "Your table is booked." The layer never
asks it a request that offers tools: the caller hears that it cannot be done now, no tool
runs, nothing is booked, the failover is logged and counted. A request without tools still
goes to the secondary.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import brisvox.providers.resilience.llm as layer_llm
from brisvox.providers.resilience import Resilience, wrap
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.failover_kit import Contacts, LegLlm, Switch, conversation, run_layered

HELLO = "Hello, how can I help?"
INVENTED = "Your table is booked."
LINE = getattr(layer_llm, "NO_TOOLS_LINE", "(no such line)")


class Primary(LegLlm):
    """The fake's leg, failing every request from the ``fail_from``-th on (503, no content)."""

    def __init__(self, fake: Any, fail_from: int) -> None:
        super().__init__(fake, Switch(), Contacts(), "openai")
        self.fail_from = fail_from
        self.requests: list[Any] = []

    def stream(self, request: Any) -> Any:
        self.requests.append(request)
        if len(self.requests) >= self.fail_from:
            self.sw.down = True
        return super().stream(request)


class Toolless(LegLlm):
    calls_tools = False

    def __init__(self, fake: Any) -> None:
        super().__init__(fake, Switch(), Contacts(), "local_llm")


def run(tools_offered: bool) -> tuple[Any, Primary, Toolless, SimTools]:
    tools = SimTools()
    made: dict[str, Any] = {}

    def layer(stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        made["p"], made["s"] = Primary(llm, fail_from=2), Toolless(llm)
        return stt, wrap("llm", made["p"], made["s"], resilience=Resilience()), tts

    call = SimCall(steps=[Utter("hello there", at=0.5), Utter("book a table for two", after_bot_done=1.0)],
                   llm=[LlmScript((Say(HELLO),)), LlmScript((Say(INVENTED),))], quiet=6.0,
                   registry=tools.registry if tools_offered else None)
    res = run_virtual(lambda: run_layered(call, layer))
    return res, made["p"], made["s"], tools


def test_the_failover_to_a_toolless_leg_says_it_cannot_do_that_now(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="brisvox.providers.resilience"):
        res, prim, sec, tools = run(tools_offered=True)
    msgs, words = conversation(res)
    assert msgs == [("user", "hello there"), ("assistant", HELLO), ("user", "book a table for two"),
                    ("assistant", LINE)]
    assert words == (HELLO + " " + LINE).split()  # the caller heard it
    assert all(r.tools for r in prim.requests)  # every request offered the tools
    assert sec.contacts.n == 0  # the tool-less leg was never asked to answer them
    assert tools.bodies["book_table"] == 0 and tools.bookings == []
    st = res.actor.runner.provider.stats()
    assert st["no_tools_answers"] == 1 and st["failovers"] == 1
    assert [r.getMessage() for r in caplog.records if "cannot call tools" in r.getMessage()] == [
        "llm failover to local_llm, which cannot call tools: a request offering 3 tool(s) is answered that it "
        "cannot be done now (no tool runs) until openai is back"]
    assert res.live_tasks_after == 0 and res.stray_tasks == []


def test_without_tools_the_toolless_leg_answers_itself() -> None:
    res, prim, sec, _ = run(tools_offered=False)
    msgs, _ = conversation(res)
    assert [m for _, m in msgs] == ["hello there", HELLO, "book a table for two", INVENTED]
    assert sec.contacts.n == 1 and res.actor.runner.provider.stats().get("no_tools_answers", 0) == 0
