"""The agent process's call telemetry: latency histograms and end reasons, per process.

Owns :data:`METRICS` (one :class:`CallMetrics` per process), fed once per call at
hang-up from the call record (:meth:`CallMetrics.observe_record`), and the
``telemetry`` entry of the process's stats (:meth:`CallMetrics.snapshot`), which
travels with every Pong to the supervisor; the supervisor sums the entries of
every agent process (``brisvox/daemon/telemetry.py``) and exposes them on ``/metrics``.

Histograms (seconds, :data:`~brisvox.runtime.histogram.LATENCY_BUCKETS`), one
observation per turn that has both marks (from ``Timeline.turn_latencies``):

* ``turn_latency``: end of the caller's speech -> first bot audio written
  (``voice_to_voice_ms``: the latency a caller hears, minus the playout path);
* ``llm_first_token``: the turn's first LLM request -> its first token;
* ``tts_first_audio``: the first token -> the first audio out (the TTS request's
  time to first audio, plus the segmenter's wait for the first phrase);
* ``barge_in_stop``: the barge-in decision -> the gateway applied the Clear (the
  bot's audio stopped), matched to the first Clear applied after it.

``end_reasons``: calls by end reason (a ``stage_failed:<stage>`` keeps its stage;
at most :data:`MAX_REASONS` distinct reasons, the rest count as ``other``).
``providers``: ``[stage, provider, kind, n]`` rows from the resilience layer's
per-provider counters (failures, retries, request errors).

Invariants: counts only grow while the process lives (the supervisor sees a
restart as a counter reset, as Prometheus does); nothing here holds a transcript,
a tool argument or a caller's number: only durations, reasons and provider names;
the snapshot is a few hundred bytes whatever the number of calls.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from brisvox.providers.resilience import PROVIDER_STATS
from brisvox.runtime.histogram import Histogram

HISTOGRAMS = ("turn_latency", "llm_first_token", "tts_first_audio", "barge_in_stop")
MAX_REASONS = 64


def _reason(r: str) -> str:
    r = (r or "unknown").strip()[:64]
    return "".join(c if c.isalnum() or c in "_:-." else "_" for c in r) or "unknown"


class CallMetrics:
    def __init__(self) -> None:
        self.hist = {name: Histogram() for name in HISTOGRAMS}
        self.end_reasons: Counter[str] = Counter()

    def observe_record(self, record: dict[str, Any], clears_ns: list[int] | None = None) -> None:
        """One ended call: its turns' latencies and its end reason."""
        reason = _reason(str(record.get("end_reason", "")))
        if reason not in self.end_reasons and len(self.end_reasons) >= MAX_REASONS:
            reason = "other"
        self.end_reasons[reason] += 1
        h = self.hist
        for t in record.get("turns") or ():
            v2v = t.get("voice_to_voice_ms")
            if isinstance(v2v, (int, float)):
                h["turn_latency"].observe(v2v / 1000.0)
            ftok = t.get("first_token_ms")
            if isinstance(ftok, (int, float)):
                h["llm_first_token"].observe(ftok / 1000.0)
            tok, aud = t.get("t_first_token"), t.get("t_first_audio")
            if isinstance(tok, (int, float)) and isinstance(aud, (int, float)) and aud >= tok:
                h["tts_first_audio"].observe(aud - tok)
        self._barge_ins(record, clears_ns or [])

    def _barge_ins(self, record: dict[str, Any], clears_ns: list[int]) -> None:
        """Barge-in -> Clear applied: the interrupt marks are on the call clock, the
        Clear stamps on ``time.monotonic_ns()``; ``clock_offset_s`` joins them."""
        if not clears_ns:
            return
        off = float(record.get("clock_offset_s") or 0.0)
        clears = sorted(ns / 1e9 for ns in clears_ns)
        j = 0
        marks = sorted(float(t["t_interrupted"]) + off for t in record.get("turns") or ()
                       if isinstance(t.get("t_interrupted"), (int, float)))
        for at in marks:
            while j < len(clears) and clears[j] < at:
                j += 1
            if j == len(clears):
                break
            self.hist["barge_in_stop"].observe(clears[j] - at)
            j += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "hist": {name: h.wire() for name, h in self.hist.items()},
            "end_reasons": dict(self.end_reasons),
            "providers": [[st, prov or "unknown", kind, n] for (st, prov, kind), n in sorted(PROVIDER_STATS.items())],
        }


METRICS = CallMetrics()
