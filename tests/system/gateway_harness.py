"""Helpers for the gateway's system tests: a standalone gateway process, a fake
agent process on ZeroMQ, free ports and speech fixtures (espeak-ng + sox).

Everything started here is stopped by pid and its shared-memory segments are
swept, even when the test fails.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import zmq

from ipc.ring import instance_id

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
# the default routes, with the built-in echo agent reachable as /twilio/echo and /ws/echo
# (a route admits no agent by name unless it lists it)
ECHO_ROUTES = [{"path": "/twilio", "protocol": "twilio", "agent": "default", "agents": ["echo"]},
               {"path": "/ws", "protocol": "native", "agent": "default", "agents": ["echo"]}]
_seq = itertools.count(1)

# Ports a test picks for a peer that binds them later (free_port closes its probe first) come
# from PICK, below the kernel's ephemeral range (32768-60999 by default): no connect() or bind to
# port 0 of any process can take one in between. Each pytest-xdist worker (gwN of
# PYTEST_XDIST_WORKER_COUNT) walks its own slice of PICK, and of RTP for rtp_range, so parallel
# workers never hand out the same port; a plain pytest run has the whole range.
PICK = (10000, 20000)
RTP = (40000, 60000)
_cursor: dict[tuple[int, int], int] = {}


def _worker_slice(lo: int, hi: int) -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    index = int(worker[2:]) % count if worker[:2] == "gw" and worker[2:].isdigit() else 0
    width = (hi - lo) // count
    return lo + index * width, lo + (index + 1) * width


def _next_base(lo: int, hi: int, count: int) -> int:
    """The next even base of ``count`` ports in this worker's slice of lo..hi, from a pid-dependent start."""
    lo, hi = _worker_slice(lo, hi)
    pos = _cursor.get((lo, hi), lo + (os.getpid() * 7919) % (hi - lo))
    base = pos + (pos & 1)
    if base + count > hi:
        base = lo + (lo & 1)
    _cursor[(lo, hi)] = base + count
    return base


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(base: int, count: int, kind: int) -> bool:
    socks = []
    try:
        for i in range(count):
            s = socket.socket(socket.AF_INET, kind)
            socks.append(s)
            s.bind(("127.0.0.1", base + i))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def _pick(count: int, kind: int) -> int:
    if _ephemeral_low() < PICK[1]:  # a host whose ephemeral range covers PICK: the kernel's choice
        for _ in range(200):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", 0))
                base = int(s.getsockname()[1])
            base -= base & 1 if count > 1 else 0
            if _bindable(base, count, kind):
                return base
        raise RuntimeError("no free port range")
    for _ in range(2000):
        base = _next_base(*PICK, count)
        if _bindable(base, count, kind):
            return base
    raise RuntimeError(f"no {count} free ports in {_worker_slice(*PICK)}")


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    """A port free on 127.0.0.1 right now (UDP, or ``kind``), for a peer to bind next."""
    return _pick(1, kind)


def free_port_pair_base(count: int = 2) -> int:
    """A port p such that p..p+count-1 are free for UDP right now (even p)."""
    return _pick(count, socket.SOCK_DGRAM)


def rtp_range(n_ports: int) -> tuple[int, int]:
    """A per-test RTP port range: in this xdist worker's slice of RTP, so parallel workers' ranges never overlap."""
    base = _next_base(*RTP, n_ports)
    return base, base + n_ports


