"""What the WebSocket adapters (Deepgram, Cartesia, ElevenLabs) share.

Owns:

* :func:`ws_connect`: one bounded handshake (``open_timeout`` = the connect
  timeout), credentials in headers, no proxy, no compression (audio does not
  compress and deflate costs CPU per frame), a bounded message size, and the
  mapping of handshake failures to ProviderError kinds (401/403 ``auth``,
  429 ``rate_limited``, 5xx ``server``, refused/unreachable ``connect``,
  past the timeout ``timeout``).
* :class:`EventPipe`: the bounded queue from a session's reader task to the
  stage's ``events()`` iterator. ``put`` waits (back-pressure on the socket
  reader, never on the stage); ``end(ev)`` makes room if needed so the final
  Closed event is never lost; the iterator ends after it.
* :class:`CancelledIds`: the last 64 cancelled TTS contexts, so late audio of
  a cancelled context is dropped and never re-opens it.
* :func:`send_bounded`: a send with the caller's timeout, mapping a closed
  socket to ProviderError("closed").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from brisvox.providers.base import ProviderError

_END = object()


async def ws_connect(url: str, headers: Mapping[str, str], timeout: float, *, max_size: int = 4 << 20,  # noqa: ASYNC109
                     ping_interval: float | None = 20.0) -> ClientConnection:
    try:
        return await websockets.connect(url, additional_headers=dict(headers), open_timeout=timeout,
                                        proxy=None, compression=None, max_size=max_size,
                                        ping_interval=ping_interval, ping_timeout=20.0, close_timeout=1.0)
    except InvalidStatus as e:
        status = e.response.status_code
        if status in (401, 403):
            raise ProviderError("auth", f"handshake HTTP {status}", retryable=False) from None
        if status == 429:
            raise ProviderError("rate_limited", "handshake HTTP 429") from None
        if status >= 500:
            raise ProviderError("server", f"handshake HTTP {status}") from None
        raise ProviderError("bad_request", f"handshake HTTP {status}", retryable=False) from None
    except TimeoutError:
        raise ProviderError("timeout", f"no WebSocket handshake within {timeout:g}s") from None
    except (OSError, InvalidHandshake) as e:
        raise ProviderError("connect", f"{type(e).__name__}: {str(e)[:200]}") from None


async def send_bounded(ws: ClientConnection, data: str | bytes, timeout: float) -> None:  # noqa: ASYNC109
    try:
        async with asyncio.timeout(timeout):
            await ws.send(data)
    except ConnectionClosed:
        raise ProviderError("closed", "the socket is closed") from None
    except TimeoutError:
        raise ProviderError("timeout", f"send took longer than {timeout:g}s") from None


async def close_ws(ws: ClientConnection, timeout: float) -> None:  # noqa: ASYNC109
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            await ws.close()


class EventPipe:
    def __init__(self, cap: int = 512) -> None:
        self._q: asyncio.Queue[Any] = asyncio.Queue(cap)
        self.ended = False
        self.dropped = 0

    async def put(self, ev: Any) -> None:
        if not self.ended:
            await self._q.put(ev)

    def put_nowait(self, ev: Any) -> bool:
        if self.ended:
            return False
        try:
            self._q.put_nowait(ev)
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            return False

    def end(self, ev: Any) -> None:
        """Queue the final event and the end marker (making room if the queue is full)."""
        if self.ended:
            return
        self.ended = True
        for item in (ev, _END):
            while True:
                try:
                    self._q.put_nowait(item)
                    break
                except asyncio.QueueFull:
                    with contextlib.suppress(asyncio.QueueEmpty):
                        self._q.get_nowait()
                        self.dropped += 1

    async def iterate(self) -> AsyncIterator[Any]:
        while True:
            ev = await self._q.get()
            if ev is _END:
                return
            yield ev


class CancelledIds:
    def __init__(self, cap: int = 64) -> None:
        self.cap = cap
        self._ids: OrderedDict[int, None] = OrderedDict()

    def add(self, ctx: int) -> None:
        self._ids[ctx] = None
        self._ids.move_to_end(ctx)
        while len(self._ids) > self.cap:
            self._ids.popitem(last=False)

    def __contains__(self, ctx: object) -> bool:
        return ctx in self._ids


async def resolve(host: str, port: int, timeout: float) -> None:  # noqa: ASYNC109
    """Warm DNS for a host (the first connect then skips the lookup)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            await loop.getaddrinfo(host, port)
    except (OSError, TimeoutError) as e:
        raise ProviderError("connect", f"DNS {host}: {type(e).__name__}") from None
