"""Where a dotted key sits in a TOML file: ``tomllib`` keeps no positions, so this scans the text.

Owns the mapping from a dotted key (``gateway.sip.port``, ``llm.options.rules.0.match``) to the
1-based line that defines it, used by every configuration error that can name a line (the daemon
config of :mod:`brisvox.config.daemon`, agent files of :mod:`brisvox.agent.definition`).

Invariants: a table maps to its header line; array-of-tables entries are numbered from 0; keys
inside multi-line strings are skipped; an inline table's keys map to the line of its key; a key
the scan cannot place maps to the nearest enclosing key that it can (0: none).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _parts(dotted: str) -> list[str]:
    return [p.strip().strip("\"'") for p in re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", dotted)]


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of its definition (tables: their header line)."""
    out: dict[str, int] = {}
    prefix: list[str] = []
    counts: dict[str, int] = {}
    in_multi: str | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        if in_multi is not None:
            if line.count(in_multi) % 2 == 1:
                in_multi = None
            continue
        m = _HEADER.match(line)
        if m and not _KEY.match(line):
            parts = _parts(m.group(2))
            if m.group(1) == "[[":
                base = ".".join(parts)
                idx = counts.get(base, 0)
                counts[base] = idx + 1
                parts = [*parts, str(idx)]
            prefix = parts
            for i in range(1, len(parts) + 1):
                out.setdefault(".".join(parts[:i]), n)
            continue
        k = _KEY.match(line)
        if k:
            full = ".".join([*prefix, *_parts(k.group(1))])
            out.setdefault(full, n)
            rest = line[k.end():]
            for q in ('"""', "'''"):
                if rest.count(q) % 2 == 1:
                    in_multi = q
    return out


def line_of(lines: Mapping[str, int], path: Sequence[Any]) -> int:
    """The line of ``path`` (key parts), or of its nearest enclosing key the scan placed (0: none)."""
    parts = [str(p) for p in path]
    while parts:
        got = lines.get(".".join(parts))
        if got:
            return got
        parts.pop()
    return 0


def split_key(dotted: str) -> list[str]:
    """``"websocket.routes[1].path"`` -> ``["websocket", "routes", "1", "path"]`` (for :func:`line_of`)."""
    return [p for p in re.split(r"[.\[\]]+", dotted) if p]
