"""Speculation: ReadOnly runs, SideEffect held, commit in issue order,
discard runs nothing, stale and exhausted commits, cancelled commits, replays."""

from __future__ import annotations

import pytest

from brisvox.agent.conversation.context import ToolCall, UserMessage
from brisvox.agent.tool_engine.registry import CancelToken
from brisvox.clock import CLOCK

from .helpers import CITY, RO, SE, Conv, Probe, engine, kind, registry


def setup(**cfg):
    look, book = Probe(0.1, result="sunny"), Probe(0.2, result="BK-1")
    eng = engine(registry(look=(RO, look, {}), book=(SE, book, {}), w=(RO, Probe(), {"parameters": CITY})), **cfg)
    return eng, look, book


def test_read_only_runs_side_effect_held_and_commit_in_issue_order_booking_first(vrun):
    async def main():
        eng, look, book = setup()
        conv = Conv(eng)
        calls = conv.respond(("book", {"slot": 1}), ("look", {}))
        spec = await eng.speculate(calls, conv.epoch, conv.token)
        assert look.count == 1 and book.count == 0
        assert [c.id for c in spec.held_calls()] == ["t1.0"]
        assert [m.call_id for m in spec.answered()] == ["t1.1"]
        assert spec.epoch() == 1 and not spec.budget_exhausted
        t0 = CLOCK.now()
        ex = await eng.commit(spec, conv.token)
        assert CLOCK.now() - t0 == pytest.approx(0.2)
        assert [m.call_id for m in ex.results] == ["t1.0", "t1.1"]
        assert ex.results[0].content == "BK-1" and ex.results[1].content == "sunny"
        assert book.count == 1 and look.count == 1
        ex.append_to(conv.ctx)
        conv.ctx.validate()

    vrun(main)


def test_a_discarded_speculation_runs_nothing_and_spends_its_round(vrun):
    async def main():
        eng, look, book = setup()
        conv = Conv(eng)
        calls = conv.respond(("book", {}), ("w", {}))  # w is malformed
        spec = await eng.speculate(calls, conv.epoch, conv.token)
        spec.discard()
        del spec
        await CLOCK.sleep(1.0)
        assert book.count == 0 and eng.invalid_rounds(conv.epoch) == 1
        assert conv.ctx.interrupt_pending_tool_calls() == 2
        conv.ctx.push(UserMessage("next"))
        conv.ctx.validate()

    vrun(main)


def test_a_speculation_of_a_superseded_turn_runs_nothing_on_commit(vrun):
    async def main():
        eng, look, book = setup()
        spec = await eng.speculate([ToolCall("t1.0", "book", {})], 1)
        ex2 = await eng.execute([ToolCall("t2.0", "look", {})], 2)
        ex2.mark_delivered()
        ex = await eng.commit(spec)
        assert kind(ex.results[0]) == "stale_turn" and book.count == 0
        ex.discard()

    vrun(main)


def test_commit_spends_no_budget(vrun):
    async def main():
        eng, look, book = setup()
        spec = await eng.speculate([ToolCall("t1.0", "book", {}), ToolCall("t1.1", "w", {})], 1)
        assert eng.invalid_rounds(1) == 1
        ex = await eng.commit(spec)
        assert eng.invalid_rounds(1) == 1 and book.count == 1
        ex.mark_delivered()

    vrun(main)


def test_commit_after_the_budget_ran_out_answers_budget_exhausted(vrun):
    async def main():
        eng, look, book = setup()
        spec = await eng.speculate([ToolCall("t1.0", "book", {})], 1)
        for i in range(3):
            ex = await eng.execute([ToolCall(f"t1.{i + 1}", "w", {})], 1)
            ex.mark_delivered()
        ex = await eng.commit(spec)
        assert ex.budget_exhausted and kind(ex.results[0]) == "budget_exhausted" and book.count == 0
        ex.mark_delivered()

    vrun(main)


def test_a_speculation_made_under_an_exhausted_budget_holds_nothing(vrun):
    async def main():
        eng, look, book = setup(max_invalid_rounds=0)
        spec = await eng.speculate([ToolCall("t1.0", "book", {}), ToolCall("t1.1", "w", {})], 1)
        assert spec.budget_exhausted and spec.held_calls() == []
        ex = await eng.commit(spec)
        assert ex.budget_exhausted and [kind(m) for m in ex.results] == ["budget_exhausted"] * 2
        assert book.count == 0
        ex.mark_delivered()

    vrun(main)


def test_commit_with_a_cancelled_token_answers_interrupted_without_running(vrun):
    async def main():
        eng, look, book = setup()
        spec = await eng.speculate([ToolCall("t1.0", "book", {})], 1)
        tok = CancelToken()
        tok.cancel()
        ex = await eng.commit(spec, tok)
        assert kind(ex.results[0]) == "interrupted" and book.count == 0
        ex.mark_delivered()

    vrun(main)


def test_commit_replay_returns_the_recorded_result(vrun):
    async def main():
        eng, look, book = setup()
        spec = await eng.speculate([ToolCall("t1.0", "book", {})], 1)
        ex = await eng.commit(spec)
        ex.mark_delivered()
        spec2 = await eng.speculate([ToolCall("t1.0", "book", {})], 1)
        ex2 = await eng.commit(spec2)
        assert ex2.results[0].content == "BK-1" and book.count == 1
        ex2.mark_delivered()
        with pytest.raises(RuntimeError):
            await eng.commit(spec2)

    vrun(main)
