"""A call's parts from its agent definition: providers, tools, telephony port, flow.

Owns :func:`from_definition`, what the agent process builds for one call of an agent file
(:mod:`brisvox.agent.host.process` calls it; the simulator builds its own): the providers
through :func:`brisvox.providers.registry.build_call` with the process's job channel, the
telephony port bound to the call's link (its ``end_call`` hang-up waits for the goodbye to
play out), the call's tool registry (exactly the agent's ``tools``, plus a flow's functions)
and the flow's :class:`~brisvox.agent.flows.manager.FlowManager` (None without ``[flow]``).
Raises what the parts raise (a missing key, a tool nothing provides): the call is refused.
Also :func:`call_info_of`: the call's metadata (caller, called, ids, parameters) from its
``CallStart``, for its tools and its record; and :func:`recording_of`: the ``[recording]``
instruction ``CallAccepted`` carries to the gateway (``{"dir", "keep_days"}``, None when the
agent does not record: off by default), the directory ``[recording] path`` or else
``recordings/`` next to the call records (:func:`recordings_default`), kept ``[calls] keep_days``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brisvox.agent.flows.manager import FlowManager
from brisvox.agent.tool_engine.builtin import LinkTelephony
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.loader import build_registry
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.providers.registry import CallEnv, CallProviders, build_call


@dataclass(slots=True)
class CallBuild:
    providers: CallProviders
    registry: ToolRegistry | None
    telephony: LinkTelephony
    flow: FlowManager | None = None
    agent_link: Any = None  # the call's AgentLink (brisvox/agent/link/), None without [agent_link]


def call_info_of(start: Any) -> CallInfo:
    """The call's :class:`CallInfo` from its ``CallStart`` (bounded again: the frame is the
    process boundary)."""
    return CallInfo.of(caller=start.caller, called=start.called, transport=start.transport,
                       transport_ids=start.transport_ids, params=start.params)


def from_definition(agent: Any, call_id: str, to_gateway: Callable[[Any], None], channel: Any,
                    hangup_after_playout: Callable[[str], None],
                    request_gateway: Callable[[Any, float], Awaitable[Any]] | None = None) -> CallBuild:
    provs = build_call(agent, CallEnv(call_id, channel=channel))
    telephony = LinkTelephony(call_id, to_gateway, hangup_hook=hangup_after_playout, request=request_gateway)
    registry = build_registry(agent, telephony) if agent.tools or agent.flow is not None else None
    flow = None
    if agent.flow is not None:
        assert registry is not None
        flow = FlowManager(agent.flow)
        for spec, body in flow.function_tools():
            registry.register(spec, body)
        flow.bind(registry.specs())
    return CallBuild(provs, registry, telephony, flow)


def recordings_default(calls_path: str, state: Path) -> Path:
    """Where recordings go without ``[recording] path``: ``recordings/`` in the ``[calls] path``
    directory (next to a ``.jsonl`` file), else ``<state_dir>/calls/recordings``."""
    if not calls_path:
        return state / "calls" / "recordings"
    p = Path(calls_path).expanduser()
    return (p.parent if p.suffix == ".jsonl" else p) / "recordings"


def recording_of(agent: Any, default_dir: Callable[[], Path], keep_days: int) -> dict[str, Any] | None:
    """The gateway's recording instruction for a call of ``agent`` (None: not recorded)."""
    rec = getattr(agent, "recording", None) or {}
    if not rec.get("enabled", False):
        return None
    path = str(rec.get("path", ""))
    d = Path(path).expanduser() if path else default_dir()
    return {"dir": str(d.absolute()), "keep_days": int(keep_days)}


async def open_call(agent: Any, start: Any, to_gateway: Callable[[Any], None], channel: Any,
                    hangup_after_playout: Callable[[str], None],
                    request_gateway: Callable[[Any, float], Awaitable[Any]] | None = None) -> CallBuild:
    """:func:`from_definition`, then the agent service's link opened and its tools registered
    (before the actor is built); with ``required = true`` a refusal raises (the call is refused).
    ``request_gateway`` (a request to the call's gateway, answered or TimeoutError) carries the
    service's ``dial`` command."""
    built = from_definition(agent, start.call_id, to_gateway, channel, hangup_after_playout, request_gateway)
    if getattr(agent, "agent_link", None) is not None:
        from brisvox.agent.link.build import open_link

        built.agent_link = await open_link(agent, start, built)
    return built
