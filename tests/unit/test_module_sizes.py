"""Whole objects, not one class spread over files: no production class borrows state from a sibling mixin.

Production modules are the ``.py`` files of ``ipc``, ``brisvox`` and ``workers`` (not tests,
not bench). A class that owns its state lives in one file and, when it grows, holds
collaborators (composition); the pattern this test forbids is the one it replaced:
``class Worker(CallTable, RealtimeLane, RequestDispatch)`` whose parts each declared the
others' attributes under ``if TYPE_CHECKING:`` and reached them through a shared ``self``.

A class fails when

* one of its bases is a project class whose body has an ``if TYPE_CHECKING:`` block (a part
  declaring attributes it expects a sibling or the final class to supply), or
* it has two or more project bases that are neither ``Protocol``\\ s, exceptions nor enums
  (multiple inheritance of project classes is a mixin chain), or
* a method does ``cast("SomeClass", self)`` (a part pretending to be the whole), or
* one of its bases is a project class defined in another module that is the base of this
  class only and is never constructed anywhere (a part of one class kept in another file:
  ``GatewayCore(AgentLinks(CallLifecycle(PlayoutCommands)))`` was a chain of such parts).

Module size is information: the largest modules are printed in every run (``pytest -s``),
and only a module over :data:`MAX_LINES` fails (a long module that is one coherent thing is
fine; a class spread over files is not).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ipc", "brisvox", "workers")
MAX_LINES = 1000
PLAIN_BASES = {"Protocol", "Exception", "BaseException", "ValueError", "RuntimeError", "KeyError",
               "TypeError", "OSError", "SystemExit", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag",
               "NamedTuple", "TypedDict", "Generic", "ABC"}


@dataclass
class ClassInfo:
    name: str
    module: str
    bases: list[str]
    declares_under_type_checking: bool
    is_protocol: bool
    casts_self: list[str] = field(default_factory=list)


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _is_type_checking_if(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and _base_name(node.test) == "TYPE_CHECKING"


def names_used(source: str) -> set[str]:
    """The names a module uses as values (called, passed, assigned, compared), not those it
    names only as a base class or in an annotation: a class in this set is used on its own."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        typed = []
        if isinstance(node, ast.ClassDef):
            typed = list(node.bases)
        elif isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            typed = [node.annotation]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            typed = [node.returns]
        for sub in typed:
            skip.update(id(n) for n in ast.walk(sub))
    used = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            used.add(node.attr)
    return used


def classes_of(source: str, module: str) -> list[ClassInfo]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [_base_name(b) for b in node.bases]
        casts = [
            ast.unparse(call)
            for call in ast.walk(node)
            if isinstance(call, ast.Call) and _base_name(call.func) == "cast" and len(call.args) == 2
            and isinstance(call.args[1], ast.Name) and call.args[1].id == "self"
        ]
        out.append(ClassInfo(
            name=node.name, module=module, bases=[b for b in bases if b],
            declares_under_type_checking=any(_is_type_checking_if(s) for s in node.body),
            is_protocol="Protocol" in bases, casts_self=casts,
        ))
    return out


