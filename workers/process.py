"""The inference worker process: ``main(rt)`` under brisvoxd, or standalone for tests and benchmarks.

Owns process-level setup around :class:`workers.core.Worker`: thread limits
for numpy/onnxruntime, locating the models (one clear error naming
``brisvox models install`` when one is missing or corrupt: a config-class
failure, so the daemon stops instead of restarting a worker that cannot
boot), warm-up before ready, the stop path.

Standalone: ``python -m workers.process --index N --endpoint ipc://...``
binds the inbox, warms up, prints ``READY <pid> <endpoint>`` on stdout and
serves until SIGTERM/SIGINT or until its parent dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from brisvox.runtime.child_runtime import ChildRuntime

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

log = logging.getLogger("brisvox.workers")

# The tick thread shares the GIL with the job lane's threads; a short switch
# interval bounds how long a job's Python code can hold a tick back.
SWITCH_INTERVAL_S = 0.001


def _models(models_dir: str | None, smart_turn: bool) -> Any:
    from workers.core import WorkerModels
    from workers.models import locate

    silero = locate("silero_vad", models_dir)
    st = locate("smart_turn", models_dir) if smart_turn else None
    return WorkerModels(silero=silero, smart_turn=st)


def main(rt: ChildRuntime) -> int:
    """Role main under brisvoxd (``brisvox/daemon/roles.py``)."""
    from brisvox.runtime import exitcodes
    from brisvox.runtime.memory import freeze_startup_heap
    from workers.core import Worker
    from workers.models import ModelError

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    cfg = rt.config
    settings = cfg.section("workers")
    vad = cfg.section("vad")
    st = cfg.section("smart_turn")
    mcfg = cfg.section("models")
    try:
        models = _models(mcfg.dir or None, st.enabled)
    except ModelError as e:
        rt.fail(str(e), exitcodes.CONFIG)
    ep = rt.inbox_endpoint("worker", rt.index)
    w = Worker(rt.index, ep, models, settings, vad, st, ctx=rt.zmq_context())
    w.load()
    w.bind()
    warm: dict[str, Any] = {k: round(v, 3) for k, v in w.warm_report.items()}
    if w.smart is not None:  # the boot self-benchmark's choice (workers/smart_turn_select.py)
        warm["smart_turn_model"] = w.smart.loaded.name
        warm["smart_turn_ms"] = round(w.smart.choice.ms, 2) if w.smart.choice is not None else None
    rt.event("worker_warm", "models loaded and run once", warm)
    st_ms = warm.get("smart_turn_ms")  # the gateway's max_calls "auto" reads it from the Topology row
    rt.ready({"inbox": ep}, measured={"smart_turn_ms": st_ms} if st_ms else None)
    freeze_startup_heap()
    stop = threading.Event()

    def on_stop() -> None:
        if not rt.drain:
            stop.set()

    rt.add_shutdown_callback(on_stop)
    drainer = threading.Thread(target=_drain_watch, args=(rt, w, stop), daemon=True)
    drainer.start()
    try:
        w.run(stop, heartbeat=rt.heartbeat, report=rt.report)
    finally:
        w.close()
    return 0


def _drain_watch(rt: Any, w: Any, stop: threading.Event) -> None:
    """On a drain, serve until every call detached or the grace period ended."""
    import time

    rt.stopping.wait()
    deadline = time.monotonic() + max(0.0, rt.grace_s)
    while not stop.is_set():
        if not rt.drain or not w.calls or time.monotonic() >= deadline:
            stop.set()
            return
        time.sleep(0.1)


def standalone(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.process", description="run one inference worker")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--max-calls", type=int, default=256)
    ap.add_argument("--tick-ms", type=int, default=None)
    ap.add_argument("--fresh-ms", type=int, default=None)
    ap.add_argument("--job-threads", type=int, default=1)
    ap.add_argument("--no-smart-turn", action="store_true")
    ap.add_argument("--vad-16k", action="store_true",
                    help="8 kHz calls use the 16 kHz model on in16 ([vad] native_8k = false)")
    ap.add_argument("--log-level", default="WARNING")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s worker-%(process)d %(levelname)s %(message)s")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    from workers.config import SmartTurnConfig, VadConfig, WorkersConfig
    from workers.core import Worker
    from workers.models import ModelError

    try:
        models = _models(a.models_dir, not a.no_smart_turn)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    import dataclasses

    settings = WorkersConfig(max_calls=a.max_calls, job_threads=a.job_threads)
    if a.tick_ms is not None:
        settings = dataclasses.replace(settings, tick_ms=a.tick_ms)
    if a.fresh_ms is not None:
        settings = dataclasses.replace(settings, fresh_ms=a.fresh_ms)
    w = Worker(a.index, a.endpoint, models, settings, vad=VadConfig(native_8k=not a.vad_16k),
               smart_turn=SmartTurnConfig(enabled=not a.no_smart_turn))
    w.load()
    w.bind()
    stop = threading.Event()
    parent = os.getppid()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def parent_watch() -> None:
        while not stop.wait(0.25):
            if os.getppid() != parent:
                stop.set()

    threading.Thread(target=parent_watch, daemon=True).start()
    print(f"READY {os.getpid()} {a.endpoint}", flush=True)
    try:
        w.run(stop)
    finally:
        w.close()
    return 0


if __name__ == "__main__":
    sys.exit(standalone())
