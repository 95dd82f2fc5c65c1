"""brisvox under the shared workload: the load benchmark against Pipecat (brisvox side).

``python -m bench load [--quick]``. For each N of ``workload.toml``'s
``load.brisvox_calls`` it starts ``brisvoxd start --foreground`` fresh with the
bench config, drives N Twilio Media Streams calls at its WebSocket ingress
with the load generator, samples CPU and PSS summed over the daemon's whole
process tree (supervisor, gateway, workers, agents), stops it, and reports the
same rows as ``bench_pipecat`` (definitions in ``bench/loadgen/harness.py``),
among them the server-side CPU per call-second (the daemon's processes only),
the load generator's own (sampled apart, never subtracted) and the calls per
core that the server-side figure implies (labelled implied; "held" is measured).

It needs only two things from brisvox, both overridable:

* the daemon command: ``BRISVOX_BENCH_CMD`` (shell words), default
  ``.venv/bin/brisvoxd start --foreground --config configs/brisvoxd.bench.toml``
  (``BRISVOX_BENCH_CONFIG`` replaces just the config path). The bench config
  must route ``/twilio`` to the scripted bench agent, whose STT/LLM/TTS timing
  comes from ``bench/workload.toml`` (its path is passed to the daemon in
  ``BRISVOX_BENCH_WORKLOAD``), with the real local VAD and Smart Turn;
* the WebSocket URL: ``BRISVOX_BENCH_URL``, default ``ws://127.0.0.1:8775/twilio``.

``BRISVOX_BENCH_CALLS`` (e.g. ``1,25,50,75,100,125,150``) replaces the workload's
levels. The bench config (``configs/brisvoxd.bench.toml``) routes ``/twilio`` to
``configs/agents/bench.toml``: scripted STT/LLM/TTS stand-ins
(``brisvox/providers/scripted_speech.py``, ``scripted_llm.py``) timed by the
workload, with the real Silero VAD and Smart Turn in the worker.

Latency breakdown: with a ``--config`` command the daemon runs a derived copy of
the config (written to a temporary folder, deleted after the level) that writes
one call record per call into a temporary folder (``[calls]``) and names the
agent files' folder of the original; the records' timeline marks are joined with
the load generator's own stamps per call and turn (:mod:`bench.breakdown`) and
printed as rows. ``BRISVOX_BENCH_EARLY_TURN_MS`` (e.g. ``100``) also sets the
workers' ``[vad] fall_delay_ms`` to it and ``[agents] early_smart_turn`` on
(``0``: off, the fall delay left as the config has it), to measure the early Smart
Turn analysis; ``BRISVOX_BENCH_EARLY_FINALIZE_MS`` the same for ``[agents]
early_finalize`` (the STT's Finalize at the falling event; the bench config ships it
on at 100 ms, so ``0`` measures without it).

Speculative LLM start (docs/LATENCY.md): ``BRISVOX_BENCH_SPECULATION`` = ``off``,
``final`` (``[speculation] enabled``) or ``partial`` (also ``on_partial``), and
``BRISVOX_BENCH_INTERIM_LAG`` = k (the scripted STT's interims lag its final by k
words, ``interim_lag_words``; 0: the last interim equals the final, as the bench
agent ships). Either set, the derived config names a copy of the agent files' folder
(in the same temporary folder) whose routed agents have those keys set; unset, the
agent files are used as they are. ``BRISVOX_BENCH_DENOISE`` = ``off``, ``rnnoise`` or
``deepfilter`` sets the routed agents' ``[audio] denoise`` the same way (the noise
suppression in the workers, docs/PROVIDERS.md). Every level prints the call records' summed
speculation counters (:func:`bench.breakdown.speculation`).

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
import re
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

from bench import breakdown, workload
from bench.loadgen import harness

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "brisvoxd.bench.toml"
DEFAULT_URL = "ws://127.0.0.1:8775/twilio"  # configs/brisvoxd.bench.toml's port
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0

# the daemon's own counters reported next to the client's figures (bench/out/brisvox.json)
SERVER_KEYS: dict[str, tuple[str, ...]] = {
    "gateway": ("call_late_frames_total", "call_underruns_total", "tick_late_p99_ms", "clear_latency_p99_ms"),
    "worker": ("jobs_done", "jobs_expired", "jobs_superseded", "jobs_cancelled", "vad_prompt", "prompt_cpu_ms",
               "end_hints", "tick_max_ms", "jobs_wait_us_total", "jobs_wait_us_max", "jobs_run_us_total", "jobs_run_us_max", "jobs_cpu_us_total", "jobs_wait_p95_us", "jobs_cpu_p95_us"),
}

TARGETS = {
    "mem": "<= 5",
    "p95": "<= N=1 p95 + 50",
    "largest": ">= 150 (target 200)",
    "last": "<= 300",
}


def early_turn_ms(name: str = "BRISVOX_BENCH_EARLY_TURN_MS") -> int | None:
    """``BRISVOX_BENCH_EARLY_TURN_MS`` (or ``name``, e.g. ``BRISVOX_BENCH_EARLY_FINALIZE_MS``):
    None (unset: the config's own), 0 (off) or the fall delay."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        ms = int(raw)
    except ValueError:
        raise harness.ServerError(f"{name} {raw!r}: expected milliseconds") from None
    if ms < 0:
        raise harness.ServerError(f"{name} must be >= 0")
    return ms


SPECULATION_MODES: dict[str, dict[str, Any]] = {  # BRISVOX_BENCH_SPECULATION -> [speculation]
    "off": {"enabled": False, "on_partial": False},
    "final": {"enabled": True, "on_partial": False},
    "partial": {"enabled": True, "on_partial": True},
}


def speculation_mode() -> str | None:
    """``BRISVOX_BENCH_SPECULATION``: None (unset: the agent file's own), or a key of
    :data:`SPECULATION_MODES`."""
    raw = os.environ.get("BRISVOX_BENCH_SPECULATION", "").strip().lower()
    if not raw:
        return None
    if raw not in SPECULATION_MODES:
        raise harness.ServerError(f"BRISVOX_BENCH_SPECULATION {raw!r}: expected one of "
                                  f"{', '.join(SPECULATION_MODES)}")
    return raw


def interim_lag() -> int | None:
    """``BRISVOX_BENCH_INTERIM_LAG``: None (unset: the agent file's own) or words >= 0."""
    raw = os.environ.get("BRISVOX_BENCH_INTERIM_LAG", "").strip()
    if not raw:
        return None
    try:
        k = int(raw)
    except ValueError:
        raise harness.ServerError(f"BRISVOX_BENCH_INTERIM_LAG {raw!r}: expected a number of words") from None
    if k < 0:
        raise harness.ServerError("BRISVOX_BENCH_INTERIM_LAG must be >= 0")
    return k


DENOISE_MODES = ("off", "rnnoise", "deepfilter")


def denoise_mode() -> str | None:
    """``BRISVOX_BENCH_DENOISE``: None (unset: the agent file's own ``[audio] denoise``) or a mode."""
    raw = os.environ.get("BRISVOX_BENCH_DENOISE", "").strip().lower()
    if not raw:
        return None
    if raw not in DENOISE_MODES:
        raise harness.ServerError(f"BRISVOX_BENCH_DENOISE {raw!r}: expected one of {', '.join(DENOISE_MODES)}")
    return raw


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a TOML basic string


def set_keys(text: str, section: str, values: dict[str, Any]) -> str:
    """``text`` (TOML) with ``values`` set in ``[section]`` (one-line keys replaced, the
    section appended when missing)."""
    lines = text.splitlines()
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    start, end = None, len(lines)
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("["):
            if start is not None:
                end = i
                break
            m = header.match(ln)
            if m and m.group(1).strip() == section:
                start = i
    new = [f"{k} = {_toml_value(v)}  # set by bench/bench_load.py" for k, v in values.items()]
    if start is None:
        return text.rstrip("\n") + f"\n\n[{section}]\n" + "\n".join(new) + "\n"
    key = re.compile(r"^\s*(" + "|".join(re.escape(k) for k in values) + r")\s*=")
    body = [ln for ln in lines[start + 1:end] if not key.match(ln)]
    return "\n".join(lines[:start + 1] + new + body + lines[end:]) + "\n"


def derive_agents(src: Path, agents_dst: Path, spec: str | None, lag: int | None,
                  denoise: str | None = None) -> None:
    """Copy the agent files of bench config ``src`` into ``agents_dst``, with the routed
    agents' (the WebSocket routes' and the default) ``[speculation]`` set to ``spec``'s
    keys, their ``[stt.options] interim_lag_words`` to ``lag`` and their ``[audio] denoise``
    to ``denoise`` (None: left as is)."""
    from brisvox.config.daemon import load_config

    cfg = load_config(str(src))
    agents_dir = cfg.section("agents").agents_path(str(src))
    routed = {r.agent for r in cfg.section("websocket").routes if r.agent}
    routed |= {a for r in cfg.section("websocket").routes for a in r.agents}
    routed.add(cfg.section("agents").default_agent)
    agents_dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(agents_dir.glob("*.toml")):
        text = f.read_text()
        if f.stem in routed:
            if spec is not None:
                text = set_keys(text, "speculation", SPECULATION_MODES[spec])
            if lag is not None:
                text = set_keys(text, "stt.options", {"interim_lag_words": lag})
            if denoise is not None:
                text = set_keys(text, "audio", {"denoise": denoise})
        (agents_dst / f.name).write_text(text)


def derive_config(src: Path, records: Path, early_ms: int | None, agents_dir: Path | None = None,
                  early_finalize_ms: int | None = None) -> str:
    """The bench config ``src`` writing call records into ``records``, with its agent files
    where the original finds them (or in ``agents_dir``), and the early Smart Turn and
    early finalize settings when asked (both set and above 0: the same fall delay)."""
    from brisvox.config.daemon import load_config

    if agents_dir is None:
        agents_dir = load_config(str(src)).section("agents").agents_path(str(src))
    text = src.read_text()
    text = set_keys(text, "calls", {"records": True, "path": str(records), "keep_days": 0})
    text = set_keys(text, "agents", {"agents_dir": str(agents_dir)})
    if early_ms and early_finalize_ms and early_ms != early_finalize_ms:
        raise harness.ServerError("BRISVOX_BENCH_EARLY_TURN_MS and BRISVOX_BENCH_EARLY_FINALIZE_MS set the "
                                  "same [vad] fall_delay_ms: give them one value")
    if early_ms is not None:
        text = set_keys(text, "agents", {"early_smart_turn": early_ms > 0})
    if early_finalize_ms is not None:
        text = set_keys(text, "agents", {"early_finalize": early_finalize_ms > 0})
    if fall := max(early_ms or 0, early_finalize_ms or 0):  # 0 leaves the config's (the other may use it)
        text = set_keys(text, "vad", {"fall_delay_ms": fall})
    return text


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
        self._n = 0
        self.server_stats: dict[int, dict[str, float]] = {}  # N -> the daemon's own counters at the end
        self.records: dict[int, list[dict[str, Any]]] = {}  # N -> the call records of the level
        self.early_ms = early_turn_ms()
        self.early_finalize_ms = early_turn_ms("BRISVOX_BENCH_EARLY_FINALIZE_MS")
        self.spec = speculation_mode()
        self.lag = interim_lag()
        self.denoise = denoise_mode()
        self.spec_stats: dict[int, dict[str, Any]] = {}  # N -> the level's speculation counters
        self._run_cmd = self.cmd  # the command of the current level (its derived config)
        self._tmp: Path | None = None  # the level's derived config and records

    def describe(self) -> str:
        early = "" if self.early_ms is None else f", early Smart Turn fall_delay_ms={self.early_ms}"
        if self.early_finalize_ms is not None:
            early += f", early finalize fall_delay_ms={self.early_finalize_ms}"
        if self.spec is not None:
            early += f", speculation {self.spec}"
        if self.lag is not None:
            early += f", interims lag the final by {self.lag} word(s)"
        if self.denoise is not None:
            early += f", [audio] denoise = {self.denoise}"
        return f"brisvoxd ({' '.join(self.cmd[1:])}{early}) at {self.url}"

    def _derive(self) -> list[str]:
        """The command with the derived config (records on), or as given without ``--config``."""
        if "--config" not in self.cmd:
            return self.cmd
        i = self.cmd.index("--config") + 1
        self._tmp = Path(tempfile.mkdtemp(prefix="bvbench"))
        (self._tmp / "calls").mkdir(mode=0o700)
        cfg = self._tmp / "brisvoxd.toml"
        agents = None
        if self.spec is not None or self.lag is not None or self.denoise is not None:
            agents = self._tmp / "agents"
            derive_agents(Path(self.cmd[i]), agents, self.spec, self.lag, self.denoise)
        cfg.write_text(derive_config(Path(self.cmd[i]), self._tmp / "calls", self.early_ms, agents,
                                     self.early_finalize_ms))
        return [*self.cmd[:i], str(cfg), *self.cmd[i + 1:]]

    def _take_records(self) -> None:
        tmp, self._tmp = self._tmp, None
        if tmp is None:
            return
        self.records[self._n] = breakdown.read_records(tmp / "calls")
        self.spec_stats[self._n] = breakdown.speculation(self.records[self._n])
        shutil.rmtree(tmp, ignore_errors=True)

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
        self._n = n_calls
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
        self._run_cmd = self._derive()
        with open(self._log, "wb") as logf:
            try:
                self._proc = subprocess.Popen(self._run_cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT,
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

    def _runtime_dir(self) -> Path | None:
        cmd = self._run_cmd
        if "--config" not in cmd:
            return None
        try:
            from brisvox.config.daemon import load_config
            from brisvox.runtime.paths import runtime_dir

            return runtime_dir(load_config(cmd[cmd.index("--config") + 1]))
        except Exception:  # noqa: BLE001 - diagnostics only
            return None

    def _collect(self) -> None:
        """The daemon's own view of the run (before it stops): the gateway's late frames
        and underruns, its pacer's tick lateness, the worker's Smart Turn jobs, the agents'."""
        rdir = self._runtime_dir()
        if rdir is None:
            return
        try:
            from ipc.bus import endpoint, request_sync
            from ipc.frames import Command

            snap = request_sync(endpoint(rdir, "control"), Command(name="status"), 3.0).data
        except Exception:  # noqa: BLE001 - diagnostics only
            return
        out: dict[str, float] = {}
        for c in snap.get("children", []):
            st = c.get("stats") or {}
            for key in SERVER_KEYS.get(c.get("role", ""), ()):
                if isinstance(st.get(key), int | float):
                    name = f"{c['role']}.{key}"
                    agg = max if key.endswith(("_ms", "_max_ms", "_p95_us")) else (lambda a, b: a + b)
                    out[name] = agg(out[name], st[key]) if name in out else st[key]
        self.server_stats[self._n] = out

    def stop(self) -> None:
        try:
            self._stop()
        finally:
            self._take_records()  # written at each hang-up: complete once the daemon stopped

    def _stop(self) -> None:
        p = self._proc
        if p is None:
            return
        if p.poll() is None:
            self._collect()
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


def env_levels() -> list[int] | None:
    """``BRISVOX_BENCH_CALLS="1,25,50,75,100"`` replaces the workload's levels (the first
    should be 1: the single-call p95 is the baseline every level is held to)."""
    raw = os.environ.get("BRISVOX_BENCH_CALLS", "").strip()
    if not raw:
        return None
    try:
        ns = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise harness.ServerError(f"BRISVOX_BENCH_CALLS {raw!r}: expected comma-separated call counts") from None
    if not ns or min(ns) < 1:
        raise harness.ServerError(f"BRISVOX_BENCH_CALLS {raw!r}: call counts must be >= 1")
    return ns


def measure(quick: bool, ns: list[int] | None = None,
            wl: workload.Workload | None = None) -> tuple[list[harness.Level], int, str]:
    """Measure brisvox; returns (levels, largest N held, description)."""
    wl = wl or workload.load()
    daemon = BrisvoxDaemon(wl_path=wl.source or None)
    levels_n = ns or env_levels() or list(wl.load.brisvox_calls_quick if quick else wl.load.brisvox_calls)
    try:
        levels, largest = harness.measure(daemon, levels_n, wl, quick)
    except harness.ServerError as e:
        if "last log lines" in str(e) or daemon._log is None:
            raise
        raise harness.ServerError(f"{e}\nbrisvoxd's last log lines:\n{daemon.log_tail()}") from None
    bds: dict[int, dict[str, Any] | None] = {
        lv.n: breakdown.breakdown(lv.summary.get("timeline", []), daemon.records[lv.n])
        if lv.n in daemon.records else None for lv in levels}
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as f:
        json.dump({"server": daemon.describe(), "largest_n_held": largest,
                   "levels": [dict(harness.level_json(lv), server=daemon.server_stats.get(lv.n, {}),
                                   breakdown=bds.get(lv.n), speculation=daemon.spec_stats.get(lv.n))
                              for lv in levels]}, f, indent=1)
    os.replace(f.name, out / "brisvox.json")
    LAST_SERVER_STATS.clear()
    LAST_SERVER_STATS.update(daemon.server_stats)
    LAST_BREAKDOWN.clear()
    LAST_BREAKDOWN.update(bds)
    LAST_SPECULATION.clear()
    LAST_SPECULATION.update(daemon.spec_stats)
    LAST_RECORDS.clear()
    LAST_RECORDS.update(daemon.records)
    return levels, largest, daemon.describe()


LAST_SERVER_STATS: dict[int, dict[str, float]] = {}
LAST_BREAKDOWN: dict[int, dict[str, Any] | None] = {}  # N -> the level's latency breakdown
LAST_SPECULATION: dict[int, dict[str, Any]] = {}  # N -> the level's summed speculation counters
LAST_RECORDS: dict[int, list[dict[str, Any]]] = {}  # N -> the level's call records (bench s2s reads them)


def speculation_rows(levels: list[harness.Level]) -> list[tuple[str, Any, str, str]]:
    """Per level, the speculation counters of its call records."""
    out: list[tuple[str, Any, str, str]] = []
    for lv in levels:
        out += breakdown.speculation_rows(f"brisvox N={lv.n}:", LAST_SPECULATION.get(lv.n))
    return out


def breakdown_rows(levels: list[harness.Level]) -> list[tuple[str, Any, str, str]]:
    """Per level, the latency breakdown: where each turn's milliseconds went."""
    out: list[tuple[str, Any, str, str]] = []
    for lv in levels:
        out += breakdown.rows(f"brisvox N={lv.n}:", LAST_BREAKDOWN.get(lv.n))
    return out


def server_rows(levels: list[harness.Level]) -> list[tuple[str, Any, str, str]]:
    """The daemon's own view of each level: did the gateway release late or run dry (a
    server-side stall), or was a frame only stamped late by a stalled load generator?"""
    out: list[tuple[str, Any, str, str]] = []
    for lv in levels:
        st = LAST_SERVER_STATS.get(lv.n)
        if not st:
            continue
        p = f"brisvox N={lv.n}:"
        out += [
            (f"{p} gateway frames released > 1 frame late", st.get("gateway.call_late_frames_total"), "frames", "0"),
            (f"{p} gateway underruns (out ring ran dry)", st.get("gateway.call_underruns_total"), "", "0"),
            (f"{p} gateway pacer tick lateness p99", st.get("gateway.tick_late_p99_ms"), "ms", ""),
            (f"{p} barge-in decision -> Clear applied in the gateway p99", st.get("gateway.clear_latency_p99_ms"),
             "ms", "<= 2"),
            (f"{p} Smart Turn analyses expired in the queue", st.get("worker.jobs_expired"),
             f"of {int(st.get('worker.jobs_done', 0) + st.get('worker.jobs_expired', 0))}", "0"),
            (f"{p} worker tick max", st.get("worker.tick_max_ms"), "ms", ""),
        ]
        call_s = lv.summary.get("call_seconds") or 0
        if call_s and st.get("worker.jobs_done") is not None:
            skipped = sum(st.get(f"worker.jobs_{k}", 0) or 0 for k in ("superseded", "cancelled", "expired"))
            out.append((f"{p} Smart Turn analyses run / skipped per call-second",
                        f"{st['worker.jobs_done'] / call_s:.3f} / {skipped / call_s:.3f}", "",
                        f"run {int(st['worker.jobs_done'])}, superseded {int(st.get('worker.jobs_superseded', 0) or 0)}, "
                        f"cancelled {int(st.get('worker.jobs_cancelled', 0) or 0)}, expired "
                        f"{int(st.get('worker.jobs_expired', 0) or 0)} over {call_s:.0f} call-s"))
        if st.get("worker.vad_prompt") is not None:
            out.append((f"{p} VAD windows scored outside the tick / stop windows from the voice's end",
                        f"{int(st['worker.vad_prompt'])} / {int(st.get('worker.end_hints', 0) or 0)}", "",
                        f"{(st.get('worker.prompt_cpu_ms', 0) or 0) / max(1.0, call_s):.3f} ms CPU per call-second "
                        "outside the tick"))
        started = st.get("worker.jobs_done", 0) or 0
        if started and st.get("worker.jobs_wait_us_total") is not None:
            out += [
                (f"{p} Smart Turn queue wait mean / max",
                 f"{st['worker.jobs_wait_us_total'] / started / 1000:.1f} / {st['worker.jobs_wait_us_max'] / 1000:.1f}",
                 "ms", ""),
                (f"{p} Smart Turn run time (wall) mean / max",
                 f"{st['worker.jobs_run_us_total'] / started / 1000:.1f} / {st['worker.jobs_run_us_max'] / 1000:.1f}",
                 "ms", ""),
            ]
        if started and st.get("worker.jobs_cpu_us_total") is not None:
            out += [
                (f"{p} Smart Turn CPU per analysis mean / p95",
                 f"{st['worker.jobs_cpu_us_total'] / started / 1000:.1f} / "
                 f"{st.get('worker.jobs_cpu_p95_us', 0) / 1000:.1f}", "ms", "job thread's own CPU"),
                (f"{p} Smart Turn queue wait p95", round(st.get("worker.jobs_wait_p95_us", 0) / 1000, 1), "ms",
                 "last 4096 analyses"),
            ]
    return out


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    wl = workload.load()
    levels, largest, describe = measure(quick, wl=wl)
    rows = harness.rows("brisvox", levels, largest, wl, TARGETS)
    rows.insert(0, ("brisvox: how it was run", describe, "", ""))
    return rows + server_rows(levels) + breakdown_rows(levels) + speculation_rows(levels)
