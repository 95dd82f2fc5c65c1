"""The call's metadata reaches every tool: a ReadOnly and a SideEffect call, a confirmed call,
as ``ctx.call_info`` (an engine built without one gives the empty CallInfo)."""

from __future__ import annotations

from brisvox.agent.tool_engine.call_info import NO_CALL, CallInfo
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.clock import CLOCK

from .helpers import RO, SE, Conv, Probe, engine, registry

INFO = CallInfo.of(caller="+15550100", called="+15550199", transport="twilio",
                   transport_ids={"callSid": "CA1"}, params={"From": "+15550100", "tier": "gold"})


def test_every_tool_run_sees_the_calls_metadata(vrun):
    async def main():
        ro, se, gated = Probe(), Probe(), Probe(result={"transferred": True})
        reg = registry(ro=(RO, ro, {}), se=(SE, se, {}), transfer=(SE, gated, {"confirm": True}))
        conv = Conv(ToolEngine(reg, "sess-1", CLOCK, call_info=INFO))
        await conv.run(("ro", {}), ("se", {}))
        conv.new_turn("transfer me")
        await conv.run(("transfer", {"to": "+15550100"}))
        conv.say("Shall I transfer you?")
        conv.new_turn("yes")
        await conv.run(("confirm_pending", {"call_id": "t2.0"}))
        runs = ro.runs + se.runs + gated.runs
        assert len(runs) == 3
        for _, ctx in runs:
            assert ctx.call_info is INFO
            assert (ctx.call_info.caller, ctx.call_info.called) == ("+15550100", "+15550199")
            assert ctx.call_info.params["tier"] == "gold" and ctx.call_info.transport_ids["callSid"] == "CA1"

    vrun(main)


def test_an_engine_without_metadata_gives_the_empty_call(vrun):
    async def main():
        ro = Probe()
        conv = Conv(engine(registry(ro=(RO, ro, {}))))
        await conv.run(("ro", {}))
        assert ro.runs[0][1].call_info is NO_CALL

    vrun(main)