def make_fixture(tmp: Path, text: str = "Hello, this is a test of the brisvox gateway. One two three four five.",
                 rate: int = 8000) -> dict[str, Path]:
    """Speech: a WAV at ``rate`` (16-bit), raw mu-law trimmed to whole 20 ms packets, and
    sox's own decode of that mu-law as the bit-exact reference."""
    wav = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True)
    wav8 = tmp / f"speech{rate}.wav"
    subprocess.run(["sox", str(wav), "-r", str(rate), "-c", "1", "-b", "16", "-e", "signed", str(wav8)],
                   check=True, capture_output=True)
    ulaw_full = tmp / "speech_full.ulaw"
    subprocess.run(["sox", str(wav), "-r", "8000", "-c", "1", "-t", "raw", "-e", "mu-law", str(ulaw_full)],
                   check=True, capture_output=True)
    data = ulaw_full.read_bytes()
    ulaw = tmp / "speech.ulaw"
    ulaw.write_bytes(data[: len(data) // 160 * 160])
    ref = tmp / "speech_ref.s16"
    subprocess.run(["sox", "-t", "raw", "-r", "8000", "-c", "1", "-e", "mu-law", str(ulaw),
                    "-t", "raw", "-e", "signed", "-b", "16", "-L", str(ref)], check=True, capture_output=True)
    return {"wav": wav8, "ulaw": ulaw, "ref": ref}


def sweep_instance(instance: str) -> list[str]:
    left = []
    for p in Path("/dev/shm").glob(f"brisvox.{instance}.*"):
        left.append(p.name)
        p.unlink(missing_ok=True)
    return left


class GatewayProc:
    """``python -m brisvox.gateway`` with a generated config; stopped by pid.

    Its rings are under the gateway process's own instance tag (``instance``, known once it
    started): a live instance, so the orphan sweep of a brisvoxd another test (or xdist
    worker) starts meanwhile leaves them alone, as it leaves a live daemon's.
    """

    def __init__(self, tmp: Path, *, gateway: dict[str, Any] | None = None, sip: dict[str, Any] | None = None,
                 websocket: dict[str, Any] | None = None, audiosocket: dict[str, Any] | None = None,
                 inbox: bool = False,
                 peers: dict[str, str] | None = None, extra_args: list[str] | None = None) -> None:
        self.tmp = tmp
        self.tag = f"t{os.getpid()}-{next(_seq)}"  # names its files; the rings' tag is ``instance``
        self.instance = ""
        lo, hi = rtp_range(400)
        tables = {
            # every test's calls come from 127.0.0.1: no per-source share ([gateway] max_calls_per_source,
            # a quarter of max_calls by default) unless a test sets one
            "gateway": {"echo_use_workers": False, "max_calls_per_source": 100_000, **(gateway or {})},
            # the tests call SIP users of many names (sales, conformance, default, ...): every one reaches
            # the agents' default, chosen explicitly as configs/brisvoxd.toml does ([sip] default_agent
            # is "" by default: an unknown user gets 404)
            "sip": {"port": 0, "rtp_port_min": lo, "rtp_port_max": hi, "default_agent": "default", **(sip or {})},
            # the tests connect to loopback without credentials as `make run`'s config allows
            # (trust_loopback); a test of the credentials sets false (or a public host: then none)
            "websocket": {"port": 0, **({} if (websocket or {}).get("host", "127.0.0.1") not in
                                        ("127.0.0.1", "localhost", "::1") else {"trust_loopback": True}),
                          **(websocket or {})},
        }
        if audiosocket is not None:  # Asterisk's AudioSocket listener, on an ephemeral loopback port
            tables["audiosocket"] = {"enabled": True, "port": 0, **audiosocket}
        self.config = tmp / f"gw-{self.tag}.toml"
        self.config.write_text(_toml(tables))
        self.inbox = f"ipc://{tmp}/gw-{self.tag}.sock" if inbox else ""
        self.args = [PY, "-m", "brisvox.gateway", "--config", str(self.config)]
        if self.inbox:
            self.args += ["--inbox", self.inbox]
        for name, ep in (peers or {}).items():
            self.args += ["--peer", f"{name}={ep}"]
        self.args += extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoints: dict[str, str] = {}
        self.stderr_path = tmp / f"gw-{self.tag}.err"

    def __enter__(self) -> GatewayProc:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self._err, env=env, cwd=str(ROOT))
        with contextlib.suppress(Exception):  # the ready line says it too; this one serves a failed start
            self.instance = instance_id(self.proc.pid)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        if not ready:
            self.__exit__(None, None, None)
            raise RuntimeError(f"gateway did not start: {self.stderr()}")
        line = self.proc.stdout.readline()
        if not line:
            self.__exit__(None, None, None)
            raise RuntimeError(f"gateway exited: {self.stderr()}")
        ready_line = orjson.loads(line)
        self.endpoints, self.instance = ready_line["endpoints"], ready_line["instance"]
        return self

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-4000:]
        except OSError:
            return ""

    @property
    def sip_port(self) -> int:
        return int(self.endpoints["sip"].rsplit(":", 1)[1])

    @property
    def ws_port(self) -> int:
        return int(self.endpoints["websocket"].rsplit(":", 1)[1])

    @property
    def audiosocket_port(self) -> int:
        return int(self.endpoints["audiosocket"].rsplit(":", 1)[1])

    def segments(self) -> list[str]:
        return sorted(p.name for p in Path("/dev/shm").glob(f"brisvox.{self.instance}.*"))

    def stats(self, timeout: float = 3.0) -> dict[str, Any]:
        return self.command("stats", timeout)

    def command(self, name: str, timeout: float = 3.0) -> dict[str, Any]:
        from ipc.bus import request_sync
        from ipc.frames import Command

        assert self.inbox, "start the gateway with inbox=True"
        reply = request_sync(self.inbox, Command(name=name), timeout)
        return reply.data or {}  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        if p is not None and p.stdout is not None:
            p.stdout.close()
        with contextlib.suppress(Exception):
            self._err.close()
        self.leaked = sweep_instance(self.instance) if self.instance else []


