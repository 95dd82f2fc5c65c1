"""The real brisvoxd: owner-only files, a private runtime dir, a sweep that spares other users,
and the file-mode audit of ``brisvoxd check``.

* Started from a shell with umask 000, the runtime dir, pid file, sockets and
  state dir are owner-only; daemonized, the log file is 0600.
* A group-writable (or, as root, foreign-owned) runtime dir: exit 2, one line
  naming the path and the fix, nothing started.
* At start the sweep removes our own dead instance's segment and leaves one
  that another user owns (as root: chowned to nobody), saying so in the log.
* ``brisvoxd check``: an inline secret in a world-readable config and a loose
  state dir give one ``warning:`` line each, exit 0; ``--strict`` exits 1;
  secrets from ``*_env``/``*_credential`` that are not available here are
  warnings, not errors.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from bench.harness.daemon import BRISVOXD, ROOT, Daemon, child_env, cli, write_config
from brisvox.runtime import exitcodes
from ipc.ring import SHM_DIR, Ring, ring_name

pytestmark = pytest.mark.system


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def loose(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``brisvoxd ARGS`` from a shell whose umask is 000."""
    return subprocess.run([*BRISVOXD, *args], cwd=ROOT, env=env or child_env(), capture_output=True, text=True,
                          timeout=timeout, preexec_fn=lambda: os.umask(0))


def test_files_are_owner_only_and_the_sweep_spares_other_users(short_tmp):
    dead = "999999997-00000001"
    own = Ring.create(ring_name(dead, "own", "in"), 256, 8000)
    other = Ring.create(ring_name(dead, "foreign", "in"), 256, 8000)
    own.close()
    other.close()
    root = os.geteuid() == 0
    if root:
        os.chown(SHM_DIR / other.name, 65534, 65534)
    d = Daemon(short_tmp)
    old = os.umask(0)
    try:
        d.start()  # Popen inherits umask 000
    finally:
        os.umask(old)
    try:
        d.wait_ready(15)
        run = short_tmp / "run"
        assert mode(run) == 0o700 and mode(run / "brisvoxd.pid") == 0o600
        socks = list(run.glob("*.sock"))
        assert socks and all(mode(s) & 0o077 == 0 for s in socks), [(s, oct(mode(s))) for s in socks]
        assert mode(short_tmp / "state") == 0o700
        assert not (SHM_DIR / own.name).exists()
        if root:
            assert (SHM_DIR / other.name).exists()
            assert "left 1 shared-memory segments of other users (uid 65534)" in d.logs()
    finally:
        d.close()
        for name in (own.name, other.name):
            (SHM_DIR / name).unlink(missing_ok=True)


def test_daemonized_log_file_is_0600(short_tmp):
    cfg = write_config(short_tmp)
    r = loose("start", "--config", str(cfg), timeout=60)
    pid_file = short_tmp / "run" / "brisvoxd.pid"
    try:
        assert r.returncode == 0, r.stderr
        log = short_tmp / "state" / "brisvoxd.log"
        assert mode(log) == 0o600 and mode(short_tmp / "state") == 0o700
    finally:
        s = cli("stop", "--config", str(cfg), "--timeout", "20")
        if s.returncode != 0 and pid_file.exists():  # never expected: kill the daemon this test started
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            time.sleep(0.5)
    assert s.returncode == 0, s.stderr


@pytest.mark.parametrize("case", ["group_writable", "foreign_owner"])
def test_unsafe_runtime_dir_refuses_start(short_tmp, case):
    run = short_tmp / "run"
    run.mkdir()
    if case == "group_writable":
        os.chmod(run, 0o775)
        expect = f"{run} is writable by group or others (mode 0775); fix: chmod 0700 {run}"
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chmod(run, 0o700)
        os.chown(run, 65534, 65534)
        expect = f"{run} is owned by uid 65534"
    r = cli("start", "--foreground", "--config", str(write_config(short_tmp)), timeout=30)
    assert r.returncode == exitcodes.CONFIG, r.stderr
    assert "daemon.runtime_dir" in r.stderr and expect in r.stderr
    assert "Traceback" not in r.stderr and not (run / "brisvoxd.pid").exists()


def test_check_warns_about_readable_secrets_and_loose_dirs(short_tmp):
    cfg = write_config(short_tmp, extra='\n[websocket]\nnative_secret = "s3cret"\n'
                                         'twilio_auth_token_credential = "twilio"\n')
    os.chmod(cfg, 0o644)
    (short_tmp / "run").mkdir(mode=0o700)
    (short_tmp / "state").mkdir()
    os.chmod(short_tmp / "state", 0o755)
    env = child_env()
    env.pop("CREDENTIALS_DIRECTORY", None)
    r = cli("check", str(cfg), env=env)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 3, r.stdout
    assert "websocket.native_secret is inline" in warnings[0] and "mode 0644" in warnings[0]
    assert "websocket.twilio_auth_token_credential: $CREDENTIALS_DIRECTORY is not set" in warnings[1]
    assert warnings[2].startswith("warning: daemon.state_dir: ") and "mode 0755" in warnings[2]
    assert "s3cret" not in r.stdout + r.stderr
    r = cli("check", "--strict", str(cfg), env=env)
    assert r.returncode == exitcodes.FAILURE and "3 file-mode/secret warning(s)" in r.stderr

    os.chmod(cfg, 0o600)
    os.chmod(short_tmp / "state", 0o700)
    (short_tmp / "cred").mkdir()
    (short_tmp / "cred" / "twilio").write_text("tok\n")
    env["CREDENTIALS_DIRECTORY"] = str(short_tmp / "cred")
    r = cli("check", "--strict", str(cfg), env=env)
    assert r.returncode == 0 and "warning:" not in r.stdout, r.stdout + r.stderr
