"""Every role's event-loop lateness on ``/metrics``, rendered by prometheus-client.

Owns the families built from the ``loop`` entry of each process's report
(:meth:`brisvox.runtime.loop_probe.LoopProbe.snapshot`: the children's with their
pongs, the supervisor's own in its snapshot's ``daemon``), labelled by the process's
``role`` and ``index`` (the supervisor: ``role="supervisor", index="0"``):

* ``brisvox_loop_lag_seconds`` (histogram): every measured wake-up's lateness;
* ``brisvox_loop_stalls_total{cause}`` (counter): wake-ups late by more than 50 ms, by
  cause: ``loop`` (the process's own code held its loop) or ``host`` (its thread was
  waiting for a CPU for all of it but 50 ms: an oversubscribed host);
* ``brisvox_loop_long_stalls_total`` (counter): ... by more than 250 ms (each logged,
  rate-limited, with the stack of what the loop ran);
* ``brisvox_loop_lag_max_seconds`` (gauge): the largest lateness since the process started.

Invariants: a process without a well-formed ``loop`` entry has no series (a child
still booting, a test role main); a malformed entry is dropped, never raised; pure:
snapshot in, text out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from brisvox.runtime.histogram import valid_wire

LABELS = ["role", "index"]


def _count(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0


def rows(snap: dict[str, Any]) -> list[tuple[list[str], dict[str, Any]]]:
    """``([role, index], loop entry)`` for every process that reports a well-formed one."""
    out: list[tuple[list[str], dict[str, Any]]] = []
    procs = [("supervisor", 0, snap["daemon"].get("loop"))]
    procs += [(c["role"], c["index"], (c.get("stats") or {}).get("loop")) for c in snap["children"]]
    for role, index, e in procs:
        if (isinstance(e, dict) and valid_wire(e.get("lag")) and _count(e.get("stalls"))
                and _count(e.get("host_stalls")) and e["host_stalls"] <= e["stalls"]
                and _count(e.get("long_stalls")) and _count(e.get("max_lag_s"))):
            out.append(([str(role), str(index)], e))
    return out


class LoopCollector:
    def __init__(self, procs: list[tuple[list[str], dict[str, Any]]]) -> None:
        self.procs = procs

    def collect(self) -> Iterator[Metric]:
        lag = HistogramMetricFamily("brisvox_loop_lag_seconds", "Lateness of each measured event-loop wake-up.",
                                    labels=LABELS)
        stalls = CounterMetricFamily("brisvox_loop_stalls", "Event-loop wake-ups late by more than 50 ms, by cause "
                                     "(loop: its own code held it; host: its thread waited for a CPU).",
                                     labels=[*LABELS, "cause"])
        longs = CounterMetricFamily("brisvox_loop_long_stalls", "Event-loop wake-ups late by more than 250 ms "
                                    "(logged with the stack of what ran).", labels=LABELS)
        peak = GaugeMetricFamily("brisvox_loop_lag_max_seconds", "Largest event-loop lateness since the process "
                                 "started.", labels=LABELS)
        for labels, e in self.procs:
            w = e["lag"]
            buckets = [(repr(float(b)), c) for b, c in zip(w["le"], w["counts"], strict=False)]
            lag.add_metric(labels, [*buckets, ("+Inf", w["counts"][-1])], sum_value=w["sum"])
            stalls.add_metric([*labels, "loop"], e["stalls"] - e["host_stalls"])
            stalls.add_metric([*labels, "host"], e["host_stalls"])
            longs.add_metric(labels, e["long_stalls"])
            peak.add_metric(labels, e["max_lag_s"])
        yield from (lag, stalls, longs, peak)


def render(snap: dict[str, Any]) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LoopCollector(rows(snap)))
    return generate_latest(reg).decode("utf-8")
