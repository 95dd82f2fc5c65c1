"""``make bench``: run every benchmark module and print its figures.

Each ``bench/bench_*.py`` exposes ``run(quick: bool) -> list[Row]`` where a
row is ``(figure, value, unit, target)``; this runner prints them side by side
and writes ``bench/out/latest.md`` (copy the numbers into docs/BENCHMARKS.md
with the command that produced them). ``python -m bench NAME ...`` runs a
subset; ``--quick`` shortens every benchmark (used by a smoke test).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import platform
import sys
import time
from pathlib import Path

import bench


def discover() -> list[str]:
    return sorted(m.name[len("bench_") :] for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default all: {', '.join(discover())})")
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    args = ap.parse_args(argv)
    names = args.names or discover()
    lines = [f"# brisvox benchmarks ({time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
             f"{platform.python_version()}, quick={args.quick})", ""]
    failed = 0
    for name in names:
        mod = importlib.import_module(f"bench.bench_{name}")
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            rows = mod.run(quick=args.quick)
        except Exception as e:  # one broken benchmark must not hide the others
            failed += 1
            print(f"   FAILED: {type(e).__name__}: {e}", flush=True)
            lines += [f"## {name}", "", f"FAILED: {e}", ""]
            continue
        lines += [f"## {name}", "", "| figure | value | unit | target |", "|---|---|---|---|"]
        for fig, val, unit, target in rows:
            v = f"{val:.3f}" if isinstance(val, float) else str(val)
            print(f"   {fig:<58} {v:>12} {unit:<10} {target}", flush=True)
            lines.append(f"| {fig} | {v} | {unit} | {target} |")
        lines += ["", f"({time.perf_counter() - t0:.1f} s)", ""]
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "latest.md").write_text("\n".join(lines))
    print(f"written to {out / 'latest.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
