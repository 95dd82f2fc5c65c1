"""No production module over 600 lines: a module that big mixes concerns.

Production modules are the ``.py`` files of ``ipc``, ``brisvox`` and
``workers`` (not tests, not bench). The test prints the ten largest, so the
next candidates for a split are visible in every run (``pytest -s``).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ipc", "brisvox", "workers")
MAX_LINES = 600

# Modules allowed over MAX_LINES for now, each with the reason. An entry must
# still be over the limit: once its module is split (or shrinks to the limit)
# the test fails until the entry is removed, so the list cannot go stale.
ALLOWED_OVER: set[str] = set()


def module_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            with path.open("rb") as f:
                sizes[path.relative_to(ROOT).as_posix()] = sum(1 for _ in f)
    return sizes


def test_no_production_module_over_the_limit() -> None:
    sizes = module_sizes()
    assert len(sizes) > 50, f"found only {len(sizes)} modules under {ROOT}: wrong root?"
    largest = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    print(f"\nthe ten largest production modules (limit {MAX_LINES} lines):")
    for name, n in largest:
        mark = " (allowed for now)" if name in ALLOWED_OVER else " OVER" if n > MAX_LINES else ""
        print(f"  {n:5d}  {name}{mark}")
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in ALLOWED_OVER}
    assert not over, (f"modules over {MAX_LINES} lines: {over}; split them by concern "
                      "(see brisvox/agent/tool_engine/ for an example)")


def test_the_allow_list_is_not_stale() -> None:
    sizes = module_sizes()
    stale = {name: sizes.get(name) for name in ALLOWED_OVER if sizes.get(name, 0) <= MAX_LINES}
    assert not stale, (f"allowed modules no longer over {MAX_LINES} lines (or gone): {stale}; "
                       "remove them from ALLOWED_OVER")
