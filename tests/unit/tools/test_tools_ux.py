"""Tool UX: the filler policy, interruption semantics, orphans and
regeneration, and the Delivery guard of an Execution. Virtual time."""

from __future__ import annotations

import asyncio

import pytest

from brisvox.agent.conversation.context import UserMessage
from brisvox.agent.tool_engine.filler import (
    DEFAULT_FILLER_DELAY,
    DEFAULT_FILLER_TEXT,
    FillerConfig,
    FillerPhrase,
    FillerPolicy,
    StaticClips,
)
from brisvox.agent.tool_engine.registry import ToolSpec
from brisvox.clock import CLOCK

from .helpers import OBJ, RO, SE, Conv, Probe, body, engine, kind, registry

# --- filler policy -------------------------------------------------------------------------


def spec(name: str, filler_after: float | None = 0.7) -> ToolSpec:
    return ToolSpec(name, "d", OBJ, RO, filler_after=filler_after)


def test_fixed_delay_uses_one_delay_and_filler_after_only_as_switch():
    p = FillerPolicy()
    assert p.delay == DEFAULT_FILLER_DELAY == 1.2
    plan = p.plan([spec("a", 0.2), spec("b", 3.0)])
    assert plan.delay == 1.2 and plan.call_index == 0
    assert p.plan([spec("a", None), spec("b", 3.0)]).call_index == 1
    assert p.plan([spec("a", None), None]) is None
    assert FillerPolicy().with_delay(0.5).plan([spec("a")]).delay == 0.5


def test_per_tool_delay_takes_the_smallest_and_ties_go_to_the_first_call():
    p = FillerPolicy.per_tool()
    plan = p.plan([spec("a", 2.0), spec("b", 0.5), spec("c", 0.5)])
    assert (plan.delay, plan.call_index, plan.tool) == (0.5, 1, "b")


def test_phrases_rotate_only_when_chosen_and_per_tool_phrases_win():
    p = FillerPolicy().with_phrases(["One moment.", "Let me check."]).with_tool_phrases("book", ["Booking now."])
    p.plan([spec("a")])  # planning does not advance the rotation
    assert [p.choose("a").text for _ in range(3)] == ["One moment.", "Let me check.", "One moment."]
    assert p.choose("book").text == "Booking now."
    assert FillerPolicy().choose().text == DEFAULT_FILLER_TEXT


def test_clip_key_only_when_the_clip_is_available():
    p = FillerPolicy().with_phrases([FillerPhrase("One moment.", "c1"), FillerPhrase("Hm.", "c2")])
    assert p.choose().clip_key is None  # no cache
    p = p.with_clips(StaticClips(["c1"]))
    assert p.choose().clip_key is None  # second phrase: c2 missing
    assert p.choose().clip_key == "c1"


def test_off_switches():
    assert FillerPolicy().with_enabled(False).plan([spec("a")]) is None
    assert FillerPolicy().with_enabled(False).choose() is None
    assert FillerPolicy().with_phrases([]).plan([spec("a")]) is None
    assert FillerPolicy().with_phrases([]).choose() is None


def test_config_builds_the_policy():
    assert FillerPolicy.from_config(FillerConfig.DEFAULT).plan([spec("a", 0.3)]).delay == 1.2
    assert FillerPolicy.from_config(FillerConfig.PER_TOOL).plan([spec("a", 0.3)]).delay == 0.3
    assert FillerPolicy.from_config(FillerConfig.OFF).plan([spec("a")]) is None
    assert FillerPolicy.from_config(FillerConfig(True, 0.8)).plan([spec("a")]).delay == 0.8
    with pytest.raises(ValueError):
        FillerPolicy.from_config(FillerConfig(True, -1.0))


