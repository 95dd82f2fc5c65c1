"""A server under test x a list of concurrency levels -> measured levels and bench rows.

Owns the procedure both sides of the comparison go through, so they are
measured the same way: for each N, start the server fresh, wait until it
serves, let it settle and read its idle PSS and CPU, run the load generator in
its own process (``python -m bench.loadgen``, so sampling never disturbs the
caller's 20 ms timer), sample the server's process tree during the run, stop
the server, and derive:

* CPU per call = CPU seconds of the tree while calls were live / call-seconds
  (a fraction of one core);
* memory per call = (PSS with N calls live - PSS idle) / N, or PSS / N when
  the server runs one process per call (then the process *is* the call's cost);
* the load generator's latency figures;
* the load generator's own CPU (its process tree, sampled the same way over
  the same window) per call-second, printed next to the server's and never
  subtracted from it, and the capacity the server-side figure *implies* for a
  host whose cores serve only the server (:func:`implied_capacity`): 1000 ms
  / server CPU ms per call-second calls per core, times the cores this
  process may use. Those rows are labelled implied; "held" stays measured.

"Held": p95 turn latency within ``hold_margin_ms`` of the single-call p95, no
frame late by more than ``late_frame_ms``, no unanswered turn and every call
completed. The largest N held is the largest N whose level and every smaller
level held.

Invariants: a server is always stopped, even when a run fails; every wait is
bounded (server start, load run); a server that does not serve fails with its
own message, never a hang.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.loadgen.sampler import TreeSampler
from bench.workload import Workload

log = logging.getLogger("bench.harness")

REPO = Path(__file__).resolve().parents[2]
SETTLE_S = 2.0


class ServerError(RuntimeError):
    """The server under test could not be started or did not serve."""


class Server(Protocol):
    name: str
    process_per_call: bool

    def start(self, n_calls: int) -> list[str]:
        """Start fresh for ``n_calls`` calls; return the WebSocket URLs once serving."""

    def pids(self) -> list[int]:
        """Root pids of the server's process tree."""

    def stop(self) -> None:
        """Stop every process this object started (by pid)."""

    def describe(self) -> str:
        """One line: how the server is run."""


@dataclass
class Level:
    n: int
    summary: dict[str, Any]
    cpu_per_call: float  # fraction of one core
    mem_per_call_mb: float
    pss_idle_mb: float
    pss_load_mb: float
    idle_cpu: float  # fraction of a core used by the idle server
    processes: int
    held: bool = False
    notes: list[str] = field(default_factory=list)
    cpu_roles: dict[str, float] = field(default_factory=dict)  # ms CPU per call-second by process role
    client_cpu_per_call: float | None = None  # the load generator's, fraction of one core per call-second

    @property
    def server_ms_per_call_s(self) -> float:
        """Server-side CPU milliseconds per call-second (the whole server tree)."""
        return self.cpu_per_call * 1000.0

    @property
    def client_ms_per_call_s(self) -> float | None:
        """The load generator's CPU milliseconds per call-second (None: not sampled)."""
        return None if self.client_cpu_per_call is None else self.client_cpu_per_call * 1000.0

    @property
    def p95(self) -> float | None:
        return self.summary["turn_ms"]["p95"]


def _raise_priority(pid: int) -> None:
    """Run the load generator ahead of the server under test (nice -10, when
    allowed): on a 2-core machine a starved client would stamp bot frames late
    and charge its own stalls to the server. Its own timer lateness is
    reported either way."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, -10)
    except OSError:
        pass


CLIENT_LATE_NOTE_MS = 10.0


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, at most its cgroup's CPU quota), at least 1."""
    from brisvox.runtime.cpu import usable_cores as cores

    return cores()


