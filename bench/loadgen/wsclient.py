"""The load generator's WebSocket client: one lean connection per simulated call.

Owns a client connection from TCP connect to close: the opening handshake
and everything unusual go through the ``websockets`` library's Sans-I/O
``ClientProtocol`` (no compression extension is offered, as Twilio's media
streams have none); the common case stays out of it, because the load
generator runs on the same cores as the server it measures:

* reads land in ONE buffer shared by every connection of the run
  (``asyncio.BufferedProtocol``: a plain ``Protocol`` makes asyncio allocate a
  256 KiB bytes object per read), and complete unfragmented data frames are
  split here (:mod:`brisvox.wire.ws_framing`) and handed to ``on_message``
  with the read's arrival time (``time.monotonic``), in order;
* :meth:`WsClient.write` puts a pre-encoded masked frame on the socket
  (:mod:`bench.loadgen.wire`); :meth:`WsClient.send_text` lets the library
  frame and mask the rare control messages (``start``, ``mark``, ``stop``).

Sends are synchronous writes (no task, no await per frame): the runner's one
timer writes every call's frame in one pass.

Invariants: :func:`connect` either returns an open connection or raises
within its timeout; ``on_closed`` is called exactly once, when the TCP
connection is gone; the library only ever sees whole frames or the whole
rest of the stream, so its parser never disagrees with ours about frame
boundaries; a closing handshake that the server does not finish is cut
after ``close_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from brisvox.wire import ws_framing

OPEN = State.OPEN
RECV_BUFFER_BYTES = 65536
_RX = memoryview(bytearray(RECV_BUFFER_BYTES))  # one loop per load generator process

MessageHandler = Callable[[bytes, float], None]


class WsClient(asyncio.BufferedProtocol):
    """One client connection (see module doc)."""

    def __init__(self, on_message: MessageHandler, on_closed: Callable[[], None], max_size: int,
                 close_timeout: float) -> None:
        self.on_message = on_message
        self.on_closed = on_closed
        self.max_size = max_size
        self.close_timeout = close_timeout
        self.proto: ClientProtocol | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False  # the TCP connection is gone
        self.opened: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[None] | None = None
        self._fast = False
        self._pending = b""
        self._frag: list[bytes] = []  # a fragmented message (library path only)
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return _RX

    def buffer_updated(self, nbytes: int) -> None:
        now = time.monotonic()
        if not self._fast:
            self._slow(bytes(_RX[:nbytes]), now)
        elif self._pending:
            data = self._pending + _RX[:nbytes]
            self._pending = b""
            self._frames(data, len(data), now)
        else:
            self._frames(_RX, nbytes, now)

    def eof_received(self) -> bool | None:
        if self.proto is not None:
            self.proto.receive_eof()
            self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self.opened is not None and not self.opened.done():
            self.opened.set_exception(ConnectionError(f"connection lost during the handshake: {exc}"))
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)
        self.on_closed()

    # -- receive ---------------------------------------------------------------------------

    def _slow(self, data: bytes, now: float) -> None:
        proto = self.proto
        assert proto is not None
        proto.receive_data(data)
        shaking = self.opened is not None and not self.opened.done()
        for ev in proto.events_received():
            if isinstance(ev, Response):
                if self.opened is not None and not self.opened.done():
                    if proto.handshake_exc is not None:
                        self.opened.set_exception(proto.handshake_exc)
                    else:
                        self.opened.set_result(None)
            elif ev.opcode is Opcode.TEXT or ev.opcode is Opcode.BINARY or ev.opcode is Opcode.CONT:
                if ev.opcode is not Opcode.CONT:
                    self._frag = []
                self._frag.append(ev.data)
                if ev.fin:
                    parts, self._frag = self._frag, []
                    self.on_message(parts[0] if len(parts) == 1 else b"".join(parts), now)
        if shaking and proto.state is OPEN and data.endswith(b"\r\n\r\n") and not proto.reader.buffer:
            self._fast = True  # the response ended exactly here: frames start at the next byte
        self._flush()

    def _frames(self, data: bytes | memoryview, end: int, now: float) -> None:
        proto = self.proto
        assert proto is not None
        scan = ws_framing.scan
        pos = 0
        while pos < end:
            kind, h, n = scan(data, pos, end, False, self.max_size)
            if kind == ws_framing.DATA:
                start = pos + h
                pos = start + n
                self.on_message(bytes(data[start:pos]), now)
            elif kind == ws_framing.CONTROL:
                proto.receive_data(bytes(data[pos:pos + h + n]))
                pos += h + n
                proto.events_received()  # ping -> pong queued; close -> echo queued
                self._flush()
                if proto.state is not OPEN:
                    break
            elif kind == ws_framing.MORE:
                self._pending = bytes(data[pos:end])
                return
            else:
                break
        else:
            return
        self._fast = False  # closing, or something only the library handles: it takes the rest
        if pos < end:
            self._slow(bytes(data[pos:end]), now)

    # -- send --------------------------------------------------------------------------------

    def _flush(self) -> None:
        proto, t = self.proto, self.transport
        if proto is None or t is None or t.is_closing():
            return
        for chunk in proto.data_to_send():
            if chunk:
                t.write(chunk)
            elif t.can_write_eof():
                t.write_eof()
        if proto.close_expected() and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.close_timeout, self.abort)

    @property
    def is_open(self) -> bool:
        return not self.closed and self.proto is not None and self.proto.state is OPEN

    def buffered(self) -> int:
        t = self.transport
        return t.get_write_buffer_size() if t is not None else 0

    def write(self, frame: bytes) -> bool:
        """Put a complete pre-encoded frame on the socket; False if the connection is not open."""
        if not self.is_open:
            return False
        self.transport.write(frame)  # type: ignore[union-attr]
        return True

    def send_text(self, text: str) -> bool:
        if not self.is_open:
            return False
        self.proto.send_text(text.encode())  # type: ignore[union-attr]
        self._flush()
        return True

    async def close(self, timeout: float) -> None:
        """Closing handshake (1000), then wait for the TCP close; abort after ``timeout``."""
        if self.closed:
            return
        if self.proto is not None and self.proto.state is OPEN:
            self.proto.send_close(1000)
            self._flush()
        if self.lost is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.lost), timeout)
            except TimeoutError:
                self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()


async def connect(url: str, on_message: MessageHandler, on_closed: Callable[[], None], *,
                  timeout: float, close_timeout: float, max_size: int = 2**20) -> WsClient:
    """Open a WebSocket to ``url`` (ws:// only); raises on refusal, rejection or timeout."""
    uri = parse_uri(url)
    if uri.secure:
        raise ValueError("the load generator speaks ws:// only")
    loop = asyncio.get_running_loop()
    client = WsClient(on_message, on_closed, max_size, close_timeout)
    client.opened = loop.create_future()
    client.lost = loop.create_future()
    async with asyncio.timeout(timeout):
        await loop.create_connection(lambda: client, uri.host, uri.port)
        try:
            proto = ClientProtocol(uri, max_size=max_size)
            client.proto = proto
            proto.send_request(proto.connect())
            client._flush()
            await client.opened
        except BaseException:
            client.abort()
            raise
    return client
