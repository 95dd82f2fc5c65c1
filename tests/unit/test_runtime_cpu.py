"""The cores a process may use (brisvox/runtime/cpu.py): its affinity, at most its cgroup's
CPU quota (systemd's CPUQuota=, a container's --cpus), read from cgroup v2's cpu.max or v1's
cfs files; no quota, or one that cannot be read, leaves the affinity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brisvox.runtime import cpu


def _v2(tmp: Path, text: str, path: str = "system.slice/brisvoxd.service") -> tuple[Path, Path]:
    (tmp / "proc").write_text(f"0::/{path}\n")
    d = tmp / "fs" / path
    d.mkdir(parents=True)
    (d / "cpu.max").write_text(text)
    return tmp / "proc", tmp / "fs"


def _v1(tmp: Path, quota: int, period: int, controllers: str = "cpu,cpuacct") -> tuple[Path, Path]:
    (tmp / "proc").write_text(f"4:memory:/x\n2:{controllers}:/system.slice/brisvoxd.service\n1:name=systemd:/y\n")
    d = tmp / "fs" / controllers / "system.slice" / "brisvoxd.service"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")
    return tmp / "proc", tmp / "fs"


@pytest.mark.parametrize(("text", "cores"), [("max 100000\n", None), ("100000 100000\n", 1.0),
                                             ("150000 100000\n", 1.5), ("50000 100000", 0.5), ("garbage", None)])
def test_cgroup_v2_cpu_max(tmp_path: Path, text: str, cores: float | None) -> None:
    proc, root = _v2(tmp_path, text)
    assert cpu.quota_cores(proc, root) == cores


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    proc, root = _v1(tmp_path, 200000, 100000)
    assert cpu.quota_cores(proc, root) == 2.0
    other = tmp_path / "unlimited"
    other.mkdir()
    proc, root = _v1(other, -1, 100000, controllers="cpuacct,cpu")
    assert cpu.quota_cores(proc, root) is None  # -1: no quota


def test_usable_cores_is_the_affinity_at_most_the_quota_rounded_up(tmp_path: Path) -> None:
    n = len(os.sched_getaffinity(0))
    proc, root = _v2(tmp_path, "max 100000")
    assert cpu.usable_cores(proc, root) == n
    for name in ("one", "half"):
        (tmp_path / name).mkdir()
    proc, root = _v2(tmp_path / "one", "100000 100000")
    assert cpu.usable_cores(proc, root) == 1  # systemd CPUQuota=100%
    proc, root = _v2(tmp_path / "half", "150000 100000")
    assert cpu.usable_cores(proc, root) == min(n, 2)
    assert cpu.usable_cores(tmp_path / "no-such-file", root) == n  # unreadable: the affinity


def test_this_process() -> None:
    q = cpu.quota_cores()
    n = len(os.sched_getaffinity(0))
    assert cpu.usable_cores() == (n if q is None else max(1, min(n, -(-q // 1))))
