"""An agent file's ``[agent_link]``: the agent service a call dials (docs/AGENT_PROTOCOL.md).

Owns :class:`LinkConfig` (parsed from the table the schema already checked) and
:func:`check_link`, the offline check ``brisvoxd check`` runs on it.

Invariants:

* The secret is never in the file: ``secret_env`` names the environment variable
  (read when a call is built, :func:`secret_of`); an unset variable is a WARNING
  offline (like an unset provider key) and refuses the call at build time.
* ``url`` is ``ws://`` or ``wss://`` with a host; ``side_effect_wait`` is in (0, 120]
  (under the engine's SideEffect backstop), ``connect_timeout`` in (0, 30].
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_SIDE_EFFECT_WAIT = 60.0
MAX_SIDE_EFFECT_WAIT = 120.0


@dataclass(frozen=True, slots=True)
class LinkConfig:
    url: str
    secret_env: str
    required: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    side_effect_wait: float = DEFAULT_SIDE_EFFECT_WAIT

    @classmethod
    def from_table(cls, t: Mapping[str, Any]) -> LinkConfig:
        return cls(url=str(t["url"]), secret_env=str(t["secret_env"]), required=bool(t.get("required", False)),
                   connect_timeout=float(t.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)),
                   side_effect_wait=min(MAX_SIDE_EFFECT_WAIT,
                                        float(t.get("side_effect_wait", DEFAULT_SIDE_EFFECT_WAIT))))


def url_problem(url: str) -> str:
    """'' for a usable ``ws://``/``wss://`` URL, else what is wrong with it."""
    try:
        u = urlsplit(url)
        _ = u.port  # raises ValueError on a bad port
    except ValueError as e:
        return f"bad URL: {e}"
    if u.scheme not in ("ws", "wss"):
        return "the agent service's URL must be ws:// or wss://"
    if not u.hostname:
        return "the URL names no host"
    return ""


def secret_of(cfg: LinkConfig, env: Mapping[str, str] | None = None) -> str:
    return (os.environ if env is None else env).get(cfg.secret_env, "")


def check_link(table: Mapping[str, Any], env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(severity, key under ``agent_link``, message) of every problem of a schema-valid table."""
    cfg = LinkConfig.from_table(table)
    out: list[tuple[str, str, str]] = []
    bad = url_problem(cfg.url)
    if bad:
        out.append(("error", "url", bad))
    if not secret_of(cfg, env):
        out.append(("warning", "secret_env",
                    f"{cfg.secret_env} is not set: calls with this agent "
                    + ("will be refused" if cfg.required else "will run without the agent service")))
    return out
