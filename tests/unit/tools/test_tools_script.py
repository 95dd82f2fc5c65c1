"""ToolEngine.act: one call of the operator's script (a flow's action) on the model's paths.

Judged on virtual time: the same idempotency key runs once; a SideEffect call cut by the
turn's token keeps running and reports a late note; a confirmation-gated tool is not held;
a malformed script call spends no retry budget; the mailbox's notes stay for
take_late_notes; an orphan the script replays keeps its note for the model;
confirm_pending is not the script's.
"""

from __future__ import annotations

import asyncio

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import ToolCall
from brisvox.clock import CLOCK

from .helpers import OBJ, SE, Conv, Probe, body, engine, kind, registry

SLOT = {"type": "object", "properties": {"slot": {"type": "integer"}}, "required": ["slot"]}


def test_the_same_key_runs_once_and_answers_the_record(vrun):
    async def main():
        book = Probe(0.1, result={"booking": "BK-1001"})
        eng = engine(registry(book=(SE, book, {})))
        first = await eng.act(ToolCall("flow.book.pre.0", "book", {"slot": 7}), 1)
        first.mark_delivered()
        again = await eng.act(ToolCall("flow.book.pre.0", "book", {"slot": 7}), 1)
        again.mark_delivered()
        assert book.count == 1
        assert again.results[0].content == first.results[0].content and body(again.results[0]) == {
            "booking": "BK-1001"}
        assert eng.stats().side_effect_replays == 1
        nxt = await eng.act(ToolCall("flow.book.pre.0", "book", {"slot": 7}), 2)  # the next turn: a new key
        nxt.mark_delivered()
        assert book.count == 2

    vrun(main)


def test_a_cut_side_effect_call_keeps_running_and_reports_a_late_note(vrun):
    async def main():
        book = Probe(1.0, result={"booking": "BK-1001"})
        eng = engine(registry(book=(SE, book, {})))
        token = Conv(eng).token
        asyncio.get_running_loop().call_later(0.2, token.cancel)
        ex = await eng.act(ToolCall("flow.book.pre.0", "book", {"slot": 7}), 1, token)
        assert kind(ex.results[0]) == te.INTERRUPTED
        ex.discard()
        assert eng.take_late_notes() == []
        await CLOCK.sleep(1.0)
        assert book.finished == 1 and book.cancelled == 0
        notes = eng.take_late_notes()
        assert len(notes) == 1 and "flow.book.pre.0" in notes[0].content and "BK-1001" in notes[0].content
        again = await eng.act(ToolCall("flow.book.pre.0", "book", {"slot": 7}), 1)
        again.mark_delivered()
        assert book.count == 1 and body(again.results[0]) == {"booking": "BK-1001"}  # the key's record

    vrun(main)


def test_the_confirmation_gate_does_not_hold_the_script(vrun):
    async def main():
        transfer = Probe(0.0, result={"status": "transferred"})
        eng = engine(registry(transfer_call=(SE, transfer, {"confirm": True})))
        ex = await eng.act(ToolCall("flow.desk.pre.0", "transfer_call", {}), 1)
        ex.mark_delivered()
        assert transfer.count == 1 and body(ex.results[0]) == {"status": "transferred"}
        assert eng.stats().confirmations_requested == 0
        refused = await eng.act(ToolCall("flow.desk.pre.1", "confirm_pending", {"call_id": "t1.0"}), 1)
        refused.mark_delivered()
        assert kind(refused.results[0]) == te.UNKNOWN_TOOL

    vrun(main)


def test_a_malformed_script_call_spends_no_retry_budget(vrun):
    async def main():
        book = Probe(0.0)
        eng = engine(registry(book=(SE, book, {"parameters": SLOT})), max_invalid_rounds=1)
        for i in range(3):
            ex = await eng.act(ToolCall(f"flow.book.pre.{i}", "book", {"slot": "seven"}), 1)
            ex.mark_delivered()
            assert kind(ex.results[0]) == te.INVALID_ARGUMENTS
        assert eng.invalid_rounds(1) == 0 and book.count == 0
        conv = Conv(eng)
        ex = await conv.run(("book", {"slot": 7}))  # the model's budget is whole
        assert not ex.results[0].is_error and book.count == 1

    vrun(main)


def test_the_mailbox_notes_stay_for_take_late_notes_and_a_replayed_orphan_keeps_its_note(vrun):
    async def main():
        book = Probe(1.0, result={"booking": "BK-1001"})
        eng = engine(registry(book=(SE, book, {}), other=(SE, Probe(0.0), {"parameters": OBJ})))
        conv = Conv(eng)
        asyncio.get_running_loop().call_later(0.2, conv.token.cancel)
        ex = await conv.run(("book", {"slot": 7}))  # the model's booking, cut
        assert kind(ex.results[0]) == te.INTERRUPTED
        conv.new_turn()
        replay = await eng.act(ToolCall("flow.book.pre.0", "book", {"slot": 7}), conv.epoch)
        replay.mark_delivered()
        assert kind(replay.results[0]) == te.DUPLICATE_CALL and book.count == 1  # still running: not run again
        await CLOCK.sleep(1.0)
        other = await eng.act(ToolCall("flow.book.pre.1", "other", {}), conv.epoch)
        assert other.late_notes == []  # the booking's note stays in the mailbox
        other.mark_delivered()
        done = await eng.act(ToolCall("flow.book.pre.2", "book", {"slot": 7}), conv.epoch)
        done.mark_delivered()
        assert body(done.results[0]) == {"booking": "BK-1001"} and book.count == 1  # the orphan's record
        notes = eng.take_late_notes()  # the model still reads the booking, once
        assert len(notes) == 1 and "BK-1001" in notes[0].content and "t1.0" in notes[0].content
        conv.ctx.extend(notes)
        assert eng.take_late_notes() == []

    vrun(main)


def test_a_script_call_of_a_superseded_turn_is_stale(vrun):
    async def main():
        book = Probe(0.0)
        eng = engine(registry(book=(SE, book, {})))
        (await eng.act(ToolCall("flow.a.pre.0", "book", {"slot": 1}), 3)).mark_delivered()
        ex = await eng.act(ToolCall("flow.a.pre.1", "book", {"slot": 2}), 2)
        ex.mark_delivered()
        assert kind(ex.results[0]) == te.STALE_TURN and book.count == 1

    vrun(main)
