"""A scriptable HTTP/1.1 loopback server for the provider adapter tests.

Owns the transport side of every fake vendor: keep-alive connections (counted,
so the tests prove the shared client reuses ONE connection per origin),
chunked streaming responses whose chunks can be split anywhere and delayed,
a slow first byte, a stream cut mid-way (the socket is aborted without the
terminating chunk), a never-ending stream, and any status. Every request is
recorded (method, path, headers, parsed JSON body).

A handler is ``(request) -> Reply``; the vendor modules build Replies in
each vendor's wire format. Binds 127.0.0.1 port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    conn: int

    @property
    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


@dataclass
class Reply:
    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    delays: list[float] | None = None  # per chunk, before it is sent
    content_type: str = "text/event-stream"
    first_byte_delay: float = 0.0  # before the status line
    cut_after: int | None = None  # abort the socket after this many chunks (no terminator)
    forever: bytes | None = None  # after the chunks, send this every ``forever_every`` s until the client leaves
    forever_every: float = 0.05
    close: bool = False  # Connection: close after this reply
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (e.g. Retry-After)


Handler = Callable[[Request], Reply]


class FakeHttpServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.connections = 0
        self.open_connections = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeHttpServer:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        if self._server is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def __aenter__(self) -> FakeHttpServer:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def bodies(self, path_part: str = "") -> list[Any]:
        return [r.json for r in self.requests if r.method == "POST" and path_part in r.path]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self.open_connections += 1
        conn = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for ln in lines[1:]:
                    if ":" in ln:
                        k, v = ln.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(n) if n else b""
                req = Request(method, path, headers, body, conn)
                self.requests.append(req)
                if method == "HEAD":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                reply = self.handler(req)
                if not await self._send(writer, reply):
                    return
                if reply.close:
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _send(self, w: asyncio.StreamWriter, r: Reply) -> bool:
        if r.first_byte_delay:
            await asyncio.sleep(r.first_byte_delay)
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 429: "Too Many Requests",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(r.status, "X")
        extra = "".join(f"{k}: {v}\r\n" for k, v in r.headers.items())
        w.write((f"HTTP/1.1 {r.status} {reason}\r\nContent-Type: {r.content_type}\r\n"
                 f"Transfer-Encoding: chunked\r\n{'Connection: close' + chr(13) + chr(10) if r.close else ''}"
                 f"{extra}\r\n").encode())
        for i, c in enumerate(r.chunks):
            if r.cut_after is not None and i >= r.cut_after:
                w.transport.abort()
                return False
            if r.delays and i < len(r.delays) and r.delays[i]:
                await asyncio.sleep(r.delays[i])
            if c:
                w.write(b"%x\r\n%s\r\n" % (len(c), c))
                await w.drain()
        if r.cut_after is not None and r.cut_after >= len(r.chunks):
            w.transport.abort()
            return False
        if r.forever is not None:
            while True:  # ends when the client goes away (write fails) or the server closes
                await asyncio.sleep(r.forever_every)
                w.write(b"%x\r\n%s\r\n" % (len(r.forever), r.forever))
                await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True


def json_reply(status: int, obj: Any) -> Reply:
    return Reply(status, [orjson.dumps(obj)], content_type="application/json")


def split_bytes(data: bytes, size: int) -> list[bytes]:
    """Cut ``data`` into chunks of ``size`` bytes (splits JSON and UTF-8 anywhere)."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]
