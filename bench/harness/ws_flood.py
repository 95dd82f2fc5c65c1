"""WebSocket floods against a running gateway, and the frame gaps of a bystander call meanwhile.

Used by ``tests/system/test_ws_floods.py`` and ``python -m bench fuzz``
(:mod:`bench.bench_fuzz`): the gateway's listener under

* a half-open flood (:func:`half_open`): TCP connections from many loopback
  source addresses that send part of a request head and nothing more;
* frame floods on upgraded connections (:class:`FrameFlood`, one thread per
  connection, raw sockets): one-byte fragments of a message that never
  ends, pings while never reading the pongs, two-byte binary frames after a
  native ``start``; each connection floods until the gateway stops reading
  it, then reads what came back (the close frame's code and reason) and
  connects again, until the phase's deadline;

while :func:`bystander` runs a native call to the echo agent and records
when each of its audio frames came back (the gateway's pacer sends one every
20 ms: the gaps are what a flood does to everyone else's audio).

Invariants: every socket opened here is closed before the function that
opened it returns (the threads are joined); everything binds 127.0.0.0/8;
every wait is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import resource
import selectors
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.harness.daemon import BRISVOXD, ROOT, Daemon
from brisvox.wire.native import NativeStream, server_message

FRAME_S = 0.02
KINDS = ("fragments", "pings", "tiny")
# the daemon's gateway role alone (its echo agent serves the bystander; nothing else is needed)
GATEWAY_ONLY = {"BRISVOX_TEST_ROLE_MAIN": "gateway=brisvox.gateway.process:main",
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def echo_config(secret: str) -> str:
    """The role sections (``extra`` of :func:`bench.harness.daemon.write_config`) of a daemon whose
    native route ``/ws`` lets ``/ws/echo?token=<secret>`` reach the echo agent, SIP off, the
    default ``[websocket]`` limits."""
    return f"""
[gateway]
echo_use_workers = false
echo_delay_ms = 100

[sip]
enabled = false

