"""A flow's tool actions through the tool engine, on virtual time with the production actor.

A node's ``{ tool = ... }``, ``end_call`` and ``transfer`` actions run as a model's call
runs (brisvox/agent/pipeline/llm/flow.py, ``ToolEngine.act``). Judged: a SideEffect action
cut by a barge-in or by its timeout runs once, finishes and its late result reaches the
context; the node entered again in the same turn does not run its action again (the same
idempotency key); ``end_call`` and ``transfer`` still end and transfer the call, recorded
by the engine, the transfer past the confirmation gate (the operator's script).
"""

from __future__ import annotations

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import SystemMessage
from brisvox.agent.flows.definition import parse_flow
from brisvox.agent.tool_engine.builtin import telephony_tools
from brisvox.agent.tool_engine.registry import ToolKind, ToolRegistry, ToolSpec
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, simulate
from brisvox.sim.sim_tools import BOOK, SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

ADA = {"name": "Ada", "people": 2}
SET_BOOKING = {"name": "set_booking", "next": "book", "parameters": {
    "type": "object", "required": ["name", "people"],
    "properties": {"name": {"type": "string"}, "people": {"type": "integer"}}}}


def booking_flow(book_pre: list[dict], book_tools: list[str] | None = None) -> object:
    return parse_flow({
        "start": "greeting",
        "role": "You are the booking line of Brisvox Bistro.",
        "nodes": {
            "greeting": {"task": "Ask for the name and the party size.", "functions": [SET_BOOKING]},
            "book": {"task": "Tell the caller about the booking.", "pre_actions": book_pre,
                     "tools": book_tools or [],
                     "functions": [{"name": "change", "next": "greeting", "parameters": {"type": "object"}}]},
        },
    })


def registry(tools: SimTools, timeout: float = 5.0):
    def reg() -> ToolRegistry:
        r = ToolRegistry()
        r.register(ToolSpec("book_table", "Book a table.", BOOK, ToolKind.SIDE_EFFECT, timeout=timeout),
                   tools.book_table)
        return r

    return reg


def late_notes(res) -> list[str]:
    return [m.content for m in res.actor.context
            if isinstance(m, SystemMessage) and m.content.startswith("Late tool result")]


def test_a_side_effect_action_cut_by_a_barge_in_runs_once_and_its_late_result_reaches_the_context():
    tools = SimTools(book_seconds=1.5)
    flow = booking_flow([{"say": "One moment while I book your table for you."},
                         {"tool": "book_table", "args": ADA}])
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("a table for two for ada", at=0.5), Utter("hello are you still there", after_bot_words=2),
               Utter("so is it booked", after_bot_done=1.0)],
        llm=[LlmScript((Call("set_booking", ADA),)),
             LlmScript((Say("Let me check."),)),
             LlmScript((Say("Yes, you are booked."),))],
        registry=registry(tools), flow=flow)))
    assert res.interrupts == 1
    assert tools.bodies["book_table"] == 1
    assert tools.bookings == ["BK-1001"]  # the barge-in did not cancel the booking half-way
    notes = late_notes(res)
    assert len(notes) == 1 and "flow.book.pre.1" in notes[0] and "BK-1001" in notes[0]
    last = res.llm.probe.requests[-1]
    assert sum("BK-1001" in getattr(m, "text", "") for m in last.messages) == 1  # the model read it, once
    assert res.actor.runner.engine.stats().side_effect_late_results == 1
    assert res.actor.context.is_valid()
    assert res.live_tasks_after == 0


