"""The daemon's files are owner-only, its runtime dir is private, the orphan sweep spares other users.

* ``restrict_umask`` sets 077; a call record is 0600 in a 0700 directory whatever the umask
  (a looser file left from before is tightened).
* An existing runtime dir writable by group/others, or owned by another user, refuses the
  start with the path and the fix.
* The sweep removes only dead instances' segments the sweeping user owns
  (:func:`ipc.ring.sweep_decision` with injected owners; a real segment chowned away when
  running as root).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brisvox.agent.host.call_record import write_record
from brisvox.config.daemon import parse_config
from brisvox.runtime.paths import (
    DAEMON_UMASK,
    PathError,
    prepare_dirs,
    private_dir_problem,
    restrict_umask,
)
from ipc.ring import SHM_DIR, Ring, ring_name, sweep_decision, sweep_segments

RECORD = {"call_id": "c1", "started": "2025-01-01T00:00:00.000+00:00", "conversation": [{"role": "tool",
          "content": "sent digits 1234"}]}


@pytest.fixture
def loose_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def test_restrict_umask_sets_077():
    old = restrict_umask()
    try:
        assert os.umask(DAEMON_UMASK) == 0o077
    finally:
        os.umask(old)


def test_call_records_are_0600_in_a_0700_dir(tmp_path, loose_umask):
    path = write_record(RECORD, tmp_path / "calls")
    assert mode(path) == 0o600 and mode(tmp_path / "calls") == 0o700
    jl = tmp_path / "rec" / "calls.jsonl"
    assert write_record(RECORD, jl) == jl
    assert mode(jl) == 0o600 and mode(jl.parent) == 0o700
    jl.chmod(0o644)  # made by an older version, or by hand
    write_record(RECORD, jl)
    assert mode(jl) == 0o600 and len(jl.read_bytes().splitlines()) == 2


def _dirs(tmp: Path) -> object:
    return parse_config({"daemon": {"runtime_dir": str(tmp / "r"), "state_dir": str(tmp / "s")}})


def test_group_writable_runtime_dir_refuses_start(short_tmp):
    (short_tmp / "r").mkdir()
    os.chmod(short_tmp / "r", 0o770)
    with pytest.raises(PathError) as ei:
        prepare_dirs(_dirs(short_tmp))
    assert ei.value.key == "daemon.runtime_dir"
    assert f"{short_tmp / 'r'} is writable by group or others (mode 0770)" in ei.value.message
    assert f"chmod 0700 {short_tmp / 'r'}" in ei.value.message
    os.chmod(short_tmp / "r", 0o750)  # readable is not refused here (brisvoxd check warns)
    rdir, sdir = prepare_dirs(_dirs(short_tmp))
    assert mode(sdir) == 0o700


def fake_stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((0o040000 | mode, 1, 1, 2, uid, uid, 4096, 0, 0, 0))


def test_private_dir_decision_with_injected_stat(tmp_path):
    assert private_dir_problem(tmp_path, fake_stat(0o700, 1000), uid=1000) == ""
    assert private_dir_problem(tmp_path, fake_stat(0o755, 1000), uid=1000) == ""  # readable: check warns
    assert "writable by group or others (mode 0775)" in private_dir_problem(tmp_path, fake_stat(0o775, 1000), 1000)
    assert "(mode 0703)" in private_dir_problem(tmp_path, fake_stat(0o703, 1000), uid=1000)
    problem = private_dir_problem(tmp_path, fake_stat(0o700, 1001), uid=1000)
    assert f"{tmp_path} is owned by uid 1001" in problem and "remove it" in problem


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_foreign_owned_runtime_dir_refuses_start(short_tmp):
    (short_tmp / "r").mkdir(mode=0o700)
    os.chown(short_tmp / "r", 65534, 65534)
    with pytest.raises(PathError, match="is owned by uid 65534"):
        prepare_dirs(_dirs(short_tmp))


def test_sweep_decision():
    def dead(inst: str) -> bool:
        return False

    def alive(inst: str) -> bool:
        return True

    assert sweep_decision("1-1", None, owner_uid=1000, uid=1000, alive=dead) == "remove"
    assert sweep_decision("1-1", None, owner_uid=1000, uid=1000, alive=alive) == "keep"
    assert sweep_decision("1-1", "1-1", owner_uid=1000, uid=1000, alive=dead) == "keep"
    # another user's segment is never removed, dead or not (its processes may be invisible to us)
    asked: list[str] = []
    assert sweep_decision("1-1", None, owner_uid=1001, uid=1000, alive=asked.append) == "foreign"
    assert sweep_decision("1-1", None, owner_uid=0, uid=1000, alive=dead) == "foreign"
    assert asked == []


def test_sweep_segments_leaves_other_users_segments():
    dead = "999999998-00000001"
    mine = Ring.create(ring_name(dead, "own", "in"), 256, 8000)
    other = Ring.create(ring_name(dead, "other", "in"), 256, 8000)
    mine.close()
    other.close()
    try:
        # swept as another user would: both segments are foreign to it, neither is removed
        sweep = sweep_segments(uid=os.geteuid() + 1)
        assert not sweep.removed and {mine.name, other.name} <= set(sweep.foreign)
        assert os.geteuid() in sweep.uids
        if os.geteuid() == 0:  # a real segment of another user
            os.chown(SHM_DIR / other.name, 65534, 65534)
            sweep = sweep_segments()
            assert mine.name in sweep.removed and not (SHM_DIR / mine.name).exists()
            assert other.name in sweep.foreign and 65534 in sweep.uids and (SHM_DIR / other.name).exists()
    finally:
        for name in (mine.name, other.name):
            (SHM_DIR / name).unlink(missing_ok=True)