def implied_capacity(server_ms_per_call_s: float, cores: int) -> tuple[float | None, float | None]:
    """(calls per core, calls on ``cores`` cores) implied by ``server_ms_per_call_s``
    server CPU ms per call-second, for cores that serve only the server: ``1000 /
    server_ms_per_call_s`` and that times ``cores``. An arithmetic bound from CPU
    alone (latency, memory and the pacing of 20 ms frames are not in it), never a
    measured level; (None, None) when the figure is not positive."""
    if server_ms_per_call_s <= 0 or cores < 1:
        return None, None
    per_core = 1000.0 / server_ms_per_call_s
    return per_core, per_core * cores


def run_loadgen(urls: list[str], n: int, wl: Workload, quick: bool, timeout_s: float,
                client_cpu: TreeSampler | None = None) -> dict[str, Any]:
    """Run the load generator in a child process; return its summary. ``client_cpu``
    (a :class:`TreeSampler` without roots) samples the generator's own process tree
    from its start to its end."""
    with tempfile.TemporaryDirectory(prefix="bvload") as td:
        out = Path(td) / "summary.json"
        cmd = [sys.executable, "-m", "bench.loadgen", "--calls", str(n), "--json", str(out)]
        for u in urls:
            cmd += ["--url", u]
        if quick:
            cmd.append("--quick")
        if wl.source and Path(wl.source).exists():
            cmd += ["--workload", wl.source]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        _raise_priority(p.pid)
        if client_cpu is not None:
            client_cpu.roots = [p.pid]
            client_cpu.start()
        try:
            _, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate(timeout=10)
            raise RuntimeError(f"load generator did not finish within {timeout_s:.0f} s") from None
        finally:
            if client_cpu is not None:
                client_cpu.stop()
        if not out.exists():
            raise RuntimeError(f"load generator failed ({p.returncode}): {err.strip()[-800:]}")
        return json.loads(out.read_text())


def measure_level(server: Server, n: int, wl: Workload, quick: bool) -> Level:
    urls = server.start(n)
    try:
        sampler = TreeSampler(server.pids())
        client = TreeSampler([])
        t_idle0 = time.monotonic()
        sampler.start()
        time.sleep(SETTLE_S)
        pss_idle = sampler.sample_pss()
        idle_cpu = sampler.cpu_seconds(t_idle0, time.monotonic()) / max(1e-9, time.monotonic() - t_idle0)
        try:
            summary = run_loadgen(urls, n, wl, quick, timeout_s=wl.load.run_timeout_s + 60, client_cpu=client)
        finally:
            sampler.stop()
        sampler.note_roles()
        procs = sampler.max_processes()
    finally:
        server.stop()
    w = summary["window"]
    notes: list[str] = []
    if w["first_connect"] is None or w["last_end"] is None or not summary["call_seconds"]:
        raise ServerError(f"{server.name}: no call completed at N={n}: {summary['errors']}")
    cpu = sampler.cpu_seconds(w["first_connect"], w["last_end"])
    cpu_per_call = cpu / summary["call_seconds"]
    client_cpu = client.cpu_seconds(w["first_connect"], w["last_end"]) / summary["call_seconds"] if client.cpu else None
    roles = {r: round(v * 1000.0 / summary["call_seconds"], 2)
             for r, v in sorted(sampler.cpu_by_role(w["first_connect"], w["last_end"]).items()) if v > 0}
    pss_load = sampler.pss_max(w["all_active_start"], w["all_active_end"])
    if pss_load is None:
        pss_load = sampler.pss_max() or pss_idle
        notes.append("no PSS sample while all calls were live; used the run's maximum")
    tick_p99 = summary["client"]["tick_late_ms"]["p99"] or 0.0
    if tick_p99 > CLIENT_LATE_NOTE_MS:
        notes.append(f"the load generator's own timer was late (p99 {tick_p99} ms): late-frame and "
                     "latency figures include its stalls")
    if server.process_per_call:
        mem = pss_load / n
    else:
        mem = (pss_load - pss_idle) / n
    return Level(n=n, summary=summary, cpu_per_call=cpu_per_call, mem_per_call_mb=mem / 2**20,
                 pss_idle_mb=pss_idle / 2**20, pss_load_mb=pss_load / 2**20, idle_cpu=idle_cpu,
                 processes=procs, notes=notes, cpu_roles=roles, client_cpu_per_call=client_cpu)