def mixin_violations(classes: list[ClassInfo], used: set[str]) -> list[str]:
    """Every breach of the module docstring's rules, as readable lines (``used``: the names
    the modules use as values, :func:`names_used`)."""
    by_name: dict[str, list[ClassInfo]] = {}
    for c in classes:
        by_name.setdefault(c.name, []).append(c)
    bad = []
    for c in classes:
        where = f"{c.module}:{c.name}"
        project_bases = [b for b in c.bases if b in by_name and b not in PLAIN_BASES]
        for b in project_bases:
            for base in by_name[b]:
                if base.declares_under_type_checking and not base.is_protocol:
                    bad.append(f"{where} inherits {base.module}:{b}, which declares attributes under "
                               "TYPE_CHECKING (a part borrowing state through a shared self)")
        mixins = [b for b in project_bases
                  if not any(base.is_protocol or set(base.bases) & PLAIN_BASES for base in by_name[b])]
        if len(mixins) >= 2:
            bad.append(f"{where} inherits {len(mixins)} project classes ({', '.join(mixins)}): a mixin chain")
        for cast in c.casts_self:
            bad.append(f"{where} does {cast}")
    subclasses: dict[str, set[tuple[str, str]]] = {}
    for c in classes:
        for b in c.bases:
            subclasses.setdefault(b, set()).add((c.module, c.name))
    for c in classes:
        for b in c.bases:
            parts = [base for base in by_name.get(b, ()) if base.module != c.module and not base.is_protocol
                     and not set(base.bases) & PLAIN_BASES]
            if parts and subclasses.get(b) == {(c.module, c.name)} and b not in used:
                bad.append(f"{c.module}:{c.name} inherits {parts[0].module}:{b}, its only subclass, which is "
                           "never constructed: a part of one class kept in another file")
    return bad


def production_sources() -> dict[str, str]:
    sources = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                sources[path.relative_to(ROOT).as_posix()] = path.read_text()
    return sources


def test_no_production_class_borrows_state_from_a_sibling_mixin() -> None:
    sources = production_sources()
    assert len(sources) > 50, f"found only {len(sources)} modules under {ROOT}: wrong root?"
    classes = [c for module, src in sources.items() for c in classes_of(src, module)]
    bad = mixin_violations(classes, set().union(*(names_used(src) for src in sources.values())))
    assert not bad, ("classes spread over files by inheritance; make the parts collaborators the "
                     "class holds (docs/ARCHITECTURE.md, 'Whole objects'):\n  " + "\n  ".join(bad))


def test_the_checker_catches_the_pattern_it_forbids() -> None:
    """The four rules each fire on a small example of the pattern the tree had before."""
    parts = '''
from typing import TYPE_CHECKING, cast
class CallTable:
    if TYPE_CHECKING:
        def send(self, frame: bytes) -> None: ...
class RealtimeLane:
    def tick(self) -> None:
        core = cast("Worker", self)
class Worker(CallTable, RealtimeLane):
    pass
class Fine(Exception):
    pass
class AlsoFine(Fine):
    pass
'''
    bad = mixin_violations(classes_of(parts, "example.py"), names_used(parts))
    assert any("Worker inherits example.py:CallTable, which declares" in b for b in bad), bad
    assert any("a mixin chain" in b and "Worker" in b for b in bad), bad
    assert any("RealtimeLane does cast('Worker', self)" in b for b in bad), bad
    assert not any("AlsoFine" in b for b in bad), bad
    core = "class GatewayCore(PlayoutCommands):\n    pass\ncore = GatewayCore()\n"
    chain = classes_of("class PlayoutCommands:\n    pass\n", "playout.py") + classes_of(core, "core.py")
    assert any("its only subclass" in b for b in mixin_violations(chain, names_used(core))), chain
    used = names_used(core) | names_used("x = (PlayoutCommands if True else None)()\n")
    assert mixin_violations(chain, used) == []  # a base that is also used on its own is a real class
    whole = '''
class Lane:
    def __init__(self, send) -> None:
        self.send = send
class Worker:
    def __init__(self) -> None:
        self.lane = Lane(self.send)
    def send(self, frame: bytes) -> None: ...
'''
    assert mixin_violations(classes_of(whole, "whole.py"), names_used(whole)) == []


def test_no_production_module_over_the_limit() -> None:
    sizes = {name: src.count("\n") for name, src in production_sources().items()}
    largest = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    print(f"\nthe ten largest production modules (information; fails only over {MAX_LINES} lines):")
    for name, n in largest:
        print(f"  {n:5d}  {name}{' OVER' if n > MAX_LINES else ''}")
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}; split them by concern into collaborators"
