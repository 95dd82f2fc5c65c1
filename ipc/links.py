"""A process's ZeroMQ control-plane links: one ROUTER inbox plus one DEALER per peer.

Owns one process's sockets of the control plane. The gateway uses it (its
ROUTER inbox, to which agents and workers connect DEALERs and push frames:
Clear, Mark, Hangup, OutUtterance, ...; and one DEALER per peer inbox,
identity ``gateway-<i>``, for requests such as CallStart and AttachCall and
pushes such as CallEnd, Playback, Cleared, MarkPlayed, Dtmf), and so does
the agent process (its inbox, and a DEALER to each ready gateway, identity
``agent-<i>``). Frames arriving on either side go to one handler. The module
knows frames and sockets only (``ipc`` imports no role package); which peers
exist and what their frames mean is the owner's business.

Invariants:

* Sockets are plain (non-asyncio) pyzmq sockets read from the event loop's
  reader callback: a frame is handled inline, in the callback that read it,
  never queued behind other work (the Clear fast path relies on it). The
  ZeroMQ FD is edge-triggered, so every callback drains until EAGAIN and a
  send re-checks ``EVENTS`` for input it may have hidden.
* Sends never block: a full peer (high-water mark) or an unroutable identity
  drops the frame and counts it (``dropped``).
* Every request has a timeout; a late reply is counted and dropped.
* Bad frames are counted per kind by a :class:`ipc.codec.DecodeGuard`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from ipc.bus import bind, connect, make_socket
from ipc.codec import DecodeGuard, Frame, encode

log = logging.getLogger("brisvox.gateway.links")  # the historical name: log filters keep working

FrameHandler = Callable[[Frame, str, "int | str | None"], None]


class Links:
    """Inbox + per-peer DEALERs on one loop (see module invariants)."""

    def __init__(self, ctx: zmq.Context, identity: str, on_frame: FrameHandler) -> None:
        self.ctx = ctx
        self.identity = identity
        self.on_frame = on_frame
        self.guard = DecodeGuard(f"{identity} links")
        self.inbox: zmq.Socket | None = None
        self.peers: dict[str, zmq.Socket] = {}
        self.endpoints: dict[str, str] = {}
        self.dropped: dict[str, int] = {}
        self.late_replies = 0
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fds: list[int] = []
        self.arrival_ns = 0
        self.closed = False  # after close(): connect() opens nothing (a late Topology push)

    # -- setup --------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop, inbox_endpoint: str | None) -> None:
        self._loop = loop
        if inbox_endpoint:
            sock = make_socket(self.ctx, zmq.ROUTER)
            bind(sock, inbox_endpoint)
            self.inbox = sock
            self._watch(sock, lambda: self._drain_inbox())

    def _watch(self, sock: zmq.Socket, cb: Callable[[], None]) -> None:
        assert self._loop is not None
        fd = int(sock.getsockopt(zmq.FD))
        self._loop.add_reader(fd, cb)
        self._fds.append(fd)
        self._loop.call_soon(cb)

    def connect(self, name: str, endpoint: str) -> None:
        """A DEALER to peer ``name``'s inbox (idempotent; a new endpoint reconnects;
        nothing once closed)."""
        if self.closed or self.endpoints.get(name) == endpoint:
            return
        self.disconnect(name)
        sock = make_socket(self.ctx, zmq.DEALER, identity=self.identity.encode())
        connect(sock, endpoint)
        self.peers[name] = sock
        self.endpoints[name] = endpoint
        self._watch(sock, functools.partial(self._drain_peer, sock, name))

    def disconnect(self, name: str) -> None:
        sock = self.peers.pop(name, None)
        self.endpoints.pop(name, None)
        if sock is not None:
            fd = int(sock.getsockopt(zmq.FD))
            if self._loop is not None:
                self._loop.remove_reader(fd)
            if fd in self._fds:
                self._fds.remove(fd)
            sock.close(0)

    def close(self) -> None:
        self.closed = True
        for name in list(self.peers):
            self.disconnect(name)
        if self.inbox is not None:
            if self._loop is not None:
                self._loop.remove_reader(int(self.inbox.getsockopt(zmq.FD)))
            self.inbox.close(0)
            self.inbox = None
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        self._pending.clear()

    # -- receive ------------------------------------------------------------

    def _drain_inbox(self) -> None:
        sock = self.inbox
        if sock is None:
            return
        while True:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            if len(parts) < 2:
                continue
            self._dispatch(parts[-1], parts[0].decode("latin-1"))

    def _drain_peer(self, sock: zmq.Socket, name: str) -> None:
        while True:
            try:
                data = sock.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            self._dispatch(data, name)

    def poll_inbox(self) -> None:
        """Handle what waits in the inbox now, if anything (a long callback's pause point: the
        pacer's tick calls it between slices of calls). About a microsecond when it is empty."""
        sock = self.inbox
        if sock is not None:
            try:
                ready = int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN
            except zmq.ZMQError:
                return
            if ready:
                self._drain_inbox()

    def drain_all(self) -> None:
        """Safety net for a missed edge (called by the gateway's housekeeping)."""
        self._drain_inbox()
        for name, sock in list(self.peers.items()):
            self._drain_peer(sock, name)

    def _dispatch(self, data: bytes, sender: str) -> None:
        self.arrival_ns = time.monotonic_ns()  # read by the Clear fast path (arrival -> cut)
        got = self.guard.decode_env(data)
        if got is None:
            return
        frame, cid = got
        if isinstance(cid, int) and cid in self._pending:
            fut = self._pending.pop(cid)
            if not fut.done():
                fut.set_result(frame)
            return
        try:
            self.on_frame(frame, sender, cid)
        except Exception:
            log.exception("handling %s from %s failed", frame.TYPE, sender)

    # -- send ---------------------------------------------------------------

    def _count_drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1

    def send(self, peer: str, frame: Frame, cid: int | str | None = None) -> bool:
        """Push ``frame`` to ``peer``: through our DEALER to its inbox if connected,
        else through our inbox ROUTER to its identity (it connected to us)."""
        data = encode(frame, cid=cid)
        sock = self.peers.get(peer)
        try:
            if sock is not None:
                sock.send(data, zmq.NOBLOCK)
                self._recheck(sock, functools.partial(self._drain_peer, sock, peer))
                return True
            if self.inbox is not None:
                self.inbox.send_multipart([peer.encode("latin-1"), data], zmq.NOBLOCK)
                self._recheck(self.inbox, self._drain_inbox)
                return True
            self._count_drop("no_route")
        except zmq.Again:
            self._count_drop("full")
        except zmq.ZMQError as e:
            self._count_drop("unroutable" if e.errno == zmq.EHOSTUNREACH else "error")
        return False

    def reply(self, peer: str, frame: Frame, cid: int | str | None) -> bool:
        """Answer a request that came from ``peer`` (on whichever socket reaches it)."""
        if self.inbox is not None and peer not in self.peers:
            try:
                self.inbox.send_multipart([peer.encode("latin-1"), encode(frame, cid=cid)], zmq.NOBLOCK)
                self._recheck(self.inbox, self._drain_inbox)
                return True
            except zmq.ZMQError:
                self._count_drop("reply")
                return False
        return self.send(peer, frame, cid)

    def _recheck(self, sock: zmq.Socket, cb: Callable[[], None]) -> None:
        try:
            if int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN and self._loop is not None:
                self._loop.call_soon(cb)
        except zmq.ZMQError:
            pass

    async def request(self, peer: str, frame: Frame, wait_s: float) -> Frame:
        """Send and await the reply with the same correlation id. Raises TimeoutError."""
        assert self._loop is not None
        cid = next(self._ids)
        fut: asyncio.Future[Frame] = self._loop.create_future()
        self._pending[cid] = fut
        try:
            if not self.send(peer, frame, cid=cid):
                raise ConnectionError(f"cannot reach {peer}")
            async with asyncio.timeout(wait_s):
                return await fut
        finally:
            if self._pending.pop(cid, None) is not None and not fut.done():
                fut.cancel()  # timed out: a reply arriving later is counted as late by the owner

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"links_dropped_{k}": v for k, v in self.dropped.items()}
        out.update({f"links_bad_frames_{k}": v for k, v in self.guard.errors.items()})
        return out
