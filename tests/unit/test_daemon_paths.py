"""Runtime/state dir resolution and the pid lock that makes a daemon unique."""

from __future__ import annotations

import os

import pytest

from brisvox.config.daemon import parse_config
from brisvox.runtime.paths import (
    AlreadyRunning,
    PathError,
    PidLock,
    is_locked,
    prepare_dirs,
    read_pid,
    runtime_dir,
    state_dir,
)


def test_directory_resolution(monkeypatch):
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/a:/run/b")
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/x")
    c = parse_config({})
    assert str(runtime_dir(c)) == "/run/a" and str(state_dir(c)) == "/var/lib/x"
    c = parse_config({"daemon": {"runtime_dir": "/tmp/q", "state_dir": "/tmp/s"}})
    assert str(runtime_dir(c)) == "/tmp/q" and str(state_dir(c)) == "/tmp/s"
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    expected = "/run/brisvox" if os.geteuid() == 0 else f"/tmp/brisvox-{os.getuid()}"
    assert str(runtime_dir(parse_config({}))) == expected


def test_too_long_runtime_dir_names_the_key(short_tmp):
    c = parse_config({"daemon": {"runtime_dir": str(short_tmp / ("x" * 100)), "state_dir": str(short_tmp / "s")}})
    with pytest.raises(PathError) as ei:
        prepare_dirs(c)
    assert ei.value.key == "daemon.runtime_dir" and "107" in ei.value.message


def test_pid_lock_refuses_a_second_holder(short_tmp):
    c = parse_config({"daemon": {"runtime_dir": str(short_tmp / "r"), "state_dir": str(short_tmp / "s")}})
    rdir, sdir = prepare_dirs(c)
    assert oct(rdir.stat().st_mode & 0o777) == "0o700" and sdir.is_dir()
    a = PidLock(rdir)
    a.acquire()
    a.write_pid(1234)
    assert is_locked(rdir) and read_pid(rdir) == 1234
    with pytest.raises(AlreadyRunning) as ei:
        PidLock(rdir).acquire()
    assert ei.value.pid == 1234 and "already running (pid 1234)" in str(ei.value)
    a.release()
    assert not is_locked(rdir) and not (rdir / "brisvoxd.pid").exists()
    b = PidLock(rdir)
    b.acquire()
    b.release()
