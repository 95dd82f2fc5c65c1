"""The booking flow on virtual time: the production actor, the LLM runner driving a FlowManager.

The scripted LLM plays the model: it calls the current node's function with what the
caller said. Judged: the nodes the flow went through, what every request offered and
started with (the node's prompt, its tools only), the context strategies, the booking
run exactly once, the goodbye node's end_call.
"""

from __future__ import annotations

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import SystemMessage
from brisvox.agent.flows.definition import parse_flow
from brisvox.agent.tool_engine.registry import ToolKind, ToolRegistry, ToolSpec
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, simulate
from brisvox.sim.sim_tools import BOOK, SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

FLOW = parse_flow({
    "start": "greeting",
    "role": "You are the booking line of Brisvox Bistro.",
    "max_transitions": 8,
    "nodes": {
        "greeting": {"task": "Ask for the name and the party size.",
                     "functions": [{"name": "set_booking", "next": "confirm", "parameters": {
                         "type": "object", "required": ["name", "people"],
                         "properties": {"name": {"type": "string"}, "people": {"type": "integer", "maximum": 12}}}}]},
        "confirm": {"task": "Repeat the booking and ask the caller to confirm.",
                    "functions": [{"name": "confirmed", "next": "book", "parameters": {"type": "object"}}]},
        "book": {"task": "Book the table with book_table.", "tools": ["book_table"],
                 "next_on": {"book_table": "goodbye"}, "context": "reset_with_summary"},
        "goodbye": {"task": "Say goodbye.", "post_actions": [{"say": "Goodbye and thank you."}]},
    },
})


def registry(tools: SimTools):
    def reg() -> ToolRegistry:
        r = ToolRegistry()
        r.register(ToolSpec("book_table", "Book a table.", BOOK, ToolKind.SIDE_EFFECT, timeout=5.0), tools.book_table)
        return r

    return reg


def run(steps, llm, tools):
    return run_virtual(lambda: simulate(SimCall(steps=steps, llm=llm, registry=registry(tools), flow=FLOW)))


def test_the_booking_flow_runs_node_by_node_and_books_once():
    tools = SimTools(book_seconds=0.3)
    res = run([Utter("a table for two for ada", at=0.5), Utter("yes that is right", after_bot_done=0.5)],
              [LlmScript((Call("set_booking", {"name": "Ada", "people": 2}),)),
               LlmScript((Say("A table for two for Ada, is that right?"),)),
               LlmScript((Call("confirmed", {}),)),
               LlmScript((Call("book_table", {"name": "Ada", "people": 2}),)),
               LlmScript((Say("You are booked, Ada."),))],
              tools)
    reqs = res.llm.probe.requests
    offered = [[t.name for t in r.tools] for r in reqs]
    assert offered == [["set_booking"], ["confirmed"], ["confirmed"], ["book_table"], []]
    prompts = [r.messages[0].text for r in reqs]
    assert prompts[0].endswith("Ask for the name and the party size.")
    assert prompts[1].endswith("ask the caller to confirm.") and prompts[3].endswith("with book_table.")
    # book: reset with the collected data: the prompt, the note, the caller's current turn
    assert "name: Ada" in reqs[3].messages[1].text
    assert [m.role for m in reqs[3].messages] == ["system", "system", "user"]
    assert reqs[3].messages[2].text == "yes that is right"
    assert tools.bodies["book_table"] == 1
    spoken = [m.text for m in res.actor.context if getattr(m, "role", "") == "assistant" and m.text]
    assert spoken[-2:] == ["You are booked, Ada.", "Goodbye and thank you."]
    assert res.actor.runner.flow.node.name == "goodbye" and res.actor.runner.flow.transitions == 3
    assert isinstance(res.actor.context[0], SystemMessage)
    assert res.live_tasks_after == 0


def test_a_call_of_a_later_nodes_tool_is_answered_unknown_and_moves_nothing():
    tools = SimTools(book_seconds=0.3)
    res = run([Utter("book it now", at=0.5)],
              [LlmScript((Call("book_table", {"name": "Ada", "people": 2}),)),
               LlmScript((Say("First, your name and party size?"),))],
              tools)
    assert tools.bodies["book_table"] == 0
    answers = [orjson.loads(m.content) for m in res.actor.context if getattr(m, "role", "") == "tool"]
    assert answers[0]["error"] == te.INVALID_TOOL_CALL and "not offered at this step" in answers[0]["detail"]
    assert res.actor.runner.flow.node.name == "greeting"


