"""Observability: one settle event per call with exact durations on virtual time,
held and late_result events, retries, and never an argument value."""

from __future__ import annotations

import asyncio
import logging

import pytest

from brisvox.agent.conversation.context import ToolCall
from brisvox.clock import CLOCK

from .helpers import CITY, RO, SE, Capture, Conv, Probe, engine, registry

SECRET = "4111-1111-1111-1111"


@pytest.fixture
def cap():
    log = logging.getLogger("brisvox.tools")
    c = Capture()
    old = log.level
    log.addHandler(c)
    log.setLevel(logging.DEBUG)
    yield c
    log.removeHandler(c)
    log.setLevel(old)


def test_every_outcome_traced_with_exact_fields_and_no_argument_values(vrun, cap):
    async def main():
        reg = registry(
            look=(RO, Probe(0.25, result="ok"), {"parameters": CITY}),
            slow=(RO, Probe(10.0), {"timeout": 0.5}),
            book=(SE, Probe(1.0, result="BK"), {"timeout": 0.5}),
            bad=(RO, Probe(error="nope"), {}),
        )
        eng = engine(reg)
        conv = Conv(eng)
        conv.epoch = 4
        await conv.run(("look", {"city": SECRET}), ("slow", {"card": SECRET}), ("book", {"card": SECRET}),
                       ("bad", {}), ("zz", {"card": SECRET}), ("look", {"town": SECRET}))
        await CLOCK.sleep(1.0)
        settled = [e for e in cap.events if e.message == "tool call settled"]
        by_call = {e.call: e for e in settled}
        assert len(settled) == 6 and len(by_call) == 6
        assert [by_call[f"t4.{i}"].outcome for i in range(6)] == [
            "ok", "timed_out", "timed_out_running", "failed", "unknown_tool", "invalid_arguments"]
        assert by_call["t4.0"].duration_us == 250_000
        assert by_call["t4.1"].duration_us == 500_000 and by_call["t4.2"].duration_us == 500_000
        assert by_call["t4.4"].duration_us == 0
        assert all(e.session == "sess-1" and e.epoch == 4 and e.retries == 0 for e in settled)
        late = [e for e in cap.events if e.message == "late_result"]
        assert [(e.call, e.outcome) for e in late] == [("t4.2", "late_result")]
        # the malformed round was spent: the next round's events carry retries=1
        await conv.run(("look", {"city": "Rome"}))
        assert cap.events[-1].retries == 1 and cap.events[-1].outcome == "ok"
        for r in cap.records:
            assert SECRET not in r.getMessage()
            assert SECRET not in repr(getattr(r, "tool_event", ""))
            assert SECRET not in repr(r.args)

    vrun(main)


def test_held_then_settled_at_commit_and_stale_budget_outcomes(vrun, cap):
    async def main():
        eng = engine(registry(book=(SE, Probe(0.1), {}), w=(RO, Probe(), {"parameters": CITY})),
                     max_invalid_rounds=0)
        spec = await eng.speculate([ToolCall("t1.0", "book", {})], 1)
        assert [(e.message, e.outcome) for e in cap.events] == [("tool call held", "held")]
        ex = await eng.commit(spec)
        ex.mark_delivered()
        assert (cap.events[-1].message, cap.events[-1].outcome, cap.events[-1].duration_us) == (
            "tool call settled", "ok", 100_000)
        old = await eng.execute([ToolCall("t0.0", "book", {})], 0)
        old.mark_delivered()
        ex = await eng.execute([ToolCall("t1.1", "w", {})], 1)
        ex.mark_delivered()
        assert [e.outcome for e in cap.events[-2:]] == ["stale_turn", "budget_exhausted"]

    vrun(main)


def test_interrupted_outcomes_and_orphan_outcomes(vrun, cap):
    async def main():
        eng = engine(registry(ro=(RO, Probe(5.0), {}), se=(SE, Probe(1.0), {})))
        conv = Conv(eng)
        asyncio.get_running_loop().call_later(0.2, conv.token.cancel)
        await conv.run(("ro", {}), ("se", {"a": 1}))
        outcomes = [e.outcome for e in cap.events if e.message == "tool call settled"]
        assert outcomes == ["interrupted", "interrupted_running"]
        conv.new_turn()
        await conv.run(("se", {"a": 1}))
        assert cap.events[-1].outcome == "orphan_in_flight"
        await CLOCK.sleep(1.0)
        conv.new_turn()
        await conv.run(("se", {"a": 1}))
        assert cap.events[-1].outcome == "orphan_replayed"
        conv.token.cancel()
        await conv.run(("ro", {}))
        assert cap.events[-1].outcome == "not_started"

    vrun(main)


