"""Inference worker benchmark: real rings, a real worker process, real models, speech in real time.

For 16, 64 and 150 concurrent calls on ONE worker process with the default
settings (``tick_ms = 20``; 8 kHz calls scored by Silero's native 8 kHz mode),
then 150 calls with ``tick_ms = 10``, and 150 calls with the VAD on in16
(``[vad] native_8k = false``: the 16 kHz model on the upsampled audio, the
behaviour before the native 8 kHz path) for a side-by-side comparison:

* CPU ms per call-second of the realtime lane (resample 8 -> 16 kHz, one
  batched Silero run per tick, VAD state machines, ticks to the subscriber):
  the worker process's CPU time over a steady window / (calls x seconds).
* VAD event lag: from the moment the feeder published the sample that ends
  the deciding window (the event's ``at``; for a stop, the end of the
  silence window) to the event's arrival at the subscriber. p50 / p99.
* The same lag while the job lane is saturated with Smart Turn analyses
  (4 requests always outstanding), and the Smart Turn latency (request sent
  -> result received) p50 / p99 under that load.

First, in this process: the CPU of one Smart Turn analysis on one thread
(features and inference separately; the original int8 model with the float64
features vs the worker's path: :class:`workers.mel.LogMel` and the
float32-softmax file derived at install time), and the cost per analysis of ONE
batched inference of 1, 2, 4 and 8 windows for every candidate file
(:func:`smart_turn_batch`: whether the job lane should batch; it does not pay,
docs/BENCHMARKS.md, "Smart Turn cost").

Processes: this one (the subscriber, plus a Smart Turn requester thread with
its own socket), a feeder process writing every call's ``in`` ring in 20 ms
frames on the wall clock (:class:`workers.harness.Feeder`), and the worker
(``python -m workers.process``). Calls play the ``vad_dialog`` fixture
(espeak-ng phrases and pauses) from staggered offsets.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import zmq

from ipc.bus import endpoint, make_socket
from ipc.codec import decode, encode
from ipc.frames import (
    AttachCall,
    Attached,
    ErrorReply,
    SmartTurnRequest,
    SmartTurnResult,
    WorkerTick,
)
from ipc.ring import instance_id
from ipc.tick_events import SpeechStart, SpeechStop, from_wire
from workers.harness import Feeder, WorkerProc, close_rings, create_call_rings

ROOT = Path(__file__).resolve().parent.parent
RATE = 8000
Row = tuple[str, float, str, str]


def _fixture() -> np.ndarray:
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.load("vad_dialog", RATE)[0]


class SmartTurnLoad(threading.Thread):
    """Keeps ``depth`` Smart Turn requests outstanding on the worker (own DEALER)."""

    def __init__(self, ctx: zmq.Context, ep: str, calls: list[str], positions: dict[str, int], depth: int) -> None:
        super().__init__(daemon=True)
        self.sock = make_socket(ctx, zmq.DEALER, identity=b"bench-st")
        self.sock.connect(ep)
        self.calls = calls
        self.positions = positions
        self.depth = depth
        self.stop = threading.Event()
        self.latencies_ms: list[float] = []
        self.took_ms: list[float] = []
        self.errors: dict[str, int] = {}

    def run(self) -> None:
        sent: dict[int, int] = {}
        cid = 0
        i = 0
        while not self.stop.is_set():
            while len(sent) < self.depth:
                call = self.calls[i % len(self.calls)]
                i += 1
                end = self.positions.get(call, 0)
                if end <= 0:
                    break
                cid += 1
                sent[cid] = time.monotonic_ns()
                self.sock.send(encode(SmartTurnRequest(call_id=call, end_pos=end,
                                                       deadline_ns=time.monotonic_ns() + 2 * 10**9), cid=cid))
            if not self.sock.poll(20):
                continue
            data = self.sock.recv()
            from ipc.codec import decode_env

            f, rcid = decode_env(data)
            t0 = sent.pop(rcid, None) if isinstance(rcid, int) else None
            if t0 is None:
                continue
            if isinstance(f, SmartTurnResult):
                self.latencies_ms.append((time.monotonic_ns() - t0) / 1e6)
                self.took_ms.append(f.took_us / 1000)
            elif isinstance(f, ErrorReply):
                self.errors[f.kind] = self.errors.get(f.kind, 0) + 1
        self.sock.close(0)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def measure(n_calls: int, phase_s: float, workdir: Path, worker_args: tuple[str, ...] = ()) -> dict[str, float]:
    audio = _fixture()
    inst = instance_id()
    ep = endpoint(workdir, f"bw{n_calls}")
    proc = WorkerProc(0, ep, max_calls=max(256, n_calls), extra=list(worker_args))
    rings: dict[str, dict] = {}
    feeder = None
    ctx = zmq.Context()
    sub = make_socket(ctx, zmq.DEALER, identity=b"bench-sub")
    load = None
    try:
        proc.start()
        sub.connect(ep)
        rng = np.random.default_rng(n_calls)
        for i in range(n_calls):
            rings[f"b{i}"] = create_call_rings(inst, f"b{i}", RATE, 16000, seconds=16.0)
        for cid, call in enumerate(rings):
            sub.send(encode(AttachCall(call_id=call, subscriber="bench-sub", instance=inst, call_rate=RATE,
                                       tts_rate=16000), cid=cid))
        attached = 0
        while attached < n_calls:
            if not sub.poll(5000):
                raise TimeoutError("attach replies missing")
            f = decode(sub.recv())
            if isinstance(f, Attached):
                attached += 1
            elif isinstance(f, ErrorReply):
                raise RuntimeError(f"attach refused: {f}")
        warm_s = 1.5
        total_s = warm_s + 2 * phase_s + 0.5
        offsets = [int(x) for x in rng.integers(0, len(audio), n_calls)]
        feeder = Feeder([r["in"].name for r in rings.values()], audio, RATE, total_s, offsets, workdir)
        feeder.start(delay_s=0.2)
        ps = psutil.Process(proc.pid)
        t_start = feeder.t0_ns
        p1 = (t_start + int(warm_s * 1e9), t_start + int((warm_s + phase_s) * 1e9))
        p2 = (p1[1], p1[1] + int(phase_s * 1e9))
        positions: dict[str, int] = {}
        arrivals: list[tuple[int, int, str, int, str]] = []  # (arrival_ns, at, kind, tick sent_ns, call)
        index = {call: i for i, call in enumerate(rings)}
        cpu: dict[str, float] = {}
        load = SmartTurnLoad(ctx, ep, list(rings), positions, depth=4)
        end_ns = p2[1]
        while time.monotonic_ns() < end_ns:
            now = time.monotonic_ns()
            if "p1_start" not in cpu and now >= p1[0]:
                cpu["p1_start"] = sum(ps.cpu_times()[:2])
                cpu["t1_start"] = now
            if "p1_end" not in cpu and now >= p1[1]:
                cpu["p1_end"] = sum(ps.cpu_times()[:2])
                cpu["t1_end"] = now
                load.start()
            if not sub.poll(10):
                continue
            f = decode(sub.recv())
            t = time.monotonic_ns()
            if isinstance(f, WorkerTick):
                positions.update(f.positions)
                for e in map(from_wire, f.events):
                    if isinstance(e, SpeechStart | SpeechStop):
                        arrivals.append((t, e.at, e.KIND, f.sent_ns, e.call_id))
        load.stop.set()
        load.join(5)
        times = feeder.times()

        def lags(window: tuple[int, int], kind: str, worker_side: bool = False) -> list[float]:
            out = []
            for t, at, k, sent, call in arrivals:
                if k != kind or not window[0] <= t < window[1]:
                    continue
                # when the frame holding the deciding window's last sample was published
                wt = feeder.write_time_ns(index[call], (at - 1) * RATE // 16000, times)
                if wt:
                    out.append(((sent if worker_side else t) - wt) / 1e6)
            return out

        l1, l2 = lags(p1, "stop"), lags(p2, "stop")
        w1, w2 = lags(p1, "stop", True), lags(p2, "stop", True)
        s1 = lags(p1, "start")
        cpu_ms = (cpu["p1_end"] - cpu["p1_start"]) * 1000
        secs = (cpu["t1_end"] - cpu["t1_start"]) / 1e9
        return {
            "cpu_ms_per_call_s": cpu_ms / (n_calls * secs),
            "stop_lag_p50": _pct(l1, 50), "stop_lag_p99": _pct(l1, 99), "stops": len(l1),
            "start_lag_p99": _pct(s1, 99),
            "worker_lag_p99": _pct(w1, 99), "loaded_worker_lag_p99": _pct(w2, 99),
            "load_avg": psutil.getloadavg()[0],
            "loaded_lag_p50": _pct(l2, 50), "loaded_lag_p99": _pct(l2, 99), "loaded_stops": len(l2),
            "st_p50": _pct(load.latencies_ms, 50), "st_p99": _pct(load.latencies_ms, 99),
            "st_took_p50": _pct(load.took_ms, 50), "st_count": len(load.latencies_ms),
            "st_per_s": len(load.latencies_ms) / phase_s,
        }
    finally:
        if load is not None and load.is_alive():
            load.stop.set()
            load.join(5)
        if feeder is not None:
            feeder.stop()
        sub.close(0)
        proc.stop()
        ctx.term()
        for r in rings.values():
            close_rings(r)


def _rows(label: str, m: dict[str, float]) -> list[Row]:
    return [
        (f"{label}: CPU per call-second, resample + VAD", m["cpu_ms_per_call_s"], "ms", "<= 1.5"),
        (f"{label}: VAD stop lag p50", m["stop_lag_p50"], "ms", ""),
        (f"{label}: VAD stop lag p99 ({m['stops']} stops)", m["stop_lag_p99"], "ms", "<= 40"),
        (f"{label}: VAD start lag p99", m["start_lag_p99"], "ms", ""),
        (f"{label}: stop lag p99 until the tick left the worker", m["worker_lag_p99"], "ms", ""),
        (f"{label}: stop lag p50, job lane saturated", m["loaded_lag_p50"], "ms", ""),
        (f"{label}: stop lag p99, job lane saturated ({m['loaded_stops']})", m["loaded_lag_p99"], "ms",
         f"<= {m['stop_lag_p99'] + 10:.1f} (p99 + 10)"),
        (f"{label}: same, until the tick left the worker", m["loaded_worker_lag_p99"], "ms", ""),
        (f"{label}: Smart Turn latency p50 (4 outstanding)", m["st_p50"], "ms", ""),
        (f"{label}: Smart Turn latency p99 (4 outstanding)", m["st_p99"], "ms", ""),
        (f"{label}: Smart Turn service time p50 (features + inference)", m["st_took_p50"], "ms", ""),
        (f"{label}: Smart Turn analyses per second", m["st_per_s"], "1/s", ""),
        (f"{label}: machine load average at the end of the run", m["load_avg"], "", "report"),
    ]


def smart_turn_cpu(runs: int = 60) -> dict[str, float]:
    """CPU ms (this thread) of one Smart Turn analysis on real speech, 1 onnxruntime thread:
    the float64 reference features vs the worker's :class:`workers.mel.LogMel`, the original
    int8 model vs the float32-softmax file derived at install time. Medians over ``runs``."""
    from workers import mel
    from workers.models import locate
    from workers.smart_turn import SmartTurnModel

    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    dialog = mod.load("vad_dialog", 16000)[0]
    clips = {"8 s of speech": dialog[-128_000:], "3.7 s, left-padded": mod.load("turn_complete", 16000)[0]}
    path = locate("smart_turn")
    orig, new = SmartTurnModel(path, derived=False), SmartTurnModel(path)
    ext = mel.LogMel()

    def cpu_ms(fn, *a: object) -> float:
        fn(*a)
        xs = []
        for _ in range(runs):
            c0 = time.thread_time_ns()
            fn(*a)
            xs.append((time.thread_time_ns() - c0) / 1e6)
        return float(np.median(xs))

    out: dict[str, float] = {"derived": float(new.is_derived)}
    for label, audio in clips.items():
        out[f"features float64, {label}"] = cpu_ms(mel.log_mel, audio)
        out[f"features LogMel, {label}"] = cpu_ms(ext, audio)
    feats = ext(clips["8 s of speech"])
    out["inference original"] = cpu_ms(orig.infer, feats)
    out["inference derived"] = cpu_ms(new.infer, feats)
    out["analysis original"] = cpu_ms(lambda a: orig.infer(mel.log_mel(a)), clips["8 s of speech"])
    out["analysis worker"] = cpu_ms(new.analyze, clips["8 s of speech"])
    return out


BATCH_SIZES = (1, 2, 4, 8)


def smart_turn_batch(runs: int = 12, sizes: tuple[int, ...] = BATCH_SIZES) -> dict[str, float]:
    """Wall and CPU ms PER ANALYSIS of one batched Smart Turn inference of ``n`` real feature
    windows (the model's batch dimension is dynamic), for each candidate file (1 onnxruntime
    thread) and each ``n`` in ``sizes``; medians over ``runs`` interleaved rounds (every file
    and size once per round, so load changes hit them alike). Also the largest |p| difference
    between a batch row and the same window run alone (``maxdiff``)."""
    from workers import mel
    from workers.models import locate
    from workers.smart_turn import ort_session
    from workers.smart_turn_select import candidates

    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    dialog = mod.load("vad_dialog", 16000)[0]
    ext = mel.LogMel()
    # 8 different windows: the dialog's 8 s windows ending at spread positions, the shorter ones left-padded
    ends = np.linspace(48_000, len(dialog), max(sizes)).astype(int)
    feats = np.stack([ext(dialog[max(0, e - mel.WINDOW_SAMPLES):e]).copy() for e in ends])
    cands, _ = candidates(locate("smart_turn"))
    sessions = {c.label: ort_session(c.path, 1) for c in cands}
    out_name = {k: s.get_outputs()[0].name for k, s in sessions.items()}

    def run(label: str, x: np.ndarray) -> np.ndarray:
        (p,) = sessions[label].run([out_name[label]], {"input_features": x})
        return np.asarray(p).reshape(-1)

    out: dict[str, float] = {}
    for label in sessions:
        single = np.array([run(label, feats[i:i + 1])[0] for i in range(len(feats))])
        for n in sizes:  # warm each shape once (onnxruntime plans per shape) and check the rows
            got = run(label, feats[:n])
            out[f"maxdiff {label} b{n}"] = float(np.max(np.abs(got - single[:n])))
    wall: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for _ in range(runs):
        for n in sizes:
            for label in sessions:
                x = feats[:n]
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                run(label, x)
                wall.setdefault((label, n), []).append((time.perf_counter_ns() - t0) / 1e6 / n)
                cpu.setdefault((label, n), []).append((time.thread_time_ns() - c0) / 1e6 / n)
    for (label, n), xs in wall.items():
        out[f"wall {label} b{n}"] = float(np.median(xs))
        out[f"cpu {label} b{n}"] = float(np.median(cpu[(label, n)]))
    out["load_avg"] = psutil.getloadavg()[0]
    return out


def _st_batch_rows(m: dict[str, float]) -> list[Row]:
    rows: list[Row] = []
    for k, v in m.items():
        if k == "load_avg":
            rows.append(("Smart Turn batch: machine load average at the end", v, "", "report"))
        elif k.startswith("maxdiff"):
            rows.append((f"Smart Turn batch: {k} (|p| batch row vs alone)", v, "", "<= 1e-4"))
        else:
            kind, label, n = k.split()
            rows.append((f"Smart Turn batch of {n[1:]}, {label}: {kind} per analysis", v, "ms", "report"))
    return rows


def _st_rows(m: dict[str, float]) -> list[Row]:
    rows: list[Row] = [(f"Smart Turn CPU per analysis (1 thread): {k}", v, "ms", "report")
                       for k, v in m.items() if k != "derived"]
    rows.append(("Smart Turn: worker loads the derived float32-softmax file", m["derived"], "bool", "1"))
    # the load benchmark's workload asks 0.18 analyses per call-second (docs/BENCHMARKS.md, "Load")
    for k in ("original", "worker"):
        rows.append((f"Smart Turn CPU per call-second at 0.18 analyses/call-s: {k}",
                     0.18 * m[f"analysis {k}"], "ms", "report"))
    return rows


def run(quick: bool = False) -> list[Row]:
    """Default settings (tick 20 ms) for 16, 64, 150 calls; then 150 calls with ``tick_ms = 10`` and
    150 calls with the 16 kHz VAD on in16 (``--vad-16k``)."""
    import tempfile

    rows: list[Row] = _st_rows(smart_turn_cpu(20 if quick else 60))
    rows += _st_batch_rows(smart_turn_batch(3 if quick else 12))
    sizes = (16,) if quick else (16, 64, 150)
    phase_s = 3.0 if quick else 12.0
    with tempfile.TemporaryDirectory(prefix="bvb", dir="/tmp") as td:
        for n in sizes:
            rows += _rows(f"{n} calls", measure(n, phase_s, Path(td)))
        if not quick:
            rows += _rows("150 calls, tick 10 ms", measure(150, phase_s, Path(td), ("--tick-ms", "10")))
            rows += _rows("150 calls, VAD on in16 (native_8k off)", measure(150, phase_s, Path(td), ("--vad-16k",)))
    return rows