class Port:
    call_id = "sim1"

    def __init__(self) -> None:
        self.hangups: list[str] = []

    def hangup(self, reason: str) -> None:
        self.hangups.append(reason)

    def send_dtmf(self, digits: str) -> None:
        pass

    async def transfer(self, target: str, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        return True, ""


def with_end_call(tools: SimTools, port: Port):
    from brisvox.agent.tool_engine.builtin import telephony_tools

    def reg() -> ToolRegistry:
        r = registry(tools)()
        for spec, body in telephony_tools(port, names=("end_call",)):
            r.register(spec, body)
        return r

    return reg


ENDING = parse_flow({
    "start": "menu",
    "max_transitions": 2,
    "fallback_line": "Sorry, goodbye.",
    "nodes": {
        "menu": {"task": "Offer bookings or opening hours.", "pre_actions": [{"say": "Welcome to the bistro."}],
                 "on_keypad": {"1": "hours"},
                 "functions": [{"name": "hours_please", "next": "hours", "parameters": {"type": "object"}}]},
        "hours": {"task": "Tell the opening hours, then ask if there is anything else.",
                  "functions": [{"name": "back", "next": "menu", "parameters": {"type": "object"}},
                                {"name": "done", "next": "bye", "parameters": {"type": "object"}}]},
        "bye": {"task": "Say goodbye.", "context": "reset", "post_actions": [{"end_call": True}]},
    },
})


def test_a_keypad_entry_moves_the_flow_and_the_goodbye_node_ends_the_call():
    from brisvox.sim.world import Press

    tools, port = SimTools(), Port()
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("hello", at=0.5), Press("1", after=2.5), Press("#", after=0.05),
               Utter("that is all thanks", after=3.0)],
        llm=[LlmScript((Say("Press one for hours."),)), LlmScript((Say("We open at noon."),)),
             LlmScript((Call("done", {}),)), LlmScript((Say("Goodbye."),))],
        registry=with_end_call(tools, port), flow=ENDING)))
    flow = res.actor.runner.flow
    assert [m.text for m in res.actor.context if getattr(m, "role", "") == "assistant"][-1] == "Goodbye."
    reqs = res.llm.probe.requests
    assert reqs[0].messages[0].text.endswith("Offer bookings or opening hours.")
    assert reqs[1].messages[0].text.startswith("Tell the opening hours")  # the keypad moved it before the answer
    assert flow.node.name == "bye" and flow.st["keypad_transitions"] == 1
    # reset: the bye node's prompt and the caller's current turn, nothing older
    assert [(m.role, m.text) for m in reqs[3].messages] == [("system", "Say goodbye."), ("user", "that is all thanks")]
    assert port.hangups == ["flow"]  # the bye node's end_call, after its answer
    heard = [w for u in res.platform.wire.order for w in res.platform.wire.heard_words(u)]
    assert heard[:4] == ["Welcome", "to", "the", "bistro."]


def test_past_max_transitions_the_fallback_line_ends_the_call():
    tools, port = SimTools(), Port()
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("hours please", at=0.5)],
        llm=[LlmScript((Call("hours_please", {}),)), LlmScript((Call("back", {}),)),
             LlmScript((Call("hours_please", {}),))],
        registry=with_end_call(tools, port), flow=ENDING)))
    flow = res.actor.runner.flow
    assert flow.transitions == 2 and flow.st["cap_reached"] == 1
    said = [m.text for m in res.actor.context if getattr(m, "role", "") == "assistant" and m.text]
    assert said[-1] == "Sorry, goodbye." and port.hangups == ["flow"]


def test_a_barge_in_during_the_flows_booking_runs_it_once_and_the_flow_goes_on():
    tools = SimTools(book_seconds=2.0)
    res = run([Utter("a table for two for ada", at=0.5), Utter("yes that is right", after_bot_done=0.5),
               Utter("hello are you still there", after_bot_words=2)],
              [LlmScript((Call("set_booking", {"name": "Ada", "people": 2}),)),
               LlmScript((Say("A table for two for Ada, is that right?"),)),
               LlmScript((Call("confirmed", {}),)),
               LlmScript((Say("One moment while I book it for you."), Call("book_table", {"name": "Ada", "people": 2}))),
               LlmScript((Call("book_table", {"name": "Ada", "people": 2}),)),  # the model repeats it
               LlmScript((Say("You are booked, Ada."),))],
              tools)
    assert res.interrupts == 1
    assert tools.bodies["book_table"] == 1  # exactly once across the barge-in and the repeat
    flow = res.actor.runner.flow
    assert flow.node.name == "goodbye"  # the booking's late result moved the flow on
    assert res.actor.context.is_valid()
    said = [m.text for m in res.actor.context if getattr(m, "role", "") == "assistant" and m.text]
    assert said[-1] == "Goodbye and thank you."
