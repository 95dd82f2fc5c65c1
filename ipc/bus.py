"""ZeroMQ plumbing for control frames: endpoints, socket options, request/reply.

Owns how processes reach each other; no domain logic.

Invariants:

* Endpoints live in the daemon's runtime directory as ``ipc://<dir>/<name>.sock``
  (``tcp://`` is accepted verbatim where a deployment spreads roles over hosts).
  An ``ipc`` path longer than the kernel's 107-byte limit is refused up front.
* Every socket made here has ``LINGER`` 0 (closing never hangs), bounded send
  and receive high-water marks, and ROUTER sockets have ``ROUTER_MANDATORY``
  so an unroutable reply raises ``EHOSTUNREACH`` instead of vanishing.
* Every request has a timeout; a reply whose correlation id is unknown (late,
  after its timeout) is counted and dropped.
* No ZeroMQ context is created at import time: the supervisor forks before
  any context exists, and each process makes its own.
* Every socket made by :func:`make_socket` is in :data:`SOCKETS` (type, the
  endpoints :func:`bind` / :func:`connect` gave it, where it was made) until it
  is closed or collected: :meth:`SocketRegistry.still_open` names the sockets
  that keep a context from terminating.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from ipc.codec import DecodeGuard, Frame, decode_env, encode

IPC_PATH_MAX = 107
DEFAULT_HWM = 10_000


class BusError(Exception):
    """Endpoint or socket setup failed."""


class RequestTimeout(TimeoutError):
    """No reply arrived within the request's timeout."""


def endpoint(runtime_dir: str | os.PathLike[str], name: str) -> str:
    """``ipc://<runtime_dir>/<name>.sock``; raises if the path is too long."""
    path = str(Path(runtime_dir) / f"{name}.sock")
    if len(path.encode()) > IPC_PATH_MAX:
        raise BusError(
            f"ipc path {path!r} is {len(path.encode())} bytes (limit {IPC_PATH_MAX}); "
            "choose a shorter runtime_dir"
        )
    return "ipc://" + path


def endpoint_path(ep: str) -> Path | None:
    """Filesystem path of an ``ipc://`` endpoint (None for tcp)."""
    return Path(ep[len("ipc://") :]) if ep.startswith("ipc://") else None


def configure(sock: zmq.Socket, *, hwm: int = DEFAULT_HWM, identity: bytes | None = None) -> zmq.Socket:
    """Apply the project's socket options (see module invariants)."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if sock.type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return sock


@dataclass(frozen=True, slots=True)
class OpenSocket:
    """A socket :data:`SOCKETS` found open: its type, endpoints and maker (``file:line function``)."""

    kind: str
    endpoints: tuple[str, ...]
    created_by: str

    def __str__(self) -> str:
        return f"{self.kind} {' '.join(self.endpoints) or '(no endpoint)'} made at {self.created_by}"


class _Entry:
    __slots__ = ("ref", "kind", "endpoints", "created_by")

    def __init__(self, sock: zmq.Socket, created_by: str) -> None:
        self.ref = weakref.ref(sock)
        self.kind = _kind_name(int(sock.type))
        self.endpoints: list[str] = []
        self.created_by = created_by


def _kind_name(kind: int) -> str:
    try:
        return zmq.SocketType(kind).name
    except ValueError:
        return str(kind)


def _maker(depth: int = 2) -> str:
    """``dir/file.py:line function`` of the first caller outside this module."""
    f = sys._getframe(depth)
    here = __file__
    while f.f_back is not None and f.f_code.co_filename == here:
        f = f.f_back
    path = Path(f.f_code.co_filename)
    return f"{path.parent.name}/{path.name}:{f.f_lineno} {f.f_code.co_name}"


class SocketRegistry:
    """The sockets made by :func:`make_socket` in this process, until closed or collected.

    Thread-safe (sockets are made on loops and on control threads); holds only weak
    references, so it keeps no socket alive; an entry leaves at the next look once
    its socket is closed or gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}

    def add(self, sock: zmq.Socket, created_by: str) -> None:
        with self._lock:
            self._prune()
            self._entries[id(sock)] = _Entry(sock, created_by)

    def note_endpoint(self, sock: zmq.Socket, ep: str) -> None:
        with self._lock:
            e = self._entries.get(id(sock))
            if e is not None and e.ref() is sock:
                e.endpoints.append(ep)

    def still_open(self, ctx: zmq.Context | None = None) -> list[OpenSocket]:
        """The registered sockets not closed yet (of ``ctx``'s underlying context when
        given: a shadow context's sockets count for the context it shadows)."""
        want = ctx.underlying if ctx is not None else None
        out = []
        with self._lock:
            self._prune()
            for e in self._entries.values():
                sock = e.ref()
                if sock is None or (want is not None and sock.context.underlying != want):
                    continue
                out.append(OpenSocket(e.kind, tuple(e.endpoints), e.created_by))
        return out

    def _prune(self) -> None:
        for k, e in list(self._entries.items()):
            sock = e.ref()
            if sock is None or sock.closed:
                del self._entries[k]


