"""The restaurant booking flow built in Python (the same graph as configs/agents/booking_flow.toml).

A dynamic flow is a :class:`~brisvox.agent.flows.definition.FlowDef` built by code: here
the goodbye line depends on the restaurant's hours, and ``check_slot`` is a handler tool
(a node tool whose result names ``next_node``) that sends the caller back to the greeting
when the slot is full. Run it with the agent process's parts:

    from brisvox.agent.flows.manager import FlowManager
    manager = FlowManager(booking_flow("22:00"))
    for spec, body in manager.function_tools():   # the flow's functions join the call's registry
        registry.register(spec, body)
    manager.bind(registry.specs())
    CallActor(..., registry=registry, flow=manager)

``python -m examples.booking_flow`` prints the problems ``brisvoxd check`` would report (none).
"""

from __future__ import annotations

from brisvox.agent.flows.definition import FlowAction, FlowDef, FlowFunction, FlowNode, check_flow

BOOKING = {"type": "object", "required": ["name", "date", "time", "people"],
           "properties": {"name": {"type": "string"}, "date": {"type": "string"}, "time": {"type": "string"},
                          "people": {"type": "integer", "minimum": 1, "maximum": 12}}}


def booking_flow(closing: str) -> FlowDef:
    nodes = {
        "greeting": FlowNode("greeting", "Greet the caller, then ask for the name, date, time and party size.",
                             functions=(FlowFunction("set_booking", "Record the booking details.", BOOKING,
                                                     "check"),),
                             on_keypad={"0": "goodbye"}),
        "check": FlowNode("check", "Check the slot with check_slot.", tools=("check_slot",),
                          next_on={"check_slot": "confirm"}),
        "confirm": FlowNode("confirm", "Repeat the booking and ask the caller to confirm.",
                            functions=(FlowFunction("confirmed", "The caller confirmed.", {"type": "object"}, "book"),
                                       FlowFunction("change", "The caller wants a change.", {"type": "object"},
                                                    "greeting"))),
        "book": FlowNode("book", "Book the table with book_table, then say the booking number.",
                         tools=("book_table",), next_on={"book_table": "goodbye"}, context="reset_with_summary"),
        "goodbye": FlowNode("goodbye", f"Thank the caller, say we are open until {closing}, and say goodbye.",
                            post_actions=(FlowAction(end_call=True),)),
    }
    return FlowDef(start="greeting", nodes=nodes, role="You are the booking line of Brisvox Bistro.",
                   max_transitions=12)


if __name__ == "__main__":
    problems = check_flow(booking_flow("22:00"), ["check_slot", "book_table", "end_call"])
    print("\n".join(f"{p.key}: {p.message}" for p in problems) or "ok")
