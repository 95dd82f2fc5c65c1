"""brisvox under the shared workload: the load benchmark of issue 8 (brisvox side).

``python -m bench load [--quick]``. For each N of ``workload.toml``'s
``load.brisvox_calls`` it starts ``brisvoxd start --foreground`` fresh with the
bench config, drives N Twilio Media Streams calls at its WebSocket ingress
with the load generator, samples CPU and PSS summed over the daemon's whole
process tree (supervisor, gateway, workers, agents), stops it, and reports the
same rows as ``bench_pipecat`` (definitions in ``bench/loadgen/harness.py``).

It needs only two things from brisvox, both overridable:

* the daemon command: ``BRISVOX_BENCH_CMD`` (shell words), default
  ``.venv/bin/brisvoxd start --foreground --config configs/brisvoxd.bench.toml``
  (``BRISVOX_BENCH_CONFIG`` replaces just the config path). The bench config
  must route ``/twilio`` to the scripted bench agent, whose STT/LLM/TTS timing
  comes from ``bench/workload.toml`` (its path is passed to the daemon in
  ``BRISVOX_BENCH_WORKLOAD``), with the real local VAD and Smart Turn;
* the WebSocket URL: ``BRISVOX_BENCH_URL``, default ``ws://127.0.0.1:8765/twilio``.

Failure is a message, never a hang: a missing command or config, a port
already taken by something else, a daemon that exits or does not accept
connections within ``READY_TIMEOUT_S``, or a daemon that accepts but completes
no call all raise ``ServerError`` with the daemon's last log lines.

Invariants: only the daemon this module started (and the descendants it
forked, found by pid) are signalled; the daemon is stopped after each level
even when the level failed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil

from bench import workload
from bench.loadgen import harness

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "brisvoxd.bench.toml"
DEFAULT_URL = "ws://127.0.0.1:8765/twilio"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0

TARGETS = {
    "mem": "<= 5",
    "p95": "<= N=1 p95 + 50",
    "largest": ">= 150 (target 200)",
    "last": "<= 300",
}


def daemon_command() -> list[str]:
    cmd = os.environ.get("BRISVOX_BENCH_CMD")
    if cmd:
        return shlex.split(cmd)
    config = Path(os.environ.get("BRISVOX_BENCH_CONFIG", DEFAULT_CONFIG))
    return [str(REPO / ".venv" / "bin" / "brisvoxd"), "start", "--foreground", "--config", str(config)]


class BrisvoxDaemon:
    """Starts and stops ``brisvoxd`` for one level."""

    name = "brisvox"
    process_per_call = False

    def __init__(self, cmd: list[str] | None = None, url: str | None = None,
                 wl_path: str | None = None) -> None:
        self.cmd = cmd or daemon_command()
        self.url = url or os.environ.get("BRISVOX_BENCH_URL", DEFAULT_URL)
        u = urlparse(self.url)
        if u.scheme not in ("ws", "wss") or not u.hostname:
            raise harness.ServerError(f"BRISVOX_BENCH_URL {self.url!r} is not a ws:// URL")
        self.host, self.port = u.hostname, u.port or 80
        self.wl_path = wl_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    def describe(self) -> str:
        return f"brisvoxd ({' '.join(self.cmd[1:])}) at {self.url}"

    def _check_command(self) -> None:
        exe = self.cmd[0]
        if not (Path(exe).exists() or shutil.which(exe)):
            raise harness.ServerError(f"daemon command not found: {exe} (is brisvox installed? `make install`)")
        if "--config" in self.cmd:
            cfg = Path(self.cmd[self.cmd.index("--config") + 1])
            if not cfg.exists():
                raise harness.ServerError(
                    f"bench config {cfg} does not exist: create it (the daemon config whose /twilio "
                    "route uses the scripted bench agent timed by bench/workload.toml), or set "
                    "BRISVOX_BENCH_CONFIG / BRISVOX_BENCH_CMD")

    def _port_open(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start(self, n_calls: int) -> list[str]:
        self.stop()
        self._check_command()
        if self._port_open():
            raise harness.ServerError(f"{self.host}:{self.port} is already in use by another process; "
                                      "stop it or point BRISVOX_BENCH_URL elsewhere")
        out = REPO / "bench" / "out"
        out.mkdir(parents=True, exist_ok=True)
        self._log = out / "brisvoxd-bench.log"
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        if self.wl_path:
            env["BRISVOX_BENCH_WORKLOAD"] = self.wl_path
        with open(self._log, "wb") as logf:
            try:
                self._proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True)
            except OSError as e:
                raise harness.ServerError(f"cannot run {self.cmd[0]}: {e}") from None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._port_open():
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise harness.ServerError(f"brisvoxd exited with code {code} before serving {self.url}; "
                                          f"last log lines:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise harness.ServerError(f"brisvoxd did not accept connections on {self.host}:{self.port} "
                                          f"within {READY_TIMEOUT_S:.0f} s; last log lines:\n{self.log_tail()}")
            time.sleep(0.2)
        return [self.url]

    def log_tail(self, n: int = 15) -> str:
        if self._log is None or not self._log.exists():
            return "(no log)"
        return "\n".join(self._log.read_text(errors="replace").strip().splitlines()[-n:])

    def pids(self) -> list[int]:
        return [self._proc.pid] if self._proc is not None else []

    def stop(self) -> None:
        p = self._proc
        if p is None:
            return
        self._proc = None
        try:
            tree = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # the supervisor stops its children
            try:
                p.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for child in tree:  # anything the supervisor left behind, by pid
            try:
                if child.is_running():
                    child.kill()
            except psutil.Error:
                pass


def measure(quick: bool, ns: list[int] | None = None,
            wl: workload.Workload | None = None) -> tuple[list[harness.Level], int, str]:
    """Measure brisvox; returns (levels, largest N held, description)."""
    wl = wl or workload.load()
    daemon = BrisvoxDaemon(wl_path=wl.source or None)
    levels_n = ns or list(wl.load.brisvox_calls_quick if quick else wl.load.brisvox_calls)
    try:
        levels, largest = harness.measure(daemon, levels_n, wl, quick)
    except harness.ServerError as e:
        if "last log lines" in str(e) or daemon._log is None:
            raise
        raise harness.ServerError(f"{e}\nbrisvoxd's last log lines:\n{daemon.log_tail()}") from None
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as f:
        json.dump({"server": daemon.describe(), "largest_n_held": largest,
                   "levels": [harness.level_json(lv) for lv in levels]}, f, indent=1)
    os.replace(f.name, out / "brisvox.json")
    return levels, largest, daemon.describe()


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    wl = workload.load()
    levels, largest, describe = measure(quick, wl=wl)
    rows = harness.rows("brisvox", levels, largest, wl, TARGETS)
    rows.insert(0, ("brisvox: how it was run", describe, "", ""))
    return rows
