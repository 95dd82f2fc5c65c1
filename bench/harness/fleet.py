"""A fleet on loopback: N real ``brisvoxd`` behind Kamailio (SIP) and HAProxy (WebSocket), always cleaned up.

Used by ``tests/system/test_fleet.py`` and ``python -m bench fleet``
(``bench/bench_fleet.py``); the scenario they share is
:mod:`bench.harness.fleet_scenario`, the callers :mod:`bench.harness.fleet_calls`.

* :class:`Fleet` starts one :class:`~bench.harness.daemon.Daemon` per instance
  (``a`` on 127.0.0.3, ``b`` on 127.0.0.4, ...; each its own tmp dir, config,
  runtime dir, call records, SIP/RTP/WebSocket ports on its own address; the
  scripted providers, so no model or key is needed; ``trusted_proxies`` = the
  proxies' address), then Kamailio and HAProxy on 127.0.0.2 with free ports,
  each running the SHIPPED file (``deploy/kamailio/kamailio.cfg`` with ``-A``
  defines, ``deploy/haproxy/haproxy.cfg`` with its environment variables), so
  a test exercises exactly what an operator installs.
* Helpers: the dispatcher's view of every destination (``kamcmd
  dispatcher.list`` on Kamailio's ctl socket), HAProxy's (``show stat`` on its
  admin socket), waits on either, and an instance's drain (the daemon's
  ``drain`` command), SIGKILL of its supervisor, and restart (same config,
  same ports).

Invariants: every process is started in its own session and stopped by its
pid / process group in :meth:`Fleet.close` (SIGTERM, then SIGKILL), whatever
happened; each instance's ``/dev/shm`` segments are removed by its
:meth:`Daemon.close`; every wait is bounded; nothing binds outside
127.0.0.0/8.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.harness.daemon import FAST, Daemon
from brisvox.agent.host.call_record import read_records
from brisvox.sim.ws_caller import TTS_RATE

ROOT = Path(__file__).resolve().parents[2]
KAMAILIO_CFG = ROOT / "deploy" / "kamailio" / "kamailio.cfg"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
PROXY_HOST = "127.0.0.2"
HOSTS = ("127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6")
SCRIPT = {"user": ["what time do you close"], "bot": ["We close at ten tonight, and we open at nine."]}


def tools_missing() -> list[str]:
    """The external programs a fleet needs that are not installed (empty: all there)."""
    need = {"kamailio": "kamailio", "kamcmd": "kamailio", "haproxy": "haproxy", "sipp": "sip-tester"}
    return [f"{exe} (apt package {pkg})" for exe, pkg in need.items()
            if shutil.which(exe) is None and not Path("/usr/sbin", exe).exists()]


def exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def free_port(host: str, kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_both(host: str) -> int:
    """A port free for UDP and TCP on ``host`` right now."""
    for _ in range(100):
        p = free_port(host, socket.SOCK_STREAM)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((host, p))
            return p
        except OSError:
            continue
    raise RuntimeError(f"no port free for UDP and TCP on {host}")


def _stop_group(proc: subprocess.Popen[bytes] | None, timeout: float = 3.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL whatever of it is left."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(2)
    except subprocess.TimeoutExpired:
        pass


def wait_until(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> float:
    """Poll ``pred`` until truthy; returns the seconds it took (AssertionError naming ``what``)."""
    t0 = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - a probe that cannot answer yet is "not yet"
            pass
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(step)


# -- one brisvoxd ------------------------------------------------------------------------------

INSTANCE = """
[gateway]
max_calls = 100
max_calls_per_source = 100  # the fleet's load generator is one source
echo_use_workers = false
tts_rate = {tts_rate}

[sip]
host = "{host}"
port = {sip_port}
default_agent = "default"  # the fleet's callers dial sip:fleet@...
rtp_port_min = {rtp_min}
rtp_port_max = {rtp_max}
trusted_proxies = ["{proxy}"]
invite_rate = ["200/second"]   # the test's callers are one loopback address
options_rate = ["1000/second"] # the dispatcher's probes plus the test's own

[websocket]
host = "{host}"
port = {ws_port}
trusted_proxies = ["{proxy}"]
handshakes_per_s = 0
max_connections_per_source = 0

[smart_turn]
enabled = false

[agents]
providers = "scripted"
script = "{script}"
smart_turn = false
lead_margin_ms = 0
max_calls = 128

