"""Latency bookkeeping of the load generator (pure): playout model, turns, summaries.

Owns what the client measures and how:

* **Playout** of one bot answer, as a zero-buffer phone would play it: the
  clock starts at the answer's first speech frame; each frame is due when the
  previous one finished playing; a frame that arrives after its due time is
  late by the difference and the clock restarts from its arrival (an
  underrun). Frames that arrive early wait in the buffer (sent ahead is fine).
* **Turn**: caller stopped speaking (send time of its last speech frame) ->
  first bot speech frame received = turn latency. On a barge-in turn, the
  caller restarted speaking at ``t_barge`` (send time of the first frame of its
  next line): -> Twilio ``clear`` received = clear latency; -> last bot frame
  received = last-audio latency; and how long the caller still *heard* the bot
  (until the clear discarded the buffer, or the buffered audio ran out) =
  "bot audio stopped after barge-in" (a server that holds its audio at the
  barge-in's start, before it confirms it with a clear, stops it here too).
* **Summary** over all calls of one run: p50/p95/p99 of each latency, late and
  missing frames, unanswered turns, missing clears, the loadgen's own timer
  health, and the windows the CPU/PSS sampler needs.

Invariants: lateness is never negative; the first frame of an answer is never
late; a turn has a latency only if it was answered; percentiles of an empty
list are None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (0 <= q <= 100), None for no values."""
    if not values:
        return None
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def dist_ms(values_s: list[float]) -> dict[str, float | int | None]:
    """p50/p95/p99/max/n of durations given in seconds, in milliseconds."""
    ms = [v * 1000.0 for v in values_s]

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    return {"n": len(ms), "p50": r(percentile(ms, 50)), "p95": r(percentile(ms, 95)),
            "p99": r(percentile(ms, 99)), "max": r(max(ms) if ms else None)}


@dataclass
class Playout:
    """Zero-buffer playout of one answer (times in seconds)."""

    t_first: float | None = None
    next_due: float = 0.0
    frames: int = 0
    speech_s: float = 0.0
    late_s: list[float] = field(default_factory=list)

    def add(self, t: float, dur_s: float, speech: bool) -> float:
        """Account a frame arriving at ``t``; returns its lateness (s)."""
        if self.t_first is None:
            if not speech:
                return 0.0  # silence before the answer starts is not part of it
            self.t_first = t
            self.next_due = t
        late = max(0.0, t - self.next_due)
        self.next_due = max(self.next_due, t) + dur_s
        self.frames += 1
        if speech:
            self.speech_s += dur_s
        self.late_s.append(late)
        return late

    @property
    def play_end(self) -> float | None:
        """When the audio received so far finishes playing (None before the first frame)."""
        return None if self.t_first is None else self.next_due


@dataclass
class Turn:
    """One caller turn and the bot's answer to it (times: time.monotonic seconds)."""

    index: int
    barge_in_ms: int | None
    t_speech_start: float | None = None
    t_speech_end: float | None = None
    playout: Playout = field(default_factory=Playout)
    t_last_frame: float | None = None
    t_barge: float | None = None
    t_clear: float | None = None
    t_last_after_barge: float | None = None
    heard_after_barge_s: float | None = None
    frames_after_clear: int = 0
    unanswered: bool = False

    @property
    def latency_s(self) -> float | None:
        if self.playout.t_first is None or self.t_speech_end is None:
            return None
        return self.playout.t_first - self.t_speech_end

    def on_frame(self, t: float, dur_s: float, speech: bool) -> None:
        if self.t_clear is not None:
            self.frames_after_clear += 1
            return
        self.playout.add(t, dur_s, speech)
        self.t_last_frame = t
        if self.t_barge is not None:
            self.t_last_after_barge = t

    def on_barge(self, t: float) -> None:
        self.t_barge = t

    def on_clear(self, t: float) -> None:
        if self.t_clear is not None:
            return
        self.t_clear = t
        if self.t_barge is not None:
            end = self.playout.play_end
            heard_until = t if end is None else min(t, end)
            self.heard_after_barge_s = max(0.0, heard_until - self.t_barge)
        if self.playout.t_first is not None:
            self.playout.next_due = min(self.playout.next_due, t)  # the buffer is discarded

    def finish_barge(self) -> None:
        """A barge-in whose clear never came: the caller heard everything buffered."""
        if self.t_barge is not None and self.t_clear is None and self.heard_after_barge_s is None:
            end = self.playout.play_end
            self.heard_after_barge_s = max(0.0, (end or self.t_barge) - self.t_barge)


