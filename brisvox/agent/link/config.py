"""An agent file's ``[agent_link]``: the agent service a call dials (docs/AGENT_PROTOCOL.md).

Owns :class:`LinkConfig` (parsed from the table the schema already checked) and
:func:`check_link`, the offline check ``brisvoxd check`` runs on it.

Invariants:

* The secret is never in the file: ``secret_env`` names the environment variable
  (read when a call is built, :func:`secret_of`); an unset variable is a WARNING
  offline (like an unset provider key) and refuses the call at build time.
* ``url`` is ``ws://`` or ``wss://`` with a host; ``side_effect_wait`` is in (0, 120]
  (under the engine's SideEffect backstop), ``connect_timeout`` in (0, 30].
* The service may make the server dial out (the ``dial`` command) only with
  ``allow_dial = true``, and only a target :meth:`LinkConfig.may_dial` finds in
  ``dial_targets`` (an entry is an exact target, or a prefix ending in ``*``): by default
  nothing is dialled, and an empty list dials nothing either (no premium number by accident).
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
    allow_dial: bool = False  # the service's dial command (docs/AGENT_PROTOCOL.md): off by default
    dial_targets: tuple[str, ...] = ()  # what it may dial: exact targets, or prefixes ending in "*"

    @classmethod
    def from_table(cls, t: Mapping[str, Any]) -> LinkConfig:
        return cls(url=str(t["url"]), secret_env=str(t["secret_env"]), required=bool(t.get("required", False)),
                   connect_timeout=float(t.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)),
                   side_effect_wait=min(MAX_SIDE_EFFECT_WAIT,
                                        float(t.get("side_effect_wait", DEFAULT_SIDE_EFFECT_WAIT))),
                   allow_dial=t.get("allow_dial", False) is True,
                   dial_targets=tuple(str(x) for x in t.get("dial_targets", ())))

    def may_dial(self, target: str) -> bool:
        """``allow_dial`` and ``target`` is one of ``dial_targets`` (or starts with a ``*`` entry's prefix)."""
        return self.allow_dial and bool(target) and any(
            target.startswith(e[:-1]) if e.endswith("*") else target == e for e in self.dial_targets)


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
    if cfg.allow_dial and not cfg.dial_targets:
        out.append(("warning", "dial_targets", "allow_dial is true but dial_targets is empty: nothing is dialled"))
    if any(e in ("*", "+*", "sip:*") for e in cfg.dial_targets):
        out.append(("warning", "dial_targets", "an entry allows any number or URI: the service can dial anything"))
    if not secret_of(cfg, env):
        out.append(("warning", "secret_env",
                    f"{cfg.secret_env} is not set: calls with this agent "
                    + ("will be refused" if cfg.required else "will run without the agent service")))
    return out