def test_each_clone_rotates_on_its_own_and_shares_the_clip_cache():
    clips = StaticClips(["k"])
    base = FillerPolicy().with_phrases([FillerPhrase("a", "k"), "b"]).with_clips(clips)
    s1, s2 = base.clone(), base.clone()
    assert s1.choose().text == "a" and s1.choose().text == "b"
    assert s2.choose().text == "a" and s2.choose().clip_key is None
    assert s1._clips is s2._clips is clips


def test_engine_gives_the_specs_of_a_rounds_calls(vrun):
    async def main():
        eng = engine(registry(a=(RO, Probe(), {"filler_after": None}), b=(SE, Probe(), {})))
        conv = Conv(eng)
        calls = conv.respond(("a", {}), ("b", {}), ("zz", "{bad"))
        specs = eng.call_specs(calls)
        assert [s.name if s else None for s in specs] == ["a", "b", None]
        assert FillerPolicy().plan(specs).call_index == 1

    vrun(main)


# --- interruption ----------------------------------------------------------------------------


def test_read_only_cancelled_when_the_execute_task_is_aborted_and_counted(vrun):
    async def main():
        slow = Probe(5.0)
        eng = engine(registry(slow=(RO, slow, {})))
        conv = Conv(eng)
        task = asyncio.create_task(eng.execute(conv.respond(("slow", {})), conv.epoch, conv.token))
        await CLOCK.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert slow.cancelled == 1 and eng.stats().read_only_cancelled == 1
        assert conv.ctx.interrupt_pending_tool_calls() == 1
        assert eng.take_late_notes() == []

    vrun(main)


# --- regeneration and orphans ------------------------------------------------------------------


def booking(delay=1.0, **cfg):
    book = Probe(delay, result={"booking": "BK-1001"})
    eng = engine(registry(book=(SE, book, {}), look=(RO, Probe(0.1), {})), **cfg)
    return eng, book


async def barge_in(conv: Conv, after: float, *calls):
    asyncio.get_running_loop().call_later(after, conv.token.cancel)
    ex = await conv.run(*calls)
    conv.new_turn("sorry, go on")
    return ex


def test_interrupted_side_effect_then_regenerated_is_replayed_once_with_one_note(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        ex = await barge_in(conv, 0.2, ("book", {"slot": 7}))
        assert kind(ex.results[0]) == "interrupted"
        await CLOCK.sleep(1.0)  # the booking finishes; its note waits in the mailbox
        ex2 = await conv.run(("book", {"slot": 7}))  # regenerated identical call, new epoch
        assert "BK-1001" in ex2.results[0].content and not ex2.results[0].is_error
        assert ex2.late_notes == []  # the note is held back: the model reads the result once
        assert book.count == 1 and eng.stats().orphan_replays == 1
        assert eng.take_late_notes() == []
        text = "\n".join(getattr(m, "content", "") or "" for m in conv.ctx)
        assert text.count("BK-1001") == 1
        # a later repeat of the consumed orphan in the same turn is already_done
        ex3 = await conv.run(("book", {"slot": 7}))
        assert kind(ex3.results[0]) == "already_done" and book.count == 1

    vrun(main)


def test_regeneration_while_the_first_still_runs_is_refused_duplicate_call(vrun):
    async def main():
        eng, book = booking(5.0)
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"slot": 7}))
        ex = await conv.run(("book", {"slot": 7}))
        b = body(ex.results[0])
        assert b["error"] == "duplicate_call" and "follows as a note" in b["detail"]
        assert eng.stats().orphan_in_flight == 1
        await CLOCK.sleep(5.0)
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-1001" in notes[0].content and book.count == 1
        conv.ctx.extend(notes)
        conv.ctx.validate()

    vrun(main)


