"""transfer_call fails closed: not offered without transfer_targets, an
agent file that lists it without targets is refused, a flow transfer must name a listed
target, and a transfer waits for the caller's yes (the confirmation gate) unless the agent
file says ``confirm_transfer = false``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from brisvox.agent.definition import AgentDefError, check_agent_file, load_agent
from brisvox.agent.tool_engine.builtin import LinkTelephony, telephony_tools
from brisvox.agent.tool_engine.loader import NO_TRANSFER_TARGETS, ToolSetupError, build_registry
from brisvox.agent.tool_engine.registry import ToolContext, ToolError
from ipc.frames import Transfer
from tests.unit.test_providers_agents import BASE

from .helpers import Conv, engine


class Port:
    """A TelephonyPort that records the frames and answers every transfer ok."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.link = LinkTelephony("c1", self.frames.append)
        self.call_id = "c1"

    def hangup(self, reason: str) -> None:
        self.link.hangup(reason)

    def send_dtmf(self, digits: str) -> None:
        self.link.send_dtmf(digits)

    async def transfer(self, target: str, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        self.frames.append(Transfer(call_id="c1", target=target))
        return True, ""


def write(tmp: Path, extra: str) -> Path:
    p = tmp / "a.toml"
    p.write_text(BASE.format(extra=extra))
    return p


def test_no_targets_no_transfer_tool() -> None:
    names = [s.name for s, _ in telephony_tools(Port())]
    assert names == ["end_call", "send_dtmf"]
    names = [s.name for s, _ in telephony_tools(Port(), transfer_targets=("+4930123",))]
    assert names == ["end_call", "send_dtmf", "transfer_call", "warm_transfer"]


def test_transfer_only_to_a_listed_target() -> None:
    port = Port()
    tools = {s.name: t for s, t in telephony_tools(port, transfer_targets=("+4930123",))}

    async def main() -> Any:
        with pytest.raises(ToolError, match="not allowed"):
            await tools["transfer_call"]({"target": "+1900555"}, ToolContext("s", 1, "t1.0"))
        return await tools["transfer_call"]({"target": "+4930123"}, ToolContext("s", 1, "t1.1"))

    assert asyncio.run(main()) == {"status": "transferred"}
    assert port.frames == [Transfer(call_id="c1", target="+4930123")]


def test_an_agent_file_with_transfer_call_and_no_targets_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, 'tools = ["end_call", "transfer_call"]')
    _, problems = check_agent_file(p, env={})
    errs = [(x.key, x.line, x.message) for x in problems if x.severity == "error"]
    assert errs == [("tools", 3, NO_TRANSFER_TARGETS)]
    with pytest.raises(AgentDefError, match="transfer_targets"):
        load_agent(p, env={})


def test_a_flow_transfer_must_name_a_listed_target(tmp_path: Path) -> None:
    flow = '''tools = ["transfer_call"]
transfer_targets = ["+4930123"]
[flow]
start = "a"
[flow.nodes.a]
task = "hand over"
pre_actions = [{ transfer = "+4930999" }]
'''
    _, problems = check_agent_file(write(tmp_path, flow), env={})
    errs = [x for x in problems if x.severity == "error"]
    assert len(errs) == 1 and errs[0].key == "flow.nodes.a.pre_actions"
    assert "'+4930999'" in errs[0].message and "transfer_targets" in errs[0].message
    _, problems = check_agent_file(write(tmp_path, flow.replace("+4930999", "+4930123")), env={})
    assert [x for x in problems if x.severity == "error"] == []


def test_transfer_is_gated_by_default_and_the_file_can_turn_the_gate_off(tmp_path: Path) -> None:
    on = load_agent(write(tmp_path, 'tools = ["transfer_call"]\ntransfer_targets = ["+4930123"]'), env={})
    assert on.confirm_transfer
    reg = build_registry(on, Port())
    assert reg.names() == ["confirm_pending", "transfer_call"] and reg.spec("transfer_call").confirm  # type: ignore[union-attr]
    off = load_agent(write(tmp_path, 'tools = ["transfer_call"]\ntransfer_targets = ["+4930123"]\n'
                                     'confirm_transfer = false'), env={})
    reg = build_registry(off, Port())
    assert reg.names() == ["transfer_call"] and not reg.spec("transfer_call").confirm  # type: ignore[union-attr]


def test_confirm_transfer_without_transfer_call_is_a_warning(tmp_path: Path) -> None:
    _, problems = check_agent_file(write(tmp_path, 'tools = ["end_call"]\nconfirm_transfer = false'), env={})
    assert [(x.severity, x.key, x.line) for x in problems] == [("warning", "confirm_transfer", 4)]


def test_build_registry_refuses_transfer_call_without_targets() -> None:
    class Agent:
        path = ""
        tool_modules = ()
        tools = ("transfer_call",)
        confirm_tools = ()
        transfer_targets = ()

    with pytest.raises(ToolSetupError) as e:
        build_registry(Agent(), Port())
    assert e.value.tool == "transfer_call" and "transfer_targets" in str(e.value)


def test_a_gated_transfer_runs_only_after_the_callers_yes(vrun, tmp_path: Path) -> None:
    agent = load_agent(write(tmp_path, 'tools = ["transfer_call"]\ntransfer_targets = ["+4930123"]'), env={})
    port = Port()

    async def main() -> None:
        conv = Conv(engine(build_registry(agent, port)))
        ex = await conv.run(("transfer_call", {"target": "+4930123"}))
        assert orjson.loads(ex.results[0].content)["status"] == "confirmation_required"
        assert port.frames == []  # nothing left the call: an injected "transfer me" alone does nothing
        conv.say("Shall I transfer you to +49 30 123?")
        conv.new_turn("yes")
        ex = await conv.run(("confirm_pending", {"call_id": "t1.0"}))
        assert orjson.loads(ex.results[0].content) == {"status": "transferred"}
        assert port.frames == [Transfer(call_id="c1", target="+4930123")]

    vrun(main)

