"""The per-turn latency breakdown of the load bench: client stamps joined with the call records.

Owns how one turn's latency (caller's last speech frame sent -> the answer's first
speech frame received, the load generator's turn latency) is split into the steps
the pipeline takes, and how they are printed (docs/BENCHMARKS.md, "Latency
breakdown"). The marks, in order:

    client: last speech frame sent          (load generator)
    VAD stop reached the turn driver        (call record: t_vad_stop)
    Smart Turn verdict came                 (t_verdict; none without Smart Turn)
    STT final reached the turn driver       (t_stt_final)
    LLM request sent                        (t_request)
    LLM first token                         (t_first_token)
    first audio written to the tts ring     (t_first_audio)
    client: first answer frame received     (load generator)

Each step is the time the mark added to the turn's critical path: a mark is
clamped to the latest mark before it, so a step is never negative (the verdict
and the STT final are awaited in parallel after the stop; an early verdict, from
the VAD falling, comes before the stop and adds 0) and the steps of one turn sum
to its turn latency exactly. p50/p95 are per step over the joined turns, so
they do not sum.

Join: a call by its Twilio stream sid (the record's ``transport_ids``), a client
turn to the record's turn whose backdated speech end (``t_speech_end``) is the
nearest within ``MATCH_S`` of the client's last-speech stamp. Clocks: the client
stamps ``time.monotonic()``; a record's marks are on the agent's loop clock and
``clock_offset_s`` converts them (the same CLOCK_MONOTONIC on one host).

Speculation (docs/LATENCY.md): :func:`speculation` sums the records' ``speculation``
counters of one level; wasted requests are the speculations started and not committed
(started - hits), per turn the record turns that ended.

Invariants: pure (no I/O but :func:`read_records`); a step no joined turn has
(no Smart Turn) is None, printed "n/a"; a turn that does not join is counted,
never guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench.loadgen.stats import dist_ms

MATCH_S = 0.5  # a record turn's speech end within this of the client's last speech frame

# (step label, the record mark that ends it; "client" marks come from the load generator)
STEPS: tuple[tuple[str, str], ...] = (
    ("caller's last speech -> VAD stop", "t_vad_stop"),
    ("VAD stop -> Smart Turn verdict", "t_verdict"),
    ("verdict (or stop) -> STT final", "t_stt_final"),
    ("STT final -> LLM request", "t_request"),
    ("LLM request -> first token", "t_first_token"),
    ("first token -> first audio written (tts ring)", "t_first_audio"),
    ("first audio written -> first frame at the client", "client"),
)


def read_records(folder: Path) -> list[dict[str, Any]]:
    """Every call record in ``folder`` (one ``.json`` file per call) or a ``.jsonl`` file."""
    out: list[dict[str, Any]] = []
    if folder.is_file():
        for line in folder.read_bytes().splitlines():
            if line.strip():
                out.append(orjson.loads(line))
        return out
    for p in sorted(folder.glob("*.json")):
        try:
            out.append(orjson.loads(p.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue
    return out


def _turn_marks(client: dict[str, Any], rec_turn: dict[str, Any], offset: float) -> list[float | None]:
    """The eight marks of one joined turn on the host's monotonic clock (None: missing)."""
    def t(key: str) -> float | None:
        v = rec_turn.get(key)
        return None if v is None else float(v) + offset

    return [client["t_speech_end"], *(t(key) for _, key in STEPS[:-1]), client["t_first_audio"]]


def join(timeline: list[dict[str, Any]], records: list[dict[str, Any]]) -> tuple[list[list[float | None]], int]:
    """The marks of every answered client turn that joins a record turn, and how many did not."""
    by_sid: dict[str, dict[str, Any]] = {}
    for r in records:
        sid = (r.get("transport_ids") or {}).get("streamSid")
        if sid:
            by_sid[sid] = r
    joined: list[list[float | None]] = []
    missed = 0
    for call in timeline:
        rec = by_sid.get(call["stream_sid"])
        for ct in call["turns"]:
            if ct["t_speech_end"] is None or ct["t_first_audio"] is None:
                continue  # not spoken, or unanswered: the summary counts those
            if rec is None:
                missed += 1
                continue
            off = float(rec.get("clock_offset_s") or 0.0)
            best, gap = None, MATCH_S
            for rt in rec.get("turns", []):
                se = rt.get("t_speech_end")
                if se is None or rt.get("t_turn_end") is None:
                    continue
                d = abs(float(se) + off - ct["t_speech_end"])
                if d <= gap:
                    best, gap = rt, d
            if best is None:
                missed += 1
            else:
                joined.append(_turn_marks(ct, best, off))
    return joined, missed