def test_dropped_execute_future_makes_an_orphan(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        task = asyncio.create_task(eng.execute(conv.respond(("book", {"s": 1})), conv.epoch, conv.token))
        await CLOCK.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        conv.ctx.interrupt_pending_tool_calls()
        conv.new_turn()
        await CLOCK.sleep(1.0)
        ex = await conv.run(("book", {"s": 1}))
        assert "BK-1001" in ex.results[0].content and book.count == 1

    vrun(main)


def test_timeout_orphan_and_a_same_turn_retry_does_not_run_again(vrun):
    async def main():
        eng, book = booking(6.0)
        conv = Conv(eng)
        ex = await conv.run(("book", {"s": 1}))
        assert kind(ex.results[0]) == "timeout"
        retry = await conv.run(("book", {"s": 1}))  # a later round of the same turn
        assert kind(retry.results[0]) == "duplicate_call"
        await CLOCK.sleep(2.0)  # the booking finished at 6 s; its note waits in the mailbox
        retry2 = await conv.run(("book", {"s": 1}))
        assert "BK-1001" in retry2.results[0].content and not retry2.results[0].is_error
        assert retry2.late_notes == [] and book.count == 1
        assert eng.stats().orphan_in_flight == 1 and eng.stats().orphan_replays == 1


@pytest.mark.parametrize("case", ["other_args", "expired", "window_off", "delivered"])
def test_not_suppressed(vrun, case):
    async def main():
        cfg = {"orphan_window": 0.0} if case == "window_off" else {}
        eng, book = booking(1.0, **cfg)
        conv = Conv(eng)
        if case == "delivered":
            await conv.run(("book", {"s": 1}))
            conv.say("Booked.")
            conv.new_turn("book it again please")
        else:
            await barge_in(conv, 0.2, ("book", {"s": 1}))
            await CLOCK.sleep(1.0)
            if case == "other_args":
                conv.ctx.extend(eng.take_late_notes())
        if case == "expired":
            await CLOCK.sleep(121.0)
        args = {"s": 2} if case == "other_args" else {"s": 1}
        ex = await conv.run(("book", args))
        assert not ex.results[0].is_error and book.count == 2

    vrun(main)


def test_same_key_replay_is_counted(vrun):
    async def main():
        eng, book = booking(0.1)
        conv = Conv(eng)
        calls = conv.respond(("book", {}))
        ex = await eng.execute(calls, conv.epoch, conv.token)
        ex.append_to(conv.ctx)
        again = await eng.execute(calls, conv.epoch, conv.token)
        assert again.results[0].content == ex.results[0].content
        assert eng.stats().side_effect_replays == 1 and book.count == 1
        again.mark_delivered()

    vrun(main)


def test_replay_dropped_with_its_round_next_to_a_slow_sibling_keeps_the_orphan_and_its_note(vrun):
    async def main():
        book = Probe(1.0, result={"booking": "BK-1001"})
        slow = Probe(5.0)
        eng = engine(registry(book=(SE, book, {}), slow=(RO, slow, {})))
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"s": 1}))
        await CLOCK.sleep(1.0)
        # the regenerated response replays the booking but its round is cut off by a slow sibling
        task = asyncio.create_task(eng.execute(conv.respond(("book", {"s": 1}), ("slow", {})), conv.epoch, conv.token))
        await CLOCK.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        conv.ctx.interrupt_pending_tool_calls()
        conv.new_turn()
        ex = await conv.run(("book", {"s": 1}))  # regenerated again: still answered from the record
        assert "BK-1001" in ex.results[0].content and book.count == 1
        assert ex.late_notes == [] and eng.take_late_notes() == []
        conv.ctx.validate()

    vrun(main)


def test_replay_in_a_discarded_execution_keeps_the_orphan_and_its_note(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"s": 1}))
        await CLOCK.sleep(1.0)
        ex = await conv.run(("book", {"s": 1}), append=False)
        assert "BK-1001" in ex.results[0].content
        ex.discard()
        conv.ctx.interrupt_pending_tool_calls()
        conv.new_turn()
        ex2 = await conv.run(("book", {"s": 1}))
        assert "BK-1001" in ex2.results[0].content and book.count == 1
        assert ex2.late_notes == [] and eng.take_late_notes() == []

    vrun(main)