SOCKETS = SocketRegistry()


def describe_open(ctx: zmq.Context | None = None, limit: int = 8) -> str:
    """The sockets of ``ctx`` still open, for a log line ("none registered" if none)."""
    got = SOCKETS.still_open(ctx)
    if not got:
        return "none registered"
    more = f"; and {len(got) - limit} more" if len(got) > limit else ""
    return "; ".join(str(s) for s in got[:limit]) + more


def make_socket(ctx: zmq.Context, kind: int, *, hwm: int = DEFAULT_HWM, identity: bytes | None = None) -> Any:
    """A socket with the project's options (see :func:`configure`), registered in :data:`SOCKETS`."""
    sock = configure(ctx.socket(kind), hwm=hwm, identity=identity)
    SOCKETS.add(sock, _maker())
    return sock


def bind(sock: zmq.Socket, ep: str) -> None:
    """Bind, removing a stale ipc socket file left by a dead process first."""
    p = endpoint_path(ep)
    if p is not None:
        p.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    sock.bind(ep)
    SOCKETS.note_endpoint(sock, "bind " + ep)


def connect(sock: zmq.Socket, ep: str) -> None:
    """Connect (and note the endpoint in :data:`SOCKETS`)."""
    sock.connect(ep)
    SOCKETS.note_endpoint(sock, "connect " + ep)


def request_sync(
    ep: str, frame: Frame, timeout: float, ctx: zmq.Context | None = None, max_bytes: int = 1 << 20
) -> Frame:
    """One request/reply on a fresh DEALER (for CLIs). Raises RequestTimeout."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    sock = make_socket(ctx, zmq.DEALER)
    try:
        connect(sock, ep)
        cid = os.getpid()
        sock.send(encode(frame, cid=cid))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                raise RequestTimeout(f"no reply from {ep} within {timeout:g}s")
            reply, rcid = decode_env(sock.recv(), max_bytes)
            if rcid == cid:
                return reply
    finally:
        sock.close(0)
        if own:
            ctx.term()


class AsyncRequester:
    """Requests over one asyncio DEALER, matched to replies by correlation id.

    Unsolicited frames (no cid, or one we never issued) go to ``on_frame``
    when given; late replies are counted in ``late_replies``.
    """

    def __init__(self, sock: zmq.asyncio.Socket, where: str, on_frame: Any = None) -> None:
        self.sock = sock
        self.guard = DecodeGuard(where)
        self.on_frame = on_frame
        self.late_replies = 0
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for fut in self._pending.values():
            fut.cancel()
        self._pending.clear()

    async def send(self, frame: Frame) -> None:
        await self.sock.send(encode(frame))

    async def request(self, frame: Frame, timeout: float) -> Frame:
        cid = next(self._ids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        try:
            await self.sock.send(encode(frame, cid=cid))
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise RequestTimeout(f"{frame.TYPE}: no reply within {timeout:g}s") from None
        finally:
            self._pending.pop(cid, None)

    async def _recv_loop(self) -> None:
        while True:
            data = await self.sock.recv()
            got = self.guard.decode_env(data)
            if got is None:
                continue
            frame, cid = got
            if isinstance(cid, int) and cid in self._pending:
                fut = self._pending[cid]
                if not fut.done():
                    fut.set_result(frame)
            elif cid is not None:
                self.late_replies += 1
            elif self.on_frame is not None:
                r = self.on_frame(frame)
                if asyncio.iscoroutine(r):
                    await r
