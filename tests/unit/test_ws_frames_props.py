"""Property: the WebSocket frame splitter (``brisvox.wire.ws_framing.scan``) returns one of its
five verdicts for any bytes at any offset (arbitrary, and mutations of valid frame streams),
never reads past ``end``, and a DATA, CONTROL or FRAGMENT verdict describes exactly the frame
the websockets library parses there. The gateway's connection fed the same bytes after its
handshake never raises and never counts a session error; the close reason any close
sends fits a control frame."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame
from websockets.streams import StreamReader

from brisvox.wire import ws_framing
from tests.unit.test_gateway_ws_fastpath import connect, feed, frame, server_frames

PROPS = settings(max_examples=300, deadline=None)
MAX = 4096
KINDS = (ws_framing.DATA, ws_framing.CONTROL, ws_framing.MORE, ws_framing.OTHER, ws_framing.FRAGMENT)


def valid_stream(draw: Any) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        first = draw(st.sampled_from((0x81, 0x82, 0x89, 0x8A, 0x01, 0x80)))
        n = draw(st.integers(0, 125 if first in (0x89, 0x8A) else 300))
        parts.append(frame(os.urandom(n), first))
    return b"".join(parts)


@st.composite
def streams(draw: Any) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=400))
    data = bytearray(valid_stream(draw))
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(("flip", "cut", "insert")))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[i:]
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=10))
    return bytes(data)


def library_frame(data: bytes, masked: bool) -> Frame | None:
    reader = StreamReader()
    reader.feed_data(data)
    gen = Frame.parse(reader.read_exact, mask=masked, max_size=MAX)
    try:
        next(gen)
    except StopIteration as stop:
        return stop.value
    except Exception:  # noqa: BLE001 - the library refuses it: scan must not have said DATA/CONTROL
        return None
    return None


@PROPS
@given(streams(), st.booleans(), st.integers(0, 20))
def test_scan_verdicts(data: bytes, masked: bool, pos: int) -> None:
    pos = min(pos, len(data))
    end = len(data)
    padded = memoryview(data + b"\xff" * 16)  # bytes beyond end must not change the verdict
    kind, h, n = ws_framing.scan(padded, pos, end, masked, MAX)
    assert (kind, h, n) == ws_framing.scan(data, pos, end, masked, MAX)
    assert kind in KINDS
    if kind in (ws_framing.DATA, ws_framing.CONTROL, ws_framing.FRAGMENT):
        assert h in ((6, 8, 14) if masked else (2, 4, 10)) and pos + h + n <= end
        f = library_frame(data[pos:pos + h + n], masked)
        assert f is not None and len(f.data) == n
        assert f.fin == (kind != ws_framing.FRAGMENT or data[pos] == 0x80)
        assert (kind == ws_framing.DATA) == (data[pos] in (ws_framing.TEXT, ws_framing.BINARY))
        assert (kind == ws_framing.FRAGMENT) == (data[pos] in (0x00, 0x01, 0x02, 0x80))
    else:
        assert (h, n) == (0, 0)


@PROPS
@given(streams(), st.integers(1, 64))
def test_the_connection_survives_any_stream(data: bytes, chunk: int) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        conn, t, s = connect(MAX)
        for i in range(0, len(data), chunk):
            if conn.closed:
                break
            feed(conn, data[i:i + chunk])
        assert "ws_session_errors" not in conn.server.counters
        conn.close(1000, "é" * 200)  # a close after anything: its reason fits
        for f in server_frames(bytes(t.out).split(b"\r\n\r\n", 1)[1]):
            if f.opcode.name == "CLOSE":
                assert len(f.data) <= 125
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_a_close_with_a_long_non_ascii_reason_is_sent() -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        conn, t, s = connect()
        t.out.clear()
        conn.close(1000, "ф" * 200)
        (close,) = server_frames(bytes(t.out))
        code, = struct.unpack("!H", close.data[:2])
        reason = close.data[2:].decode("utf-8")
        assert code == 1000 and reason == "ф" * 61 and len(close.data) == 124
    finally:
        asyncio.set_event_loop(None)
        loop.close()
