"""CPU seconds and PSS memory of a server's process tree over a load run (psutil).

Owns sampling, on a background thread, every process under the given root
pids (the roots and all their descendants, found again at each sample so
workers forked or restarted during the run are included): cumulative CPU
seconds (user + system of each process; a process that exits keeps its last
value, so its CPU is not lost) every ``interval`` seconds, and the summed PSS
(proportional set size: shared pages split between the processes sharing
them, so summing over processes does not double count) every
``pss_interval`` seconds (reading it costs about 3 ms per process here, so
it is sampled less often than CPU). Timestamps are ``time.monotonic()``, the clock the
load generator stamps its calls with, so the two line up.

Invariants: cumulative CPU never decreases; a process that vanished between
listing and reading is skipped, never an error; the thread stops within one
interval of ``stop()``.
"""

from __future__ import annotations

import bisect
import threading
import time

import psutil


class TreeSampler:
    def __init__(self, root_pids: list[int], interval: float = 0.25, pss_interval: float = 2.0) -> None:
        self.roots = list(root_pids)
        self.interval = interval
        self.pss_interval = pss_interval
        self.cpu: list[tuple[float, float, int]] = []  # (t, cumulative cpu s, live processes)
        self.pss: list[tuple[float, int]] = []  # (t, summed PSS bytes)
        self._procs: dict[int, psutil.Process] = {}
        self._last_cpu: dict[int, float] = {}
        self._roles: dict[int, str] = {}  # pid -> role (process title without its index)
        self.by_pid: list[tuple[float, dict[int, float]]] = []  # (t, cumulative cpu s per pid)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- sampling -------------------------------------------------------------------------

    def processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid in self.roots:
            try:
                root = self._procs.get(pid) or psutil.Process(pid)
                found[pid] = root
                for child in root.children(recursive=True):
                    found[child.pid] = self._procs.get(child.pid) or child
            except psutil.Error:
                continue
        self._procs = found
        return list(found.values())

    def sample_cpu(self) -> float:
        with self._lock:
            procs = self.processes()
            for p in procs:
                try:
                    t = p.cpu_times()
                    self._last_cpu[p.pid] = max(self._last_cpu.get(p.pid, 0.0), t.user + t.system)
                except psutil.Error:
                    continue
            total = sum(self._last_cpu.values())
            now = time.monotonic()
            self.cpu.append((now, total, len(procs)))
            self.by_pid.append((now, dict(self._last_cpu)))
            return total

    def sample_pss(self) -> int:
        with self._lock:
            total = 0
            for p in self.processes():
                try:
                    total += p.memory_full_info().pss
                except psutil.Error:
                    continue
            self.pss.append((time.monotonic(), total))
            return total

    def start(self) -> None:
        self.sample_cpu()
        self._thread = threading.Thread(target=self._loop, name="tree-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.sample_cpu()

    def _loop(self) -> None:
        next_pss = time.monotonic()
        while not self._stop.wait(self.interval):
            self.sample_cpu()
            if time.monotonic() >= next_pss:
                self.sample_pss()
                next_pss = time.monotonic() + self.pss_interval

    # --- queries --------------------------------------------------------------------------

    def cpu_at(self, t: float) -> float:
        """Cumulative CPU seconds at ``t``, linearly interpolated between samples."""
        if not self.cpu:
            return 0.0
        times = [s[0] for s in self.cpu]
        i = bisect.bisect_left(times, t)
        if i <= 0:
            return self.cpu[0][1]
        if i >= len(self.cpu):
            return self.cpu[-1][1]
        (t0, c0, _), (t1, c1, _) = self.cpu[i - 1], self.cpu[i]
        return c0 if t1 <= t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    def cpu_seconds(self, t0: float, t1: float) -> float:
        return max(0.0, self.cpu_at(t1) - self.cpu_at(t0))

    def note_roles(self) -> None:
        """Read the live processes' titles now (a child sets its own after the fork):
        call it before the server stops; gone processes keep the role last read."""
        with self._lock:
            for pid, proc in self._procs.items():
                role = role_of(proc)
                if role != "other":
                    self._roles[pid] = role

    def cpu_by_role(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds per role between the samples nearest ``t0`` and ``t1``."""
        if not self.by_pid:
            return {}
        times = [t for t, _ in self.by_pid]

        def snap(t: float) -> dict[int, float]:
            i = min(range(len(times)), key=lambda k: abs(times[k] - t))
            return self.by_pid[i][1]

        a, b = snap(t0), snap(t1)
        self.note_roles()
        out: dict[str, float] = {}
        for pid, cpu in b.items():
            role = self._roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + max(0.0, cpu - a.get(pid, 0.0))
        return out

    def pss_max(self, t0: float | None = None, t1: float | None = None) -> int | None:
        vals = [v for t, v in self.pss if (t0 is None or t >= t0) and (t1 is None or t <= t1)]
        return max(vals) if vals else None

    def max_processes(self) -> int:
        return max((n for _, _, n in self.cpu), default=0)


def role_of(p: psutil.Process) -> str:
    """``brisvoxd: worker 0`` -> ``worker``; any other process: its executable's name."""
    try:
        title = " ".join(p.cmdline())
        name = p.name()
    except psutil.Error:
        return "other"
    if title.startswith("brisvoxd:"):
        words = title.split(":", 1)[1].split()
        return words[0] if words else "brisvoxd"
    return "brisvoxd" if "brisvoxd" in title else name