def test_side_effect_result_in_a_discarded_execution_is_noted_and_not_run_again(vrun):
    async def main():
        eng, book = booking(0.5)
        conv = Conv(eng)
        ex = await conv.run(("book", {"s": 1}), append=False)
        assert "BK-1001" in ex.results[0].content
        ex.discard()  # the filler was still being sent at the barge-in
        conv.ctx.interrupt_pending_tool_calls()
        conv.new_turn()
        ex2 = await conv.run(("book", {"s": 1}))
        assert "BK-1001" in ex2.results[0].content and book.count == 1
        notes_text = [n.content for n in ex2.late_notes] + [n.content for n in eng.take_late_notes()]
        assert notes_text == []  # the result reaches the context once: as the replay

    vrun(main)


def test_notes_taken_by_a_discarded_execution_go_back(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"s": 1}))
        await CLOCK.sleep(1.0)
        ex = await conv.run(("look", {}), append=False)
        assert len(ex.late_notes) == 1
        ex.discard()
        conv.ctx.interrupt_pending_tool_calls()
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "BK-1001" in notes[0].content

    vrun(main)


def test_repeat_after_the_note_was_taken_is_already_reported(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"s": 1}))
        await CLOCK.sleep(1.0)
        conv.ctx.extend(eng.take_late_notes())
        ex = await conv.run(("book", {"s": 1}))
        b = body(ex.results[0])
        assert b["error"] == "already_reported" and "note above" in b["detail"]
        ex2 = await conv.run(("book", {"s": 1}))  # later repeats within the window: the same
        assert kind(ex2.results[0]) == "already_reported"
        assert book.count == 1 and eng.stats().orphan_reported == 2
        text = "\n".join(getattr(m, "content", "") or "" for m in conv.ctx)
        assert text.count("BK-1001") == 1

    vrun(main)


def test_repeat_after_a_delivered_execution_carried_the_note_is_already_reported(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"s": 1}))
        await CLOCK.sleep(1.0)
        ex = await conv.run(("look", {}))
        assert len(ex.late_notes) == 1
        ex2 = await conv.run(("book", {"s": 1}))
        assert kind(ex2.results[0]) == "already_reported" and book.count == 1

    vrun(main)


def test_repeat_after_a_discarded_execution_that_carried_the_note_is_replayed(vrun):
    async def main():
        eng, book = booking(1.0)
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("book", {"s": 1}))
        await CLOCK.sleep(1.0)
        ex = await conv.run(("look", {}), append=False)
        assert len(ex.late_notes) == 1
        ex.discard()
        conv.ctx.interrupt_pending_tool_calls()
        conv.new_turn()
        ex2 = await conv.run(("book", {"s": 1}))
        assert "BK-1001" in ex2.results[0].content and not ex2.results[0].is_error
        assert ex2.late_notes == [] and book.count == 1

    vrun(main)


def test_lost_orphan_is_unknown_outcome(vrun):
    async def main():
        p = Probe(1.0, panic=True)
        eng = engine(registry(p=(SE, p, {})))
        conv = Conv(eng)
        await barge_in(conv, 0.2, ("p", {}))
        await CLOCK.sleep(1.0)
        ex = await conv.run(("p", {}))
        assert kind(ex.results[0]) == "unknown_outcome" and p.count == 1
        assert eng.stats().orphan_lost == 1

    vrun(main)


def test_two_identical_calls_of_one_response_both_run_even_next_to_an_orphan(vrun):
    async def main():
        eng, book = booking(0.1)
        conv = Conv(eng)
        ex = await conv.run(("book", {"s": 1}), ("book", {"s": 1}))
        assert [m.is_error for m in ex.results] == [False, False] and book.count == 2
        conv.ctx.push(UserMessage("x"))
        conv.ctx.validate()

    vrun(main)
