"""The WebSocket server's fast path (ws_server + brisvox.wire.ws_framing) delivers what the library would.

A connection with a fake transport and a recording session: after the
handshake, masked data frames arriving whole, several per read, or split at
every byte boundary reach the session unmasked and in order; a ping in
between is answered with a pong; a fragmented message is reassembled there
too; an unmasked frame and an oversized frame go to the websockets library,
which closes with its own codes (1002, 1009).
"""

from __future__ import annotations

import asyncio
import os
import struct

import pytest
from websockets.frames import Close, Frame, Opcode, apply_mask
from websockets.streams import StreamReader

from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.transports import TRANSPORTS
from brisvox.gateway.ws.server import WebSocketServer, WsConnection
from brisvox.wire import ws_framing

REQ = (b"GET /twilio HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
       b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


class Transport:
    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, d: bytes) -> None:
        self.out += d

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, k: str) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def abort(self) -> None:
        pass


class Session:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []

    def on_text(self, data: bytes) -> None:
        self.got.append(("text", data))

    def on_binary(self, data: bytes) -> None:
        self.got.append(("binary", data))

    def on_closed(self, code: int, reason: str) -> None:
        pass


def frame(payload: bytes, first: int = 0x81, mask: bool = True) -> bytes:
    key = os.urandom(4)
    n = len(payload)
    b1 = (0x80 if mask else 0)
    hdr = bytes((first, b1 | n)) if n < 126 else struct.pack("!BBH", first, b1 | 126, n)
    return hdr + (key + apply_mask(payload, key) if mask else payload)


def server_frames(data: bytes) -> list[Frame]:
    reader = StreamReader()
    reader.feed_data(data)
    out = []
    while reader.buffer:
        gen = Frame.parse(reader.read_exact, mask=False)
        try:
            next(gen)
        except StopIteration as stop:
            out.append(stop.value)
            continue
        break
    return out


@pytest.fixture(autouse=True)
def loop():
    lp = asyncio.new_event_loop()
    asyncio.set_event_loop(lp)
    yield lp
    asyncio.set_event_loop(None)
    lp.close()


def connect(max_size: int = 4096, **cfg: int) -> tuple[WsConnection, Transport, Session]:
    # no handshake rate: the property tests open hundreds of connections a second from one address
    # (the limit's storage is one per process), and the framing is what these tests are about; no frame
    # budget unless a test sets one (they feed thousands of frames at once)
    settings: dict[str, int] = {"max_frames_per_s": 0, "max_bytes_per_s": 0, "max_control_frames_per_s": 0, **cfg}
    server = WebSocketServer(None, WebSocketConfig(max_message_bytes=max_size, handshakes_per_s=0,  # type: ignore[arg-type]
                                                   **settings), TRANSPORTS)
    session = Session()
    server.make_session = lambda conn, route, req: session  # type: ignore[method-assign]
    conn = WsConnection(server)
    t = Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    feed(conn, REQ)
    return conn, t, session


def feed(conn: WsConnection, data: bytes) -> None:
    view = conn.server.rx_view
    view[:len(data)] = data
    conn.buffer_updated(len(data))


def test_data_frames_whole_batched_and_split_at_every_byte() -> None:
    conn, t, s = connect()
    assert conn._fast and b"101" in t.out
    msgs = [b'{"event":"media","n":%d}' % i + b"x" * (i * 37) for i in range(6)]
    wire = b"".join(frame(m) for m in msgs) + frame(b"\x01\x02", 0x82)
    feed(conn, wire)  # all in one read
    for cut in range(1, len(wire)):  # and every split into two reads
        feed(conn, wire[:cut])
        feed(conn, wire[cut:])
    expect = [("text", m) for m in msgs] + [("binary", b"\x01\x02")]
    assert s.got == expect * len(wire)
    assert conn._fast


def test_a_ping_is_answered_and_the_fast_path_goes_on() -> None:
    conn, t, s = connect()
    t.out.clear()
    feed(conn, frame(b"a") + frame(b"hi", 0x89) + frame(b"b"))
    assert s.got == [("text", b"a"), ("text", b"b")]
    (pong,) = server_frames(bytes(t.out))
    assert pong.opcode is Opcode.PONG and pong.data == b"hi"
    assert conn._fast


def test_a_fragmented_message_is_reassembled_on_the_fast_path() -> None:
    conn, t, s = connect()
    feed(conn, frame(b"one") + frame(b'{"a":', 0x01) + frame(b"1}", 0x80) + frame(b"two"))
    assert s.got == [("text", b"one"), ("text", b'{"a":1}'), ("text", b"two")]
    assert conn._fast


def test_unmasked_and_oversized_frames_close_with_the_library_codes() -> None:
    for data, code in ((frame(b"x", mask=False), 1002), (frame(b"y" * 5000), 1009)):
        conn, t, s = connect(max_size=4096)
        t.out.clear()
        feed(conn, data)
        assert s.got == []
        (close,) = server_frames(bytes(t.out))
        assert close.opcode is Opcode.CLOSE and Close.parse(close.data).code == code


def test_scan_classifies_frames() -> None:
    big = frame(b"z" * 300)
    assert ws_framing.scan(big, 0, len(big), True, 4096) == (ws_framing.DATA, 8, 300)
    assert ws_framing.scan(big, 0, len(big) - 1, True, 4096)[0] == ws_framing.MORE
    assert ws_framing.scan(big, 0, 3, True, 4096)[0] == ws_framing.MORE
    assert ws_framing.scan(big, 0, len(big), True, 100)[0] == ws_framing.OTHER  # too large
    assert ws_framing.scan(big, 0, len(big), False, 4096)[0] == ws_framing.OTHER  # masked, server side
    close = frame(b"\x03\xe8", 0x88)
    assert ws_framing.scan(close, 0, len(close), True, 4096) == (ws_framing.CONTROL, 6, 2)
    cont = frame(b"x", 0x00)
    assert ws_framing.scan(cont, 0, len(cont), True, 4096) == (ws_framing.FRAGMENT, 6, 1)
    long = struct.pack("!BBQ", 0x82, 0x80 | 127, 70000) + b"k" * 4 + b"p" * 70000
    assert ws_framing.scan(long, 0, len(long), True, 100000) == (ws_framing.DATA, 14, 70000)
    assert ws_framing.scan(long, 0, 9, True, 100000)[0] == ws_framing.MORE
    assert ws_framing.scan(long, 0, len(long), True, 65536)[0] == ws_framing.OTHER  # too large
    assert ws_framing.header(5) == b"\x81\x05"
    assert ws_framing.header(300, ws_framing.BINARY) == b"\x82\x7e\x01\x2c"


def test_a_peer_that_reset_before_our_half_close_is_aborted_not_a_session_error() -> None:
    conn, t, s = connect()
    aborted: list[bool] = []

    def write_eof() -> None:
        raise OSError(107, "Transport endpoint is not connected")
    t.write_eof = write_eof  # type: ignore[method-assign]
    t.abort = lambda: aborted.append(True)  # type: ignore[method-assign]
    feed(conn, frame(b"\x03\xe8", 0x88))  # the client's close; our echo and half-close follow
    assert "ws_session_errors" not in conn.server.counters
    assert conn.server.counters["ws_eof_after_reset"] == 1 and aborted
