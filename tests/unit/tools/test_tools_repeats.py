"""Repeats within a turn (already_done), with a mutation check:
each deliberately broken engine variant must make at least one of these scenarios fail."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.agent.tool_engine.side_effects import _Mutations
from brisvox.clock import CLOCK
from brisvox.sim.vloop import run_virtual

from .helpers import RO, SE, Conv, Probe, body, kind, registry


def make(reg: ToolRegistry, mut: _Mutations) -> ToolEngine:
    return ToolEngine(reg, "sess-1", CLOCK, None, _mutations=mut)


def tools():
    book, look, dtmf, flaky = Probe(result={"booking": "BK-1001"}), Probe(), Probe(), Probe(error="busy")
    reg = registry(book_table=(SE, book, {}), look=(RO, look, {}), dtmf=(SE, dtmf, {"repeatable": True}),
                   flaky=(SE, flaky, {}))
    return reg, book, look, dtmf, flaky


async def identical_call_of_a_later_response_is_refused(mut: _Mutations) -> None:
    reg, book, *_ = tools()
    conv = Conv(make(reg, mut))
    await conv.run(("book_table", {"name": "Kaya", "time": "19:00"}))
    ex = await conv.run(("book_table", {"time": "19:00", "name": "Kaya"}))  # key order differs
    assert kind(ex.results[0]) == "already_done", ex.results[0]
    b = body(ex.results[0])
    assert "already ran earlier in this turn and succeeded" in b["detail"] and "do not repeat" in b["detail"].lower()
    assert book.count == 1
    assert conv.engine.stats().side_effect_repeats == 1
    conv.say("Your table is booked.")
    conv.ctx.validate()


async def other_arguments_run(mut: _Mutations) -> None:
    reg, book, *_ = tools()
    conv = Conv(make(reg, mut))
    await conv.run(("book_table", {"name": "Kaya", "time": "19:00"}))
    ex = await conv.run(("book_table", {"name": "Kaya", "time": "20:00"}))
    assert not ex.results[0].is_error and book.count == 2


async def next_turn_runs(mut: _Mutations) -> None:
    reg, book, *_ = tools()
    conv = Conv(make(reg, mut))
    await conv.run(("book_table", {"name": "Kaya"}))
    conv.say("Booked.")
    conv.new_turn("book another one, same")
    ex = await conv.run(("book_table", {"name": "Kaya"}))
    assert not ex.results[0].is_error, ex.results[0]
    assert book.count == 2


async def two_calls_of_one_response_both_run(mut: _Mutations) -> None:
    reg, book, *_ = tools()
    conv = Conv(make(reg, mut))
    ex = await conv.run(("book_table", {"name": "Kaya"}), ("book_table", {"name": "Kaya"}))
    assert [m.is_error for m in ex.results] == [False, False] and book.count == 2


async def repeatable_tool_runs(mut: _Mutations) -> None:
    reg, _, _, dtmf, _ = tools()
    conv = Conv(make(reg, mut))
    await conv.run(("dtmf", {"digit": "1"}))
    ex = await conv.run(("dtmf", {"digit": "1"}))
    assert not ex.results[0].is_error and dtmf.count == 2


async def read_only_tool_runs(mut: _Mutations) -> None:
    reg, _, look, *_ = tools()
    conv = Conv(make(reg, mut))
    await conv.run(("look", {"q": 1}))
    ex = await conv.run(("look", {"q": 1}))
    assert not ex.results[0].is_error and look.count == 2


async def retry_of_a_failed_call_runs(mut: _Mutations) -> None:
    reg, *_, flaky = tools()
    conv = Conv(make(reg, mut))
    ex = await conv.run(("flaky", {"x": 1}))
    assert kind(ex.results[0]) == "tool_failed"
    ex = await conv.run(("flaky", {"x": 1}))
    assert kind(ex.results[0]) == "tool_failed" and flaky.count == 2, ex.results[0]


SCENARIOS: dict[str, Callable[[_Mutations], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        identical_call_of_a_later_response_is_refused,
        other_arguments_run,
        next_turn_runs,
        two_calls_of_one_response_both_run,
        repeatable_tool_runs,
        read_only_tool_runs,
        retry_of_a_failed_call_runs,
    )
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_repeat_rule(name):
    run_virtual(lambda: SCENARIOS[name](_Mutations()))


def failing(mut: _Mutations) -> set[str]:
    out = set()
    for name, scen in SCENARIOS.items():
        try:
            run_virtual(lambda s=scen: s(mut))
        except AssertionError:
            out.add(name)
    return out


@pytest.mark.parametrize(
    "mut,expected",
    [
        (_Mutations(no_already_done_check=True), "identical_call_of_a_later_response_is_refused"),
        (_Mutations(already_done_ignores_epoch=True), "next_turn_runs"),
        (_Mutations(failures_count_as_success=True), "retry_of_a_failed_call_runs"),
    ],
)
def test_mutation_check_each_broken_variant_fails_a_test(mut, expected):
    failed = failing(mut)
    assert expected in failed, failed
