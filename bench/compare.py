"""Side by side: brisvox vs Pipecat on the same calls, in one invocation (docs/BENCHMARKS.md).

``python -m bench.compare [--quick] [--only pipecat|brisvox] [--calls 1,10]``: measures Pipecat
(``bench_pipecat``) and brisvox (``bench_load``) with the same workload and
load generator, then prints both sides and the ratios brisvox / Pipecat for
CPU per call, memory per call, p95 turn latency and the largest N held, and
writes them to ``bench/out/compare.md`` (copy into docs/BENCHMARKS.md with
the command). ``--calls`` measures both sides at those levels only (e.g. ``1``:
the single-call latency; ``BRISVOX_BENCH_SPECULATION`` / ``BRISVOX_BENCH_INTERIM_LAG``
set brisvox's speculative start, bench/bench_load.py). ``run(quick)`` gives the same
as bench rows.

Which level each ratio compares: CPU and memory per call at each side's
largest held N (the per-call figures of a server are most favourable near its
capacity), and also at each side's largest N measured before it broke down
(the sweep's own rule), which does not hinge on one stray late frame;
p95 turn latency at N=1 (engine overhead on an idle machine) and at each
side's largest N held. A ratio below 1 means brisvox uses less / is faster,
except "largest N held", where above 1 means brisvox holds more.

Invariants: one side failing does not hide the other's figures; a ratio
with a missing side is reported as missing, never invented.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import bench_load, bench_pipecat, workload
from bench.loadgen import harness

OUT = Path(__file__).resolve().parent / "out"


def _level(levels: list[harness.Level], n: int | None) -> harness.Level | None:
    return next((lv for lv in levels if lv.n == n), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def _before_breakdown(levels: list[harness.Level]) -> harness.Level | None:
    """The largest level measured before the server broke down by the harness's own
    sweep rule (p95 more than 1 s above the N = 1 p95, or a tenth of the turns
    unanswered): per-call CPU and memory there do not hinge on one stray late frame."""
    if not levels:
        return None
    base = levels[0].p95
    ok = [lv for lv in levels
          if base is not None and lv.p95 is not None and lv.p95 <= base + 1000
          and lv.summary["unanswered"] <= lv.summary["turns"] / 10]
    return ok[-1] if ok else levels[0]


def ratios(bv: tuple[list[harness.Level], int] | None,
           pc: tuple[list[harness.Level], int] | None) -> list[tuple[str, Any, str, str]]:
    """The comparison rows (figure, value, unit, target)."""
    out: list[tuple[str, Any, str, str]] = []
    if bv is None or pc is None:
        return [("ratios brisvox / Pipecat", "missing", "", "a side failed to run")]
    (bl, bn), (pl, pn) = bv, pc
    b_at = _level(bl, bn) or (bl[-1] if bl else None)
    p_at = _level(pl, pn) or (pl[-1] if pl else None)
    if b_at and p_at:
        out.append(("CPU per call, brisvox / Pipecat", _ratio(b_at.cpu_per_call, p_at.cpu_per_call),
                    f"x (N={b_at.n} vs N={p_at.n})", "<= 0.2"))
        out.append(("memory per call, brisvox / Pipecat", _ratio(b_at.mem_per_call_mb, p_at.mem_per_call_mb),
                    f"x (N={b_at.n} vs N={p_at.n})", "<= 0.2"))
    b_ok, p_ok = _before_breakdown(bl), _before_breakdown(pl)
    if b_ok and p_ok and (b_ok is not b_at or p_ok is not p_at):
        out.append(("CPU per call before breakdown, brisvox / Pipecat", _ratio(b_ok.cpu_per_call, p_ok.cpu_per_call),
                    f"x (N={b_ok.n} vs N={p_ok.n})", "<= 0.2"))
        out.append(("memory per call before breakdown, brisvox / Pipecat",
                    _ratio(b_ok.mem_per_call_mb, p_ok.mem_per_call_mb), f"x (N={b_ok.n} vs N={p_ok.n})", "<= 0.2"))
    b1, p1 = _level(bl, 1), _level(pl, 1)
    if b1 and p1:
        out.append(("p95 turn latency at N=1, brisvox / Pipecat", _ratio(b1.p95, p1.p95), "x", "<= 1"))
    if b_at and p_at:
        out.append(("p95 turn latency at largest N held, brisvox / Pipecat", _ratio(b_at.p95, p_at.p95),
                    f"x (N={b_at.n} vs N={p_at.n})", "<= 1"))
    out.append(("largest N held, brisvox / Pipecat", _ratio(float(bn), float(pn)) if pn else None,
                f"x ({bn} vs {pn})", ">= 5"))
    return out


def _side(name: str, fn, quick: bool) -> tuple[tuple[list[harness.Level], int] | None, list, str]:
    print(f"== {name}", flush=True)
    try:
        levels, largest, describe = fn(quick)
    except Exception as e:  # one side failing must not hide the other
        print(f"   {name} FAILED: {type(e).__name__}: {e}", flush=True)
        return None, [(f"{name}", "FAILED", "", str(e).splitlines()[0][:120])], str(e)
    wl = workload.load()
    targets = bench_load.TARGETS if name == "brisvox" else None
    rows = [(f"{name}: how it was run", describe, "", "")] + harness.rows(name, levels, largest, wl, targets)
    if name == "brisvox":
        rows += bench_load.server_rows(levels)  # the daemon's own view: stalls vs client stamping
        rows += bench_load.breakdown_rows(levels)  # where each turn's milliseconds went
        rows += bench_load.speculation_rows(levels)  # the speculative LLM start's counters
    return (levels, largest), rows, ""


def compare(quick: bool, only: str | None = None, calls: list[int] | None = None) -> list[tuple[str, Any, str, str]]:
    pc = bv = None
    rows: list[tuple[str, Any, str, str]] = []
    if only in (None, "pipecat"):
        pc, r, _ = _side("pipecat", lambda q: bench_pipecat.measure(q, ns=calls), quick)
        rows += r
    if only in (None, "brisvox"):
        bv, r, _ = _side("brisvox", lambda q: bench_load.measure(q, ns=calls), quick)
        rows += r
    if only is None:
        rows += ratios(bv, pc)
    return rows


def _fmt(rows: list[tuple[str, Any, str, str]]) -> list[str]:
    lines = ["| figure | value | unit | target |", "|---|---|---|---|"]
    for fig, val, unit, target in rows:
        v = f"{val:.3f}" if isinstance(val, float) else str(val)
        lines.append(f"| {fig} | {v} | {unit} | {target} |")
    return lines


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    return compare(quick)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("pipecat", "brisvox"))
    ap.add_argument("--calls", help="comma-separated levels for both sides (e.g. 1), instead of the workload's")
    args = ap.parse_args(argv)
    calls = None
    if args.calls:
        try:
            calls = [int(x) for x in args.calls.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--calls {args.calls!r}: expected comma-separated call counts")
        if not calls or min(calls) < 1:
            ap.error("--calls: call counts must be >= 1")
    t0 = time.monotonic()
    rows = compare(args.quick, args.only, calls)
    for fig, val, unit, target in rows:
        v = f"{val:.3f}" if isinstance(val, float) else str(val)
        print(f"   {fig:<62} {v:>12} {unit:<22} {target}")
    OUT.mkdir(exist_ok=True)
    cmd = "python -m bench.compare" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    cmd += f" --calls {args.calls}" if args.calls else ""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("BRISVOX_BENCH_SPECULATION", "BRISVOX_BENCH_INTERIM_LAG")
                   if os.environ.get(k))
    cmd = f"{env} {cmd}" if env else cmd
    text = [f"# brisvox vs Pipecat ({time.strftime('%Y-%m-%d %H:%M')}, `{cmd}`, "
            f"{time.monotonic() - t0:.0f} s)", ""] + _fmt(rows)
    (OUT / "compare.md").write_text("\n".join(text) + "\n")
    print(f"written to {OUT / 'compare.md'}")
    return 0 if not any(r[1] == "FAILED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
