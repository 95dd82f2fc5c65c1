"""brisvoxd as a real process tree: start, status, kill -9, boot failures, stop, config errors.

Each test starts its own daemon (own runtime dir, metrics on port 0) and the
harness kills its process group and removes its segments even on failure.
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from bench.harness.daemon import Daemon, alive, child_env, cli, wait_dead, write_config
from brisvox.runtime import exitcodes
from ipc.ring import SHM_DIR, Ring, ring_name
from tests.system.daemon_promparse import parse, value

pytestmark = pytest.mark.system

ROLES_MOD = "tests.system.daemon_roles"


@pytest.fixture
def daemon_factory(short_tmp):
    made: list[Daemon] = []

    def make(**kw) -> Daemon:
        d = Daemon(short_tmp, **kw)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.close()


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def test_start_status_stop_leaves_nothing(short_tmp, daemon_factory):
    cfg = write_config(short_tmp, workers=2, agents=2)
    d = daemon_factory(config=cfg)
    snap = d.wait_ready()
    names = [c["name"] for c in snap["children"]]
    assert names == ["gateway-0", "worker-0", "worker-1", "agent-0", "agent-1"]
    for c in snap["children"]:
        assert c["state"] == "ready" and c["restarts"] == 0
        assert cmdline(c["pid"]) == f"brisvoxd: {c['role']} {c['index']}"
        assert os.getpgid(c["pid"]) == d.proc.pid  # same group: systemd's KillMode=mixed reaches them
    pids = [c["pid"] for c in snap["children"]]

    # the CLI agrees: a table and JSON
    r = cli("status", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "worker   1" in r.stdout and r.stdout.count(" ready ") == 5
    r = cli("status", "--json", "--config", str(cfg))
    assert [c["state"] for c in json.loads(r.stdout)["children"]] == ["ready"] * 5

    # a second start on the same runtime dir is refused, naming the running pid
    r = cli("start", "--foreground", "--config", str(cfg))
    assert r.returncode == exitcodes.FAILURE
    assert f"already running (pid {d.proc.pid})" in r.stderr

    # a segment of this instance (as the gateway would make for a call) is unlinked at stop
    inst = snap["daemon"]["instance"]
    ring = Ring.create(ring_name(inst, "call1", "in"), 1024, 8000)
    ring.close()

    r = cli("stop", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert d.wait_exit(10) == 0
    assert wait_dead(pids, 3.0) == []
    assert not list(SHM_DIR.glob(f"brisvox.{inst}.*"))
    assert not list(d.run_dir.glob("*.sock"))
    assert not (d.run_dir / "brisvoxd.pid").exists()
    r = cli("status", "--config", str(cfg))
    assert r.returncode == exitcodes.NOT_RUNNING and "not running" in r.stderr
    logs = d.logs()
    for line in logs.splitlines():  # every line from every process is JSON tagged with role and pid
        rec = json.loads(line)
        assert rec["role"] in ("supervisor", "gateway", "worker", "agent") and rec["pid"] > 0
    assert any(json.loads(line)["role"] == "worker" for line in logs.splitlines())


@pytest.mark.serial  # replaced within 2 s
@pytest.mark.parametrize("victim", ["gateway-0", "worker-1", "agent-0"])
def test_kill9_child_is_replaced_within_2s_and_others_untouched(daemon_factory, victim):
    d = daemon_factory()
    snap = d.wait_ready()
    before = {c["name"]: c["pid"] for c in snap["children"]}
    t0 = time.monotonic()
    os.kill(before[victim], signal.SIGKILL)
    snap = d.wait_for(lambda s: d.child(s, victim)["pid"] != before[victim] and d.child(s, victim)["state"] == "ready",
                      5.0, f"{victim} replaced")
    took = time.monotonic() - t0
    assert took <= 2.0, f"replacement took {took:.2f}s"
    after = {c["name"]: c["pid"] for c in snap["children"]}
    assert {k: v for k, v in after.items() if k != victim} == {k: v for k, v in before.items() if k != victim}
    c = d.child(snap, victim)
    assert c["restarts"] == 1 and "SIGKILL" in c["last_exit"]
    assert all(c["state"] == "ready" for c in snap["children"])
    d.command("stop")
    assert d.wait_exit() == 0


@pytest.mark.serial  # the respawned peer ready within 3 s
def test_topology_is_pushed_to_children_when_a_peer_dies_and_returns(daemon_factory):
    d = daemon_factory(env={"BRISVOX_TEST_ROLE_MAIN": f"agent-0={ROLES_MOD}:topology_echo"})
    snap = d.wait_ready()
    old = d.child(snap, "worker-1")["pid"]
    os.kill(old, signal.SIGKILL)
    snap = d.wait_for(lambda s: d.child(s, "worker-1")["pid"] != old and d.child(s, "worker-1")["state"] == "ready",
                      5.0, "worker-1 back")
    new = d.child(snap, "worker-1")["pid"]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and f"worker-1:ready:{new}" not in d.logs():
        time.sleep(0.05)
    seen = [json.loads(line)["msg"] for line in d.logs().splitlines() if "event topology" in line]
    death = next(i for i, m in enumerate(seen) if f"worker-1:exited:{old}" in m or f"worker-1:starting:{new}" in m)
    back = next(i for i, m in enumerate(seen) if f"worker-1:ready:{new}" in m)
    assert death < back
    assert f"worker-0:ready:{d.child(snap, 'worker-0')['pid']}" in seen[back]
    os.kill(d.proc.pid, signal.SIGINT)  # Ctrl-C: a clean stop
    assert d.wait_exit() == 0


def test_boot_crashing_child_is_marked_failed_not_respawned(daemon_factory):
    d = daemon_factory(env={"BRISVOX_TEST_ROLE_MAIN": f"worker-1={ROLES_MOD}:crash_at_boot"})
    # the error frame and the exit can arrive in either order; the status names the error either way
    snap = d.wait_for(lambda s: d.child(s, "worker-1")["state"] == "failed" and d.child(s, "worker-1")["error"],
                      10.0, "worker-1 failed, with its error")
    w1 = d.child(snap, "worker-1")
    assert w1["boot_failures"] == 3 and w1["restarts"] == 2
    assert "deliberate boot crash" in w1["error"]
    # everything else is serving, READY was sent, and the failed slot stays put
    snap = d.wait_for(lambda s: s["daemon"]["ready"], 5.0, "ready")
    assert all(c["state"] == "ready" for c in snap["children"] if c["name"] != "worker-1")
    time.sleep(0.5)
    snap = d.status()
    assert d.child(snap, "worker-1")["state"] == "failed" and d.child(snap, "worker-1")["restarts"] == 2
    assert "failed: worker-1" in snap["daemon"]["status"]
    status, text = d.metrics_text()
    fams = parse(text)
    assert value(fams, "brisvox_children", role="worker", state="failed") == 1
    assert value(fams, "brisvox_children", role="worker", state="ready") == 1
    code, body = d.metrics_text("/healthz")
    assert code == 503 and json.loads(body)["failed"] == ["worker-1"]
    r = cli("status", "--config", str(d.config))
    assert "failed" in r.stdout and "deliberate boot crash" in r.stdout
    d.command("stop")
    assert d.wait_exit() == 0


def test_bad_config_file_exits_2_naming_the_key(short_tmp):
    cfg = write_config(short_tmp)
    cfg.write_text(cfg.read_text().replace("workers = 2", 'workers = "many"'))
    r = cli("start", "--foreground", "--config", str(cfg), timeout=15)
    assert r.returncode == exitcodes.CONFIG
    assert "daemon.workers" in r.stderr and "expected an integer" in r.stderr
    r = cli("check", str(cfg))
    assert r.returncode == exitcodes.CONFIG and "daemon.workers" in r.stderr

    cfg.write_text(cfg.read_text().replace('workers = "many"', "workers = 2") + "\n[daemon.restart2]\nx = 1\n")
    r = cli("check", str(cfg))
    assert r.returncode == exitcodes.CONFIG and "daemon.restart2" in r.stderr

    cfg.write_text(write_config(short_tmp).read_text() + "\n[bogus]\nx = 1\n")
    r = cli("start", "--foreground", "--config", str(cfg), timeout=15)
    assert r.returncode == exitcodes.CONFIG and "bogus" in r.stderr and "unknown section" in r.stderr
    assert not (short_tmp / "run" / "brisvoxd.pid").exists()

    r = cli("check", str(write_config(short_tmp)))
    assert r.returncode == 0 and "ok" in r.stdout


def test_child_config_error_stops_the_daemon_with_exit_2(daemon_factory):
    d = daemon_factory(env={"BRISVOX_TEST_ROLE_MAIN": f"gateway={ROLES_MOD}:config_error"})
    assert d.wait_exit(15) == exitcodes.CONFIG
    logs = d.logs()
    assert "brisvoxd: configuration error:" in logs and "gateway.test_key" in logs
    pids = [int(json.loads(line)["pid"]) for line in logs.splitlines() if line.startswith("{")]
    assert wait_dead(sorted(set(pids)), 3.0) == []
    assert not list(d.run_dir.glob("*.sock"))


def test_hung_child_is_detected_dumped_and_restarted(daemon_factory):
    d = daemon_factory(env={"BRISVOX_TEST_ROLE_MAIN": f"agent-0={ROLES_MOD}:hang_after_ready"})
    snap = d.wait_for(lambda s: d.child(s, "agent-0")["hung"] >= 1, 10.0, "agent-0 declared hung")
    d.wait_for(lambda s: d.child(s, "agent-0")["restarts"] >= 1, 5.0, "agent-0 restarted")
    logs = d.logs()
    assert "is hung: main loop heartbeat" in logs
    assert "Current thread" in logs or "Thread 0x" in logs  # the SIGUSR2 stack dump reached the log
    assert all(c["state"] == "ready" for c in snap["children"] if c["role"] != "agent")
    d.command("stop")
    assert d.wait_exit() == 0


@pytest.mark.serial  # a 3.5 s stall against the 3 s pong timeout
def test_a_stalled_supervisor_does_not_blame_its_children(daemon_factory):
    d = daemon_factory()
    snap = d.wait_ready()
    before = {c["name"]: c["pid"] for c in snap["children"]}
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(3.5)  # longer than pong_timeout_s = 3.0
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    time.sleep(0.5)
    snap = d.wait_ready()
    assert {c["name"]: c["pid"] for c in snap["children"]} == before
    assert all(c["hung"] == 0 for c in snap["children"])
    assert "master loop stalled" in d.logs()
    d.command("stop")
    assert d.wait_exit() == 0


def test_stop_escalates_to_sigterm_when_a_child_ignores_shutdown(daemon_factory):
    d = daemon_factory(env={"BRISVOX_TEST_ROLE_MAIN": f"agent-0={ROLES_MOD}:ignore_shutdown"})
    snap = d.wait_ready()
    pids = [c["pid"] for c in snap["children"]]
    t0 = time.monotonic()
    r = cli("stop", "--config", str(d.config))
    assert r.returncode == 0, r.stderr
    assert d.wait_exit() == 0
    assert time.monotonic() - t0 < 8.0
    assert wait_dead(pids, 2.0) == []
    logs = d.logs()
    assert "agent-0" in logs and "grace period over; sending SIGTERM" in logs


def test_children_exit_when_the_supervisor_dies(short_tmp, daemon_factory):
    d = daemon_factory()
    snap = d.wait_ready()
    pids = [c["pid"] for c in snap["children"]]
    inst = snap["daemon"]["instance"]
    ring = Ring.create(ring_name(inst, "orphan", "out"), 1024, 8000)
    ring.write(np.zeros(10, np.int16))
    ring.close()
    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait(5)
    assert wait_dead(pids, 5.0) == [], "children outlived their supervisor"
    # a new daemon on the same runtime dir starts (stale lock) and sweeps the dead instance's rings
    d2 = daemon_factory(config=d.config)
    d2.wait_ready()
    assert not list(SHM_DIR.glob(f"brisvox.{inst}.*"))
    d2.command("stop")
    assert d2.wait_exit() == 0


def test_memory_limit_restarts_the_child(short_tmp, daemon_factory):
    cfg = write_config(short_tmp, workers=1, agents=1, extra="\n[daemon.memory.worker]\nwarn_mb = 1\nlimit_mb = 2\n")
    d = daemon_factory(config=cfg)
    snap = d.wait_for(lambda s: d.child(s, "worker-0")["memory_restarts"] >= 1, 10.0, "memory restart")
    d.wait_for(lambda s: d.child(s, "worker-0")["restarts"] >= 1, 5.0, "worker restarted")
    assert d.child(snap, "gateway-0")["restarts"] == 0
    assert "over its 2 MiB limit; restarting it" in d.logs()
    d.command("stop")
    assert d.wait_exit() == 0


def test_reload_rescales_and_retries_failed(short_tmp, daemon_factory):
    cfg = write_config(short_tmp, workers=1, agents=1)
    d = daemon_factory(config=cfg)
    d.wait_ready()
    cfg.write_text(cfg.read_text().replace("workers = 1", "workers = 3"))
    r = cli("reload", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    snap = d.wait_for(lambda s: len(s["children"]) == 5 and all(c["state"] == "ready" for c in s["children"]),
                      10.0, "three workers")
    assert [c["name"] for c in snap["children"] if c["role"] == "worker"] == ["worker-0", "worker-1", "worker-2"]
    cfg.write_text(cfg.read_text().replace("workers = 3", "workers = 1"))
    os.kill(d.proc.pid, signal.SIGHUP)
    snap = d.wait_for(lambda s: len(s["children"]) == 3, 10.0, "back to one worker")
    cfg.write_text(cfg.read_text().replace("workers = 1", "workers = 0"))
    r = cli("reload", "--runtime-dir", str(d.run_dir))
    assert r.returncode == 1 and "daemon.workers" in r.stderr  # bad file: keeps running as it was
    assert len(d.status()["children"]) == 3
    d.command("stop")
    assert d.wait_exit() == 0


def test_daemonized_start_then_stop(short_tmp):
    cfg = write_config(short_tmp, workers=1, agents=1)
    env = child_env()
    r = cli("start", "--config", str(cfg), env=env)
    try:
        assert r.returncode == 0, r.stderr
        assert "brisvoxd started" in r.stdout and "control ipc://" in r.stdout
        st = cli("status", "--json", "--config", str(cfg))
        snap = json.loads(st.stdout)
        pids = [snap["daemon"]["pid"]] + [c["pid"] for c in snap["children"]]
        assert all(c["state"] == "ready" for c in snap["children"])
        r = cli("stop", "--config", str(cfg))
        assert r.returncode == 0, r.stderr
        assert wait_dead(pids, 5.0) == []
        assert (short_tmp / "state" / "brisvoxd.log").read_text().count("ready") >= 1
    finally:
        pid_file = short_tmp / "run" / "brisvoxd.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            if alive(pid):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
