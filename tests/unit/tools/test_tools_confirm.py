"""The confirmation gate: held calls, a later user turn, epoch, TTL, barge-in, once, bounds."""

from __future__ import annotations

import logging

import orjson
import pytest

from brisvox.agent.conversation.context import ToolCall
from brisvox.agent.tool_engine.confirm import CONFIRM_MESSAGE, MAX_PENDING, Confirmations, Refusal
from brisvox.agent.tool_engine.recent import call_digest
from brisvox.clock import CLOCK

from .helpers import SE, Capture, Conv, Probe, body, engine, kind, registry


def gated(**cfg):
    transfer = Probe(0.1, result={"transferred": True})
    eng = engine(registry(transfer=(SE, transfer, {"confirm": True})), **cfg)
    return eng, transfer


def test_gated_call_is_held_and_answered_confirmation_required(vrun):
    async def main():
        eng, transfer = gated()
        conv = Conv(eng)
        ex = await conv.run(("transfer", {"to": "+15550100"}))
        m = ex.results[0]
        assert not m.is_error and transfer.count == 0
        assert orjson.loads(m.content) == {"status": "confirmation_required", "tool": "transfer",
                                           "call_id": "t1.0", "message": CONFIRM_MESSAGE}

    vrun(main)


def test_confirm_in_the_same_user_turn_is_refused_and_stays_pending_then_runs_after_a_reply(vrun):
    async def main():
        eng, transfer = gated()
        conv = Conv(eng)
        await conv.run(("transfer", {"to": "+15550100"}))
        ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        b = body(ex.results[0])
        assert b["error"] == "confirmation_refused" and "has not replied since you asked" in b["detail"]
        assert transfer.count == 0
        conv.say("Shall I transfer you to +1 555 0100?")
        conv.new_turn("yes please")
        cap = Capture()
        logging.getLogger("brisvox.tools").addHandler(cap)
        logging.getLogger("brisvox.tools").setLevel(logging.DEBUG)
        try:
            ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        finally:
            logging.getLogger("brisvox.tools").removeHandler(cap)
        assert orjson.loads(ex.results[0].content) == {"transferred": True}
        assert transfer.count == 1
        args, ctx = transfer.runs[0]
        assert args == {"to": "+15550100"} and ctx.call == "t1.0" and ctx.epoch == 1
        infos = [r.getMessage() for r in cap.records if r.levelno == logging.INFO]
        assert any("confirms=t1.0" in line for line in infos)
        assert not any("15550100" in r.getMessage() for r in cap.records)
        # once: a second confirmation finds nothing
        ex2 = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        assert kind(ex2.results[0]) == "confirmation_refused" and transfer.count == 1
        # a replay of the same confirming call returns the recorded result
        replay = await eng.execute([ToolCall("t2.0", "confirm_pending", {"call_id": "t1.0"})], conv.epoch)
        assert orjson.loads(replay.results[0].content) == {"transferred": True} and transfer.count == 1
        replay.discard()
        conv.ctx.validate()

    vrun(main)


def test_speech_that_started_before_the_request_is_not_the_reply(vrun):
    async def main():
        eng, transfer = gated()
        conv = Conv(eng)
        eng.note_user_speech_started()  # the caller was still talking when the model called the tool
        await conv.run(("transfer", {"to": "x"}))
        conv.new_turn("...and then")  # that speech ends now
        ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        assert kind(ex.results[0]) == "confirmation_refused" and transfer.count == 0
        eng.note_user_speech_started()
        conv.new_turn("yes")
        ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        assert not ex.results[0].is_error and transfer.count == 1

    vrun(main)


def test_expiry_on_the_injected_clock(vrun):
    async def main():
        eng, transfer = gated(confirm_ttl=10.0)
        conv = Conv(eng)
        await conv.run(("transfer", {"to": "x"}))
        conv.new_turn("yes")
        await CLOCK.sleep(10.5)
        ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        assert kind(ex.results[0]) == "confirmation_refused" and "expired" in body(ex.results[0])["detail"]
        assert transfer.count == 0

    vrun(main)


def test_barge_in_clears_every_pending_request(vrun):
    async def main():
        eng, transfer = gated()
        conv = Conv(eng)
        await conv.run(("transfer", {"to": "x"}))
        eng.clear_confirmations()
        conv.new_turn("yes")
        ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        assert kind(ex.results[0]) == "confirmation_refused" and transfer.count == 0
        # the model repeats the identical call: a fresh request with a fresh call id (no repeat rule)
        ex = await conv.run(("transfer", {"to": "x"}))
        assert orjson.loads(ex.results[0].content)["call_id"] == "t2.1"
        assert len(eng.confirmations) == 1

    vrun(main)


def test_speculation_holds_a_gated_call_until_commit(vrun):
    async def main():
        eng, transfer = gated()
        spec = await eng.speculate([ToolCall("t1.0", "transfer", {"to": "x"})], 1)
        assert len(eng.confirmations) == 0 and [c.id for c in spec.held_calls()] == ["t1.0"]
        ex = await eng.commit(spec)
        assert len(eng.confirmations) == 1 and transfer.count == 0
        ex.mark_delivered()

    vrun(main)


def test_bounded_and_identical_requests_replace():
    c = Confirmations(120.0)
    for i in range(MAX_PENDING + 2):
        c.request(f"t1.{i}", "transfer", {"to": i}, call_digest("transfer", {"to": i}), 1, 0.0)
    assert len(c) == MAX_PENDING and c.pending_ids()[0] == "t1.2" and c.dropped == 2
    c.request("t1.99", "transfer", {"to": 5}, call_digest("transfer", {"to": 5}), 1, 0.0)
    assert "t1.5" not in c.pending_ids() and c.pending_ids()[-1] == "t1.99" and len(c) == MAX_PENDING


def test_rules_of_take_directly():
    c = Confirmations(60.0)
    c.request("t3.0", "transfer", {}, b"d", 3, 0.0)
    assert c.take("t3.0", 3, 1.0) is Refusal.NO_REPLY
    c.note_user_turn()
    assert c.take("t3.0", 2, 1.0) is Refusal.STALE  # a confirmation from an older epoch
    assert c.take("nope", 3, 1.0) is Refusal.NOT_PENDING
    req = c.take("t3.0", 4, 1.0)
    assert not isinstance(req, Refusal) and req.call_id == "t3.0"
    assert c.take("t3.0", 4, 1.0) is Refusal.NOT_PENDING
    c.request("t4.0", "transfer", {}, b"d", 4, 0.0)
    c.note_user_turn()
    assert c.take("t4.0", 4, 60.5) is Refusal.EXPIRED and len(c) == 0


@pytest.mark.parametrize("args", [{}, {"call_id": 3}, {"call_id": ""}])
def test_confirm_pending_arguments_are_validated(vrun, args):
    async def main():
        eng, transfer = gated()
        conv = Conv(eng)
        ex = await conv.run(("confirm_pending", args))
        assert kind(ex.results[0]) == "invalid_arguments" and transfer.count == 0

    vrun(main)
