"""The agent process's call telemetry: latency histograms and end reasons, per process.

Owns :data:`METRICS` (one :class:`CallMetrics` per process) and :class:`TurnMeter`
(one per call: it feeds METRICS each turn of the call once, when the turn ends, so
a long call is on ``/metrics`` while it lasts), and the ``telemetry`` entry of the
process's stats (:meth:`CallMetrics.snapshot`), which travels with every Pong to the
supervisor; the supervisor sums the entries of every agent process
(``brisvox/daemon/telemetry.py``) and exposes them on ``/metrics``.

A turn ends (:meth:`TurnMeter.poll`, which the process calls for every live call at
its report, every 0.5 s, and the hang-up calls with ``final``) when a later turn of
the call has begun, when it was interrupted, or when its answer is complete (the
timeline's ``answered`` mark: no round follows) and the call is idle again (the answer
played); at the hang-up every turn not yet counted is. Idle alone is not enough: a
tool phase between two rounds can leave the call idle with the answer half done. A
turn without a turn end mark (speech the turn driver never released) has no figures.

Histograms (seconds, :data:`~brisvox.runtime.histogram.LATENCY_BUCKETS`), from the
turn's timeline marks (``brisvox/agent/conversation/timeline.py``):

* ``turn_latency``: end of the caller's speech -> first bot audio written
  (``voice_to_voice_ms``: the latency a caller hears, minus the playout path);
* ``llm_first_token``: per timed LLM round, its request -> its first token;
* ``llm_round``: per timed LLM round, its request -> its end (``llm_done``);
* ``tts_first_audio``: the turn's first token (of any round) -> the first audio out
  (the TTS request's time to first audio, plus the segmenter's wait for the first phrase);
* ``barge_in_stop``: the barge-in decision -> the gateway applied the Clear (the
  bot's audio stopped), matched to the first Clear applied after it (a barge-in whose
  Clear has not come yet waits for the next poll; at the hang-up it is dropped).

``llm_rounds_dropped``: LLM rounds not timed (a turn times at most
:data:`~brisvox.agent.conversation.timeline.MAX_ROUNDS`).
``end_reasons``: calls by end reason (a ``stage_failed:<stage>`` keeps its stage;
at most :data:`MAX_REASONS` distinct reasons, the rest count as ``other``).
``providers``: ``[stage, provider, kind, n]`` rows from the resilience layer's
per-provider counters (failures, retries, request errors).

Invariants: a turn is counted once (its epoch is remembered until the timeline
drops it); counts only grow while the process lives (the supervisor sees a
restart as a counter reset, as Prometheus does); nothing here holds a transcript,
a tool argument or a caller's number: only durations, reasons and provider names;
the snapshot is a few hundred bytes whatever the number of calls; a poll looks at
the turns not yet counted only (O(1) per call once they are).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from brisvox.agent.conversation.timeline import Timeline, TurnMarks
from brisvox.providers.resilience import PROVIDER_STATS
from brisvox.runtime.histogram import Histogram

HISTOGRAMS = ("turn_latency", "llm_first_token", "llm_round", "tts_first_audio", "barge_in_stop")
MAX_REASONS = 64
MAX_PENDING = 64


def _reason(r: str) -> str:
    r = (r or "unknown").strip()[:64]
    return "".join(c if c.isalnum() or c in "_:-." else "_" for c in r) or "unknown"


class CallMetrics:
    def __init__(self) -> None:
        self.hist = {name: Histogram() for name in HISTOGRAMS}
        self.end_reasons: Counter[str] = Counter()
        self.rounds_dropped = 0

    def observe_end(self, reason: str) -> None:
        """One ended call's end reason."""
        r = _reason(reason)
        if r not in self.end_reasons and len(self.end_reasons) >= MAX_REASONS:
            r = "other"
        self.end_reasons[r] += 1

    def observe_turn(self, t: TurnMarks) -> None:
        """One ended turn's figures (each only when both its marks are there)."""
        h = self.hist
        if t.speech_end is not None and t.first_audio_out is not None:
            h["turn_latency"].observe(t.first_audio_out - t.speech_end)
        for r in t.ordered():
            if r.request is None:
                continue
            if r.first_token is not None:
                h["llm_first_token"].observe(r.first_token - r.request)
            if r.done is not None:
                h["llm_round"].observe(r.done - r.request)
        tok = t.first_token()
        if tok is not None and t.first_audio_out is not None and t.first_audio_out >= tok:
            h["tts_first_audio"].observe(t.first_audio_out - tok)
        self.rounds_dropped += t.rounds_dropped

    def observe_barge_in(self, seconds: float) -> None:
        self.hist["barge_in_stop"].observe(seconds)

    def snapshot(self) -> dict[str, Any]:
        return {
            "hist": {name: h.wire() for name, h in self.hist.items()},
            "end_reasons": dict(self.end_reasons),
            "llm_rounds_dropped": self.rounds_dropped,
            "providers": [[st, prov or "unknown", kind, n] for (st, prov, kind), n in sorted(PROVIDER_STATS.items())],
        }


METRICS = CallMetrics()


class TurnMeter:
    """One call's turns into a :class:`CallMetrics`, each once, when it ends (module docstring).

    :meth:`clear_applied` takes the call-clock instants the gateway applied a Clear (in
    order); each barge-in is matched to the first of them not before it, as they come
    (at most :data:`MAX_PENDING` of either wait)."""

    def __init__(self, timeline: Timeline, metrics: CallMetrics = METRICS) -> None:
        self.timeline = timeline
        self.metrics = metrics
        self.counted: set[int] = set()  # epochs observed (pruned below the timeline's oldest)
        self._barge: list[float] = []  # interruption marks waiting for their Clear
        self._clears: deque[float] = deque(maxlen=MAX_PENDING)  # Clears applied, not matched yet
        self.turns = 0

    def clear_applied(self, at: float) -> None:
        self._clears.append(at)

    def poll(self, idle: bool, final: bool = False) -> int:
        """Count the turns that ended (all the rest too when ``final``); the number counted."""
        turns = self.timeline.turns
        newest = next(reversed(turns), None)
        n = 0
        later = False  # a turn after this one began (walking from the newest back)
        for epoch in reversed(turns):
            if epoch in self.counted:
                break  # every older turn is counted already
            t = turns[epoch]
            if final or later or t.interrupted_at is not None or (idle and epoch == newest and t.answered is not None):
                if t.turn_end is not None:
                    self._count(t)
                    n += 1
                elif final or later:
                    self.counted.add(epoch)  # never released: nothing to count, never looked at again
            if t.speech_start is not None or t.turn_end is not None:
                later = True
        if len(self.counted) > 2 * self.timeline.max_turns:
            oldest = next(iter(turns), 0)
            self.counted = {e for e in self.counted if e >= oldest}
        self._match_clears(final)
        return n

    def _count(self, t: TurnMarks) -> None:
        self.counted.add(t.epoch)
        self.turns += 1
        self.metrics.observe_turn(t)
        if t.interrupted_at is not None:
            self._barge.append(t.interrupted_at)
            self._barge.sort()

    def _match_clears(self, final: bool) -> None:
        clears, waiting = self._clears, []
        for at in self._barge:
            while clears and clears[0] < at:
                clears.popleft()  # a Clear before this barge-in: not its stop
            if not clears:
                waiting.append(at)
                continue
            self.metrics.observe_barge_in(clears.popleft() - at)
        self._barge = [] if final else waiting[-MAX_PENDING:]
