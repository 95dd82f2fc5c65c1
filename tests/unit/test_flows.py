"""Flows: the definition's checks and the manager's transitions (brisvox/agent/flows/)."""

from __future__ import annotations

import orjson
import pytest

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.flows.definition import check_flow, parse_flow
from brisvox.agent.flows.manager import FlowCapReached, FlowManager
from brisvox.agent.tool_engine.registry import ToolKind, ToolSpec

PARTY = {"type": "object", "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12},
                                          "time": {"type": "string"}}, "required": ["people", "time"]}
BOOKING = {
    "start": "greeting",
    "role": "You are the booking line of Trattoria Test.",
    "max_transitions": 8,
    "nodes": {
        "greeting": {"task": "Greet the caller and ask for the party size and time.",
                     "pre_actions": [{"say": "Welcome to Trattoria Test."}],
                     "functions": [{"name": "set_party", "description": "The party size and time.",
                                    "parameters": PARTY, "next": "confirm"}],
                     "on_keypad": {"0": "goodbye"}},
        "confirm": {"task": "Repeat the booking and ask the caller to confirm.",
                    "functions": [{"name": "confirmed", "parameters": {"type": "object"}, "next": "book"},
                                  {"name": "change", "parameters": {"type": "object"}, "next": "greeting"}]},
        "book": {"task": "Book the table.", "tools": ["book_table"], "next_on": {"book_table": "goodbye"},
                 "context": "reset_with_summary"},
        "goodbye": {"task": "Say goodbye.", "post_actions": [{"end_call": True}], "context": "reset"},
    },
}
BOOK = ToolSpec("book_table", "Book a table.", {"type": "object"}, ToolKind.SIDE_EFFECT)


def flow(**changes):
    t = orjson.loads(orjson.dumps(BOOKING))
    for path, v in changes.items():
        d = t
        *parts, last = path.split("__")
        for p in parts:
            d = d[p]
        if v is None:
            del d[last]
        else:
            d[last] = v
    return parse_flow(t)


def test_the_booking_flow_checks():
    assert check_flow(flow(), ["book_table", "end_call"]) == []
    problems = check_flow(flow(), ["book_table"])  # the goodbye node's end_call action needs the built-in
    assert [p.key for p in problems] == ["flow.nodes.goodbye.actions"]


@pytest.mark.parametrize(("changes", "key", "text"), [
    ({"start": "nowhere"}, "flow.start", "unknown node 'nowhere'"),
    ({"nodes__confirm__functions": [{"name": "confirmed", "next": "bok"}]}, "flow.nodes.confirm.functions.confirmed.next",
     "unknown node 'bok'"),
    ({"nodes__book__tools": ["book_tabel"], "nodes__book__next_on": {}}, "flow.nodes.book.tools", "'book_tabel'"),
    ({"nodes__orphan": {"task": "Never entered."}}, "flow.nodes.orphan", "unreachable"),
    ({"nodes__goodbye__post_actions": []}, "flow.nodes.greeting", "loop without an exit"),
    ({"nodes__book__context": "forget"}, "flow.nodes.book.context", "one of append"),
    ({"nodes__confirm__functions": [{"name": "book_table", "next": "book"}]}, "flow.nodes.confirm.functions",
     "clashes"),
    ({"nodes__confirm__functions": [{"name": "set_party", "next": "book"}]}, "flow.nodes.confirm.functions",
     "unique in the flow"),
    ({"nodes__book__pre_actions": [{"tool": "confirm_pending", "args": {"call_id": "t1.0"}}]},
     "flow.nodes.book.actions", "never gated"),
])
def test_bad_flows_are_refused_with_the_node_named(changes, key, text):
    problems = check_flow(flow(**changes), ["book_table", "end_call", "confirm_pending"])
    assert any(p.key == key and text in p.message for p in problems), problems