def judge(levels: list[Level], wl: Workload) -> int:
    """Mark each level held or not; return the largest N held (0 if none)."""
    if not levels:
        return 0
    base = levels[0].p95
    largest = 0
    prefix_ok = True
    for lv in levels:
        s = lv.summary
        lv.held = (base is not None and lv.p95 is not None
                   and lv.p95 <= base + wl.measure.hold_margin_ms
                   and s["max_late_ms"] <= wl.measure.late_frame_ms
                   and s["unanswered"] == 0 and s["calls_ok"] == lv.n)
        prefix_ok = prefix_ok and lv.held
        if prefix_ok:
            largest = lv.n
    return largest


def measure(server: Server, ns: list[int], wl: Workload, quick: bool,
            progress: bool = True) -> tuple[list[Level], int]:
    """Measure every N in ``ns`` (ascending; the first should be 1). A level that
    broke down (p95 over a second above the baseline, or a tenth of the turns
    unanswered) ends the sweep: higher N would only break down further."""
    levels: list[Level] = []
    for n in sorted(set(ns)):
        lv = measure_level(server, n, wl, quick)
        if lv.summary["turns"] and lv.summary["unanswered"] == lv.summary["turns"]:
            raise ServerError(f"{server.name}: answered none of {lv.summary['turns']} turns at N={n} "
                              "(is the route served by the scripted bench agent?)")
        levels.append(lv)
        judge(levels, wl)
        s = lv.summary
        if progress:
            gen = "-" if lv.client_cpu_per_call is None else f"{lv.client_cpu_per_call * 100:.1f}%"
            print(f"   [{server.name}] N={n}: turn p50/p95 {s['turn_ms']['p50']}/{s['turn_ms']['p95']} ms, "
                  f"CPU/call {lv.cpu_per_call * 100:.1f}% core (load generator {gen}), "
                  f"mem/call {lv.mem_per_call_mb:.1f} MB, "
                  f"max late {s['max_late_ms']} ms, unanswered {s['unanswered']}/{s['turns']}, "
                  f"held={lv.held}", flush=True)
        base = levels[0].p95
        if n > 1 and (s["unanswered"] > s["turns"] / 10
                      or (base is not None and lv.p95 is not None and lv.p95 > base + 1000)):
            break
    return levels, judge(levels, wl)


def scripted_ms(wl: Workload) -> int:
    """The part of a turn's latency the scripted services spend: STT final after
    the finalize + LLM first token + TTS first audio. The rest is the engine's
    (its VAD stop window, turn decision, queues, pacing and transport)."""
    return wl.stt.final_after_finalize_ms + wl.llm.first_token_ms + wl.tts.first_audio_ms