[calls]
path = "{records}"
"""


@dataclass
class Instance:
    name: str
    host: str
    sip_port: int
    ws_port: int
    tmp: Path
    config: Path
    daemon: Daemon | None = None
    retired: list[Daemon] = field(default_factory=list)  # earlier processes (killed, drained)
    starts: int = 0

    @property
    def sip_uri(self) -> str:
        return f"sip:{self.host}:{self.sip_port}"

    @property
    def ws_addr(self) -> str:
        return f"{self.host}:{self.ws_port}"

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.tmp / "records")

    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.proc is not None and self.daemon.proc.poll() is None

    def gateway_stats(self) -> dict[str, Any]:
        assert self.daemon is not None
        snap = self.daemon.status()
        return dict(self.daemon.child(snap, "gateway-0").get("stats") or {})


def write_instance_config(inst: Instance, rtp_min: int, proxy: str, drain_timeout_s: float) -> None:
    inst.tmp.mkdir(parents=True, exist_ok=True)
    script = inst.tmp / "script.json"
    script.write_bytes(orjson.dumps(SCRIPT))
    base = FAST.format(run=inst.tmp / "run", state=inst.tmp / "state", workers=1, agents=1)
    base = base.replace("drain_timeout_s = 5.0", f"drain_timeout_s = {drain_timeout_s:g}")
    base = base.replace('level = "info"', 'level = "warning"')
    extra = INSTANCE.format(tts_rate=TTS_RATE, host=inst.host, sip_port=inst.sip_port, ws_port=inst.ws_port,
                            rtp_min=rtp_min, rtp_max=rtp_min + 198, proxy=proxy, script=script,
                            records=inst.tmp / "records")
    inst.config.write_text(base + extra)


class _Proxy:
    """What Kamailio and HAProxy share: the log file they write and how they are stopped."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        _stop_group(self.proc)
        if hasattr(self, "_log"):
            self._log.close()


# -- Kamailio ----------------------------------------------------------------------------------

class Kamailio(_Proxy):
    """``deploy/kamailio/kamailio.cfg`` on ``host:port`` with a dispatcher list of ``dests``."""

    def __init__(self, tmp: Path, host: str, port: int, dests: dict[str, str], ping_interval: int = 1,
                 fr_timer_ms: int = 2000) -> None:
        self.tmp, self.host, self.port = tmp, host, port
        self.dests = dests  # name -> sip:host:port
        self.ping_interval, self.fr_timer_ms = ping_interval, fr_timer_ms
        self.ctl = tmp / "kamailio_ctl"
        self.log_path = tmp / "kamailio.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        ds = self.tmp / "dispatcher.list"
        ds.write_text("".join(f"1 {uri} 0 0 duid={name}\n" for name, uri in self.dests.items()))
        return [exe("kamailio"), "-DD", "-E", "-f", str(KAMAILIO_CFG),
                "-A", f"LISTEN=udp:{self.host}:{self.port}", "-A", f'DS_LIST="{ds}"',
                "-A", f'CTL_SOCKET="unix:{self.ctl}"', "-A", f'PING_FROM="sip:dispatcher@{self.host}"',
                "-A", f"PING_INTERVAL={self.ping_interval}", "-A", f"FR_TIMER={self.fr_timer_ms}",
                "-A", "CHILDREN=2", "-P", str(self.tmp / "kamailio.pid"), "-Y", str(self.tmp), "-w", str(self.tmp),
                "-m", "32", "-M", "4"]

    def start(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        check = subprocess.run([*self.args(), "-c"], capture_output=True, text=True, timeout=20)
        if check.returncode != 0:
            raise RuntimeError(f"kamailio -c refused {KAMAILIO_CFG}:\n{check.stdout[-2000:]}{check.stderr[-2000:]}")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args(), stdout=self._log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                     start_new_session=True)
        wait_until(lambda: self.dispatcher(), 15, "Kamailio's ctl socket to answer dispatcher.list")

    def rpc(self, *cmd: str) -> str:
        r = subprocess.run([exe("kamcmd"), "-s", f"unix:{self.ctl}", *cmd], capture_output=True, text=True,
                           timeout=5)
        if r.returncode != 0:
            raise RuntimeError(f"kamcmd {' '.join(cmd)}: {r.stderr.strip()[:200]}")
        return r.stdout

    def dispatcher(self) -> dict[str, str]:
        """Destination URI -> dispatcher flags (``AP`` active and probed, ``IP`` inactive, ...)."""
        out = self.rpc("dispatcher.list")
        uris = re.findall(r"URI:\s*(\S+)", out)
        flags = re.findall(r"FLAGS:\s*(\S+)", out)
        return dict(zip(uris, flags, strict=True))

    def active(self, uri: str) -> bool:
        return self.dispatcher().get(uri, "").startswith("A")



# -- HAProxy -----------------------------------------------------------------------------------