def test_a_side_effect_action_cut_by_its_timeout_runs_once_and_its_late_result_reaches_the_context():
    tools = SimTools(book_seconds=2.5)
    flow = booking_flow([{"tool": "book_table", "args": ADA}], book_tools=["book_table"])
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("a table for two for ada", at=0.5), Utter("is it done", after_bot_done=3.0)],
        llm=[LlmScript((Call("set_booking", ADA),)),
             LlmScript((Call("book_table", ADA),)),  # the model repeats the timed-out action
             LlmScript((Say("Your booking is on its way."),)),
             LlmScript((Say("Yes, you are booked."),))],
        registry=registry(tools, timeout=1.0), flow=flow)))
    assert tools.bodies["book_table"] == 1  # neither the timeout nor the model's repeat ran it again
    assert tools.bookings == ["BK-1001"]  # the timeout did not cancel it half-way
    answers = [orjson.loads(m.content) for m in res.actor.context if getattr(m, "role", "") == "tool"]
    assert answers[-1]["error"] == te.DUPLICATE_CALL  # the repeat found the action still running
    notes = late_notes(res)
    assert len(notes) == 1 and "flow.book.pre.0" in notes[0] and "BK-1001" in notes[0]
    assert any("BK-1001" in getattr(m, "text", "") for m in res.llm.probe.requests[-1].messages)
    assert res.actor.runner.flow_hook.action_failures == 1  # the timeout, logged
    assert res.actor.context.is_valid()
    assert res.live_tasks_after == 0


def test_the_node_entered_again_in_the_same_turn_does_not_run_its_action_twice():
    tools = SimTools(book_seconds=0.3)
    flow = booking_flow([{"tool": "book_table", "args": ADA}])
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("a table for two for ada", at=0.5)],
        llm=[LlmScript((Call("set_booking", ADA),)),
             LlmScript((Call("change", {}),)),  # back to the greeting ...
             LlmScript((Call("set_booking", ADA),)),  # ... and into the book node again, same turn
             LlmScript((Say("You are booked, Ada."),))],
        registry=registry(tools), flow=flow)))
    flow_mgr = res.actor.runner.flow
    assert flow_mgr.node.name == "book" and flow_mgr.transitions == 3
    assert tools.bodies["book_table"] == 1 and tools.bookings == ["BK-1001"]
    engine = res.actor.runner.engine
    assert engine.stats().side_effect_replays == 1  # the second entry was answered from the record
    assert res.actor.runner.flow_hook.action_failures == 0
    assert res.actor.context.is_valid()


class Port:
    call_id = "sim1"

    def __init__(self) -> None:
        self.hangups: list[str] = []
        self.transfers: list[str] = []

    def hangup(self, reason: str) -> None:
        self.hangups.append(reason)

    def send_dtmf(self, digits: str) -> None:
        pass

    async def transfer(self, target: str, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        self.transfers.append(target)
        return True, ""


def telephony(port: Port):
    def reg() -> ToolRegistry:
        r = ToolRegistry()
        for spec, body in telephony_tools(port, transfer_targets=("+4930123456",),
                                          names=("end_call", "transfer_call")):
            r.register(spec, body)
        r.require_confirmation("transfer_call")  # as the loader does unless confirm_transfer = false
        return r

    return reg


EXITS = parse_flow({
    "start": "menu",
    "nodes": {
        "menu": {"task": "Offer the front desk or goodbye.",
                 "functions": [{"name": "desk", "next": "desk", "parameters": {"type": "object"}},
                               {"name": "bye", "next": "bye", "parameters": {"type": "object"}}]},
        "desk": {"task": "Say you are transferring.", "pre_actions": [{"say": "Transferring you now."},
                                                                       {"transfer": "+4930123456"}]},
        "bye": {"task": "Say goodbye.", "post_actions": [{"end_call": True}]},
    },
})


def test_end_call_and_transfer_actions_through_the_engine_still_end_and_transfer_the_call():
    port = Port()
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("the front desk please", at=0.5)],
        llm=[LlmScript((Call("desk", {}),))],
        registry=telephony(port), flow=EXITS)))
    assert port.transfers == ["+4930123456"]  # past the confirmation gate: the operator's script
    engine = res.actor.runner.engine
    assert engine.stats().confirmations_requested == 0
    assert engine.idempotency_usage().entries == 1  # the transfer's key is recorded: never run twice
    assert res.actor.runner.flow_hook.action_failures == 0

    port = Port()
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("that is all goodbye", at=0.5)],
        llm=[LlmScript((Call("bye", {}),)), LlmScript((Say("Goodbye."),))],
        registry=telephony(port), flow=EXITS)))
    assert port.hangups == ["flow"] and port.transfers == []
    assert res.actor.runner.engine.idempotency_usage().entries == 1  # the end_call's key
    assert res.actor.runner.flow_hook.action_failures == 0
