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
* :class:`TaskSet`: the background tasks a session spawns (a cancel request,
  a queued event that did not fit), referenced until done, cancelled on close.
* :class:`WsSession`: the session plumbing every socket adapter shares: ONE
  reader task hands each message to the vendor's ``_message`` (which returns
  an error text to end the session); the session ends exactly once, with the
  stage's Closed event (``""`` = a clean close by us; a socket the server
  closed or cut, a garbage frame the vendor treats as fatal, or a reader bug
  give the reason), after which sends raise ``closed`` and a socket still open
  is closed. ``close()`` is idempotent and bounded by its timeout.
* :class:`WsTtsSession`: the TTS context bookkeeping of a socket TTS
  (Cartesia, ElevenLabs): our ``bv-<n>`` context ids, the contexts open at the
  server, the flushed ones waiting for their last message, and the cancelled
  ones; ``cancel()`` queues TtsCancelled at once, sends the vendor's cancel
  message on its own task when the server knows the context, and every later
  message of that context is dropped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from brisvox.providers.base import (
    ProviderError,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsEvent,
    TtsFlushed,
)

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


class TaskSet:
    """Background tasks of a session, referenced until they finish (asyncio keeps only weak ones)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        for t in list(self._tasks):
            t.cancel()


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

    def put_soon(self, ev: Any, tasks: TaskSet) -> None:
        """Queue ``ev`` now, or on a task of ``tasks`` when the queue is full (never blocks)."""
        if not self.put_nowait(ev):
            tasks.spawn(self.put(ev))

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


async def resolve_url(url: str, timeout: float) -> None:  # noqa: ASYNC109
    """:func:`resolve` for the host of a ``ws://`` / ``wss://`` base URL (the warm-up of the socket adapters)."""
    u = urlsplit(url)
    await resolve(u.hostname or "", u.port or (443 if u.scheme == "wss" else 80), timeout)


def context_id(context: int) -> str:
    """The wire id of a TTS context (the stage's int id)."""
    return f"bv-{context}"


def context_of(cid: Any) -> int | None:
    """The stage's context id of a wire id (None: not one of ours)."""
    if isinstance(cid, str) and cid.startswith("bv-") and cid[3:].isdigit():
        return int(cid[3:])
    return None


def b64_pcm(data: Any) -> bytes | None:
    """Base64 PCM16 -> bytes with a trailing odd byte dropped; None if it is not base64."""
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    return pcm[:-1] if len(pcm) % 2 else pcm


class WsSession:
    """One vendor socket: the reader task, the event pipe and the session's end (see the module doc).

    A vendor implements ``_message`` and, if it has one, ``_goodbye`` (the
    message that asks the server to end the stream, sent by ``close()``)."""

    def __init__(self, ws: ClientConnection, pipe_cap: int, closed: Callable[[str], Any]) -> None:
        self._ws = ws
        self._pipe = EventPipe(pipe_cap)
        self._closed_event = closed
        self._closed = False
        self._tasks = TaskSet()
        self.bad_messages = 0
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def events(self) -> AsyncIterator[Any]:
        return self._pipe.iterate()

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderError("closed", "session closed")

    async def _send_json(self, obj: Mapping[str, Any], timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        await send_bounded(self._ws, orjson.dumps(obj).decode(), timeout)

    async def _message(self, msg: str | bytes) -> str:
        """Handle one message; a non-empty result ends the session with that error."""
        raise NotImplementedError

    def _goodbye(self) -> str | None:
        return None

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            return
        self._closed = True
        goodbye = self._goodbye()
        if goodbye is not None:
            with contextlib.suppress(Exception):
                await send_bounded(self._ws, goodbye, min(timeout, 0.2))
        await close_ws(self._ws, timeout)
        self._reader.cancel()
        self._tasks.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._reader, timeout)
        self._pipe.end(self._closed_event(""))

    async def _read(self) -> None:
        error = ""
        try:
            async for msg in self._ws:
                error = await self._message(msg)
                if error:
                    break
        except ConnectionClosed as e:
            error = "" if self._closed else f"closed: {e.rcvd.code if e.rcvd else 1006}"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a reader bug ends the session, not the process
            error = type(e).__name__
        finally:
            self._tasks.cancel()
            if not self._closed and not error:
                error = "closed by the server"
            self._closed = True
            self._pipe.end(self._closed_event(error))
            if error:
                await close_ws(self._ws, 0.5)


class WsTtsSession(WsSession):
    """Context bookkeeping of a socket TTS (see the module doc); the vendor adds its wire."""

    def __init__(self, ws: ClientConnection, sample_rate: int) -> None:
        super().__init__(ws, 1024, TtsClosed)
        self.sample_rate = sample_rate
        self._cancelled = CancelledIds()
        self._open: set[int] = set()  # contexts the server knows (text or a flush went out)
        self._flushing: set[int] = set()  # flushed contexts waiting for their last message

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._pipe.iterate()

    def _cancel_message(self, context: int) -> Mapping[str, Any]:
        """What tells the server to stop ``context``."""
        raise NotImplementedError

    def cancel(self, context: int) -> None:
        self._cancelled.add(context)
        self._flushing.discard(context)
        was_open = context in self._open
        self._open.discard(context)
        self._pipe.put_soon(TtsCancelled(context), self._tasks)
        if was_open and not self._closed:
            self._tasks.spawn(self._send_quietly(self._cancel_message(context)))

    async def _send_quietly(self, obj: Mapping[str, Any]) -> None:
        with contextlib.suppress(ProviderError):
            await self._send_json(obj, 2.0)

    async def _message(self, msg: str | bytes) -> str:
        try:
            obj = orjson.loads(msg)
        except orjson.JSONDecodeError:
            self.bad_messages += 1
            return "garbage from the server"
        if not isinstance(obj, dict):
            self.bad_messages += 1
            return ""
        return await self._handle(obj)

    async def _handle(self, obj: dict[str, Any]) -> str:
        """One JSON message of the vendor; a non-empty result ends the session."""
        raise NotImplementedError

    def _pcm(self, data: Any) -> bytes | None:
        """:func:`b64_pcm`, counting a bad chunk (the caller then ends the session)."""
        pcm = b64_pcm(data)
        if pcm is None:
            self.bad_messages += 1
        return pcm

    async def _audio(self, context: int, pcm: bytes) -> None:
        if pcm:
            await self._pipe.put(TtsAudio(context, pcm))

    async def _flushed(self, context: int) -> None:
        """The server sent the last message of ``context``: answer its flush (if it was flushed)."""
        if context in self._flushing:
            self._flushing.discard(context)
            self._open.discard(context)
            await self._pipe.put(TtsFlushed(context))