@dataclass
class CallResult:
    index: int
    turns: list[Turn]
    t_connect: float | None = None
    t_end: float | None = None
    error: str | None = None
    unattributed_frames: int = 0  # bot audio when no answer was due (while the caller spoke)
    marks_echoed: int = 0
    invalid_messages: int = 0


def client_timeline(stream_sid: str, call: CallResult) -> dict[str, Any]:
    """One call's per-turn client stamps (``time.monotonic`` seconds): the send time of the
    turn's last speech frame and the arrival of the answer's first speech frame."""
    return {"stream_sid": stream_sid, "index": call.index,
            "turns": [{"k": t.index, "t_speech_end": t.t_speech_end, "t_first_audio": t.playout.t_first}
                      for t in call.turns]}


def summarize(calls: list[CallResult], *, late_frame_ms: float, answer_ms: float,
              tick_late_s: list[float] | None = None, ticks_skipped: int = 0,
              send_dropped: int = 0) -> dict[str, Any]:
    """Aggregate one run (all calls of one N)."""
    latencies: list[float] = []
    by_turn: dict[int, list[float]] = {}  # turn index in its call -> latencies
    clear: list[float] = []
    last_audio: list[float] = []
    heard: list[float] = []
    late: list[float] = []
    turns = unanswered = barge_ins = clears_missing = short = 0
    missing_s = 0.0
    after_clear = 0
    for c in calls:
        for k, t in enumerate(c.turns):
            if t.t_speech_end is None:
                continue  # the call ended before this turn was spoken
            turns += 1
            if t.latency_s is None:
                unanswered += 1
            else:
                latencies.append(t.latency_s)
                by_turn.setdefault(k, []).append(t.latency_s)
            late.extend(t.playout.late_s)
            after_clear += t.frames_after_clear
            if t.t_barge is not None and t.playout.t_first is not None:
                barge_ins += 1
                if t.t_clear is None:
                    clears_missing += 1
                else:
                    clear.append(t.t_clear - t.t_barge)
                last = t.t_last_after_barge
                last_audio.append(0.0 if last is None else last - t.t_barge)
                if t.heard_after_barge_s is not None:
                    heard.append(t.heard_after_barge_s)
            elif t.playout.t_first is not None:
                gap = answer_ms / 1000.0 - t.playout.speech_s
                if gap > 0.020 + 1e-9:  # more than one frame of the answer never came
                    short += 1
                    missing_s += gap
    connects = [c.t_connect for c in calls if c.t_connect is not None]
    ends = [c.t_end for c in calls if c.t_end is not None]
    ok = [c for c in calls if c.error is None and c.t_connect is not None and c.t_end is not None]
    window: dict[str, float | None] = {
        "first_connect": min(connects) if connects else None,
        "last_end": max(ends) if ends else None,
        # all calls live at once: from the last connect to the first end
        "all_active_start": max(connects) if len(connects) == len(calls) and calls else None,
        "all_active_end": min(ends) if len(ends) == len(calls) and calls else None,
    }
    late_ms = [v * 1000.0 for v in late]
    tl = tick_late_s or []
    return {
        "calls": len(calls),
        "calls_ok": len(ok),
        "errors": sorted({c.error for c in calls if c.error})[:5],
        "call_seconds": round(sum((c.t_end - c.t_connect) for c in ok), 3),
        "turns": turns,
        "unanswered": unanswered,
        "turn_ms": dist_ms(latencies),
        # the same by the turn's place in its call (the first turns meet the ramp of call setups)
        "turn_ms_by_turn": {str(k): dist_ms(v) for k, v in sorted(by_turn.items())},
        "barge_ins": barge_ins,
        "clears_missing": clears_missing,
        "clear_ms": dist_ms(clear),
        "last_audio_ms": dist_ms(last_audio),
        "heard_after_barge_ms": dist_ms(heard),
        "frames": len(late),
        "late_frames": sum(1 for v in late_ms if v > late_frame_ms),
        "max_late_ms": round(max(late_ms), 1) if late_ms else 0.0,
        "p99_late_ms": round(percentile(late_ms, 99) or 0.0, 1),
        "short_answers": short,
        "missing_ms": round(missing_s * 1000.0, 1),
        "frames_after_clear": after_clear,
        "unattributed_frames": sum(c.unattributed_frames for c in calls),
        "marks_echoed": sum(c.marks_echoed for c in calls),
        "invalid_messages": sum(c.invalid_messages for c in calls),
        "client": {
            "tick_late_ms": dist_ms(tl),
            "ticks_skipped": ticks_skipped,
            "send_dropped": send_dropped,
        },
        "window": window,
    }
