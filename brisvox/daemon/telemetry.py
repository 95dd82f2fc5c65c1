"""The agents' call telemetry on ``/metrics``: summed across processes, rendered by prometheus-client.

Owns the families built from the ``telemetry`` entry every agent process
reports with its pongs (``brisvox/agent/host/call_metrics.py``): :func:`aggregate`
sums them over the children (histograms bucket by bucket, counters by label
set), :class:`TelemetryCollector` turns the sum into typed families, and
:func:`render` is their text exposition (``prometheus_client.generate_latest``
over a CollectorRegistry holding only that collector):

* histograms (seconds): ``brisvox_turn_latency_seconds``,
  ``brisvox_llm_first_token_seconds``, ``brisvox_llm_round_seconds``,
  ``brisvox_tts_first_audio_seconds``, ``brisvox_barge_in_stop_seconds`` (each turn
  observed when it ends, not at the hang-up);
* counters: ``brisvox_calls_ended_total{reason}``, ``brisvox_llm_rounds_dropped_total``
  (LLM rounds a turn did not time: past its 32nd),
  ``brisvox_provider_errors_total{stage,provider,kind}`` (kind ``failures``,
  ``request_errors``), ``brisvox_provider_retries_total{stage,provider}``.

Invariants: every family is present (an empty histogram has zero buckets), so
a dashboard has a series before the first call; a malformed entry (a child's
bad report) is dropped, never raised; the sums are over the processes alive now
(a restarted process starts again from 0: a counter reset, which ``rate()``
handles); pure: snapshot in, text out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from brisvox.runtime.histogram import LATENCY_BUCKETS, merge_all

HISTOGRAMS: dict[str, tuple[str, str]] = {  # wire name -> (metric, help)
    "turn_latency": ("brisvox_turn_latency_seconds",
                     "Per turn: end of the caller's speech to the first bot audio written."),
    "llm_first_token": ("brisvox_llm_first_token_seconds", "Per LLM round: its request to its first token."),
    "llm_round": ("brisvox_llm_round_seconds", "Per LLM round: its request to the end of its stream."),
    "tts_first_audio": ("brisvox_tts_first_audio_seconds",
                        "Per turn: the first LLM token to the first bot audio (TTS time to first audio)."),
    "barge_in_stop": ("brisvox_barge_in_stop_seconds",
                      "Per barge-in: the interruption to the gateway applying the Clear (bot audio stopped)."),
}
ERROR_KINDS = ("failures", "request_errors")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def aggregate(entries: Iterable[Any]) -> dict[str, Any]:
    """The sum of the children's ``telemetry`` entries (bad ones skipped)."""
    hists: dict[str, list[dict[str, Any]]] = {k: [] for k in HISTOGRAMS}
    reasons: Counter[str] = Counter()
    providers: Counter[tuple[str, str, str]] = Counter()
    dropped = 0
    for e in entries:
        if not isinstance(e, dict):
            continue
        if _num(e.get("llm_rounds_dropped")):
            dropped += int(e["llm_rounds_dropped"])
        for name, w in (e.get("hist") or {}).items() if isinstance(e.get("hist"), dict) else ():
            if name in hists:
                hists[name].append(w)
        er = e.get("end_reasons")
        for r, n in (er.items() if isinstance(er, dict) else ()):
            if _num(n):
                reasons[str(r)[:64]] += int(n)
        for row in e.get("providers") or () if isinstance(e.get("providers"), list) else ():
            if isinstance(row, list) and len(row) == 4 and _num(row[3]):
                providers[(str(row[0])[:32], str(row[1])[:64], str(row[2])[:32])] += int(row[3])
    return {"hist": {k: merge_all(v) for k, v in hists.items()}, "end_reasons": dict(reasons),
            "providers": dict(providers), "llm_rounds_dropped": dropped}


def _le(b: float) -> str:
    return repr(float(b))


class TelemetryCollector:
    """A prometheus-client custom collector over one aggregate."""

    def __init__(self, agg: dict[str, Any]) -> None:
        self.agg = agg

    def collect(self) -> Iterator[Metric]:
        for key, (name, help_) in HISTOGRAMS.items():
            w = self.agg["hist"].get(key)
            if w is None:
                bounds, counts, total = list(LATENCY_BUCKETS), [0] * (len(LATENCY_BUCKETS) + 1), 0.0
            else:
                bounds, counts, total = w["le"], w["counts"], w["sum"]
            buckets = [(_le(b), c) for b, c in zip(bounds, counts, strict=False)] + [("+Inf", counts[-1])]
            yield HistogramMetricFamily(name, help_, buckets=buckets, sum_value=total)
        calls = CounterMetricFamily("brisvox_calls_ended", "Calls the agents ended, by end reason.",
                                    labels=["reason"])
        for r, n in sorted(self.agg["end_reasons"].items()):
            calls.add_metric([r], n)
        yield calls
        yield CounterMetricFamily("brisvox_llm_rounds_dropped", "LLM rounds not timed (a turn times its first 32).",
                                  value=self.agg.get("llm_rounds_dropped", 0))
        errors = CounterMetricFamily("brisvox_provider_errors", "Provider attempts that failed, per stage and provider.",
                                     labels=["stage", "provider", "kind"])
        retries = CounterMetricFamily("brisvox_provider_retries", "Provider attempts that were retries (took a token).",
                                      labels=["stage", "provider"])
        for (stage, prov, kind), n in sorted(self.agg["providers"].items()):
            if kind == "retries":
                retries.add_metric([stage, prov], n)
            elif kind in ERROR_KINDS:
                errors.add_metric([stage, prov, kind], n)
        yield errors
        yield retries


def render(children: list[dict[str, Any]]) -> str:
    """The telemetry families of the children's reports, as exposition text."""
    agg = aggregate((c.get("stats") or {}).get("telemetry") for c in children if c.get("role") == "agent")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TelemetryCollector(agg))
    return generate_latest(reg).decode("utf-8")