class HAProxy(_Proxy):
    """``deploy/haproxy/haproxy.cfg`` on ``host:port`` in front of ``servers`` (name -> host:port)."""

    def __init__(self, tmp: Path, host: str, port: int, servers: dict[str, str]) -> None:
        self.tmp, self.host, self.port, self.servers = tmp, host, port, servers
        self.sock = tmp / "haproxy.sock"
        self.log_path = tmp / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> Path:
        """The shipped file as is when the servers are its ``a`` and ``b``; for another set, the
        same file with its ``server`` lines replaced (nothing else changes)."""
        if sorted(self.servers) == ["a", "b"]:
            return HAPROXY_CFG
        lines = [ln for ln in HAPROXY_CFG.read_text().splitlines() if not ln.strip().startswith("server ")]
        lines += [f"    server {n} {addr}" for n, addr in self.servers.items()]
        path = self.tmp / "haproxy.cfg"
        path.write_text("\n".join(lines) + "\n")
        return path

    def env(self) -> dict[str, str]:
        env = dict(os.environ, BRISVOX_LB_BIND=f"{self.host}:{self.port}", BRISVOX_LB_SOCKET=str(self.sock),
                   BRISVOX_LB_SOURCE=self.host)
        for n, addr in self.servers.items():
            env[f"BRISVOX_WS_{n.upper()}"] = addr
        return env

    def start(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        cfg = self.config()
        check = subprocess.run([exe("haproxy"), "-c", "-f", str(cfg)], env=self.env(), capture_output=True,
                               text=True, timeout=20)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused {cfg}:\n{check.stdout[-2000:]}{check.stderr[-2000:]}")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([exe("haproxy"), "-db", "-f", str(cfg)], env=self.env(), stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True)
        wait_until(lambda: self.status(), 15, "HAProxy's admin socket to answer show stat")

    def command(self, cmd: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(str(self.sock))
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return b"".join(chunks).decode(errors="replace")

    def status(self) -> dict[str, str]:
        """Server name -> HAProxy's status (``UP``, ``DOWN``, ``UP 1/2``, ...) in the media backend."""
        rows = self.command("show stat").splitlines()
        if not rows or not rows[0].startswith("# "):
            return {}
        head = rows[0][2:].split(",")
        ix = {k: i for i, k in enumerate(head)}
        out: dict[str, str] = {}
        for r in rows[1:]:
            f = r.split(",")
            if len(f) > ix["status"] and f[ix["pxname"]] == "brisvox_ws" and f[ix["svname"]] not in ("BACKEND",):
                out[f[ix["svname"]]] = f[ix["status"]]
        return out

    def up(self, name: str) -> bool:
        return self.status().get(name, "") == "UP"

    def down(self, name: str) -> bool:
        return self.status().get(name, "").startswith("DOWN")



# -- the fleet ---------------------------------------------------------------------------------

class Fleet:
    """N instances behind Kamailio and HAProxy (module docstring). Use as a context manager."""

    def __init__(self, tmp: Path, n: int = 2, proxy: str = PROXY_HOST, ping_interval: int = 1,
                 fr_timer_ms: int = 2000, drain_timeout_s: float = 120.0) -> None:
        if not 1 <= n <= len(HOSTS):
            raise ValueError(f"1..{len(HOSTS)} instances")
        self.tmp, self.proxy = tmp, proxy
        self.ping_interval, self.fr_timer_ms = ping_interval, fr_timer_ms
        self.drain_timeout_s = drain_timeout_s
        self.instances: dict[str, Instance] = {}
        rtp = 20000 + (os.getpid() % 90) * 400  # a range of its own per run (other runs share the machine)
        for i, host in enumerate(HOSTS[:n]):
            name = "abcdef"[i]
            d = tmp / name
            inst = Instance(name, host, free_both(host), free_port(host, socket.SOCK_STREAM), d, d / "brisvoxd.toml")
            write_instance_config(inst, rtp + i * 200, proxy, drain_timeout_s)
            self.instances[name] = inst
        self.kamailio = Kamailio(tmp / "kamailio", proxy, free_port(proxy), {n: i.sip_uri for n, i in self.items()},
                                 ping_interval, fr_timer_ms)
        self.haproxy = HAProxy(tmp / "haproxy", proxy, free_port(proxy, socket.SOCK_STREAM),
                               {n: i.ws_addr for n, i in self.items()})

    def items(self) -> list[tuple[str, Instance]]:
        return list(self.instances.items())

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ------------------------------------------------------------------------------
    @property
    def sip_target(self) -> str:
        """Kamailio's address (``host:port``) for SIPp and ``sip:`` URIs."""
        return f"{self.proxy}:{self.kamailio.port}"

    def ws_url(self, path: str = "/twilio") -> str:
        return f"ws://{self.proxy}:{self.haproxy.port}{path}"

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> float:
        """Every instance ready, then both proxies, then every destination active in both.
        Returns the seconds it took."""
        t0 = time.monotonic()
        for inst in self.instances.values():
            self._spawn(inst)
        for inst in self.instances.values():
            self._ready(inst, timeout)
        self.kamailio.start()
        self.haproxy.start()
        self.wait_active(list(self.instances), timeout=15)
        return time.monotonic() - t0

    def _spawn(self, inst: Instance) -> None:
        inst.starts += 1
        d = Daemon(inst.tmp, config=inst.config, real_roles=True,
                   env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        d.log_path = inst.tmp / f"daemon-{inst.starts}.log"
        inst.daemon = d.start()

    def _ready(self, inst: Instance, timeout: float) -> None:
        assert inst.daemon is not None
        inst.daemon.wait_ready(timeout)
        ep = inst.daemon.child(inst.daemon.status(), "gateway-0")["endpoints"]
        assert ep.get("sip") == f"{inst.host}:{inst.sip_port}", ep
        assert ep.get("websocket") == inst.ws_addr, ep

    def wait_active(self, names: list[str], timeout: float = 10.0) -> float:
        """Until the dispatcher has each of ``names`` active and HAProxy has it UP; seconds."""
        return wait_until(lambda: all(self.kamailio.active(self.instances[n].sip_uri) and self.haproxy.up(n)
                                      for n in names), timeout,
                          f"{names} active in Kamailio's dispatcher and UP in HAProxy "
                          f"(dispatcher {self._safe(self.kamailio.dispatcher)}, HAProxy {self._safe(self.haproxy.status)})")

    @staticmethod
    def _safe(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a diagnostic only
            return f"{type(e).__name__}: {e}"

    def states(self) -> dict[str, dict[str, Any]]:
        """Per instance: dispatcher flags, HAProxy status, process alive."""
        ds = self._safe(self.kamailio.dispatcher)
        hp = self._safe(self.haproxy.status)
        return {n: {"dispatcher": ds.get(i.sip_uri) if isinstance(ds, dict) else ds,
                    "haproxy": hp.get(n) if isinstance(hp, dict) else hp, "alive": i.alive()}
                for n, i in self.items()}

    # -- faults -----------------------------------------------------------------------------------
    def drain(self, name: str, timeout_s: float | None = None) -> float:
        """``brisvoxd drain`` on ``name`` (its control socket); returns time.monotonic() of the command."""
        inst = self.instances[name]
        assert inst.daemon is not None
        t = time.monotonic()
        reply = inst.daemon.command("drain", {"timeout_s": timeout_s if timeout_s is not None
                                              else self.drain_timeout_s})
        assert getattr(reply, "ok", False), reply
        return t

    def kill(self, name: str) -> float:
        """SIGKILL the supervisor of ``name`` (its children get SIGTERM from the kernel); returns
        time.monotonic() of the kill."""
        inst = self.instances[name]
        assert inst.daemon is not None and inst.daemon.proc is not None
        t = time.monotonic()
        os.kill(inst.daemon.proc.pid, signal.SIGKILL)
        inst.daemon.proc.wait(5)
        return t

    def group_gone(self, name: str) -> bool:
        """True when no process of the instance's (last) process group is left."""
        inst = self.instances[name]
        if inst.daemon is None or inst.daemon.proc is None:
            return True
        try:
            os.killpg(inst.daemon.proc.pid, 0)
            return False
        except ProcessLookupError:
            return True

    def restart(self, name: str, timeout: float = 60.0) -> float:
        """Start ``name`` again (same config and ports) after its process is gone; seconds to ready."""
        inst = self.instances[name]
        if inst.daemon is not None:
            if inst.daemon.proc is not None and inst.daemon.proc.poll() is None:
                raise RuntimeError(f"instance {name} is still running")
            inst.daemon.close()  # whatever is left of its group, its /dev/shm segments
            inst.retired.append(inst.daemon)
        t0 = time.monotonic()
        self._spawn(inst)
        self._ready(inst, timeout)
        return time.monotonic() - t0

    def logs(self, tail: int = 3000) -> str:
        out = [f"states: {self.states()}"]
        for n, i in self.items():
            for d in [*i.retired, i.daemon]:
                if d is not None:
                    out.append(f"--- {n} {d.log_path.name}\n{d.logs()[-tail:]}")
        out.append(f"--- kamailio\n{self.kamailio.log()[-tail:]}")
        out.append(f"--- haproxy\n{self.haproxy.log()[-tail:]}")
        return "\n".join(out)

    def close(self) -> None:
        for fn in (self.haproxy.close, self.kamailio.close):
            try:
                fn()
            except Exception:  # noqa: BLE001 - every part is stopped whatever one did
                pass
        for inst in self.instances.values():
            for d in [*inst.retired, inst.daemon]:
                if d is not None:
                    try:
                        d.close()
                    except Exception:  # noqa: BLE001
                        pass
