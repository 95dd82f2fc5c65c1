"""Whether a daemon configuration declares any webhook (then the supervisor starts ``outbound``).

Invariants: reads only the daemon config and the agent files' TOML text (no agent
definition is parsed: an unreadable or broken file counts as declaring none, and
``brisvoxd check`` reports it); never raises.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

MAX_AGENT_FILES = 1000


def agent_files_with_webhooks(cfg: Any) -> list[Path]:
    """The agent files of the daemon's agents directory whose TOML has a ``[[webhooks]]`` array."""
    try:
        base = Path(cfg.section("agents").agents_path(getattr(cfg, "path", None)))
        files = sorted(base.glob("*.toml"))[:MAX_AGENT_FILES]
    except OSError:
        return []
    out = []
    for p in files:
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        hooks = data.get("webhooks")
        if isinstance(hooks, list) and hooks:
            out.append(p)
    return out


def webhooks_wanted(cfg: Any) -> bool:
    """Any ``[[webhooks]]`` in ``brisvoxd.toml`` or in an agent file."""
    return bool(cfg.section("webhooks").hooks) or bool(agent_files_with_webhooks(cfg))
