"""Every judgment of the chaos run, per call and after the run, as bench rows with a verdict.

:func:`judge` turns a finished :class:`.run.Run` into a :class:`Report`: a
list of :class:`Check` (figure, value, unit, target, ok) in the order the
run is judged -- leaks and tables after the run, the booking counter,
isolation, the killed agent's calls, the killed worker's calls, tool
results, fds and memory -- then informational figures (ok None).

Definitions (docs/BENCHMARKS.md "Chaos run"):

* a call's record is found by its call id (native) or its transport ids
  (Twilio streamSid, SIP Call-ID);
* *killed-agent calls*: the calls agent-1 mapped when it was SIGKILLed, and the
  live calls the gateway had placed on it (one whose CallStart it was still
  handling maps no ring yet); they
  have no record; each must have been ended by the gateway (the client saw
  the end) within ``KILL_END_S`` of the kill;
* *killed-worker calls*: the calls worker-1 mapped when it was SIGKILLed;
  every turn of theirs that began ``FAILOVER_S`` after the kill must be
  answered;
* *isolated calls*: undisturbed ``talk``/``book`` calls, and ``malformed`` /
  ``slowread`` ones, on no killed process; their normalised conversation
  must equal the baseline call's of the same script, and the turn latency
  p95 of the undisturbed ones be within ``LATENCY_MARGIN_MS`` of the
  baseline p95;
* *tool results*: each tool call in a record's conversation has exactly one
  result -- its tool message or a late note naming it; none lost, none twice;
* *booking counter*: no Idempotency-Key was POSTed twice; every booking the
  API made is confirmed in exactly one record, except bookings of calls that
  ended before the result could reach them (cut mid-tool, or on the killed
  agent), at most one per such call;
* *doubled side effects*: booking bodies POSTed twice under one key +
  bookings confirmed in two records + tool results that reached a context
  twice (the three counts above, summed);
* *leaks*: leaked /dev/shm segments + mappings of deleted segments + leaked
  processes and zombies + segments and processes left after the stop (the
  counts above, summed);
* *silent turns*: a caller turn (the question spoken to its end) after which
  the caller received no loud bot audio at all, neither an answer nor an
  apology, before it moved on or the call ended. Not counted: the killed
  agent's calls (no record; the gateway ended them, judged above), turns of
  the killed worker's calls in flight at the kill (begun before kill +
  ``FAILOVER_S``, answer window reaching the kill; judged above) and turns
  after a caller's own hang-up. The call record's side is shown with it: the
  turn driver's ``empty_turns`` (a turn that ended with no text, so nothing
  was asked) of the records;
* *the primary TTS's death* (``ttsdie``): the primary (Cartesia) dies
  mid-answer 2 and stays down; the secondary (ElevenLabs, voice
  :data:`.script.SECONDARY_VOICE`) must be heard: every ``ttsdie`` call's
  last turn in the secondary's voice only (:func:`.callers.voice_of`), no
  primary audio after secondary audio, at least one call that heard the
  primary and then the secondary (the death mid-call), and the secondary's
  wire saw that voice id and no other.

Invariants: judging reads only the run's data (no I/O); a missing datum is a
failed check, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.harness.chaos import script

if TYPE_CHECKING:
    from bench.harness.chaos.callers import CallResult
    from bench.harness.chaos.faults import FaultScheduler
    from bench.harness.chaos.run import Run

KILL_END_S = 2.0
FAILOVER_S = 1.0
LATENCY_MARGIN_MS = 500.0
FD_TOLERANCE = 10
MEM_TOLERANCE = 0.10
ISOLATED_FAULTS = ("", "malformed", "slowread")


@dataclass
class Check:
    figure: str
    value: Any
    unit: str
    target: str
    ok: bool | None  # None: informational
    key: str = ""  # a stable name for tests
    detail: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, key: str, figure: str, value: Any, unit: str, target: str, ok: bool | None,
            detail: str = "") -> None:
        self.checks.append(Check(figure, value, unit, target, ok, key, detail))

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def get(self, key: str) -> Check:
        return next(c for c in self.checks if c.key == key)

    def rows(self) -> list[tuple[str, Any, str, str]]:
        out = []
        for c in self.checks:
            verdict = "" if c.ok is None else (" ok" if c.ok else " FAILED")
            out.append((c.figure, c.value, c.unit, f"{c.target}{verdict}".strip()))
        return out


def match_records(results: list[CallResult], records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Result index (its position in ``results``) -> its call record."""
    by_id = {r.get("call_id"): r for r in records}
    by_tid: dict[str, dict[str, Any]] = {}
    for r in records:
        for v in (r.get("transport_ids") or {}).values():
            by_tid[str(v)] = r
    out: dict[int, dict[str, Any]] = {}
    for i, res in enumerate(results):
        rec = by_id.get(res.call_id) if res.call_id else None
        if rec is None:
            rec = next((by_tid[v] for v in res.ids.values() if v in by_tid), None)
        if rec is not None:
            out[i] = rec
    return out


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