def steps(joined: list[list[float | None]]) -> list[list[float | None]]:
    """Per turn, the critical-path duration (s) of each step (None: the mark is missing)."""
    out: list[list[float | None]] = []
    for marks in joined:
        prev = marks[0]
        assert prev is not None
        row: list[float | None] = []
        for m in marks[1:]:
            if m is None:
                row.append(None)
                continue
            row.append(max(0.0, m - prev))
            prev = max(prev, m)
        out.append(row)
    return out


def breakdown(timeline: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """The breakdown of one level: p50/p95 per step, the total, and the join's counts."""
    joined, missed = join(timeline, records)
    per_turn = steps(joined)
    out: dict[str, Any] = {"joined": len(joined), "missed": missed, "records": len(records), "steps": []}
    for i, (label, _) in enumerate(STEPS):
        vals = [row[i] for row in per_turn if row[i] is not None]
        d = dist_ms([v for v in vals if v is not None])
        out["steps"].append({"step": label, "n": d["n"], "p50": d["p50"], "p95": d["p95"]})
    total = [m[-1] - m[0] for m in joined if m[-1] is not None and m[0] is not None]
    d = dist_ms(total)
    out["total"] = {"n": d["n"], "p50": d["p50"], "p95": d["p95"]}
    # an early verdict (the VAD falling) came before the stop it ended
    out["early_verdicts"] = sum(1 for m in joined if m[2] is not None and m[1] is not None and m[2] <= m[1])
    return out


def rows(prefix: str, bd: dict[str, Any] | None) -> list[tuple[str, Any, str, str]]:
    """Bench rows of one level's breakdown (``prefix`` e.g. "brisvox N=1:")."""
    if not bd:
        return [(f"{prefix} latency breakdown", "n/a", "", "no call records (BRISVOX_BENCH_CMD without --config?)")]

    def pair(d: dict[str, Any]) -> str:
        return "n/a" if not d["n"] else f"{d['p50']} / {d['p95']}"

    out: list[tuple[str, Any, str, str]] = []
    for s in bd["steps"]:
        out.append((f"{prefix} breakdown {s['step']} p50 / p95", pair(s), "ms", ""))
    out.append((f"{prefix} breakdown total (= turn latency) p50 / p95", pair(bd["total"]), "ms",
                f"{bd['joined']} turns joined, {bd['missed']} not; {bd['early_verdicts']} early verdicts"))
    return out


SPEC_KEYS = ("started", "hits", "misses", "context_changes", "expired", "superseded", "withdrawn",
             "abandoned", "skipped_busy", "skipped_unsafe", "failures", "offered", "head_start_ms")


def speculation(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summed speculation counters of one level's call records, the hit rate (hits over
    decided: hits, misses, context changes, expiries), the turns that ended and the wasted
    requests (started, not committed) per such turn."""
    out: dict[str, Any] = dict.fromkeys(SPEC_KEYS, 0)
    turns = 0
    for r in records:
        sp = r.get("speculation") or {}
        for k in SPEC_KEYS:
            v = sp.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[k] += v
        turns += sum(1 for t in r.get("turns", []) if t.get("t_turn_end") is not None)
    decided = out["hits"] + out["misses"] + out["context_changes"] + out["expired"]
    out["hit_rate"] = round(out["hits"] / decided, 4) if decided else None
    out["turns"] = turns
    out["wasted"] = out["started"] - out["hits"]
    out["wasted_per_turn"] = round(out["wasted"] / turns, 3) if turns else None
    out["head_start_ms_mean"] = round(out["head_start_ms"] / out["hits"], 1) if out["hits"] else None
    return out


def speculation_rows(prefix: str, sp: dict[str, Any] | None) -> list[tuple[str, Any, str, str]]:
    """Bench rows of one level's :func:`speculation` (``prefix`` e.g. "brisvox N=1:")."""
    if not sp:
        return [(f"{prefix} speculation", "n/a", "", "no call records")]

    def na(v: Any) -> Any:
        return "n/a" if v is None else v

    return [
        (f"{prefix} speculation started / hits / misses / withdrawn / expired",
         f"{sp['started']} / {sp['hits']} / {sp['misses']} / {sp['withdrawn']} / {sp['expired']}", "",
         f"superseded {sp['superseded']}, abandoned {sp['abandoned']}, context changes "
         f"{sp['context_changes']}, skipped busy {sp['skipped_busy']}"),
        (f"{prefix} speculation hit rate", na(sp["hit_rate"]), "", "hits / decided"),
        (f"{prefix} speculation wasted requests per turn", na(sp["wasted_per_turn"]), "",
         f"{sp['wasted']} not committed over {sp['turns']} turns"),
        (f"{prefix} speculation head start per hit (mean)", na(sp["head_start_ms_mean"]), "ms", ""),
    ]