[websocket]
port = 0
native_secret = "{secret}"
routes = [{{ path = "/ws", protocol = "native", agent = "default", agents = ["echo"] }}]
"""


# -- a daemon with a small soft file limit -----------------------------------------------------


class LimitedDaemon(Daemon):
    """:class:`~bench.harness.daemon.Daemon` whose process (and so its children) starts with the soft
    ``RLIMIT_NOFILE`` at ``nofile`` (the hard limit stays what it is), as from a shell with ``ulimit -n``."""

    def __init__(self, *args: Any, nofile: int = 1024, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nofile = nofile

    def _limit(self) -> None:  # runs in the child between fork and exec
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(self.nofile, hard), hard))

    def start(self) -> LimitedDaemon:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([*BRISVOXD, "start", "--foreground", "--config", str(self.config), *self.args],
                                     cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=self._limit)
        return self


def limited_module(argv: list[str], nofile: int) -> list[str]:
    """``argv`` (``[python, "-m", module, *args]``) as a command that first sets the soft ``RLIMIT_NOFILE``
    to ``nofile`` (the hard limit stays) in the process itself, then runs the module (same pid)."""
    py, flag, module, *args = argv
    assert flag == "-m", argv
    code = ("import resource, runpy, sys; h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, (min({nofile}, h), h)); sys.argv[0] = {module!r}; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [py, "-c", code, *args]


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


# -- the bystander call ---------------------------------------------------------------------------


@dataclass
class Gaps:
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each audio frame received
    error: str = ""

    def between(self, t0: float, t1: float) -> np.ndarray:
        """Gaps (ms) between consecutive frames that arrived within ``[t0, t1]``."""
        a = np.array([t for t in self.arrivals if t0 <= t <= t1])
        return np.diff(a) * 1000.0 if len(a) > 1 else np.zeros(0)


def gap_figures(gaps: np.ndarray) -> dict[str, float]:
    if not len(gaps):
        return {"frames": 0, "p99_ms": float("nan"), "worst_ms": float("nan")}
    return {"frames": len(gaps) + 1, "p99_ms": float(np.percentile(gaps, 99)), "worst_ms": float(gaps.max())}


async def bystander(port: int, stop: asyncio.Event, gaps: Gaps, path: str = "/ws/echo", rate: int = 8000) -> None:
    """A native call to the echo agent: 20 ms frames of a tone out, the echo's arrival times into ``gaps``,
    until ``stop`` is set."""
    from websockets.asyncio.client import connect

    n = rate // 50
    tone = (4000 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)).astype("<i2").tobytes()
    try:
        async with connect(f"ws://127.0.0.1:{port}{path}", open_timeout=5, close_timeout=2, max_queue=None) as ws:
            await ws.send(NativeStream(rate).start())
            assert server_message(orjson.loads(await ws.recv())).event == "started"

            async def rx() -> None:
                async for m in ws:
                    if isinstance(m, bytes):
                        gaps.arrivals.append(time.monotonic())

            task = asyncio.create_task(rx())
            t0 = time.monotonic()
            k = 0
            while not stop.is_set():
                await ws.send(tone)
                k += 1
                await asyncio.sleep(max(0.0, t0 + k * FRAME_S - time.monotonic()))
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    except Exception as e:  # noqa: BLE001 - a lost call is a result
        gaps.error = f"{type(e).__name__}: {e}"[:200]


# -- the half-open flood -------------------------------------------------------------------------


def sources(n: int, first: int = 10) -> list[str]:
    """``n`` loopback source addresses from 127.0.<first>.1 on (never 127.0.0.1, the bystander's)."""
    return [f"127.0.{first + i // 250}.{1 + i % 250}" for i in range(n)]


def half_open(port: int, n: int, addrs: list[str], deadline_s: float = 5.0) -> tuple[list[socket.socket], int]:
    """``n`` connections spread over ``addrs``, each sending the start of a request head and nothing more.
    Returns the sockets (the caller closes them) and how many connected."""
    socks: list[socket.socket] = []
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((addrs[i % len(addrs)], 0))
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        socks.append(s)
    connected = 0
    deadline = time.monotonic() + deadline_s
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_WRITE)
        left = len(socks)
        while left and time.monotonic() < deadline:
            for key, _ in sel.select(0.2):
                s = key.fileobj  # type: ignore[assignment]
                sel.unregister(s)
                left -= 1
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected += 1
                    with contextlib.suppress(OSError):
                        s.send(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
    return socks, connected


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()


def http_status(port: int, path: str = "/healthz", timeout: float = 2.0, host: str = "127.0.0.1") -> int:
    """The status of ``GET path`` on ``host:port`` (0 when it got no answer in time)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = s.recv(64)
        return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    except (OSError, ValueError, IndexError):
        return 0


# -- frame floods ------------------------------------------------------------------------------------


def _masked(payload: bytes, first: int) -> bytes:
    key = b"\x11\x22\x33\x44"
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes((first, 0x80 | len(payload))) + key + masked


def flood_bytes(kind: str, size: int = 65536) -> bytes:
    """About ``size`` bytes of one flood: one-byte continuation fragments, one-byte pings, or 2-byte binary
    frames (one PCM16 sample each: audio a native call accepts)."""
    unit = {"fragments": _masked(b"x", 0x00), "pings": _masked(b"p", 0x89), "tiny": _masked(b"\x00\x01", 0x82)}[kind]
    return unit * max(1, size // len(unit))


def _closes(data: bytes) -> list[tuple[int, str]]:
    """The close frames (code, reason) among unmasked server frames in ``data``."""
    out, pos = [], 0
    while pos + 2 <= len(data):
        b0, b1 = data[pos], data[pos + 1] & 0x7F
        h = 2
        if b1 == 126:
            if pos + 4 > len(data):
                break
            b1, h = struct.unpack_from("!H", data, pos + 2)[0], 4
        elif b1 == 127:
            if pos + 10 > len(data):
                break
            b1, h = struct.unpack_from("!Q", data, pos + 2)[0], 10
        body = data[pos + h:pos + h + b1]
        if b0 == 0x88 and len(body) >= 2:
            out.append((struct.unpack("!H", body[:2])[0], body[2:].decode("utf-8", "replace")))
        pos += h + b1
    return out


@dataclass
class FloodResult:
    kind: str
    source: str
    connections: int = 0
    closes: list[tuple[int, str]] = field(default_factory=list)  # per connection: what the gateway said
    to_close_s: list[float] = field(default_factory=list)  # per connection: flood start -> gateway stopped reading
    refused: int = 0  # handshakes answered with something else than 101 (e.g. 429)
    sent_bytes: int = 0
    errors: list[str] = field(default_factory=list)


class FrameFlood:
    """One flooding connection after another from ``source`` until ``until`` (a thread; see module doc)."""

    def __init__(self, port: int, kind: str, source: str, until: float, path: str = "/ws/echo") -> None:
        self.port, self.kind, self.source, self.until, self.path = port, kind, source, until, path
        self.result = FloodResult(kind, source)
        self.chunk = flood_bytes(kind)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _handshake(self, s: socket.socket) -> bool:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET {self.path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            got = s.recv(4096)
            if not got:
                return False
            head += got
        if not head.startswith(b"HTTP/1.1 101"):
            return False
        if self.kind == "tiny":  # a call first: its audio frames are what floods
            start = NativeStream(8000).start().encode()
            s.sendall(_masked(start, 0x81) if len(start) < 126 else
                      struct.pack("!BBH", 0x81, 0x80 | 126, len(start)) + b"\0\0\0\0" + start)
        elif self.kind == "fragments":  # the message the continuations belong to, never finished
            s.sendall(_masked(b"x", 0x01))
        return True

    def _one(self) -> None:
        r = self.result
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((self.source, 0))
            s.settimeout(2.0)
            s.connect(("127.0.0.1", self.port))
            if not self._handshake(s):
                r.refused += 1
                time.sleep(0.1)
                return
            r.connections += 1
            s.settimeout(0.2)  # a send that blocks this long: the gateway stopped reading
            t0 = time.monotonic()
            try:
                while time.monotonic() < self.until + 2.0:
                    s.sendall(self.chunk)
                    r.sent_bytes += len(self.chunk)
            except (TimeoutError, OSError):
                pass
            r.to_close_s.append(time.monotonic() - t0)
            data = b""
            s.settimeout(1.0)
            with contextlib.suppress(OSError):
                while len(data) < 1 << 22:
                    got = s.recv(65536)
                    if not got:
                        break
                    data += got
            closes = _closes(data)
            r.closes.append(closes[0] if closes else (0, ""))
        except OSError as e:
            r.errors.append(f"{type(e).__name__}: {e}"[:120])
        finally:
            s.close()

    def _run(self) -> None:
        while time.monotonic() < self.until:
            self._one()


def frame_floods(port: int, kind: str, addrs: list[str], seconds: float, path: str = "/ws/echo") -> list[FloodResult]:
    """One :class:`FrameFlood` per address for ``seconds``; their results once every thread is done."""
    until = time.monotonic() + seconds
    floods = [FrameFlood(port, kind, a, until, path) for a in addrs]
    for f in floods:
        f.thread.start()
    for f in floods:
        f.thread.join(seconds + 10.0)
    return [f.result for f in floods]


Phase = tuple[str, float, float, list[FloodResult]]  # kind, monotonic start and end, per connection


def flood_phases(port: int, kinds: tuple[str, ...], addrs: list[str], seconds: float, path: str) -> list[Phase]:
    """:func:`frame_floods` of each kind in turn."""
    out = []
    for kind in kinds:
        t0 = time.monotonic()
        results = frame_floods(port, kind, addrs, seconds, path)
        out.append((kind, t0, time.monotonic(), results))
    return out


async def flood_phases_apart(port: int, kinds: tuple[str, ...], addrs: list[str], seconds: float,
                             path: str) -> list[Phase]:
    """:func:`flood_phases` in a process of its own (spawned), so the flooding threads never hold the
    interpreter lock of the bystander's loop: its gaps are the gateway's, not this process's. The
    monotonic clock is the system's, so the phases' times compare with the bystander's."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, flood_phases, port, kinds, addrs,
                                                                seconds, path)


def log_lines(path: Path, start: int) -> int:
    """Lines written to ``path`` after byte ``start``."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().count(b"\n")
    except OSError:
        return -1