def _toml(tables: dict[str, dict[str, Any]]) -> str:
    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list | tuple):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f'"{k}" = {val(x)}' for k, x in v.items()) + "}"
        raise TypeError(v)

    out = []
    for name, table in tables.items():
        out.append(f"[{name}]")
        for k, v in table.items():
            out.append(f"{k} = {val(v)}")
        out.append("")
    return "\n".join(out)


class FakeAgent:
    """An agent process on ZeroMQ: binds its inbox, accepts every CallStart, records
    what the gateway sends, and sends frames to the gateway. Runs on a thread."""

    def __init__(self, tmp: Path, name: str = "agent-0", accept: bool = True) -> None:
        self.endpoint = f"ipc://{tmp}/{name}-{os.getpid()}-{next(_seq)}.sock"
        self.accept = accept
        self.frames: list[Any] = []
        self.gateway_id = b""
        self._lock = threading.Lock()
        self._out: list[bytes] = []
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeAgent:
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.bind(self.endpoint)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close(0)
        self._ctx.term()

    def _run(self) -> None:
        from ipc.codec import decode_env, encode
        from ipc.frames import CallAccepted, CallStart, ErrorReply

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            with self._lock:
                out, self._out = self._out, []
            for data in out:
                try:
                    self._sock.send_multipart([self.gateway_id or b"gateway-0", data])
                except zmq.ZMQError:
                    pass
            if not dict(poller.poll(5)):
                continue
            while True:
                try:
                    ident, data = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.gateway_id = ident
                frame, cid = decode_env(data)
                with self._lock:
                    self.frames.append(frame)
                if isinstance(frame, CallStart):
                    reply = CallAccepted(call_id=frame.call_id) if self.accept else ErrorReply(kind="busy")
                    self._sock.send_multipart([ident, encode(reply, cid=cid)])

    def send(self, frame: Any) -> None:
        from ipc.codec import encode

        with self._lock:
            self._out.append(encode(frame))

    def of(self, cls: type) -> list[Any]:
        with self._lock:
            return [f for f in self.frames if isinstance(f, cls)]

    def wait_for(self, cls: type, pred: Any = None, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for f in self.of(cls):
                if pred is None or pred(f):
                    return f
            time.sleep(0.005)
        raise AssertionError(f"no {cls.__name__} within {timeout}s; got {[type(f).__name__ for f in self.frames]}")


@contextlib.contextmanager
def attached_ring(instance: str, kind: str, timeout: float = 10.0) -> Iterator[Any]:
    """Wait for the first ring of ``kind`` of the instance and attach it."""
    from ipc.ring import Ring, list_segments

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        segs = [s for s in list_segments(instance) if s.endswith(f".{kind}")]
        if segs:
            ring = Ring.attach(segs[0])
            try:
                yield ring
            finally:
                ring.close()
            return
        time.sleep(0.005)
    raise AssertionError(f"no {kind} ring for {instance}")


def correlate(sent: np.ndarray, got: np.ndarray, rate: int = 8000) -> tuple[float, float]:
    """(delay in ms, correlation coefficient) of ``got`` against ``sent``."""
    a = sent.astype(np.float64)
    b = got.astype(np.float64)
    n = len(a) + len(b)
    c = np.fft.irfft(np.fft.rfft(b, 2 * n) * np.conj(np.fft.rfft(a, 2 * n)))[:len(b)]
    lag = int(np.argmax(c))
    seg = min(len(a), len(b) - lag)
    if seg < rate // 10:
        return lag * 1000 / rate, 0.0
    return lag * 1000 / rate, float(np.corrcoef(a[:seg], b[lag:lag + seg])[0, 1])


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def wait_for(pred: Any, timeout: float, step: float = 0.05) -> bool:
    """Poll ``pred`` until it is true or ``timeout`` s passed; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())