_BK = re.compile(r"BK-\d+")


def _tool_results(rec: dict[str, Any]) -> tuple[int, int, int, set[str]]:
    """(tool calls, lost, twice, booking numbers confirmed) of one record."""
    conv = rec.get("conversation") or []
    ids = [c["id"] for m in conv if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    booked: set[str] = set()
    lost = twice = 0
    for cid in ids:
        n = sum(1 for m in conv if m.get("role") == "tool" and m.get("call_id") == cid)
        n += sum(1 for m in conv if m.get("role") == "system" and f"the call {cid} " in str(m.get("content", "")))
        lost += n == 0
        twice += n > 1
    for m in conv:
        if m.get("role") == "tool" or (m.get("role") == "system" and "Late tool result" in str(m.get("content"))):
            booked |= set(_BK.findall(str(m.get("content", ""))))
    return len(ids), lost, twice, booked


def _delta(a: dict[str, int], b: dict[str, int], unit: int) -> str:
    return ", ".join(f"{k.replace('brisvoxd: ', '')}: {(a.get(k, 0) - b.get(k, 0)) / unit:+.1f}"
                     for k in sorted(set(a) | set(b)))


def _turn_latencies(results: list[CallResult]) -> list[float]:
    return [t["latency_ms"] for r in results for t in r.turns if t["latency_ms"] is not None]


ANSWER_WAIT_S = 8.0  # the callers' answer_wait (callers.TIMING): a turn's answer window


def _silent_turns(res: list[CallResult], matched: dict[int, dict[str, Any]], t_worker_kill: float | None,
                  killed_worker: set[str]) -> tuple[list[str], int]:
    """(labels of silent turns, turns considered): see the module docstring."""
    silent: list[str] = []
    n = 0
    for i, r in enumerate(res):
        if i not in matched:
            continue  # the killed agent's calls (judged: ended by the gateway)
        on_w = matched[i].get("call_id") in killed_worker
        for t in r.turns:
            if t["t_speech_end"] is None:
                continue
            if r.ended_by == "client" and r.spec.fault.startswith("hangup") and r.t_end is not None \
                    and r.t_end <= t["t_speech_end"] + ANSWER_WAIT_S:
                continue  # the caller left before this turn's answer window ended
            if on_w and t_worker_kill is not None and t["t_speech_start"] is not None \
                    and t["t_speech_start"] < t_worker_kill + FAILOVER_S \
                    and t["t_speech_end"] + ANSWER_WAIT_S >= t_worker_kill:
                continue  # in flight at the worker's kill (judged with it)
            n += 1
            if t["t_first_audio"] is None:
                silent.append(f"{r.spec.label} turn {t['index']} ({matched[i].get('end_reason')})")
    return silent, n


def _judge_tts_death(rep: Report, res: list[CallResult], matched: dict[int, dict[str, Any]],
                     vs: dict[str, Any]) -> None:
    """The ``ttsdie`` calls with a record (the killed agent's have none; the killed worker's
    last turns begin seconds after its kill): see the module docstring."""
    calls = [r for i, r in enumerate(res) if r.spec.variant == "ttsdie" and i in matched]
    deaths = len(vs.get("tts_deaths") or [])
    voices = dict(vs.get("secondary_voices") or {})
    bad: list[str] = []
    mid = 0
    for r in calls:
        seq = [v for t in sorted(r.turns, key=lambda t: t["index"]) for v in ("primary", "secondary")
               if (t.get("voices") or {}).get(v)]
        last = next((t for t in r.turns if t["index"] == script.TURNS), None)
        lv = (last or {}).get("voices") or {}
        after = "secondary" in seq and "primary" in seq[seq.index("secondary"):]
        if last is None or not lv.get("secondary") or lv.get("primary") or after:
            bad.append(f"{r.spec.label}: {[(t['index'], t.get('voices')) for t in r.turns]}")
        mid += seq[:1] == ["primary"] and "secondary" in seq
    ok = bool(calls) and not bad and deaths >= 1 and mid >= 1 and set(voices) == {script.SECONDARY_VOICE}
    rep.add("tts_failover", "primary TTS died mid-call: calls whose last turn was in the secondary's voice "
            "(heard primary -> secondary)", f"{len(calls) - len(bad)} of {len(calls)} ({mid})", "calls",
            f"all, >= 1 mid-call, deaths >= 1, secondary wire voice {script.SECONDARY_VOICE}", ok,
            f"deaths {deaths}, secondary voices {voices}, refused {vs.get('tts_refused')}; " + "; ".join(bad[:3]))


def judge(run: Run, sched: FaultScheduler) -> Report:  # noqa: C901 - one list of judgments, in order
    rep = Report()
    res, recs = run.results, run.records
    matched = match_records(res, recs)
    base_matched = match_records(run.baseline, recs)
    agent_ev = sched.event("kill", "agent")
    worker_ev = sched.event("kill", "worker")
    killed_agent = set(agent_ev.calls) if agent_ev else set()
    killed_worker = set(worker_ev.calls) if worker_ev else set()

    # -- 1. tables, segments, mappings, processes after the run -----------------------------------
    st = run.status_after or {}
    children = st.get("children", [])
    left = (st.get("daemon", {}).get("calls", -1) if st else -1) + sum(c.get("calls", 0) for c in children)
    subs = sum(sum((c.get("stats") or {}).get("calls_by_subscriber", {}).values()) for c in children
               if c.get("role") == "worker")
    rep.add("tables", "calls left in any table after the run (daemon, gateway, workers, agents)", left + subs,
            "calls", "0", left + subs == 0,
            "; ".join(f"{c['name']}={c['calls']}" for c in children if c.get("calls")))
    idle, after = run.idle, run.after
    if idle is None or after is None:
        rep.add("snapshot", "process snapshots taken", 0, "", "2", False)
        return rep
    leaked_segs = sorted(set(after.segments) - set(idle.segments))
    rep.add("shm", "leaked /dev/shm segments of the instance after the run", len(leaked_segs), "segments", "0",
            not leaked_segs, ", ".join(leaked_segs[:5]))
    n_del = sum(len(v) for v in after.deleted_maps.values())
    rep.add("maps", "mappings of deleted /dev/shm segments in any process", n_del, "mappings", "0", n_del == 0,
            str(dict(list(after.deleted_maps.items())[:3])))
    procs_delta = len(after.procs) - len(idle.procs)
    leaked_p = abs(procs_delta) + after.zombies
    rep.add("procs", "leaked processes (tree after - idle, zombies)", leaked_p, "procs",
            f"0 (idle {len(idle.procs)})", leaked_p == 0, f"after: {after.names()}")
    stop_left = run.left_after_stop
    n_stop = len(stop_left.get("segments", [])) + len(stop_left.get("processes", []))
    rep.add("stop", "segments + processes left after the stop", n_stop, "", "0", n_stop == 0, str(stop_left))

    # -- 2. booking counter -------------------------------------------------------------------------
    vs = run.vendor_stats
    posts: dict[str, int] = vs.get("posts", {})
    doubles = sum(n - 1 for n in posts.values() if n > 1)
    rep.add("double_posts", "booking bodies POSTed twice under one Idempotency-Key", doubles, "bodies", "0",
            doubles == 0)
    server = set(vs.get("bookings", {}).values())
    confirmed: dict[str, int] = {}
    for rec in list(matched.values()) + list(base_matched.values()):
        for bk in _tool_results(rec)[3]:
            confirmed[bk] = confirmed.get(bk, 0) + 1
    invented = sorted(set(confirmed) - server)
    twice_confirmed = sorted(b for b, n in confirmed.items() if n > 1)
    unconfirmed = server - set(confirmed)
    cut_calls = [r for i, r in enumerate(res) if script.SCRIPT_OF[r.spec.variant] == "book"
                 and (r.spec.fault == "hangup_tool" or i not in matched)]
    ok_b = not invented and not twice_confirmed and len(unconfirmed) <= len(cut_calls)
    rep.add("bookings", "booking API bookings = confirmed in a record (+ calls cut before the result)",
            f"{len(server)} = {len(confirmed)} + {len(unconfirmed)}", "bookings",
            f"unconfirmed <= {len(cut_calls)}, 0 invented, 0 confirmed twice", ok_b,
            f"invented {invented[:3]}, twice {twice_confirmed[:3]}")

    # -- 3. isolation -------------------------------------------------------------------------------
    want: dict[str, list[tuple[str, str]]] = {}
    for i, r in enumerate(run.baseline):
        if i in base_matched:
            want.setdefault(r.spec.variant, script.normalise(base_matched[i]["conversation"]))
    base_ok = all(want.get(v) == script.expected(v) for v in ("talk", "book"))
    rep.add("baseline", "baseline conversations equal the script", sum(v in want for v in ("talk", "book")),
            "of 2 scripts", "2", base_ok, str({v: want.get(v) for v in ("talk", "book")})[:600])
    iso = [i for i, r in enumerate(res) if r.spec.variant in ("talk", "book") and r.spec.fault in ISOLATED_FAULTS
           and i in matched and matched[i]["call_id"] not in killed_worker]
    bad = [i for i in iso if script.normalise(matched[i]["conversation"]) != script.expected(res[i].spec.variant)]
    rep.add("isolation", "isolated calls whose conversation differs from the baseline", len(bad),
            f"of {len(iso)}", "0", bool(iso) and not bad,
            "; ".join(f"{res[i].spec.label}: {script.normalise(matched[i]['conversation'])}" for i in bad[:3]))
    unans = [i for i in iso if any(t["unanswered"] for t in res[i].turns) or len(res[i].turns) < script.TURNS]
    rep.add("iso_unanswered", "isolated calls with an unanswered or missing turn", len(unans), f"of {len(iso)}",
            "0", not unans, "; ".join(res[i].spec.label for i in unans[:5]))
    lat_base = _turn_latencies(run.baseline)
    lat = _turn_latencies([res[i] for i in iso if res[i].spec.fault != "slowread"])
    b95, c95 = pct(lat_base, 0.95), pct(lat, 0.95)
    rep.add("lat_base", "baseline turn latency p50 / p95 (6 quiet calls)",
            f"{pct(lat_base, 0.5)} / {b95}", "ms", "", None)
    rep.add("latency", "isolated calls' turn latency p95 (p50)", f"{c95} ({pct(lat, 0.5)})", "ms",
            f"<= baseline p95 + {LATENCY_MARGIN_MS:.0f}", b95 is not None and c95 is not None
            and c95 <= b95 + LATENCY_MARGIN_MS)

    # -- 4. the killed agent's calls ----------------------------------------------------------------
    no_rec = [r for i, r in enumerate(res) if i not in matched and r.t_open is not None]
    if agent_ev is None or agent_ev.error:
        rep.add("agent_kill", "agent-1 SIGKILLed", 0, "", "1", False, agent_ev.error if agent_ev else "no event")
    else:
        delays = [(r.t_end - agent_ev.t) * 1000 for r in no_rec if r.t_end is not None and r.ended_by == "server"]
        late = [r for r in no_rec if r.ended_by != "server" or r.t_end is None or r.t_end - agent_ev.t > KILL_END_S
                or r.t_end < agent_ev.t]
        natives = [r for r in no_rec if r.call_id]
        foreign = [r for r in natives if r.call_id not in killed_agent]
        ok_a = len(no_rec) == len(killed_agent) and not late and not foreign and bool(killed_agent)
        rep.add("agent_kill", f"killed agent's calls ended by the gateway within {KILL_END_S:g} s",
                f"{len(no_rec) - len(late)} of {len(killed_agent)}", "calls", "all", ok_a,
                f"no record: {len(no_rec)}, late/unclean: {[(r.spec.label, r.end_reason) for r in late[:3]]}, "
                f"not on agent-1: {[r.spec.label for r in foreign[:3]]}")
        rep.add("agent_kill_end", "killed agent's calls: kill -> end at the client, max (p50)",
                f"{max(delays):.0f} ({pct(delays, 0.5):.0f})" if delays else "n/a", "ms",
                f"<= {KILL_END_S * 1000:.0f}", None)

    # -- 5. the killed worker's calls ---------------------------------------------------------------
    if worker_ev is None or worker_ev.error:
        rep.add("worker_kill", "worker-1 SIGKILLed", 0, "", "1", False, worker_ev.error if worker_ev else "no event")
    else:
        on_w = [i for i in matched if matched[i]["call_id"] in killed_worker]
        later = [(i, t) for i in on_w for t in res[i].turns
                 if t["t_speech_start"] is not None and t["t_speech_start"] >= worker_ev.t + FAILOVER_S
                 and not res[i].spec.fault.startswith("hangup")]
        miss = [(res[i].spec.label, t["index"]) for i, t in later if t["unanswered"]]
        rep.add("worker_kill", f"killed worker's calls: turns begun {FAILOVER_S:g} s after the kill answered",
                f"{len(later) - len(miss)} of {len(later)}", f"turns ({len(on_w)} calls)", "all",
                bool(later) and not miss, str(miss[:5]))
        same = sum(1 for i in on_w if res[i].spec.variant in ("talk", "book") and res[i].spec.fault in
                   ISOLATED_FAULTS and script.normalise(matched[i]["conversation"]) ==
                   script.expected(res[i].spec.variant))
        cand = sum(1 for i in on_w if res[i].spec.variant in ("talk", "book") and res[i].spec.fault in ISOLATED_FAULTS)
        rep.add("worker_kill_same", "killed worker's undisturbed calls with the baseline conversation",
                f"{same} of {cand}", "calls", "", None)

    # -- 6. tool results ----------------------------------------------------------------------------
    n_calls = lost = twice = 0
    lost_where = []
    for i, rec in matched.items():
        n, lo, tw, _ = _tool_results(rec)
        n_calls, lost, twice = n_calls + n, lost + lo, twice + tw
        if lo or tw:
            lost_where.append(f"{res[i].spec.label} ({rec.get('end_reason')}, tools {rec.get('tools')})")
    rep.add("tool_results", "tool results lost / reached their context twice", f"{lost} / {twice}",
            f"of {n_calls} tool calls", "0 / 0", lost == 0 and twice == 0, "; ".join(lost_where[:3]))

    # -- 6b. doubled side effects (the counts above, summed) -------------------------------------
    n_doubled = doubles + len(twice_confirmed) + twice
    rep.add("doubled", "doubled side effects (bodies twice under one key + bookings confirmed twice + tool "
            "results twice)", n_doubled, "", "0", n_doubled == 0,
            f"{doubles} + {len(twice_confirmed)} + {twice}")

    # -- 6c. silent turns -----------------------------------------------------------------------------
    silent, considered = _silent_turns(res, matched, worker_ev.t if worker_ev and not worker_ev.error else None,
                                       killed_worker)
    empty = sum(int(((r.get("stats") or {}).get("turn") or {}).get("empty_turns", 0)) for r in matched.values())
    rep.add("silent_turns", "silent turns (the caller spoke, then got neither bot audio nor an apology)",
            len(silent), f"of {considered} turns", "0", considered > 0 and not silent,
            f"records' empty_turns: {empty}; " + "; ".join(silent[:5]))

    # -- 6d. the primary TTS's death mid-call: the secondary's voice heard ------------------------------
    _judge_tts_death(rep, res, matched, vs)

    # -- 7. fds and memory --------------------------------------------------------------------------
    dfd = after.fd_total - idle.fd_total
    rep.add("fds", "open fds of the daemon's tree after - idle", dfd, f"fds (idle {idle.fd_total})",
            f"within +-{FD_TOLERANCE}", abs(dfd) <= FD_TOLERANCE,
            _delta(after.by_name(after.fds), idle.by_name(idle.fds), 1))
    for key, a, b in (("pss", after.pss, idle.pss), ("rss", after.rss, idle.rss)):
        rep.add(key, f"{key.upper()} of the daemon's tree after / idle", round(a / max(1, b), 3),
                f"(idle {b / 2**20:.0f} MiB)", f"<= {1 + MEM_TOLERANCE:.2f}", a <= b * (1 + MEM_TOLERANCE),
                "PSS MiB after-idle by process: " + _delta(after.by_name(after.pss_by), idle.by_name(idle.pss_by),
                                                           2**20) if key == "pss" else "")

    n_leaks = len(leaked_segs) + n_del + leaked_p + n_stop
    rep.add("leaks", "leaks (segments + deleted mappings + processes and zombies + left after the stop)",
            n_leaks, "", "0", n_leaks == 0, f"{len(leaked_segs)} + {n_del} + {leaked_p} + {n_stop}")

    # -- 8. every call, informational figures ----------------------------------------------------------
    errors = [r for r in res if r.ended_by == "error" or r.error]
    rep.add("errors", "calls that could not be placed or broke in the client", len(errors), f"of {len(res)}", "0",
            not errors, "; ".join(f"{r.spec.label}: {r.error}" for r in errors[:3]))
    timed = [r for r in res if r.end_reason == "time limit"]
    rep.add("time_limit", "calls that hit the client's time limit (hung)", len(timed), "calls", "0", not timed,
            "; ".join(r.spec.label for r in timed[:3]))
    rep.add("mix", "calls: Twilio / native / SIP", " / ".join(str(sum(r.spec.transport == t for r in res))
                                                             for t in ("twilio", "native", "sip")), "calls", "", None)
    rep.add("faults_fired", "vendor faults fired (armed left)", str(vs.get("fired")), "", "", None,
            str(vs.get("armed")))
    rep.add("kills", "killed: agent-1 calls / worker-1 calls", f"{len(killed_agent)} / {len(killed_worker)}",
            "calls", "", None)
    fault_calls = [r for r in res if r.spec.fault or r.spec.variant not in ("talk", "book")]
    rep.add("fault_calls", "faulted calls (provider or client fault)", len(fault_calls), "calls", "", None)
    rep.add("duration", "chaos calls wall time / whole run", f"{run.timings.get('chaos_calls_s', 0):.1f} / "
            f"{run.timings.get('total_s', 0):.1f}", "s", "", None)
    for note in run.notes:
        rep.add("note", "note", note, "", "", None)
    rep.calls = [dict(r.as_json(), record=matched.get(i, {}).get("call_id"),
                      end_record=matched.get(i, {}).get("end_reason")) for i, r in enumerate(res)]
    return rep
