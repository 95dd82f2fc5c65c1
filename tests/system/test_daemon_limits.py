"""The daemon's file limit and its refusal of an open SIP port, on a real brisvoxd.

* Started from a process whose soft ``RLIMIT_NOFILE`` is 1024 (the default outside
  systemd), every process of the daemon runs with the hard limit (``/proc/<pid>/limits``),
  and ``brisvoxd status`` (text and JSON), ``/metrics`` and ``brisvoxd check`` say so.
* ``brisvoxd start`` and ``check`` refuse a SIP listener on ``0.0.0.0`` whose allow list is
  ``0.0.0.0/0`` (exit 2, naming ``sip.allow``); ``[daemon] unsafe_open_sip`` overrides it
  with a warning.
* The container config with ``BRISVOX_SIP_ALLOW`` unset answers SIP from loopback only,
  and with ``0.0.0.0/0`` it is refused.

Every role runs the minimal main (the supervisor is under test, and no SIP socket is ever
bound: nothing here listens beyond 127.0.0.1).
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.daemon import ROOT, Daemon, child_env, cli, write_config
from tests.system.daemon_promparse import parse, value

pytestmark = pytest.mark.system

CONTAINER = ROOT / "configs" / "brisvoxd.container.toml"


@contextlib.contextmanager
def started(tmp: Path, **kw) -> Iterator[Daemon]:
    """A started Daemon, closed (its process group killed, its segments removed) whatever happens."""
    d = Daemon(tmp, **kw)
    try:
        yield d.start()
    finally:
        d.close()


@contextlib.contextmanager
def soft_nofile(soft: int) -> Iterator[int]:
    """This test process's soft file limit at ``soft`` (inherited by what it starts); yields the hard limit."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    if old[1] != resource.RLIM_INFINITY and old[1] <= soft:
        pytest.skip(f"the hard file limit here is {old[1]}: nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield old[1]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def proc_nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


def test_a_daemon_started_with_a_1024_soft_limit_runs_every_role_at_the_hard_limit(short_tmp):
    with contextlib.ExitStack() as stack:
        with soft_nofile(1024) as hard:
            d = stack.enter_context(started(short_tmp))  # Popen forks now: the daemon starts with soft 1024
            checked = cli("check", str(d.config))
        _check_every_process(d, hard, checked.stdout)
        assert checked.returncode == 0, checked.stderr


def _check_every_process(d: Daemon, hard: int, check_out: str) -> None:
    snap = d.wait_ready()
    pids = {"supervisor": d.proc.pid, **{c["name"]: c["pid"] for c in snap["children"]}}
    assert {n.split("-")[0] for n in pids} == {"supervisor", "gateway", "worker", "agent"}
    for name, pid in pids.items():
        assert proc_nofile(pid) == (hard, hard), f"{name} (pid {pid}) runs with {proc_nofile(pid)}"
    sup = snap["daemon"]["nofile"]
    assert (sup["soft"], sup["hard"], sup["before"]) == (hard, hard, 1024)
    assert all(c["nofile"] == {"soft": hard, "hard": hard} for c in snap["children"])
    assert f"soft limit raised from 1024 to {hard}" in d.logs()

    status = cli("status", "--config", str(d.config))
    assert status.returncode == 0, status.stderr
    assert f"supervisor {hard}/{hard}" in status.stdout and "NOFILE" in status.stdout
    assert status.stdout.count(f"{hard}/{hard}") == 1 + len(snap["children"])
    code, text = d.metrics_text()
    assert code == 200
    fams = parse(text)
    assert value(fams, "brisvox_nofile_limit", role="supervisor", index="0", limit="soft") == hard
    for c in snap["children"]:
        assert value(fams, "brisvox_nofile_limit", role=c["role"], index=str(c["index"]), limit="soft") == hard

    assert f"soft 1024, hard {hard}; brisvoxd start raises the soft limit to {hard}" in check_out
    d.command("stop")
    assert d.wait_exit() == 0


OPEN_SIP = '\n[sip]\nhost = "0.0.0.0"\nallow = ["0.0.0.0/0"]\n'


def test_start_and_check_refuse_an_open_sip_listener_naming_the_key(short_tmp):
    cfg = write_config(short_tmp, workers=1, extra=OPEN_SIP)
    with started(short_tmp, config=cfg) as d:
        assert d.wait_exit(15) == 2
        logs = d.logs()
    assert "configuration error" in logs and "sip.allow" in logs and "0.0.0.0/0" in logs
    assert "paid agent calls" in logs and "unsafe_open_sip" in logs
    assert not (short_tmp / "run" / "brisvoxd.pid").exists()  # refused before anything was prepared
    checked = cli("check", str(cfg))
    assert checked.returncode == 2 and "sip.allow" in checked.stderr, checked.stdout + checked.stderr


def test_the_override_starts_with_a_warning_and_strict_check_fails(short_tmp):
    cfg = write_config(short_tmp, workers=1, extra=OPEN_SIP)
    cfg.write_text(cfg.read_text().replace("[daemon]\n", "[daemon]\nunsafe_open_sip = true\n", 1))
    checked = cli("check", str(cfg))
    assert checked.returncode == 0 and "warning: sip.allow admits 0.0.0.0/0" in checked.stdout, checked.stderr
    assert cli("check", "--strict", str(cfg)).returncode == 1
    with started(short_tmp, config=cfg) as d:
        d.wait_ready()
        assert "unsafe_open_sip = true" in d.logs()
        d.command("stop")
        assert d.wait_exit() == 0


def test_the_container_config_opens_sip_only_to_the_networks_of_its_variable():
    env = child_env(BRISVOX_NATIVE_SECRET="s" * 32, TWILIO_AUTH_TOKEN="t" * 32)
    env.pop("BRISVOX_SIP_ALLOW", None)
    unset = cli("check", str(CONTAINER), env=env)
    assert unset.returncode == 0, unset.stderr
    assert "sip: 0.0.0.0:5060 answers 127.0.0.0/8 (sip.allow)" in unset.stdout
    narrow = cli("check", str(CONTAINER), env={**env, "BRISVOX_SIP_ALLOW": "203.0.113.0/24, 198.51.100.7"})
    assert narrow.returncode == 0 and "answers 203.0.113.0/24, 198.51.100.7" in narrow.stdout, narrow.stderr
    wide = cli("check", str(CONTAINER), env={**env, "BRISVOX_SIP_ALLOW": "0.0.0.0/0"})
    assert wide.returncode == 2 and "sip.allow" in wide.stderr and "BRISVOX_SIP_ALLOW" in wide.stderr
