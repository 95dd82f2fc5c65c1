"""A call's agent link, opened before its actor starts (docs/AGENT_PROTOCOL.md).

Owns :func:`open_link` (what :func:`brisvox.agent.host.call_build.open_call` runs for an
agent file with ``[agent_link]``) and :func:`call_metadata` (the offer's ``call``).

Invariants:

* The link is open and its tools are in the call's registry BEFORE the actor is built
  (the runner offers the registry's specs read at its construction; the engine reads the
  registry at every call).
* ``required = true``: an unset secret, a refusal or an unreachable service raises
  :class:`~brisvox.agent.link.client.LinkRefused` (the agent process refuses the call,
  ``bad_agent``); otherwise the call runs without the service (None, logged).
* :func:`call_metadata` reads whatever the ``CallStart`` has (``caller``/``called`` when the
  gateway says them, else the parameters' ``caller``/``called``/``From``/``To``), every
  value a bounded string: it never raises.
"""

from __future__ import annotations

import logging
from typing import Any

from brisvox.agent.link.client import AgentLink, LinkRefused
from brisvox.agent.link.config import secret_of
from brisvox.agent.tool_engine.registry import ToolRegistry

log = logging.getLogger("brisvox.agent.link")


def _s(v: Any, n: int = 256) -> str:
    return v[:n] if isinstance(v, str) else ""


def call_metadata(agent: Any, start: Any) -> dict[str, Any]:
    params = getattr(start, "params", None)
    params = {str(k)[:64]: _s(v) for k, v in list(params.items())[:32]} if isinstance(params, dict) else {}
    info = getattr(start, "call_info", None)
    caller = _s(getattr(start, "caller", "")) or _s(getattr(info, "caller", "")) or params.get(
        "caller", params.get("From", ""))
    called = _s(getattr(start, "called", "")) or _s(getattr(info, "called", "")) or params.get(
        "called", params.get("To", ""))
    ids = getattr(start, "transport_ids", None)
    return {"call_id": _s(getattr(start, "call_id", ""), 128), "agent": _s(getattr(agent, "name", ""), 64),
            "transport": _s(getattr(start, "transport", ""), 32), "caller": caller, "called": called,
            "transport_ids": {str(k)[:64]: _s(v) for k, v in ids.items()} if isinstance(ids, dict) else {},
            "params": params}


async def open_link(agent: Any, start: Any, built: Any, fallback_line: str = "") -> AgentLink | None:
    """Open the call's link and register its tools in ``built.registry`` (created if None)."""
    cfg = agent.agent_link
    if built.registry is None:
        built.registry = ToolRegistry()
    secret = secret_of(cfg)
    if not secret:
        if cfg.required:
            raise LinkRefused(f"{cfg.secret_env} is not set")
        log.warning("call %s: %s is not set: the call runs without its agent service", start.call_id, cfg.secret_env)
        return None
    link = AgentLink(cfg, secret, session=start.call_id, call=call_metadata(agent, start), registry=built.registry,
                     telephony=built.telephony, transfer_targets=tuple(agent.transfer_targets),
                     fallback_line=fallback_line)
    try:
        await link.open()
    except LinkRefused as e:
        if cfg.required:
            raise
        log.warning("call %s: runs without its agent service: %s", start.call_id, e)
        return None
    if link.refused:
        log.warning("call %s: the agent service's tools refused: %s", start.call_id,
                    "; ".join(f"{n}: {why}" for n, why in link.refused)[:300])
    return link
