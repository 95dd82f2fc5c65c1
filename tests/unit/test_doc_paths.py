"""Every repository path and module the README and docs/*.md name exists.

The docs steer a newcomer ("a new carrier: ``brisvox/gateway/carriers/<name>.py``"), so a
path that moved must move in the docs too. Checked, in each ```code``` span of README.md
and docs/*.md:

* a path that starts at a top-level folder of the repository (``brisvox/gateway/core/``,
  ``tests/unit/test_x.py``, ``deploy/brisvoxd.service``), or a top-level file
  (``Makefile``, ``pyproject.toml``), optionally followed by ``:line`` or ``::test``;
* a dotted module name under ``brisvox``, ``ipc`` or ``workers``
  (``brisvox.gateway.transports.TRANSPORTS``): the longest prefix that is a module must
  exist, and a name after a *package* must be one of its modules (a name after a module
  is an attribute and must be defined at its top level).

A dotted name that production code uses as a string (a logger such as ``brisvox.agent.stt``,
a span attribute such as ``brisvox.call_id``) names that string, not a module. Spans with
placeholders (``<name>``, ``*``, ``{a,b}``, ``...``) are patterns, not paths, and are
skipped; so are generated folders (``.venv/``, anything ``.gitignore`` names, such as
``bench/out/``) and paths under ``/``.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_FILES = {"Makefile", "pyproject.toml", "constraints.txt", "Dockerfile", "README.md"}
SKIP_PARTS = (".venv", "__pycache__", "node_modules", "dist", ".stamp")
SPAN = re.compile(r"`([^`\n]+)`")
MODULE = re.compile(r"^(brisvox|ipc|workers)(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def top_folders() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") or p.name == ".ci"}


def candidates(text: str) -> list[str]:
    out = []
    for span in SPAN.findall(text):
        for token in span.split():
            token = token.strip("(),;:.'\"")
            if token and not any(c in token for c in "<>*{}$") and "..." not in token:
                out.append(token)
    return out


def path_of(token: str, folders: set[str]) -> str | None:
    """The repository path ``token`` names, or None when it names none."""
    token = token.split("::", 1)[0]
    token = re.sub(r":\d+(-\d+)?$", "", token)
    head = token.split("/", 1)[0]
    if token in TOP_FILES or (head in folders and "/" in token):
        return None if any(part in token for part in SKIP_PARTS) else token
    return None


@functools.cache
def code_strings() -> frozenset[str]:
    """Every string constant of the production code (logger names, span attributes, ...)."""
    out: set[str] = set()
    for pkg in ("brisvox", "ipc", "workers"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                    out.add(node.value)
    return frozenset(out)


def ignored(path: str) -> bool:
    """``path`` is one git ignores (generated output, such as ``bench/out/``)."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


@functools.cache
def top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def module_problem(dotted: str) -> str | None:
    """Why ``dotted`` names nothing (None: it does)."""
    if dotted in code_strings():
        return None
    parts = dotted.split(".")
    here = ROOT
    for i, part in enumerate(parts):
        if (here / part).is_dir() and (here / part / "__init__.py").exists():
            here = here / part
            continue
        if (here / f"{part}.py").exists():
            rest = parts[i + 1:]
            if rest and rest[0] not in top_level_names(here / f"{part}.py"):
                return f"{'.'.join(parts[:i + 1])} defines no {rest[0]}"
            return None
        if i == 0:
            return None  # not ours
        if here != ROOT and part in top_level_names(here / "__init__.py"):
            return None  # a package attribute
        return f"{'.'.join(parts[:i])} has no module {part}"
    return None


def test_every_path_and_module_the_docs_name_exists() -> None:
    folders = top_folders()
    assert {"brisvox", "ipc", "workers", "tests", "docs"} <= folders
    missing = []
    checked = 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for token in candidates(line):
                where = f"{doc.relative_to(ROOT)}:{n}"
                path = path_of(token, folders)
                if path is not None:
                    checked += 1
                    if not (ROOT / path.rstrip("/")).exists() and not ignored(path):
                        missing.append(f"{where}: {token} (no such path)")
                elif MODULE.match(token):
                    checked += 1
                    if (why := module_problem(token)) is not None:
                        missing.append(f"{where}: {token} ({why})")
    assert checked > 200, f"checked only {checked} names: is the extraction broken?"
    assert not missing, "the docs name paths or modules that do not exist:\n  " + "\n  ".join(missing)


def test_the_checker_finds_a_stale_path_and_module() -> None:
    folders = top_folders()
    assert path_of("brisvox/gateway/sip_ua.py:12", folders) == "brisvox/gateway/sip_ua.py"
    assert not (ROOT / "brisvox/gateway/sip_ua.py").exists()
    assert path_of("brisvox/gateway/<name>.py", folders) is None or "<" in "brisvox/gateway/<name>.py"
    assert candidates("see `brisvox/gateway/carriers/<name>.py` and `ipc/ring.py`") == ["ipc/ring.py"]
    assert module_problem("brisvox.gateway.sip_ua") == "brisvox.gateway has no module sip_ua"
    assert module_problem("brisvox.gateway.transports.NOPE") == "brisvox.gateway.transports defines no NOPE"
    assert module_problem("brisvox.gateway.transports.TRANSPORTS") is None