def test_a_function_call_runs_through_the_engine_is_recorded_and_moves_the_flow():
    import asyncio

    from brisvox.agent.tool_engine.engine import ToolEngine
    from brisvox.agent.tool_engine.registry import ToolRegistry
    from brisvox.sim.vloop import run_virtual

    m = FlowManager(flow(), [BOOK])
    reg = ToolRegistry()
    for spec, body in m.function_tools():
        reg.register(spec, body)
    m.bind(reg.specs())
    ctx = Context([SystemMessage("base prompt"), UserMessage("hi")])
    pre = m.start(ctx)
    assert [a.say for a in pre] == ["Welcome to Trattoria Test."]
    assert ctx[0].content.startswith("You are the booking line") and "party size" in ctx[0].content
    assert [s.name for s in m.tool_specs()] == ["set_party"]
    assert m.offered("set_party") and not m.offered("confirmed") and not m.offered("book_table")

    async def go():
        engine = ToolEngine(reg, "s1")
        bad = ToolCall("t1.0", "set_party", {"people": 40, "time": "19:00"})
        good = ToolCall("t1.1", "set_party", {"people": 2, "time": "19:00"})
        ex = await engine.execute([bad, good], 1)
        ex.mark_delivered()
        await asyncio.sleep(0)
        return [bad, good], ex.results

    calls, results = run_virtual(go)
    assert results[0].is_error and orjson.loads(results[0].content)["error"] == "invalid_arguments"
    assert orjson.loads(results[1].content) == {"ok": True, "recorded": {"people": 2, "time": "19:00"}, "next": "confirm"}
    assert m.data == {"people": 2, "time": "19:00"}  # the bad call recorded nothing
    assert m.decide(calls[:1], results[:1]) is None and m.decide(calls, results) == "confirm"
    t = m.enter("confirm", ctx)
    assert t.context[0].content.endswith("ask the caller to confirm.") and len(t.context) == len(ctx)  # append
    assert m.node.name == "confirm" and m.transitions == 1


def test_a_reset_keeps_call_ids_unique_and_a_summary_carries_the_data():
    m = FlowManager(flow(), [BOOK])
    ctx = Context([SystemMessage("p")])
    m.start(ctx)
    m.data.update({"people": 2, "time": "19:00"})
    ctx.push(UserMessage("yes"))
    ctx.push(AssistantMessage("", (ToolCall("t3.0", "confirmed", {}),)))
    ctx.push(ToolMessage("t3.0", '{"ok":true}'))
    m.node = m.flow.nodes["confirm"]
    t = m.enter("book", ctx)
    assert [type(x).__name__ for x in t.context] == ["SystemMessage", "SystemMessage", "UserMessage"]
    assert "people: 2" in t.context[1].content
    assert t.context.next_tool_call_id(3) == "t3.1"  # never t3.0 again: the engine's key stays unique
    assert m.decide([ToolCall("t4.0", "book_table", {})], [ToolMessage("t4.0", '{"ref":"BK-1"}')]) == "goodbye"
    assert m.decide([ToolCall("t4.0", "book_table", {})], [ToolMessage("t4.0", '{"error":"x"}', True)]) is None
    g = m.enter("goodbye", t.context)
    assert len(g.context) == 2 and [a.end_call for a in g.pre_actions + tuple(m.node.post_actions)] == [True]


def test_keypad_and_the_transition_cap():
    m = FlowManager(flow(max_transitions=1), [BOOK])
    m.start(Context([SystemMessage("p")]))
    assert m.keypad("5") is None and m.keypad("0#") == "goodbye"
    m.enter("goodbye", Context([SystemMessage("p")]))
    with pytest.raises(FlowCapReached):
        m.enter("greeting", Context([SystemMessage("p")]))
    assert m.st["cap_reached"] == 1


def test_a_handler_tool_decides_the_next_node_dynamically():
    m = FlowManager(flow(), [BOOK])
    m.node = m.flow.nodes["book"]
    call = ToolCall("t5.0", "book_table", {})
    assert m.decide([call], [ToolMessage("t5.0", '{"ref":"BK-1","next_node":"confirm"}')]) == "confirm"
    # an unknown node named by a handler moves nothing on its own: next_on still applies
    assert m.decide([call], [ToolMessage("t5.0", '{"ref":"BK-1","next_node":"nowhere"}')]) == "goodbye"


def test_the_python_example_flow_checks():
    from examples.booking_flow import booking_flow

    f = booking_flow("22:00")
    assert check_flow(f, ["check_slot", "book_table", "end_call"]) == []
    assert "until 22:00" in f.nodes["goodbye"].task


def test_a_node_offering_a_gated_tool_offers_the_confirmation_tool_too():
    """A transfer (or any confirm_tools entry) at a node needs confirm_pending there, else the
    gated call could never be confirmed and the caller would wait for ever."""
    gated = FlowManager(flow(start="book"), [BOOK.with_confirm(True)])
    assert gated.node.name == "book"
    assert "confirm_pending" in gated.offered_names() and gated.offered("confirm_pending")
    plain = FlowManager(flow(start="book"), [BOOK])
    assert "confirm_pending" not in plain.offered_names() and not plain.offered("confirm_pending")
