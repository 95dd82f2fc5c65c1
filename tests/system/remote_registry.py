"""A call's registry whose tools are REMOTE: the same tools served by an agent service built
with the Python SDK (sdk/python), reached through the daemon's AgentLink (brisvox/agent/link/).

``remote_registry(local)`` starts an SDK ``Agent`` on a free loopback port (on the running
loop) declaring every tool of ``local`` with its own spec (kind, timeout, filler delay, schema)
and a body that runs the local tool's body; then opens a real ``AgentLink`` to it, whose
registry holds the remote twins. The scenario tests run unchanged over it.
"""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from brisvox.agent.link.client import AgentLink
from brisvox.agent.link.config import LinkConfig
from brisvox.agent.tool_engine.registry import ToolContext, ToolKind, ToolRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
from brisvox_agent import Agent  # noqa: E402

SECRET = "remote-scenarios"
LAST_STATS: dict[str, int] = {}  # the last link's counters (the tests check the calls went remote)


def _serve_like(agent: Agent, local: ToolRegistry, name: str) -> None:
    rt = local.get(name)
    assert rt is not None
    spec = rt.spec

    async def body(ctx: Any, args: dict[str, Any]) -> Any:
        return await rt.tool(args, ToolContext("remote", ctx.epoch, ctx.call_id, tool=name))

    agent.tool(body, name=name, description=spec.description, parameters=spec.parameters,
               kind="side_effect" if spec.kind is ToolKind.SIDE_EFFECT else "read_only",
               timeout_ms=int(spec.timeout * 1000),
               filler_after_ms=None if spec.filler_after is None else int(spec.filler_after * 1000),
               repeatable=spec.repeatable, confirm=spec.confirm)


@asynccontextmanager
async def remote_registry(local: ToolRegistry, session: str = "scenario"):  # noqa: ANN201
    agent = Agent(secret=SECRET, port=0)
    for name in local.names():
        _serve_like(agent, local, name)
    async with agent:
        link = AgentLink(LinkConfig(f"ws://127.0.0.1:{agent.port}/brisvox", "S", required=True), SECRET,
                         session=session, call={"call_id": session}, registry=ToolRegistry())
        await link.open()
        try:
            assert sorted(link.registry.names()) == sorted(local.names()), link.refused
            yield link.registry
        finally:
            LAST_STATS.clear()
            LAST_STATS.update(link.stats.as_dict())
            await link.aclose()