def test_side_effect_execution_is_logged_at_info_with_key_digest(vrun, cap):
    async def main():
        eng = engine(registry(book=(SE, Probe(), {})))
        conv = Conv(eng)
        await conv.run(("book", {"card": SECRET}))
        infos = [r.getMessage() for r in cap.records if r.levelno == logging.INFO]
        from brisvox.agent.tool_engine.registry import IdempotencyKey

        assert infos == [f"side effect session=sess-1 tool=book epoch=1 key={IdempotencyKey('sess-1', 1, 't1.0').hex()}"]

    vrun(main)


ALL_OUTCOMES = {
    "ok", "ok_truncated", "failed", "timed_out", "timed_out_running", "interrupted", "interrupted_running",
    "not_started", "recorded", "duplicate", "repeat_refused", "lost", "store_full", "malformed", "unknown_tool",
    "invalid_arguments", "arguments_too_large", "too_many_calls", "budget_exhausted", "stale_turn",
    "result_too_large", "held", "late_result", "orphan_replayed", "orphan_in_flight", "orphan_lost",
    "orphan_reported",
}


def test_every_outcome_of_the_seed_is_traced(vrun, cap):
    async def main():
        reg = registry(
            ro=(RO, Probe(0.1, result="r"), {"parameters": CITY}),
            big=(RO, Probe(result="x" * 200), {}),
            bigse=(SE, Probe(result="x" * 200), {}),
            slow=(RO, Probe(5.0), {"timeout": 0.5}),
            se=(SE, Probe(1.0, result="BK"), {"timeout": 0.5}),
            fail=(RO, Probe(error="no"), {}),
            crash=(SE, Probe(0.1, panic=True), {}),
            hang=(SE, Probe(hang=True), {"timeout": 0.1}),
        )
        eng = engine(reg, max_result_bytes=100, max_argument_bytes=200, idempotency_capacity=4,
                     max_invalid_rounds=2)
        conv = Conv(eng)
        await conv.run(("ro", {"city": "a"}), ("big", {}), ("bigse", {}), ("slow", {}), ("se", {"a": 1}),
                       ("fail", {}), ("zz", {}), ("ro", {}), ("ro", {"city": "x" * 300}), ("ro", "{bad"))
        dup = ToolCall("t1.90", "bigse", {"d": 1})
        ex = await eng.execute([dup, dup], conv.epoch)  # duplicate
        ex.mark_delivered()
        ex = await eng.execute([dup], conv.epoch)  # recorded
        ex.mark_delivered()
        await conv.run(("bigse", {}))  # repeat_refused
        ex = await eng.execute([ToolCall(f"t1.{50 + i}", "ro", {"city": "a"}) for i in range(33)], conv.epoch)
        ex.mark_delivered()  # too_many_calls
        await conv.run(("crash", {}))  # lost
        await conv.run(("ro", {}))  # budget_exhausted (3rd malformed round > 2)
        old = await eng.execute([ToolCall("t0.0", "ro", {"city": "a"})], 0)
        old.mark_delivered()  # stale_turn
        conv.token.cancel()
        conv.new_turn()
        conv.token.cancel()
        await conv.run(("ro", {"city": "a"}))  # not_started
        conv.new_turn()
        asyncio.get_running_loop().call_later(0.05, conv.token.cancel)
        await conv.run(("slow", {}), ("crash", {"k": 2}))  # interrupted + interrupted_running
        conv.new_turn()
        await CLOCK.sleep(0.2)
        await conv.run(("crash", {"k": 2}))  # orphan_lost
        await conv.run(("se", {"a": 9}))  # timed_out_running -> orphan
        conv.new_turn()
        await conv.run(("se", {"a": 9}))  # orphan_in_flight
        await CLOCK.sleep(1.0)
        conv.new_turn()
        await conv.run(("se", {"a": 9}))  # orphan_replayed
        await conv.run(("se", {"a": 1}))  # the first 'se' (epoch 1) finished long ago: note reported
        for i in range(4):
            await conv.run(("hang", {"i": i}))  # fills the store with in-flight calls
        await conv.run(("se", {"store": "full"}))  # store_full
        spec = await eng.speculate([ToolCall("t9.0", "se", {"h": 1})], 9)
        spec.discard()
        outcomes = {e.outcome for e in cap.events}
        assert ALL_OUTCOMES - outcomes == set()
        assert outcomes - ALL_OUTCOMES <= {"confirmation_required", "confirmation_refused"}
        for e in cap.events:
            assert e.session == "sess-1" and isinstance(e.duration_us, int) and e.retries >= 0
        await eng.aclose()

    vrun(main)
