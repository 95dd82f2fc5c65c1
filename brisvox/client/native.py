"""Client side of the native brisvox WebSocket protocol (``/ws``; docs/PROTOCOL.md).

Owns one ``brisvox call`` over the native protocol: ``start`` (rate, params,
``marks: "release"``), caller audio as binary PCM16 frames, ``dtmf`` events,
``stop``; from the gateway ``started`` (the call id), binary bot audio,
``clear``, ``dtmf`` (digits the agent pressed), ``error`` (counted, the call
goes on), ``stop`` and the close; with ``events`` (the start's ``"events": true``) also
the call's ``call_event`` messages (transcript lines, turn latencies, tool calls), kept in
:attr:`NativeTransport.call_events` (at most :data:`MAX_EVENTS`) and passed to ``on_event``
as they arrive. The messages are :mod:`brisvox.wire.native`.

Invariants: ``open`` returns only once ``started`` arrived (or raises
:class:`TransportError` after ``CONNECT_TIMEOUT_S``); audio is sent only
after that; a close or a ``stop`` from the gateway ends the call once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from brisvox.client.transport import CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S, BotEvents, TransportError
from brisvox.wire.native import NativeStream, server_message

MAX_EVENTS = 4000  # call events kept per call (the gateway sends at most 2000)


class NativeTransport:
    """See :class:`~brisvox.client.transport.CallTransport`."""

    def __init__(self, url: str, rate: int = 16000, params: dict[str, str] | None = None,
                 token: str = "", events: bool = False,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.url = url
        self.rate = rate
        self.params = params or {}
        self.token = token
        self.stream = NativeStream(rate, self.params, marks="release", events=events)
        self.call_events: list[dict[str, Any]] = []  # each call_event message as it came (no "event" key)
        self.on_event = on_event
        self.call_id = ""
        self.agent = ""
        self.ids: dict[str, str] = {}
        self.errors: list[str] = []
        self.ws: Any = None
        self._rx: asyncio.Task[None] | None = None
        self._events = BotEvents()
        self._ended = False
        self._closing = False

    async def open(self, events: BotEvents) -> None:
        from websockets.asyncio.client import connect

        self._events = events
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                self.ws = await connect(self.url, compression=None, ping_interval=None,
                                        open_timeout=CONNECT_TIMEOUT_S, close_timeout=CLOSE_TIMEOUT_S,
                                        max_size=2**20, additional_headers=headers)
                await self.ws.send(self.stream.start())
                while True:
                    first = await self.ws.recv()
                    if isinstance(first, bytes):
                        continue
                    msg = server_message(orjson.loads(first))
                    if msg.event == "started":
                        break
                    if msg.event == "error":
                        self.errors.append(msg.code)
                        continue
                    raise TransportError(f"unexpected first message {msg.event!r}")
        except TransportError:
            raise
        except Exception as e:  # refused, timeout, closed (1003 bad rate, 1013 full, 1011 no agent)
            code = getattr(self.ws, "close_code", None) if self.ws is not None else None
            why = f" (close {code}: {getattr(self.ws, 'close_reason', '')})" if code else ""
            raise TransportError(f"cannot start a call at {self.url}: {type(e).__name__}{why}") from None
        self.call_id = msg.call_id
        self.agent = msg.agent
        self.ids = {"call_id": self.call_id}
        self._rx = asyncio.create_task(self._receive())

    def _end(self, reason: str) -> None:
        if not self._ended:
            self._ended = True
            self._events.on_end(reason, time.monotonic())

    async def _receive(self) -> None:
        ws = self.ws
        reason = "closed by the server"
        try:
            async for m in ws:
                now = time.monotonic()
                if isinstance(m, bytes):
                    self._events.on_audio(np.frombuffer(m, dtype="<i2"), now)
                    continue
                try:
                    msg = server_message(orjson.loads(m))
                except orjson.JSONDecodeError:
                    self.errors.append("bad_json_from_server")
                    continue
                ev = msg.event
                if ev == "clear":
                    self._events.on_clear(now)
                elif ev == "dtmf":
                    self._events.on_dtmf(msg.digits, now)
                elif ev == "error":
                    self.errors.append(msg.code)
                elif ev == "call_event":
                    self._call_event(msg.fields or {})
                elif ev == "stop":
                    reason = msg.reason or "stop"
                    if not self._closing:
                        self._end(reason)
        except Exception as e:  # noqa: BLE001 - a reset ends the call like a close
            reason = f"connection lost: {type(e).__name__}"
        if not self._closing:
            self._end(reason)

    def _call_event(self, fields: dict[str, Any]) -> None:
        if len(self.call_events) >= MAX_EVENTS:
            return
        ev = {k: v for k, v in fields.items() if k != "event"}
        self.call_events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    async def send_audio(self, pcm: np.ndarray) -> None:
        if self._ended or self.ws is None:
            return
        try:
            await self.ws.send(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
        except Exception:  # noqa: BLE001 - the receive task reports the end
            return

    async def send_dtmf(self, digits: str) -> None:
        if self._ended or self.ws is None:
            return
        for d in digits:
            try:
                await self.ws.send(self.stream.dtmf(d, 100))
            except Exception:  # noqa: BLE001
                return

    async def close(self) -> None:
        self._closing = True
        ws = self.ws
        if ws is not None:
            try:
                if not self._ended:
                    await asyncio.wait_for(ws.send(self.stream.stop()), CLOSE_TIMEOUT_S)
                await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - best effort at hang-up
                pass
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        if ws is not None and ws.transport is not None:
            ws.transport.abort()
        self._ended = True
