"""A tiny non-blocking HTTP/1.0 server polled by the supervisor's master loop.

Owns the ``/metrics`` and ``/healthz`` transport: no threads, no framework.
The arbiter adds :meth:`MiniHttp.poll_items` to its poll set and calls
:meth:`MiniHttp.handle` with what became ready, so serving a scrape never
competes with the master loop for state (it renders a snapshot in-line).

Invariants: at most ``max_conns`` connections (more are closed at once and
counted); a request head is at most 8 KiB; a connection lives at most
``timeout_s``; every response closes the connection (``Connection: close``).
An ``accept()`` that fails for want of resources (``EMFILE``: out of file
descriptors) is counted and pauses accepting for :data:`ACCEPT_PAUSE_S`
(the pending connection would wake the loop again at once: no busy loop);
it and a handler that raises (500) log through the
:class:`~brisvox.runtime.log_limit.LogLimiter` given: the first with its
detail, then a count.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.supervisor")

Handler = Callable[[str, str], tuple[int, str, bytes]]  # (method, path) -> (status, type, body)
MAX_HEAD = 8192
ACCEPT_PAUSE_S = 0.25  # after an accept() that failed for want of resources
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}
POLLIN, POLLOUT = 1, 2  # zmq.POLLIN / zmq.POLLOUT values


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytes = b""
    sent: int = 0


class MiniHttp:
    def __init__(self, host: str, port: int, handler: Handler, max_conns: int = 16, timeout_s: float = 2.0,
                 log_limit: LogLimiter | None = None) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host, port))
        except OSError:
            self.listener.close()
            raise
        self.listener.listen(32)
        self.listener.setblocking(False)
        self.host = host
        self.port = self.listener.getsockname()[1]
        self.handler = handler
        self.max_conns = max_conns
        self.timeout_s = timeout_s
        self.conns: dict[int, _Conn] = {}
        self.requests = 0
        self.rejected = 0
        self.bad_requests = 0
        self.accept_errors = 0
        self.handler_errors = 0
        self.accept_paused_until = 0.0
        self.log_limit = log_limit or LogLimiter(log)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def refused(self) -> dict[str, int]:
        """Requests and connections not served, by reason (``brisvox_metrics_refused_total``)."""
        return {"busy": self.rejected, "bad_request": self.bad_requests, "accept_error": self.accept_errors,
                "handler_error": self.handler_errors}

    def poll_items(self, now: float | None = None) -> list[tuple[int, int]]:
        now = time.monotonic() if now is None else now
        items = [(self.listener.fileno(), POLLIN)] if now >= self.accept_paused_until else []
        for fd, c in self.conns.items():
            items.append((fd, POLLOUT if c.outbuf else POLLIN))
        return items

    def next_deadline(self) -> float | None:
        times = [c.deadline for c in self.conns.values()]
        if self.accept_paused_until:
            times.append(self.accept_paused_until)
        return min(times, default=None)

    def handle(self, ready: dict[int, int], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.accept_paused_until and now >= self.accept_paused_until:
            self.accept_paused_until = 0.0
        if ready.get(self.listener.fileno()) and not self.accept_paused_until:
            self._accept(now)
        for fd in list(self.conns):
            ev = ready.get(fd)
            if ev:
                self._service(fd, ev)
        for fd, c in list(self.conns.items()):
            if now > c.deadline:
                self._close(fd)

    def _accept(self, now: float) -> None:
        for _ in range(64):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _RESOURCE_ERRNOS:  # the connection stays queued: wait before the next try
                    self.accept_errors += 1
                    self.accept_paused_until = now + ACCEPT_PAUSE_S
                    self.log_limit("metrics_accept", "metrics listener: accept() failed: %s; not accepting "
                                   "for %.2f s", e.strerror or e, ACCEPT_PAUSE_S, level=logging.ERROR)
                return
            if len(self.conns) >= self.max_conns:
                self.rejected += 1
                sock.close()
                continue
            sock.setblocking(False)
            self.conns[sock.fileno()] = _Conn(sock, now + self.timeout_s)

    def _service(self, fd: int, ev: int) -> None:
        c = self.conns[fd]
        if not c.outbuf:
            try:
                chunk = c.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(fd)
                return
            if not chunk:
                self._close(fd)
                return
            c.inbuf += chunk
            end = c.inbuf.find(b"\r\n\r\n")
            if end < 0:
                end = c.inbuf.find(b"\n\n")
            if end < 0:
                if len(c.inbuf) > MAX_HEAD:
                    self.bad_requests += 1
                    c.outbuf = self._response(431, "text/plain", b"request head too large\n", False)
                else:
                    return
            else:
                c.outbuf = self._respond(bytes(c.inbuf[:end]))
        try:
            n = c.sock.send(c.outbuf[c.sent :])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            if e.errno != errno.EAGAIN:
                self._close(fd)
            return
        c.sent += n
        if c.sent >= len(c.outbuf):
            self._close(fd)

    def _respond(self, head: bytes) -> bytes:
        try:
            line = head.split(b"\n", 1)[0].decode("ascii").strip()
            method, target, _version = line.split(" ", 2)
        except (UnicodeDecodeError, ValueError):
            self.bad_requests += 1
            return self._response(400, "text/plain", b"bad request\n", False)
        self.requests += 1
        if method not in ("GET", "HEAD"):
            return self._response(405, "text/plain", b"method not allowed\n", False)
        path = target.split("?", 1)[0]
        try:
            status, ctype, body = self.handler(method, path)
        except Exception as e:
            self.handler_errors += 1
            self.log_limit("metrics_handler", "metrics endpoint %s %s failed: %s: %s", method, path[:100],
                           type(e).__name__, str(e)[:300], level=logging.ERROR)
            return self._response(500, "text/plain", b"internal error\n", method == "HEAD")
        return self._response(status, ctype, body, method == "HEAD")

    @staticmethod
    def _response(status: int, ctype: str, body: bytes, head_only: bool) -> bytes:
        hdr = (f"HTTP/1.0 {status} {_REASONS.get(status, 'Status')}\r\n"
               f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\nCache-Control: no-store\r\n\r\n")
        return hdr.encode() + (b"" if head_only else body)

    def _close(self, fd: int) -> None:
        c = self.conns.pop(fd, None)
        if c is not None:
            try:
                c.sock.close()
            except OSError:
                pass

    def close(self) -> None:
        for fd in list(self.conns):
            self._close(fd)
        self.listener.close()
