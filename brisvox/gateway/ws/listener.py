"""The WebSocket listener's sockets and its accept loop (instead of ``loop.create_server``'s).

Owns :class:`Acceptor`: the listening sockets of ``[websocket] host/port``
and the accepting of connections on them. asyncio's own accept loop does two
things a flood turns against the gateway: it builds a transport and a
protocol for every connection before anyone may refuse it (so a cap can act
only after the fd, the objects and a task exist), and when ``accept()``
fails for want of descriptors (EMFILE/ENFILE) it logs an ERROR with a
traceback and goes on accepting, up to ``backlog`` times per loop pass
("socket.accept() out of system resource": hundreds of thousands of lines
in a minute at a file limit of 1,024).

Invariants:

* Every accepted socket is offered to ``admit(sock, peer)`` (the server's
  accept-time caps) before any transport exists; one it refuses is closed
  at once with a reset (``SO_LINGER`` 0: no TIME_WAIT, nothing read). One it
  keeps gets its transport through ``loop.connect_accepted_socket`` (asyncio
  or uvloop), and the protocol ``admit`` returned.
* At most :data:`ACCEPT_BATCH` accepts per readiness of a listening socket,
  so one pass of the loop stays short under a flood.
* An ``accept()`` error other than "nothing pending" pauses accepting on
  that socket for :data:`ACCEPT_BACKOFF_S` (the pending connections wait in
  the kernel's backlog) and is counted (``ws_accept_errors``, and
  ``ws_accept_errors_fd`` for EMFILE/ENFILE) and logged through the server's
  :class:`~brisvox.runtime.log_limit.LogLimiter`: the first with its detail,
  then one line a minute with the count; never a traceback, never a spin.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from brisvox.gateway.ws.half_open import soft_nofile
from brisvox.runtime.log_limit import LogLimiter

ACCEPT_BATCH = 64  # accepts per readiness of a listening socket
ACCEPT_BACKOFF_S = 0.25  # accepting pauses this long after an accept() error
FD_ERRNOS = (errno.EMFILE, errno.ENFILE)
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST

Admit = Callable[[socket.socket, tuple[Any, ...]], "asyncio.BaseProtocol | None"]


def reset(sock: socket.socket) -> None:
    """Close ``sock`` at once with a TCP reset (nothing is read or sent)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    sock.close()


class Acceptor:
    """The listening sockets and their accept loop (see the module invariants)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, admit: Admit, bad: LogLimiter,
                 count: Callable[[str], None]) -> None:
        self.loop = loop
        self.admit = admit
        self.bad = bad
        self.count = count
        self.sockets: list[socket.socket] = []
        self._paused: dict[int, asyncio.TimerHandle] = {}  # fd -> the timer that resumes it
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, host: str, port: int, backlog: int) -> tuple[str, int]:
        """Bind and listen on every address ``host`` resolves to (as ``create_server`` does);
        the first socket's address is returned."""
        infos = await self.loop.getaddrinfo(host or None, port, family=socket.AF_UNSPEC,
                                            type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        for sock in self.sockets:
            self.loop.add_reader(sock.fileno(), self._readable, sock)
        name = self.sockets[0].getsockname()
        return str(name[0]), int(name[1])

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections are the server's)."""
        for timer in self._paused.values():
            timer.cancel()
        self._paused.clear()
        for sock in self.sockets:
            try:
                self.loop.remove_reader(sock.fileno())
            except (ValueError, OSError):  # already closed
                pass
            sock.close()
        self.sockets = []

    def _readable(self, lsock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the peer gave up while it waited in the backlog
                continue
            except OSError as e:
                self._accept_failed(lsock, e)
                return
            try:
                sock.setblocking(False)
                proto = self.admit(sock, peer)
            except Exception:  # noqa: BLE001 - never leak the descriptor of a connection nobody owns
                reset(sock)
                raise
            if proto is None:
                reset(sock)
                continue
            task = self.loop.create_task(self._attach(sock, proto))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _attach(self, sock: socket.socket, proto: asyncio.BaseProtocol) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: proto, sock=sock)
        except OSError:  # the peer reset before its transport existed: connection_lost tells the protocol
            self.count("ws_accept_attach_errors")
            sock.close()
            lost = getattr(proto, "connection_lost", None)
            if lost is not None:
                lost(None)

    def _accept_failed(self, lsock: socket.socket, e: OSError) -> None:
        fd = lsock.fileno()
        self.count("ws_accept_errors")
        full = e.errno in FD_ERRNOS
        if full:
            self.count("ws_accept_errors_fd")
        self.bad("ws_accept_error", "websocket accept() failed: %s%s; accepting paused %.2f s",
                 f"{type(e).__name__}: {e}"[:160],
                 f" (the file table is full: soft RLIMIT_NOFILE {soft_nofile()})" if full else "",
                 ACCEPT_BACKOFF_S, level=logging.ERROR)
        if fd in self._paused:
            return
        try:
            self.loop.remove_reader(fd)
        except (ValueError, OSError):
            return
        self._paused[fd] = self.loop.call_later(ACCEPT_BACKOFF_S, self._resume, lsock)

    def _resume(self, lsock: socket.socket) -> None:
        self._paused.pop(lsock.fileno(), None)
        if lsock in self.sockets:
            self.loop.add_reader(lsock.fileno(), self._readable, lsock)
