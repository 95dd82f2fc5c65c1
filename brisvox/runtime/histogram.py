"""Fixed-bucket histograms a process aggregates and the supervisor merges.

Owns :class:`Histogram` (observe, wire form, merge) and :data:`LATENCY_BUCKETS`
(seconds), shared by the agent processes (which observe) and the supervisor
(which sums what every process reports and exposes it on ``/metrics``).

The wire form travels in a Pong's stats: ``{"le": [upper bounds], "counts":
[cumulative counts, one per bound, then +Inf], "sum": s, "count": n}``.

Invariants: the bounds are finite, strictly increasing, and the same for
every process of a histogram (the merge refuses a mismatch: it returns the
left side unchanged); ``counts`` is cumulative and non-decreasing, its last
entry (+Inf) equals ``count``; an observation is O(log buckets) and
allocation-free; merging is associative and commutative (sums of integers and
of floats), so the supervisor's total does not depend on the order it hears
the children in.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

# end of speech -> first bot audio, time to first token, ... : 25 ms to 10 s
LATENCY_BUCKETS: tuple[float, ...] = (
    0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)


class Histogram:
    __slots__ = ("bounds", "buckets", "sum", "count")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        b = tuple(float(x) for x in bounds)
        if not b or any(not math.isfinite(x) for x in b) or any(x >= y for x, y in zip(b, b[1:], strict=False)):
            raise ValueError("histogram bounds must be finite and strictly increasing")
        self.bounds = b
        self.buckets = [0] * (len(b) + 1)  # per bucket (NOT cumulative); the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        if not math.isfinite(v):
            return
        self.buckets[bisect_left(self.bounds, v)] += 1  # le: v <= bound lands in that bound
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[int]:
        out, n = [], 0
        for c in self.buckets:
            n += c
            out.append(n)
        return out

    def wire(self) -> dict[str, Any]:
        return {"le": list(self.bounds), "counts": self.cumulative(), "sum": self.sum, "count": self.count}


def valid_wire(w: Any) -> bool:
    """A well-formed wire histogram (the supervisor drops anything else)."""
    if not isinstance(w, dict):
        return False
    le, counts = w.get("le"), w.get("counts")
    if not isinstance(le, list) or not isinstance(counts, list) or len(counts) != len(le) + 1:
        return False
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (*le, *counts)):
        return False
    if any(a > b for a, b in zip(counts, counts[1:], strict=False)):
        return False
    return isinstance(w.get("sum"), (int, float)) and w.get("count") == counts[-1]


def merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """The sum of two wire histograms with the same bounds (``a`` None: a copy of ``b``)."""
    if a is None:
        return {"le": list(b["le"]), "counts": list(b["counts"]), "sum": float(b["sum"]), "count": int(b["count"])}
    if list(a["le"]) != list(b["le"]):
        return a
    return {"le": a["le"], "counts": [x + y for x, y in zip(a["counts"], b["counts"], strict=True)],
            "sum": a["sum"] + float(b["sum"]), "count": a["count"] + int(b["count"])}


def merge_all(ws: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    out: dict[str, Any] | None = None
    for w in ws:
        if valid_wire(w):
            out = merge(out, w)
    return out
