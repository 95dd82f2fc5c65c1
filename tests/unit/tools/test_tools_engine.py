"""ToolEngine: parallel runs, order, timeouts, failures, sizes,
interruption, late results, backstop, idempotency, budget, call cap, context validity.
All on virtual time (the ``vrun`` fixture)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import SystemMessage, ToolCall, UserMessage
from brisvox.agent.tool_engine.config import MAILBOX_CAPACITY, TRUNCATION_MARKER
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import CancelToken, IdempotencyKey, ToolContext
from brisvox.clock import CLOCK

from .helpers import CITY, OBJ, RO, SE, Conv, Probe, body, engine, kind, registry

# --- parallel timing and order --------------------------------------------------------


def test_parallel_pair_finishes_at_the_longest_and_results_keep_issue_order(vrun):
    async def main():
        slow, fast = Probe(0.1), Probe(0.05)
        conv = Conv(engine(registry(slow=(RO, slow, {}), fast=(RO, fast, {}), b=(SE, Probe(0.1), {}))))
        t0 = CLOCK.now()
        ex = await conv.run(("slow", {}), ("fast", {}))
        assert CLOCK.now() - t0 == pytest.approx(0.1, abs=1e-9)
        assert [m.call_id for m in ex.results] == ["t1.0", "t1.1"]  # reversed completion
        assert slow.started_at == fast.started_at == [t0]  # both started before either finished
        t1 = CLOCK.now()
        await conv.run(("slow", {}), ("b", {"x": 1}))  # a 100 ms + 100 ms pair, mixed kinds
        assert CLOCK.now() - t1 == pytest.approx(0.1, abs=1e-9)

    vrun(main)


def test_three_calls_results_in_issue_order_whatever_completes_first(vrun):
    async def main():
        p = {n: Probe(d, result=n) for n, d in (("a", 0.3), ("b", 0.1), ("c", 0.2))}
        conv = Conv(engine(registry(**{n: (RO, t, {}) for n, t in p.items()})))
        ex = await conv.run(("a", {}), ("b", {}), ("c", {}))
        assert [m.content for m in ex.results] == ["a", "b", "c"]

    vrun(main)


# --- ReadOnly timeouts, failures, panics ------------------------------------------------


def test_read_only_timeout_drops_the_future(vrun):
    async def main():
        slow = Probe(10.0)
        conv = Conv(engine(registry(slow=(RO, slow, {"timeout": 0.5}))))
        t0 = CLOCK.now()
        ex = await conv.run(("slow", {}))
        assert CLOCK.now() - t0 == pytest.approx(0.5)
        assert kind(ex.results[0]) == "timeout" and ex.results[0].is_error
        assert slow.cancelled == 1 and slow.finished == 0

    vrun(main)


def test_tool_error_is_tool_failed_with_its_message(vrun):
    async def main():
        conv = Conv(engine(registry(bad=(RO, Probe(error="no such city"), {}))))
        ex = await conv.run(("bad", {}))
        b = body(ex.results[0])
        assert b == {"error": "tool_failed", "tool": "bad", "detail": "no such city"}

    vrun(main)


def test_panicking_read_only_tool_in_call_and_in_future_next_to_answered_siblings(vrun):
    def panics_in_call(args, ctx):
        raise RuntimeError("in call")

    async def main():
        conv = Conv(engine(registry(
            p1=(RO, panics_in_call, {}), p2=(RO, Probe(0.01, panic=True), {}), ok=(RO, Probe(0.02), {}))))
        ex = await conv.run(("p1", {}), ("ok", {}), ("p2", {}))
        assert [kind(m) for m in ex.results] == ["tool_failed", None, "tool_failed"]
        assert body(ex.results[0])["detail"] == "the tool panicked"
        assert body(ex.results[1])["ok"] is True

    vrun(main)


# --- result size --------------------------------------------------------------------------


@pytest.mark.parametrize("kind_", [RO, SE])
def test_result_exactly_at_the_limit_passes_for_json_and_text(vrun, kind_):
    async def main():
        limit = 1000
        text = "x" * limit
        js = {"v": "y" * (limit - 8)}  # {"v":"..."} = 8 bytes of framing
        conv = Conv(engine(registry(t=(kind_, Probe(result=text), {}), j=(kind_, Probe(result=js), {})),
                           max_result_bytes=limit))
        ex = await conv.run(("t", {}), ("j", {"k": 1}))
        assert ex.results[0].content == text and not ex.results[0].is_error
        assert len(ex.results[1].content) == limit and not ex.results[1].is_error

    vrun(main)


def test_read_only_result_over_the_limit_is_result_too_large(vrun):
    async def main():
        conv = Conv(engine(registry(t=(RO, Probe(result="x" * 1001), {}), j=(RO, Probe(result={"v": "y" * 993}), {})),
                           max_result_bytes=1000))
        ex = await conv.run(("t", {}), ("j", {}))
        assert [kind(m) for m in ex.results] == ["result_too_large", "result_too_large"]

    vrun(main)


@pytest.mark.parametrize("payload", ["x" * 1001, "é" * 600, {"v": "é" * 600}])
def test_side_effect_result_over_the_limit_is_cut_with_marker_and_recorded(vrun, payload):
    async def main():
        limit = 1000
        tool = Probe(result=payload)
        eng = engine(registry(t=(SE, tool, {})), max_result_bytes=limit)
        conv = Conv(eng)
        ex = await conv.run(("t", {}))
        out = ex.results[0].content
        assert out.endswith(TRUNCATION_MARKER) and not ex.results[0].is_error
        raw = out.encode()
        assert limit - 3 <= len(raw) <= limit  # a multi-byte cut may leave up to 3 bytes
        full = payload if isinstance(payload, str) else '{"v":"' + "é" * 600 + '"}'
        assert full.startswith(out[: -len(TRUNCATION_MARKER)])
        if isinstance(payload, str) and payload.isascii():
            assert len(raw) == limit
        # recorded as done: a replay of the same call id answers the cut text without running
        again = await eng.execute([ToolCall("t1.0", "t", {})], conv.epoch, conv.token)
        assert again.results[0].content == out and tool.count == 1
        again.discard()

    vrun(main)


# --- argument cap -------------------------------------------------------------------------


def test_argument_cap_exactly_at_cap_runs_one_byte_over_is_refused(vrun):
    async def main():
        cap = 100
        tool = Probe()
        conv = Conv(engine(registry(t=(RO, tool, {})), max_argument_bytes=cap))
        at = {"s": "a" * (cap - 8)}  # {"s":"..."} adds 8 bytes
        ex = await conv.run(("t", at))
        assert not ex.results[0].is_error and tool.count == 1
        over = {"s": "a" * (cap - 7)}
        ex = await conv.run(("t", over))
        assert kind(ex.results[0]) == "arguments_too_large" and tool.count == 1
        assert conv.engine.invalid_rounds(conv.epoch) == 1

    vrun(main)


def test_a_200_kib_unique_items_array_is_refused_before_validation(vrun):
    async def main():
        schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
        tool = Probe()
        conv = Conv(engine(registry(t=(RO, tool, {"parameters": schema}))))
        xs = [{"k": i} for i in range(200 * 1024 // 9)]
        ex = await conv.run(("t", {"xs": xs}))
        assert kind(ex.results[0]) == "arguments_too_large" and tool.count == 0

    vrun(main)


# --- interruption and late results ------------------------------------------------------


def test_read_only_interruption_drops_the_call(vrun):
    async def main():
        slow = Probe(5.0)
        eng = engine(registry(slow=(RO, slow, {})))
        conv = Conv(eng)
        asyncio.get_running_loop().call_later(0.2, conv.token.cancel)
        t0 = CLOCK.now()
        ex = await conv.run(("slow", {}))
        assert CLOCK.now() - t0 == pytest.approx(0.2)
        assert kind(ex.results[0]) == "interrupted" and slow.cancelled == 1
        assert eng.stats().read_only_cancelled == 1
        assert eng.take_late_notes() == []

    vrun(main)


def test_side_effect_interruption_is_not_dropped_and_reported_later_as_a_note(vrun):
    async def main():
        book = Probe(1.0, result={"booking": "BK-1001"})
        eng = engine(registry(book=(SE, book, {})))
        conv = Conv(eng)
        asyncio.get_running_loop().call_later(0.2, conv.token.cancel)
        t0 = CLOCK.now()
        ex = await conv.run(("book", {"slot": 7}))
        assert CLOCK.now() - t0 == pytest.approx(0.2)  # barge-in not delayed by the booking
        assert kind(ex.results[0]) == "interrupted"
        assert eng.stats().side_effect_interrupted == 1
        await CLOCK.sleep(1.0)
        assert book.finished == 1 and book.cancelled == 0
        conv.new_turn()
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-1001" in notes[0].content and "t1.0" in notes[0].content
        conv.ctx.extend(notes)
        conv.ctx.validate()
        assert eng.take_late_notes() == []  # exactly once
        assert eng.stats().side_effect_late_results == 1

    vrun(main)


def test_call_not_started_with_a_cancelled_token_does_not_run_for_both_kinds(vrun):
    async def main():
        ro, se = Probe(), Probe()
        eng = engine(registry(ro=(RO, ro, {}), se=(SE, se, {})))
        conv = Conv(eng)
        conv.token.cancel()
        ex = await conv.run(("ro", {}), ("se", {}))
        assert [kind(m) for m in ex.results] == ["interrupted", "interrupted"]
        assert ro.count == se.count == 0
        assert eng.stats().not_started_cancelled == 2

    vrun(main)


def test_side_effect_past_its_timeout_keeps_running_is_not_repeated_and_reported(vrun):
    async def main():
        book = Probe(5.1, result={"booking": "BK-7"})
        eng = engine(registry(book=(SE, book, {"timeout": 5.0})))
        conv = Conv(eng)
        t0 = CLOCK.now()
        ex = await conv.run(("book", {"slot": 1}))
        assert CLOCK.now() - t0 == pytest.approx(5.0)
        b = body(ex.results[0])
        assert b["error"] == "timeout" and "keeps running" in b["detail"] and "do not repeat" in b["detail"]
        # the LLM retries the same booking in the next round of the turn: not run again
        ex2 = await conv.run(("book", {"slot": 1}))
        assert kind(ex2.results[0]) == "duplicate_call"
        await CLOCK.sleep(0.2)
        assert book.count == 1 and book.finished == 1
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-7" in notes[0].content
        # recorded: the same key answers the recorded result
        ex3 = await eng.execute([ToolCall("t1.0", "book", {"slot": 1})], conv.epoch, conv.token)
        assert "BK-7" in ex3.results[0].content
        ex3.discard()

    vrun(main)


def test_result_sent_before_a_dropped_execute_is_read_comes_back_as_a_note(vrun):
    async def main():
        book = Probe(0.1, result="BK-1")
        slow = Probe(1.0)
        eng = engine(registry(book=(SE, book, {}), slow=(RO, slow, {})))
        conv = Conv(eng)
        calls = conv.respond(("book", {}), ("slow", {}))
        task = asyncio.create_task(eng.execute(calls, conv.epoch, conv.token))
        await CLOCK.sleep(0.5)  # the booking's slot resolved inside the run
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        conv.ctx.interrupt_pending_tool_calls()
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-1" in notes[0].content
        conv.ctx.extend(notes)
        conv.ctx.validate()
        assert book.count == 1

    vrun(main)


def test_a_result_arriving_after_a_dropped_execute_is_noted_and_the_call_is_not_stuck(vrun):
    async def main():
        book = Probe(1.0, result="BK-2")
        eng = engine(registry(book=(SE, book, {})))
        conv = Conv(eng)
        calls = conv.respond(("book", {}))
        task = asyncio.create_task(eng.execute(calls, conv.epoch, conv.token))
        await CLOCK.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        conv.ctx.interrupt_pending_tool_calls()
        assert eng.take_late_notes() == []
        await CLOCK.sleep(1.0)
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-2" in notes[0].content
        assert eng.idempotency_usage().entries == 1
        assert eng.running_side_effects() == 0
        # the key is recorded (done), not stuck in flight
        ex = await eng.execute([ToolCall("t1.0", "book", {})], conv.epoch, conv.token)
        assert ex.results[0].content == "BK-2"
        ex.discard()

    vrun(main)


def test_stress_tools_finishing_at_their_timeout_each_answered_or_noted_exactly_once(vrun):
    async def main():
        tools = {f"s{i}": Probe(0.5, result=f"R{i}") for i in range(12)}
        reg = registry(**{n: (SE, t, {"timeout": 0.5}) for n, t in tools.items()})
        eng = engine(reg)
        conv = Conv(eng)
        ex = await conv.run(*[(n, {}) for n in tools])
        await CLOCK.sleep(0.1)
        notes = ex.late_notes + eng.take_late_notes()
        seen: dict[str, int] = {}
        for m in ex.results:
            if not m.is_error:
                seen[m.content] = seen.get(m.content, 0) + 1
        for n in notes:
            for i in range(12):
                if n.content.endswith(f"result: R{i}"):
                    seen[f"R{i}"] = seen.get(f"R{i}", 0) + 1
        assert seen == {f"R{i}": 1 for i in range(12)}
        assert all(t.count == 1 for t in tools.values())

    vrun(main)


def test_hard_backstop_drops_a_hung_tool_records_it_lost_and_never_reruns(vrun):
    async def main():
        hung = Probe(hang=True)
        eng = engine(registry(hung=(SE, hung, {"timeout": 1.0})), max_side_effect_runtime=10.0)
        conv = Conv(eng)
        ex = await conv.run(("hung", {}))
        assert kind(ex.results[0]) == "timeout"
        await CLOCK.sleep(9.5)
        assert hung.cancelled == 1 and eng.running_side_effects() == 0
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "unknown" in notes[0].content
        rerun = await eng.execute([ToolCall("t1.0", "hung", {})], conv.epoch, conv.token)
        assert kind(rerun.results[0]) == "unknown_outcome" and hung.count == 1
        rerun.discard()

    vrun(main)


def test_the_backstop_is_raised_to_the_tools_own_timeout(vrun):
    async def main():
        slow = Probe(30.0, result="late")
        eng = engine(registry(slow=(SE, slow, {"timeout": 40.0})), max_side_effect_runtime=1.0)
        conv = Conv(eng)
        ex = await conv.run(("slow", {}))
        assert ex.results[0].content == "late"

    vrun(main)


def test_closing_the_engine_aborts_running_side_effects_recorded_lost(vrun):
    async def main():
        hung = Probe(hang=True)
        eng = engine(registry(hung=(SE, hung, {"timeout": 0.1})))
        conv = Conv(eng)
        await conv.run(("hung", {}))
        assert eng.running_side_effects() == 1
        await eng.aclose()
        assert hung.cancelled == 1 and eng.running_side_effects() == 0
        assert eng._store.get(IdempotencyKey("sess-1", 1, "t1.0")).state.value == "lost"
        with pytest.raises(RuntimeError):
            await eng.execute([], 1)

    vrun(main)


def test_panicking_side_effect_task_is_lost_and_never_run_again(vrun):
    async def main():
        p = Probe(0.1, panic=True)
        eng = engine(registry(p=(SE, p, {})))
        conv = Conv(eng)
        ex = await conv.run(("p", {}))
        assert kind(ex.results[0]) == "unknown_outcome"
        again = await eng.execute([ToolCall("t1.0", "p", {})], conv.epoch, conv.token)
        assert kind(again.results[0]) == "unknown_outcome" and p.count == 1
        again.discard()

    vrun(main)


# --- idempotency ----------------------------------------------------------------------------


def test_replay_of_a_call_runs_once(vrun):
    async def main():
        book = Probe(result="BK-1")
        eng = engine(registry(book=(SE, book, {})))
        conv = Conv(eng)
        ex = await conv.run(("book", {}))
        for _ in range(3):
            r = await eng.execute([ToolCall("t1.0", "book", {})], conv.epoch, conv.token)
            assert r.results[0].content == "BK-1"
            r.mark_delivered()
        assert book.count == 1 and ex.results[0].content == "BK-1"
        assert eng.stats().side_effect_replays == 3

    vrun(main)


def test_same_call_id_twice_in_one_response_runs_once(vrun):
    async def main():
        book = Probe(0.1)
        eng = engine(registry(book=(SE, book, {})))
        c = ToolCall("t1.0", "book", {})
        ex = await eng.execute([c, c], 1)
        assert not ex.results[0].is_error and kind(ex.results[1]) == "duplicate_call"
        assert book.count == 1
        ex.mark_delivered()

    vrun(main)


def test_eviction_by_count_keeps_in_flight_and_store_full_runs_nothing(vrun):
    async def main():
        book = Probe(result="ok")
        hang = Probe(hang=True)
        # repeatable: the replay below is about the store, not the already_done rule
        eng = engine(registry(book=(SE, book, {"repeatable": True}), hang=(SE, hang, {"timeout": 0.01})),
                     idempotency_capacity=3)
        # three settled entries (distinct arguments: not repeats), then a fourth evicts the oldest
        for i in range(4):
            ex = await eng.execute([ToolCall(f"t1.{i}", "book", {"i": i})], 1)
            ex.mark_delivered()
        assert eng.idempotency_usage().entries == 3
        r = await eng.execute([ToolCall("t1.0", "book", {"i": 0})], 1)  # evicted: runs again
        r.mark_delivered()
        assert book.count == 5
        # fill the store with in-flight calls: a new call is store_full and does not run
        for i in range(3):
            r = await eng.execute([ToolCall(f"t2.{i}", "hang", {"i": i})], 2)
            r.mark_delivered()
        assert eng.idempotency_usage().entries == 3
        r = await eng.execute([ToolCall("t2.9", "book", {"i": 99})], 2)
        assert kind(r.results[0]) == "store_full" and book.count == 5
        r.mark_delivered()
        await eng.aclose()

    vrun(main)


def test_eviction_by_bytes_and_the_byte_budget_is_raised_to_one_result(vrun):
    async def main():
        book = Probe(result="x" * 400)
        eng = engine(registry(book=(SE, book, {})), idempotency_max_bytes=10, max_result_bytes=1000)
        assert eng._store.max_bytes == 1000
        for i in range(3):
            r = await eng.execute([ToolCall(f"t1.{i}", "book", {"i": i})], 1)
            r.mark_delivered()
        u = eng.idempotency_usage()
        assert u.entries == 2 and u.bytes == 800

    vrun(main)


def test_capacity_zero_is_treated_as_one(vrun):
    async def main():
        book = Probe(result="ok")
        eng = engine(registry(book=(SE, book, {})), idempotency_capacity=0)
        for i in range(2):
            r = await eng.execute([ToolCall(f"t1.{i}", "book", {"i": i})], 1)
            assert r.results[0].content == "ok"
            r.mark_delivered()
        assert eng.idempotency_usage().entries == 1

    vrun(main)


def test_failing_side_effect_is_recorded_and_not_retried_for_the_same_key(vrun):
    async def main():
        bad = Probe(error="card declined")
        eng = engine(registry(pay=(SE, bad, {})))
        conv = Conv(eng)
        ex = await conv.run(("pay", {"amount": 5}))
        assert body(ex.results[0])["detail"] == "card declined"
        r = await eng.execute([ToolCall("t1.0", "pay", {"amount": 5})], conv.epoch)
        assert body(r.results[0])["detail"] == "card declined" and bad.count == 1
        r.discard()

    vrun(main)


def test_tools_receive_session_epoch_call_id_and_the_turns_own_token(vrun):
    async def main():
        ro, se = Probe(), Probe()
        eng = engine(registry(ro=(RO, ro, {}), se=(SE, se, {})))
        conv = Conv(eng)
        conv.epoch = 7
        await conv.run(("ro", {}), ("se", {}))
        for tool, cid in ((ro, "t7.0"), (se, "t7.1")):
            ctx: ToolContext = tool.runs[0][1]
            assert (ctx.session, ctx.epoch, ctx.call) == ("sess-1", 7, cid)
            assert ctx.cancel is conv.token
            assert ctx.idempotency_key() == IdempotencyKey("sess-1", 7, cid)

    vrun(main)


def test_digest_is_pinned_and_depends_on_session_epoch_and_call():
    k = IdempotencyKey("sess-1", 3, "t3.0")
    assert k.encoded() == b"6:sess-1|3|t3.0"
    pinned = 0x7365D5FE16124387
    assert k.digest() == pinned and k.hex() == "7365d5fe16124387"
    from brisvox.agent.tool_engine.registry import fnv1a64

    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C  # the published FNV-1a 64 test vector
    assert IdempotencyKey("sess-1", 3, "t3.0").digest() == pinned
    assert IdempotencyKey("sess-2", 3, "t3.0").digest() != pinned
    assert IdempotencyKey("sess-1", 4, "t3.0").digest() != pinned
    assert IdempotencyKey("sess-1", 3, "t3.1").digest() != pinned
    assert len(k.hex()) == 16


# --- late notes mailbox ---------------------------------------------------------------------


def test_late_notes_drained_by_the_next_execute_after_its_results(vrun):
    async def main():
        book = Probe(1.0, result="BK-9")
        look = Probe(0.1, result="sunny")
        eng = engine(registry(book=(SE, book, {"timeout": 0.5}), look=(RO, look, {})))
        conv = Conv(eng)
        await conv.run(("book", {}))
        await CLOCK.sleep(1.0)
        ex = await conv.run(("look", {}))
        assert len(ex.late_notes) == 1 and "BK-9" in ex.late_notes[0].content
        assert conv.ctx[-1] == ex.late_notes[0] and conv.ctx[-2].call_id == ex.results[0].call_id
        conv.ctx.validate()
        assert eng.take_late_notes() == []

    vrun(main)


def test_mailbox_keeps_64_and_counts_the_65th(vrun):
    async def main():
        n = MAILBOX_CAPACITY + 1
        tools = {f"s{i}": Probe(0.2, result=f"R{i}") for i in range(n)}
        eng = engine(registry(**{k: (SE, t, {"timeout": 0.1}) for k, t in tools.items()}), max_calls=100)
        ex = await eng.execute([ToolCall(f"t1.{i}", f"s{i}", {}) for i in range(n)], 1)
        ex.mark_delivered()
        await CLOCK.sleep(0.2)
        assert len(eng.take_late_notes()) == MAILBOX_CAPACITY
        assert eng.late_notes_dropped() == 1

    vrun(main)


# --- unknown tools, budget, call cap ----------------------------------------------------------


def test_unknown_tool_is_answered_and_spends_budget(vrun):
    async def main():
        eng = engine(registry(t=(RO, Probe(), {})))
        conv = Conv(eng)
        ex = await conv.run(("nope", {}), ("t", {}))
        assert kind(ex.results[0]) == "unknown_tool" and not ex.results[1].is_error
        assert eng.invalid_rounds(conv.epoch) == 1

    vrun(main)


def test_budget_exhaustion_schema_failures_no_refund_and_next_turn_budget(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(w=(RO, tool, {"parameters": CITY})))
        conv = Conv(eng)
        for i in range(2):  # two malformed rounds: still within the budget of 2
            ex = await conv.run(("w", {"town": "x"}), ("w", {"city": "Rome"}))
            assert kind(ex.results[0]) == "invalid_arguments" and not ex.results[1].is_error
            assert not ex.budget_exhausted and eng.invalid_rounds(conv.epoch) == i + 1
        ok = await conv.run(("w", {"city": "Oslo"}))  # a valid round refunds nothing
        assert not ok.budget_exhausted and eng.invalid_rounds(conv.epoch) == 2
        ex = await conv.run(("w", {}), ("w", {"city": "Rome"}))  # third: exhausted, nothing runs
        assert ex.budget_exhausted and [kind(m) for m in ex.results] == ["budget_exhausted"] * 2
        runs = tool.count
        later = await conv.run(("w", {"city": "Paris"}))  # every later round of the turn too
        assert later.budget_exhausted and kind(later.results[0]) == "budget_exhausted"
        assert tool.count == runs
        conv.new_turn()
        fresh = await conv.run(("w", {"city": "Paris"}))
        assert not fresh.budget_exhausted and tool.count == runs + 1

    vrun(main)


def test_a_superseded_turn_neither_resets_nor_spends_the_current_budget(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(w=(RO, tool, {"parameters": CITY})))
        conv = Conv(eng)
        conv.epoch = 5
        await conv.run(("w", {}))  # epoch 5 spends one
        old = await eng.execute([ToolCall("t4.0", "w", {})], 4)  # stale malformed round
        assert [kind(m) for m in old.results] == ["stale_turn"] and tool.count == 0
        old.discard()
        assert eng.invalid_rounds(5) == 1 and eng.invalid_rounds(4) == 0
        stale_valid = await eng.execute([ToolCall("t4.1", "w", {"city": "a"})], 4)
        assert kind(stale_valid.results[0]) == "stale_turn" and tool.count == 0
        stale_valid.discard()

    vrun(main)


def test_call_cap_answers_the_33rd_call_too_many_calls(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(t=(RO, tool, {})))
        calls = [ToolCall(f"t1.{i}", "t", {"i": i}) for i in range(34)]
        ex = await eng.execute(calls, 1)
        assert [kind(m) for m in ex.results[32:]] == ["too_many_calls"] * 2
        assert all(not m.is_error for m in ex.results[:32]) and tool.count == 32
        assert eng.invalid_rounds(1) == 1
        ex.mark_delivered()

    vrun(main)


def test_invalid_calls_from_the_assembler_are_answered_and_valid_siblings_run(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(t=(RO, tool, {})))
        conv = Conv(eng)
        ex = await conv.run(("t", "{bad json"), ("t", {}), ("t", "[1]"))
        assert [kind(m) for m in ex.results] == ["invalid tool call", None, "invalid tool call"]
        assert tool.count == 1 and eng.invalid_rounds(conv.epoch) == 1

    vrun(main)


def test_every_result_message_is_well_formed_for_many_kinds(vrun):
    async def main():
        eng = engine(registry(t=(RO, Probe(), {"parameters": CITY})))
        conv = Conv(eng)
        ex = await conv.run(("t", {"city": 3}), ("zz", {}))
        for m in ex.results:
            b = body(m)
            assert set(b) >= {"error", "tool", "detail"} and m.is_error
        assert body(ex.results[0])["issues"][0]["path"] == "/city"

    vrun(main)


def test_execution_is_dropped_without_reaching_the_context_when_discarded_by_gc(vrun):
    async def main():
        book = Probe(result="BK-5")
        eng = engine(registry(book=(SE, book, {})))
        conv = Conv(eng)
        calls = conv.respond(("book", {}))
        ex = await eng.execute(calls, conv.epoch, conv.token)
        del ex
        gc.collect()
        conv.ctx.interrupt_pending_tool_calls()
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-5" in notes[0].content
        conv.ctx.extend(notes)
        conv.ctx.push(UserMessage("next"))
        conv.ctx.validate()

    vrun(main)


def test_context_stays_valid_through_a_three_round_tool_loop(vrun):
    async def main():
        look = Probe(0.1, result="sunny")
        book = Probe(0.2, result="BK-1")
        eng = engine(registry(look=(RO, look, {}), book=(SE, book, {})))
        conv = Conv(eng)
        await conv.run(("look", {"c": "Oslo"}), text="Checking.")
        await conv.run(("look", {"c": "Rome"}), ("book", {"c": "Rome"}))
        await conv.run(("look", {"c": "Paris"}))
        conv.say("Booked Rome.")
        conv.ctx.validate()
        ids = [c.id for m in conv.ctx if getattr(m, "tool_calls", None) for c in m.tool_calls]
        assert ids == ["t1.0", "t1.1", "t1.2", "t1.3"]
        assert isinstance(conv.ctx[0], SystemMessage)

    vrun(main)


def test_error_kinds_spelling():
    assert te.INVALID_TOOL_CALL == "invalid tool call"
    assert {te.UNKNOWN_TOOL, te.INVALID_ARGUMENTS, te.ARGUMENTS_TOO_LARGE, te.TOO_MANY_CALLS, te.BUDGET_EXHAUSTED,
            te.STALE_TURN, te.TIMEOUT, te.INTERRUPTED, te.TOOL_FAILED, te.RESULT_TOO_LARGE, te.DUPLICATE_CALL,
            te.STORE_FULL, te.UNKNOWN_OUTCOME, te.ALREADY_DONE, te.ALREADY_REPORTED} == {
        "unknown_tool", "invalid_arguments", "arguments_too_large", "too_many_calls", "budget_exhausted",
        "stale_turn", "timeout", "interrupted", "tool_failed", "result_too_large", "duplicate_call",
        "store_full", "unknown_outcome", "already_done", "already_reported"}


def test_engine_default_config_values():
    eng = ToolEngine(registry(), "s")
    c = eng.config
    assert (c.max_invalid_rounds, c.max_result_bytes, c.idempotency_capacity, c.idempotency_max_bytes,
            c.max_argument_bytes, c.max_side_effect_runtime, c.orphan_window, c.confirm_ttl) == (
        2, 64 * 1024, 256, 4 * 1024 * 1024, 16 * 1024, 120.0, 120.0, 120.0)
    assert OBJ == {"type": "object"} and isinstance(CancelToken(), CancelToken)
