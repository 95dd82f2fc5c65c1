"""A call's metadata on virtual time, through the production actor: the local tools the model
calls (a ReadOnly and a SideEffect one) and a flow's pre-action tool read the caller, the
called number and the parameters from ``ctx.call_info``; the call record's ``call`` section
has the numbers and the parameters, without the secret one."""

from __future__ import annotations

from typing import Any

from brisvox.agent.flows.definition import parse_flow
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.registry import ToolContext, ToolKind, ToolRegistry, ToolSpec
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

OBJ = {"type": "object"}
INFO = CallInfo.of(caller="+15550100", called="+15550199", transport="twilio",
                   transport_ids={"streamSid": "MZ1", "callSid": "CA1"},
                   params={"From": "+15550100", "To": "+15550199", "tier": "gold", "auth_token": "s3cret"})


def tools(seen: list[tuple[str, ToolContext]]):
    def make(name: str):
        async def tool(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            seen.append((name, ctx))
            return {"caller": ctx.call_info.caller, "tier": ctx.call_info.params.get("tier", "")}

        return tool

    def reg() -> ToolRegistry:
        r = ToolRegistry()
        r.register(ToolSpec("whoami", "Who is calling.", OBJ, ToolKind.READ_ONLY), make("whoami"))
        r.register(ToolSpec("note", "Note the call.", OBJ, ToolKind.SIDE_EFFECT), make("note"))
        return r

    return reg


def test_local_tools_and_the_record_see_the_calls_metadata():
    seen: list[tuple[str, ToolContext]] = []
    flow = parse_flow({"start": "hello", "nodes": {"hello": {
        "task": "Greet the caller by number.", "tools": ["whoami", "note"],
        "pre_actions": [{"tool": "note", "args": {}}]}}})
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter("who am i", at=0.5)],
        # the model's note has its own arguments: an identical one would be the pre-action's repeat (already_done)
        llm=[LlmScript((Call("whoami", {}), Call("note", {"by": "model"}))),
             LlmScript((Say("You are calling from 555."),))],
        registry=tools(seen), flow=flow, call_info=INFO)))
    names = [name for name, _ in seen]
    assert names[0] == "note" and sorted(names[1:]) == ["note", "whoami"]  # the pre-action, then the model's
    for _, ctx in seen:
        assert ctx.call_info is INFO
        assert (ctx.call_info.caller, ctx.call_info.called) == ("+15550100", "+15550199")
        assert ctx.call_info.params["auth_token"] == "s3cret"  # the tools see every parameter
        assert ctx.call_info.transport_ids["callSid"] == "CA1"
    results = [m.content for m in res.actor.context if getattr(m, "role", "") == "tool"]
    assert any('"caller":"+15550100"' in r and '"tier":"gold"' in r for r in results)
    call = res.record["call"]
    assert call == {"caller": "+15550100", "called": "+15550199",
                    "params": {"From": "+15550100", "To": "+15550199", "tier": "gold"}}
    assert "s3cret" not in str(res.record)
    assert res.record["transport"] == "sim" and res.live_tasks_after == 0


def test_a_call_without_metadata_records_an_empty_call_section():
    res = run_virtual(lambda: simulate(SimCall(steps=[Utter("hello", at=0.5)], llm=[LlmScript((Say("Hi."),))])))
    assert res.record["call"] == {"caller": "", "called": "", "params": {}}
    assert res.record["transport_ids"] == {"sim": "sim1"}
