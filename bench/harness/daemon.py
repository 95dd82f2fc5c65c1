"""Start a real brisvoxd in the foreground for a system test or a benchmark, talk to it, always clean up.

The daemon runs in its own session (``start_new_session``), so teardown can
SIGKILL exactly the process group this test started, then removes the
instance's shared-memory segments. Timings in the generated config are short
so failures are detected in tenths of a second.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ipc.bus import RequestTimeout, endpoint, request_sync
from ipc.frames import Command

ROOT = Path(__file__).resolve().parents[2]
BRISVOXD = [sys.executable, "-m", "brisvox.cli.brisvoxd"]

FAST = """
[daemon]
runtime_dir = "{run}"
state_dir = "{state}"
workers = {workers}
agents = {agents}

[daemon.restart]
backoff_initial_s = 0.05
backoff_max_s = 0.5
boot_failures_max = 3

[daemon.health]
init_timeout_s = 20.0
ping_interval_s = 0.2
pong_timeout_s = 3.0
heartbeat_timeout_s = 2.0
orphan_exit_s = 2.0

[daemon.shutdown]
ack_timeout_s = 0.5
grace_s = 1.0
drain_timeout_s = 5.0
term_timeout_s = 1.0

[daemon.memory]
check_interval_s = 0.5

[daemon.metrics]
listen = "127.0.0.1:0"

[daemon.log]
format = "json"
level = "info"
"""


def write_config(tmp: Path, workers: int = 2, agents: int = 1, extra: str = "") -> Path:
    """A daemon config for a test or a benchmark. Without a ``[websocket]`` table in ``extra`` the
    WebSocket listener takes a free port (``port = 0``): two daemons on the default port, in
    tests run side by side, would fail each other's gateway boot ("Address already in use")."""
    path = tmp / "brisvoxd.toml"
    ws = "" if re.search(r"^\[websocket\]", extra, re.MULTILINE) else "\n[websocket]\nport = 0\n"
    path.write_text(FAST.format(run=tmp / "run", state=tmp / "state", workers=workers, agents=agents) + extra + ws)
    return path


def agents_config(agents_dir: Path, records: Path, *, default_agent: str = "", sip: str = "enabled = false",
                  websocket: str = "", agents: str = "", smart_turn: bool = False) -> str:
    """The role sections of a daemon that runs agent files from ``agents_dir`` (the ``extra`` of
    :func:`write_config`): the echo agent off the workers, the WebSocket listener on a free port
    (``websocket``: more of its lines, e.g. routes), SIP off unless ``sip`` gives its lines,
    Smart Turn off unless asked (a test of the pipeline, not of the model), records to ``records``."""
    turn = "" if smart_turn else "\n[smart_turn]\nenabled = false\n"
    default = f'default_agent = "{default_agent}"\n' if default_agent else ""
    # [sip] default_agent: the SIP users the tests call (keypad, flowdemo, ...) reach the default agent
    # [gateway] max_calls_per_source, [websocket] trust_loopback: the tests' calls all come from
    # 127.0.0.1 without credentials, as `make run`'s config (configs/brisvoxd.toml) lets them
    return (f"\n[gateway]\necho_use_workers = false\nmax_calls_per_source = 100000\n\n[sip]\ndefault_agent = \"default\"\n"
            f"{sip}\n\n[websocket]\nport = 0\ntrust_loopback = true\n{websocket}\n{turn}"
            f'\n[agents]\nproviders = "definitions"\n{default}agents_dir = "{agents_dir}"\n'
            f"{'' if smart_turn else 'smart_turn = false'}\n{agents}\n"
            f'\n[calls]\npath = "{records}"\n')


def ws_port(gateway: dict[str, Any]) -> int:
    """The port the gateway's WebSocket listener took (``[websocket] port = 0``), from its status entry."""
    return int(gateway["endpoints"]["websocket"].rsplit(":", 1)[1])


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BRISVOXD, *args], cwd=ROOT, env=env or child_env(), capture_output=True, text=True,
                          timeout=timeout)


# The supervisor tests run every role with the minimal main (fast, no models), so they
# test the supervisor and not the role owners' code; a per-test entry overrides it.
MINIMAL = ",".join(f"{r}=brisvox.daemon.minimal:main" for r in ("gateway", "worker", "agent"))


def child_env(real_roles: bool = False, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.pop("BRISVOX_TEST_ROLE_MAIN", None)
    env["PYTHONPATH"] = str(ROOT)
    roles = extra.pop("BRISVOX_TEST_ROLE_MAIN", "")
    env.update(extra)
    mains = ",".join(x for x in ("" if real_roles else MINIMAL, roles) if x)
    if mains:
        env["BRISVOX_TEST_ROLE_MAIN"] = mains
    return env


class Daemon:
    def __init__(self, tmp: Path, config: Path | None = None, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = (), real_roles: bool = False) -> None:
        self.tmp = tmp
        self.config = config or write_config(tmp)
        self.run_dir = tmp / "run"
        self.log_path = tmp / "daemon.log"
        self.env = child_env(real_roles, **(env or {}))
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.instance = ""
        self.seen_pids: set[int] = set()

    def start(self) -> Daemon:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([*BRISVOXD, "start", "--foreground", "--config", str(self.config), *self.args],
                                     cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    @property
    def control(self) -> str:
        return endpoint(self.run_dir, "control")

    def command(self, name: str, args: dict[str, Any] | None = None, timeout: float = 3.0) -> Any:
        return request_sync(self.control, Command(name=name, args=args), timeout)

    def status(self) -> dict[str, Any]:
        snap = self.command("status").data
        self.instance = snap["daemon"]["instance"]
        for c in snap["children"]:
            if c["pid"]:
                self.seen_pids.add(c["pid"])
        return snap

    def wait_for(self, pred: Any, timeout: float = 10.0, what: str = "condition") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}) waiting for {what}:\n{self.logs()}")
            try:
                last = self.status()
                if pred(last):
                    return last
            except RequestTimeout:
                pass
            time.sleep(0.03)
        raise AssertionError(f"timed out waiting for {what}; last status {last}\n{self.logs()[-4000:]}")

    def wait_ready(self, timeout: float = 10.0) -> dict[str, Any]:
        return self.wait_for(lambda s: s["daemon"]["ready"] and all(c["state"] == "ready" for c in s["children"]),
                             timeout, "every child ready")

    def child(self, snap: dict[str, Any], name: str) -> dict[str, Any]:
        return next(c for c in snap["children"] if c["name"] == name)

    def metrics_text(self, path: str = "/metrics") -> tuple[int, str]:
        url = self.status()["daemon"]["metrics_url"].rsplit("/", 1)[0] + path
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_exit(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        from ipc.ring import SHM_DIR

        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for pid in self.seen_pids:  # children whose group we could not reach (never expected)
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"brisvoxd:"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        if self.instance:
            for p in SHM_DIR.glob(f"brisvox.{self.instance}.*"):
                p.unlink(missing_ok=True)
        if hasattr(self, "_log"):
            self._log.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_dead(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.03)
    return [p for p in pids if alive(p)]
