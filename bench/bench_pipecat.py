"""Pipecat 1.14 under the shared workload: the reference side of the load comparison.

``python -m bench pipecat [--quick]``. Installs ``bench/.venv-pipecat`` if needed
(``bench/pipecat/install.sh``), then for each N of ``workload.toml``'s
``load.pipecat_calls`` starts a fresh fleet of ``bench/pipecat/server.py`` processes,
drives N Twilio calls at it with the load generator and reports CPU per call,
memory per call, turn/clear latencies, late frames and the largest N held
(see ``bench/loadgen/harness.py`` for the definitions).

How Pipecat is run (``BENCH_PIPECAT_MODE``):

* ``per-call`` (default): one server process per call, as Pipecat's
  maintainers recommend (a dispatcher in front gives each call a warm
  process); memory per call is then the process's whole PSS. Measured here
  (quick runs, noisy machine), it holds more calls than the alternatives:
  10 calls with no late frame, where 2 processes sharing the calls already
  had frames 55-105 ms late at 5-10 calls, and one process for all calls
  138 ms late at 10 calls. Consistent with this: as in the Twilio example, a
  new call builds its SileroVADAnalyzer and LocalSmartTurnAnalyzerV3 on the
  event loop that the other calls' audio shares, and building them took
  50-120 ms here.
* ``per-core``: one process per core (2 here), calls spread round-robin.
* ``single``: every call in one process.

Every server process gets ``OPENBLAS_NUM_THREADS=1`` / ``OMP_NUM_THREADS=1``
(numpy's OpenBLAS helper thread otherwise busy-waits: about 4% of a core per
process at one call, measured on 2 cores), and Pipecat's log level WARNING: the settings a
careful operator would use, so the comparison does not flatter brisvox.

Invariants: only processes this module started are signalled, by pid; each
server is stopped after its level even if the run failed; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import workload
from bench.loadgen import harness

HERE = Path(__file__).resolve().parent
VENV_PY = HERE / ".venv-pipecat" / "bin" / "python"
SERVER = HERE / "pipecat" / "server.py"
INSTALL = HERE / "pipecat" / "install.sh"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0
MODES = ("per-core", "per-call", "single")


def ensure_venv() -> None:
    r = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 or not VENV_PY.exists():
        raise harness.ServerError(f"bench/pipecat/install.sh failed: {r.stderr.strip()[-600:]}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PipecatFleet:
    """Starts and stops the Pipecat server processes for one level."""

    name = "pipecat"

    def __init__(self, mode: str = "per-call", wl_path: str | None = None, log_dir: Path | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.process_per_call = mode == "per-call"
        self.wl_path = wl_path
        self.log_dir = log_dir or HERE / "out" / "pipecat-logs"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._ports: list[int] = []

    def processes_for(self, n_calls: int) -> int:
        if self.mode == "per-call":
            return n_calls
        if self.mode == "single":
            return 1
        return max(1, min(n_calls, os.cpu_count() or 1))

    def describe(self) -> str:
        return f"Pipecat 1.14.0, mode {self.mode} (server processes = {self.mode.replace('-', ' ')})"

    def start(self, n_calls: int) -> list[str]:
        self.stop()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)
        for i in range(self.processes_for(n_calls)):
            port = free_port()
            cmd = [str(VENV_PY), str(SERVER), "--port", str(port)]
            if self.wl_path:
                cmd += ["--workload", self.wl_path]
            logf = open(self.log_dir / f"server-{i}.log", "wb")  # noqa: SIM115 - closed with the process
            try:
                p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
            finally:
                logf.close()
            self._procs.append(p)
            self._ports.append(port)
        self._wait_ready()
        return [f"ws://127.0.0.1:{port}/twilio" for port in self._ports]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(zip(self._procs, self._ports, strict=True))
        while pending:
            p, port = pending[0]
            if p.poll() is not None:
                log = (self.log_dir / f"server-{self._procs.index(p)}.log").read_text(errors="replace")
                self.stop()
                raise harness.ServerError(f"Pipecat server on port {port} exited ({p.returncode}): "
                                          f"{log.strip()[-600:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1.0) as r:
                    if json.loads(r.read()).get("ok"):
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise harness.ServerError(f"Pipecat server on port {port} not serving after "
                                          f"{READY_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self._procs = []
        self._ports = []


def measure(quick: bool, mode: str | None = None, ns: list[int] | None = None,
            wl: workload.Workload | None = None) -> tuple[list[harness.Level], int, str]:
    """Measure Pipecat; returns (levels, largest N held, description)."""
    ensure_venv()
    wl = wl or workload.load()
    fleet = PipecatFleet(mode or os.environ.get("BENCH_PIPECAT_MODE", "per-call"), wl.source or None)
    levels_n = ns or list(wl.load.pipecat_calls_quick if quick else wl.load.pipecat_calls)
    levels, largest = harness.measure(fleet, levels_n, wl, quick)
    _save(levels, largest, fleet.describe())
    return levels, largest, fleet.describe()


def _save(levels: list[harness.Level], largest: int, describe: str) -> None:
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "pipecat.json").write_text(json.dumps(
        {"server": describe, "largest_n_held": largest, "levels": [harness.level_json(lv) for lv in levels]},
        indent=1))


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    wl = workload.load()
    levels, largest, describe = measure(quick, wl=wl)
    rows = harness.rows("pipecat", levels, largest, wl)
    rows.insert(0, ("pipecat: how it was run", describe, "", ""))
    return rows
