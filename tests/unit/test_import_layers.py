"""The process map, enforced: the import-linter contracts of ``pyproject.toml`` hold.

The contracts (``[tool.importlinter]``) say which package may import which:
``ipc`` imports no domain package; ``brisvox.wire`` (every wire format)
imports no other brisvox package, nor ``ipc``, the workers, ``bench`` or
``tests``, nor does ``brisvox.playout`` (the playout machines), and the callers (client, load generator, simulator) import no
gateway module; the gateway, the agent, the workers and the providers import
no other role (nor the supervisor); the tool engine and the context import no
provider; the conversation and the tool engine import neither the pipeline,
the host nor the agent definition, and the conversation imports no tool engine module;
the pipeline imports not its host, and its subpackages are layered (chain > s2s > cascade >
llm : speculation > stage), as are the gateway's (mains > registry > carriers | sip | audiosocket >
ws : control > core, the AudioSocket listener > its leg, with the configuration and the shared edge modules below them all);
``brisvox.runtime`` imports no other brisvox package; the client reaches the workers only
through ``workers.api``; nothing but ``tests`` and ``bench`` imports the simulator;
``bench`` imports no ``tests`` module. ``make lint`` runs the
same check (``lint-imports``). The graph (grimp) holds every import
statement at any depth, imports inside functions included, and a forbidden
contract also fails on an indirect chain; a broken contract is printed with
every offending import and its line.

Checked here as well, because a module expression cannot say ``tool_*``: the
tool-engine contract lists the ``tool_engine`` package (every tool module lives
in it) and any ``brisvox/agent/tool*`` module beside it, the
production contract lists every ``brisvox`` subpackage but ``sim``, and the
wire contract every one but ``wire``, the playout contract every one but
``playout``. And what import-linter does not see (it graphs the project's
own packages only): ``brisvox.wire`` imports no third-party package but
numpy and pylibsrtp (libsrtp, the SRTP transform of ``brisvox.wire.srtp``), ``brisvox.playout`` none at all, at any depth of any of their modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _contracts() -> dict[str, dict[str, Any]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["name"]: c for c in doc["tool"]["importlinter"]["contracts"]}


def _contract(starts: str) -> dict[str, Any]:
    found = [c for name, c in _contracts().items() if name.startswith(starts)]
    assert len(found) == 1, f"one contract named {starts!r}... in pyproject.toml, found {len(found)}"
    return found[0]


def _children(package: Path, prefix: str) -> set[str]:
    """Dotted names of a package's direct modules and subpackages."""
    out = {f"{prefix}.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    out |= {f"{prefix}.{p.parent.name}" for p in package.glob("*/__init__.py")}
    return out


def test_the_import_contracts_hold():
    """The same check as ``make lint`` (import-linter comes with the test extra)."""
    proc = subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (
        "a layering contract of pyproject.toml [tool.importlinter] is broken "
        "(move the code to where it belongs; see README 'Layout'):\n" + proc.stdout + proc.stderr)
    assert f"{len(_contracts())} kept, 0 broken" in proc.stdout, proc.stdout


def test_the_tool_engine_contract_lists_every_tool_module():
    sources = set(_contract("the tool engine and the context")["source_modules"])
    agent = ROOT / "brisvox" / "agent"
    tool_modules = {m for m in _children(agent, "brisvox.agent") if m.rsplit(".", 1)[1].startswith("tool")}
    assert tool_modules, "no brisvox/agent/tool* module found"
    assert tool_modules <= sources, f"add to the tool-engine contract: {sorted(tool_modules - sources)}"
    assert "brisvox.agent.tool_engine" in sources
    assert {"brisvox.agent.conversation.context", "brisvox.agent.conversation.truncation",
            "brisvox.agent.conversation.assemble"} <= sources


def test_the_production_contract_lists_every_production_package():
    sources = set(_contract("production code imports neither")["source_modules"])
    want = (_children(ROOT / "brisvox", "brisvox") - {"brisvox.sim"}) | {"ipc", "workers"}
    assert want <= sources, f"add to the production contract: {sorted(want - sources)}"
    assert "brisvox.sim" not in sources


def test_the_wire_contract_lists_every_other_brisvox_package():
    forbidden = set(_contract("the wire formats import no other")["forbidden_modules"])
    want = (_children(ROOT / "brisvox", "brisvox") - {"brisvox.wire"}) | {"ipc", "workers", "bench", "tests"}
    assert want <= forbidden, f"add to the wire contract: {sorted(want - forbidden)}"


def test_the_playout_contract_lists_every_other_brisvox_package():
    forbidden = set(_contract("the playout machines import no other")["forbidden_modules"])
    want = (_children(ROOT / "brisvox", "brisvox") - {"brisvox.playout"}) | {"ipc", "workers", "bench", "tests"}
    assert want <= forbidden, f"add to the playout contract: {sorted(want - forbidden)}"


def _third_party(package: str, allowed: set[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "brisvox" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue  # a relative import stays inside the package
            for name in names:
                if name.split(".")[0] not in allowed and not (name + ".").startswith(f"brisvox.{package}."):
                    found.setdefault(path.relative_to(ROOT).as_posix(), set()).add(name)
    return found


def test_the_wire_package_imports_only_the_standard_library_numpy_libsrtp_and_itself():
    found = _third_party("wire", set(sys.stdlib_module_names) | {"numpy", "pylibsrtp", "__future__"})
    assert not found, f"brisvox.wire imports only the standard library, numpy, pylibsrtp and itself: {found}"


def test_the_playout_package_imports_only_the_standard_library_and_itself():
    found = _third_party("playout", set(sys.stdlib_module_names) | {"__future__"})
    assert not found, f"brisvox.playout imports only the standard library and itself: {found}"
