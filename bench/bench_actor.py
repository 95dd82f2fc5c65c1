"""The call actor's own overhead: ``python -m bench actor [--quick]``.

Figures:

* gated turn end -> LLM request issued: from the actor's timeline (the gated
  release of UserTurnEnded to ``provider.stream()``), in the real agent
  process of a running daemon with scripted providers (and, for comparison,
  in one process on the real clock with the simulated gateway/worker);
* first TTS audio written -> first frame at the caller: the actor's
  first write of an epoch into the tts ring (timeline ``t_first_audio``, a
  ``time.monotonic()`` mark) to the arrival of that answer's first non-silent
  frame at a WebSocket client on loopback (so it includes the hop to the
  worker, its immediate conversion of the utterance's first audio, the
  OutUtterance to the gateway, the pacer's release and the WebSocket send);
  with the gateway's own part (OutUtterance read -> first frame released);
* barge-in decision -> Clear applied in the gateway: the gateway's own
  ``clear_latency_p99_ms`` (Clear's ``sent_ns``, stamped in the decision
  step, to the cut), and the decision to the client's ``clear`` event;
* memory per call actor: the actor's retained object graph after a 5-minute
  simulated call (without its conversation), and the agent process's PSS
  growth per live call in the daemon;
* CPU of the agent processes per call-second under the load benchmark's
  workload (docs/BENCHMARKS.md, "Load"): ``brisvoxd`` with ``configs/brisvoxd.bench.toml`` (or
  ``BRISVOX_BENCH_CONFIG`` / ``BRISVOX_BENCH_URL``, as ``bench/bench_load.py``),
  N calls from the load generator, each process's CPU time (psutil) over the
  calls' window divided by the call-seconds, summed over the agent processes
  (and the worker's and gateway's for comparison).

The machine is shared while benches run; figures are medians/percentiles of
one run.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
Row = tuple[str, float, str, str]


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else float("nan")


def _inprocess(n_calls: int) -> list[float]:
    """Turn end -> request (ms) for concurrent sim calls on the REAL clock."""
    from brisvox.sim.harness import simulate
    from brisvox.sim.scenarios import s03

    async def main() -> list[Any]:
        calls = []
        for i in range(n_calls):
            c, _ = s03()
            c.call_id = f"bench{i}"
            c.seed = i
            c.quiet = 1.0
            calls.append(simulate(c))
        return await asyncio.gather(*calls)

    res = asyncio.run(main())
    out = []
    for r in res:
        for t in r.record["turns"]:
            if t["request_ms"] is not None:
                out.append(float(t["request_ms"]))
    return out


def _actor_memory() -> float:
    """Retained bytes of one actor after a 5-minute simulated call (without its context)."""
    from brisvox.providers.seeded_fakes import LlmScript, Say
    from brisvox.sim.harness import SimCall, simulate
    from brisvox.sim.memsize import actor_bytes, retained_bytes
    from brisvox.sim.vloop import run_virtual
    from brisvox.sim.world import Utter

    got: list[int] = []

    def probe(t: float, actor: Any) -> None:
        if not got and t >= 290:
            got.append(actor_bytes(actor) - retained_bytes(actor.context))

    steps = [Utter("hello there", at=0.5)] + [Utter("and tell me more please", after_bot_done=2.0) for _ in range(60)]
    call = SimCall(steps=steps, llm=[], llm_default=LlmScript((Say("A fairly complete answer with some details."),)),
                   max_time=300.0, probe=probe, probe_every=10.0)
    run_virtual(lambda: simulate(call))
    return float(got[0]) if got else float("nan")


def _daemon(n_calls: int) -> dict[str, list[float] | float]:
    import soundfile as sf

    from bench.harness.call_daemon import SPEECH, config
    from bench.harness.daemon import Daemon, ws_port
    from brisvox.agent.host.call_record import read_records
    from brisvox.sim.ws_caller import ANSWER, SECOND, one_call

    tmp = Path(tempfile.mkdtemp(prefix="bvb", dir="/tmp"))
    script = tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": ["what time do you close", "wait a moment"], "bot": [ANSWER, SECOND]}))
    d = Daemon(tmp, config=config(tmp, script), real_roles=True)
    out: dict[str, Any] = {"request": [], "first_audio": [], "worker_announce": [], "clear_client": [],
                           "clear_gw_p99": float("nan"), "first_frame_gw": (float("nan"), float("nan")),
                           "pss_per_call": float("nan")}
    try:
        d.start()
        snap = d.wait_ready(60)
        port = ws_port(d.child(snap, "gateway-0"))
        pss0 = d.child(snap, "agent-0").get("pss_bytes") or 0
        speech, _ = sf.read(SPEECH, dtype="int16")
        peak: list[int] = []

        async def all_calls() -> list[dict[str, Any]]:
            async def staggered(i: int) -> dict[str, Any]:
                await asyncio.sleep(i * 0.05)
                return await one_call(port, speech, seed=i)

            async def sample() -> None:
                for _ in range(20):
                    await asyncio.sleep(1.0)
                    try:
                        s = await asyncio.to_thread(d.status)
                        a = d.child(s, "agent-0")
                        if a.get("calls"):
                            peak.append(((a.get("pss_bytes") or 0), a["calls"]))  # type: ignore[arg-type]
                    except Exception:  # noqa: BLE001 - a missed sample is fine
                        pass

            sampler = asyncio.create_task(sample())
            res = await asyncio.gather(*(staggered(i) for i in range(n_calls)))
            sampler.cancel()
            return list(res)

        results = asyncio.run(all_calls())
        want = {r["call_id"] for r in results}
        d.wait_for(lambda s: len({r["call_id"] for r in read_records(tmp / "records")} & want) == n_calls,
                   30, "every call record")
        records = {r["call_id"]: r for r in read_records(tmp / "records")}
        for res in results:
            rec = records[res["call_id"]]
            turns = rec["turns"]
            for t in turns:
                if t["request_ms"] is not None:
                    out["request"].append(float(t["request_ms"]))
                if t.get("t_out_utterance") and t.get("t_first_audio"):
                    out["worker_announce"].append((t["t_out_utterance"] - t["t_first_audio"]) * 1000)
            frames = res["frames"]
            t0 = res["t0"]
            # answer 1: its first non-silent frame; answer 2: the first non-silent frame after the clear
            i1 = next((i for i, (_, x) in enumerate(frames) if np.any(x)), None)
            if i1 is not None and turns and turns[0]["t_first_audio"]:
                out["first_audio"].append((t0 + frames[i1][0] - turns[0]["t_first_audio"]) * 1000)
            if res["clear_at"] is not None and len(turns) > 1 and turns[1]["t_first_audio"]:
                ct, ci = res["clear_at"]
                i2 = next((i for i in range(ci, len(frames)) if np.any(frames[i][1])), None)
                if i2 is not None:
                    out["first_audio"].append((t0 + frames[i2][0] - turns[1]["t_first_audio"]) * 1000)
                if turns[0]["t_interrupted"]:
                    out["clear_client"].append((t0 + ct - turns[0]["t_interrupted"]) * 1000)
        snap = d.status()
        gw = d.child(snap, "gateway-0").get("stats") or {}
        out["clear_gw_p99"] = float(gw.get("clear_latency_p99_ms", float("nan")))
        out["first_frame_gw"] = (float(gw.get("first_frame_p50_ms", float("nan"))),
                                 float(gw.get("first_frame_p99_ms", float("nan"))))
        if peak:
            pss, calls = max(peak, key=lambda x: x[1])
            out["pss_per_call"] = (pss - pss0) / max(1, calls)
    finally:
        d.close()
    return out


def _agent_cpu(n_calls: int) -> dict[str, float]:
    """ms of CPU per call-second, per daemon role, at ``n_calls`` (see the module docstring)."""
    import threading

    import psutil

    from bench import workload
    from bench.bench_load import BrisvoxDaemon
    from bench.loadgen import harness

    wl = workload.load()
    d = BrisvoxDaemon(wl_path=wl.source or None)
    urls = d.start(n_calls)
    samples: list[tuple[float, dict[int, float]]] = []
    stop = threading.Event()
    try:
        time.sleep(2.0)
        procs: dict[int, tuple[str, psutil.Process]] = {}
        for c in psutil.Process(d.pids()[0]).children(recursive=True):
            try:
                title = " ".join(c.cmdline())
            except psutil.Error:
                continue
            procs[c.pid] = (title.split("brisvoxd:")[-1].strip().split(" ")[0], c)

        def sample() -> None:
            while not stop.is_set():
                row: dict[int, float] = {}
                for pid, (_, p) in procs.items():
                    try:
                        t = p.cpu_times()
                        row[pid] = t.user + t.system
                    except psutil.Error:
                        pass
                samples.append((time.monotonic(), row))
                stop.wait(0.25)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            summary = harness.run_loadgen(urls, n_calls, wl, False, timeout_s=wl.load.run_timeout_s + 60)
        finally:
            stop.set()
            th.join()
    finally:
        d.stop()
    w = summary["window"]
    if not samples or not summary["call_seconds"] or w["first_connect"] is None:
        return {}

    def at(t: float) -> dict[int, float]:
        return min(samples, key=lambda s: abs(s[0] - t))[1]

    a, b = at(w["first_connect"]), at(w["last_end"])
    out: dict[str, float] = {}
    for pid, (role, _) in procs.items():
        out[role] = out.get(role, 0.0) + (b.get(pid, 0.0) - a.get(pid, 0.0)) * 1000.0 / summary["call_seconds"]
    return out


def run(quick: bool) -> list[Row]:
    rows: list[Row] = []
    inproc = _inprocess(3 if quick else 10)
    rows.append(("in-process (sim world, real clock): turn end -> LLM request p50", _pct(inproc, 50), "ms", ""))
    rows.append(("in-process (sim world, real clock): turn end -> LLM request p95", _pct(inproc, 95), "ms", "(info: shares the loop with the sim)"))
    rows.append(("actor retained memory after 5 min (without its conversation)", _actor_memory() / 1e6, "MB", "<= 2"))
    t = time.perf_counter()
    dm = _daemon(4 if quick else 20)
    n = 4 if quick else 20
    rows.append((f"daemon, {n} calls: gated turn end -> LLM request p50", _pct(dm["request"], 50), "ms", ""))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls: gated turn end -> LLM request p95", _pct(dm["request"], 95), "ms", "<= 3"))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls: first TTS audio written -> client frame p50", _pct(dm["first_audio"], 50), "ms", ""))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls: first TTS audio written -> client frame p95", _pct(dm["first_audio"], 95), "ms", "<= 5 (to gateway release)"))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls:   of which written -> worker's OutUtterance at the actor p50", _pct(dm["worker_announce"], 50), "ms", ""))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls:   of which written -> worker's OutUtterance at the actor p95", _pct(dm["worker_announce"], 95), "ms", ""))  # type: ignore[arg-type]
    ff50, ff99 = dm["first_frame_gw"]  # type: ignore[misc]
    rows.append((f"daemon, {n} calls:   of which OutUtterance read -> first frame released (gateway p50)", ff50, "ms",
                 "(histogram step 0.05)"))
    rows.append((f"daemon, {n} calls:   of which OutUtterance read -> first frame released (gateway p99)", ff99, "ms",
                 ""))
    rows.append((f"daemon, {n} calls: barge-in decision -> Clear applied (gateway p99)", float(dm["clear_gw_p99"]), "ms", "<= 2 (p95)"))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls: barge-in decision -> client clear event p95", _pct(dm["clear_client"], 95), "ms", ""))  # type: ignore[arg-type]
    rows.append((f"daemon, {n} calls: agent PSS growth per live call", float(dm["pss_per_call"]) / 1e6, "MB", "<= 2"))  # type: ignore[arg-type]
    rows.append(("daemon run wall time", time.perf_counter() - t, "s", ""))
    n = 20 if quick else 100
    cpu = _agent_cpu(n)
    rows.append((f"load workload, {n} calls: agent processes' CPU per call-second (summed)", cpu.get("agent", float("nan")),
                 "ms", "(3.5 before the pump/STT batching)"))
    for role in ("worker", "gateway"):
        rows.append((f"load workload, {n} calls:   for comparison, the {role}'s", cpu.get(role, float("nan")), "ms", ""))
    return rows
