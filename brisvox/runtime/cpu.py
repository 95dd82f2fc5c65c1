"""The CPU this process may use: its CPU affinity, bounded by its cgroup's CPU quota.

One answer for every role that sizes itself by cores (the gateway's ``max_calls = "auto"``,
the local LLM's lent threads in the workers). A quota is what systemd's ``CPUQuota=`` (or a
container's ``--cpus``) sets: ``cpu.max`` in cgroup v2 (``"<quota> <period>"``, or ``"max"``),
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in cgroup v1 (quota ``-1``: none). A quota of
1.5 cores counts as 2 (a thread may still run on two cores, half the time each); no quota, or
one that cannot be read, leaves the affinity's count. Read once per call (a few small files):
callers that need it often keep the answer.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def affinity_cores() -> int:
    """Cores this process may run on (its CPU affinity; a forked child inherits it), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def quota_cores(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (None: no quota, or none readable)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # "hierarchy-id:controllers:path"
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2 (the unified hierarchy)
            got = _v2(root / rel / "cpu.max")
        elif "cpu" in controllers.split(","):
            got = _v1(root / controllers / rel) or _v1(root / "cpu" / rel)
        else:
            continue
        if got is not None:
            return got
    return None


def _v2(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _v1(directory: Path) -> float | None:
    try:
        q = int((directory / "cpu.cfs_quota_us").read_text().strip())
        p = int((directory / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cores(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its affinity's count, at most its quota rounded up; >= 1."""
    n = affinity_cores()
    q = quota_cores(proc_cgroup, root)
    return n if q is None else max(1, min(n, math.ceil(q - 1e-9)))