def rows(name: str, levels: list[Level], largest: int, wl: Workload,
         targets: dict[str, str] | None = None) -> list[tuple[str, Any, str, str]]:
    """bench rows: per N the figures, then the largest N held."""
    t = targets or {}
    out: list[tuple[str, Any, str, str]] = []
    scripted = scripted_ms(wl)
    for lv in levels:
        s = lv.summary
        p = f"{name} N={lv.n}:"
        p50, p95 = s["turn_ms"]["p50"], s["turn_ms"]["p95"]
        out += [
            (f"{p} CPU per call", round(lv.cpu_per_call * 100, 2), "% core", t.get("cpu", "")),
            (f"{p} memory per call", round(lv.mem_per_call_mb, 1), "MB", t.get("mem", "")),
            (f"{p} idle server PSS (before the calls)", round(lv.pss_idle_mb, 1), "MB", "whole process tree"),
            (f"{p} turn latency p50", s["turn_ms"]["p50"], "ms", ""),
            (f"{p} turn latency p95", s["turn_ms"]["p95"], "ms", t.get("p95", "")),
            (f"{p} turn latency p99", s["turn_ms"]["p99"], "ms", ""),
            (f"{p} turn latency p95 by turn of the call",
             " / ".join(f"{d['p95']}" for _, d in sorted(s.get("turn_ms_by_turn", {}).items(),
                                                          key=lambda kv: int(kv[0]))) or None,
             "ms", ""),
            (f"{p} engine overhead p50 (turn - {scripted} ms scripted)",
             None if p50 is None else round(p50 - scripted, 1), "ms", ""),
            (f"{p} engine overhead p95", None if p95 is None else round(p95 - scripted, 1), "ms", ""),
            (f"{p} clear latency p95", s["clear_ms"]["p95"], "ms", ""),
            (f"{p} last bot audio after barge-in p95", s["last_audio_ms"]["p95"], "ms", t.get("last", "")),
            (f"{p} bot audio stopped after barge-in p50", s["heard_after_barge_ms"]["p50"], "ms", ""),
            (f"{p} bot audio stopped after barge-in p95", s["heard_after_barge_ms"]["p95"], "ms",
             t.get("stopped", "")),
            (f"{p} frames late > {wl.measure.late_frame_ms} ms", s["late_frames"], "frames", "0"),
            (f"{p} max frame lateness", s["max_late_ms"], "ms", f"<= {wl.measure.late_frame_ms}"),
            (f"{p} unanswered turns", s["unanswered"], f"of {s['turns']}", "0"),
            (f"{p} server processes", lv.processes, "procs", ""),
            (f"{p} CPU per call-second by process role",
             ", ".join(f"{r} {v}" for r, v in lv.cpu_roles.items()) or None, "ms", ""),
            (f"{p} load generator timer lateness p99", s["client"]["tick_late_ms"]["p99"], "ms",
             f"<= {CLIENT_LATE_NOTE_MS:.0f} (else the run is client-bound)"),
        ]
        out += cpu_rows(p, lv)
        out += [(f"{p} note", note, "", "") for note in lv.notes]
    out.append((f"{name}: largest N held", largest, "calls", t.get("largest", "")))
    return out


def cpu_rows(p: str, lv: Level, cores: int | None = None) -> list[tuple[str, Any, str, str]]:
    """The server's and the load generator's CPU per call-second side by side, and the
    capacity the server's figure implies (labelled implied: the held verdict is measured)."""
    cores = cores or usable_cores()
    server = lv.server_ms_per_call_s
    client = lv.client_ms_per_call_s
    per_core, total = implied_capacity(server, cores)
    out: list[tuple[str, Any, str, str]] = [
        (f"{p} server CPU per call-second (server processes only)", round(server, 1), "ms", ""),
        (f"{p} load generator CPU per call-second (same machine, not subtracted)",
         None if client is None else round(client, 1), "ms", ""),
    ]
    if client is not None and server + client > 0:
        out.append((f"{p} load generator share of the measured CPU", round(100.0 * client / (server + client), 1),
                    "%", ""))
    out += [
        (f"{p} implied calls per core (1000 ms / server CPU per call-second; implied, not measured)",
         None if per_core is None else round(per_core, 1), "calls", ""),
        (f"{p} implied calls on {cores} cores serving only the server (implied, not measured)",
         None if total is None else int(total), "calls", ""),
    ]
    return out


def level_json(lv: Level) -> dict[str, Any]:
    return {"n": lv.n, "cpu_per_call": lv.cpu_per_call, "mem_per_call_mb": lv.mem_per_call_mb,
            "pss_idle_mb": lv.pss_idle_mb, "pss_load_mb": lv.pss_load_mb, "idle_cpu": lv.idle_cpu,
            "processes": lv.processes, "held": lv.held, "notes": lv.notes, "cpu_roles": lv.cpu_roles,
            "client_cpu_per_call": lv.client_cpu_per_call, "summary": lv.summary}
