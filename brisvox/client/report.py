"""What ``brisvox call`` prints: one block per turn, a summary line, and the JSON result.

Owns the result format (:func:`result`, a plain dict, also written by
``--json``) and its text rendering (:func:`render`). Pure: no I/O.

Result keys: ``protocol``, ``target``, ``call_id``, ``ids`` (protocol ids to
find the call record), ``end_reason``, ``duration_s``, ``recording``,
``turns`` (per turn: ``index``, ``kind``, ``caller`` (the text, or a file's
transcript), ``bot`` (transcript of the bot's audio), ``latency_ms``
(caller stopped -> first bot audio at the client), ``answer_s``,
``unanswered``, ``barged``, ``stop_ms`` (barge-in: caller talked over the
bot -> bot audio stopped at the client), ``clear`` (a clear arrived),
``bot_start_s``/``bot_end_s`` (where the answer sits in the recording)),
``bot_dtmf``, ``stats``, and ``t0_monotonic``: the call's time 0 on this host's
``time.monotonic()`` clock (every ``*_s`` time is relative to it), the clock
the daemon's call records use for their raw ``t_*`` marks.
"""

from __future__ import annotations

from typing import Any

from brisvox.client.script import TurnResult


def _ms(v: float | None) -> int | None:
    return None if v is None else int(round(v))


def turn_row(t: TurnResult, t0: float, caller: str, bot: str) -> dict[str, Any]:
    def rel(x: float | None) -> float | None:
        return None if x is None else round(x - t0, 3)

    end = t.bot_stopped if t.barged and t.bot_stopped is not None else t.t_last_audio
    return {
        "index": t.index,
        "kind": t.kind,
        "label": t.label,
        "caller": caller,
        "bot": bot,
        "latency_ms": _ms(t.latency_ms),
        "answer_s": round(t.answer_s, 2),
        "unanswered": t.unanswered,
        "barged": t.barged,
        "stop_ms": _ms(t.stop_ms),
        "clear": t.t_clear is not None,
        "caller_start_s": rel(t.t_speech_start),
        "caller_end_s": rel(t.t_speech_end),
        "bot_start_s": rel(t.t_first_audio),
        "bot_end_s": rel(end),
        "barge_onset_s": rel(t.barge_onset),
        "overlap_s": round(t.overlap_s, 2),
    }


def result(*, protocol: str, target: str, call_id: str, ids: dict[str, str], end_reason: str, duration_s: float,
           recording: str, turns: list[dict[str, Any]], bot_dtmf: list[str], stats: dict[str, Any],
           t0_monotonic: float) -> dict[str, Any]:
    return {"protocol": protocol, "target": target, "call_id": call_id, "ids": ids, "end_reason": end_reason,
            "duration_s": round(duration_s, 2), "recording": recording, "turns": turns, "bot_dtmf": bot_dtmf,
            "stats": stats, "t0_monotonic": t0_monotonic}


def render(res: dict[str, Any]) -> str:
    lines = []
    who = res["call_id"] or ", ".join(f"{k}={v}" for k, v in res["ids"].items())
    lines.append(f"call {who} ({res['protocol']} {res['target']})")
    for t in res["turns"]:
        head = "greeting" if t["kind"] == "greeting" else f"turn {t['index']}"
        lines.append(head)
        if t["kind"] == "press":
            lines.append(f"  caller: pressed {t['label'].split()[-1]}")
        elif t["kind"] == "line":
            lines.append(f"  caller: {t['caller']}")
        if t["unanswered"]:
            lines.append("  bot:    (no answer)" if t["kind"] != "press" else "  bot:    (no audible reaction)")
        else:
            said = t["bot"] if t["bot"] else "(no words recognized)"
            lines.append(f"  bot:    {said}" + (" [interrupted]" if t["barged"] else ""))
        if t["latency_ms"] is not None:
            lines.append(f"  latency: caller stopped -> first bot audio {t['latency_ms']} ms")
        if t["barged"]:
            if t["stop_ms"] is None:
                lines.append("  barge-in: the bot's audio did not stop")
            elif t["stop_ms"] < 0:
                lines.append("  barge-in: the answer had already ended")
            else:
                lines.append(f"  barge-in: bot audio stopped {t['stop_ms']} ms after the caller started talking"
                             + (" (clear received)" if t["clear"] else ""))
    lats = [t["latency_ms"] for t in res["turns"] if t["latency_ms"] is not None]
    summary = f"ended: {res['end_reason']} after {res['duration_s']:.1f} s"
    if lats:
        summary += f"; latency min/max {min(lats)}/{max(lats)} ms"
    if res["bot_dtmf"]:
        summary += f"; the bot pressed {''.join(res['bot_dtmf'])}"
    if res["recording"]:
        summary += f"; bot audio in {res['recording']}"
    lines.append(summary)
    return "\n".join(lines)
