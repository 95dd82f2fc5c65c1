"""The WebSocket listener's flood limits, on a connection with a fake transport and on the pure parts.

* fragments are reassembled on the fast path with control frames in between,
  and the connection stays there; a continuation without a message, a new
  message inside one (1002) and a message over ``max_message_bytes`` (1009,
  before the fragment is kept) close it;
* frames sent in the same read as the request head take the fast path;
* beyond ``max_frames_per_s``, ``max_bytes_per_s`` or ``max_control_frames_per_s``,
  or a ping while the send buffer is over ``max_send_buffer_bytes``, the
  connection is closed 1008 with its reason, counted, and reads are paused;
* :class:`HalfOpenTable`: the per-source cap refuses, the global cap evicts
  the oldest, trusted proxies are exempt, counts stay exact;
  :func:`auto_cap` follows the file limit within its bounds;
* :class:`FrameBudget` windows; config keys refuse bad values;
* an ``accept()`` that fails for want of descriptors is counted, logged once
  (not once per failure, no traceback), and pauses accepting on that socket.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

import pytest
from websockets.frames import Close, Opcode

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.ws.half_open import HalfOpenTable, auto_cap
from brisvox.gateway.ws.inbound import FrameBudget, Reassembly
from brisvox.gateway.ws.listener import Acceptor
from brisvox.runtime.log_limit import LogLimiter
from tests.unit.test_gateway_ws_fastpath import (
    REQ,
    Transport,
    connect,
    feed,
    frame,
    loop,
    server_frames,
)

__all__ = ["loop"]  # the fixture, used by every test here


class Pausable(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.buffered = 0

    def pause_reading(self) -> None:
        self.paused = True

    def get_write_buffer_size(self) -> int:
        return self.buffered


def closes(t: Transport) -> list[tuple[int, str]]:
    return [(c.code, c.reason) for c in (Close.parse(f.data) for f in server_frames(bytes(t.out).split(b"\r\n\r\n", 1)[-1])
                                         if f.opcode is Opcode.CLOSE)]


def with_pausable(**cfg: int):  # type: ignore[no-untyped-def]
    conn, t, s = connect(**cfg)
    p = Pausable()
    conn.transport = p  # type: ignore[assignment]
    return conn, p, s


def test_fragments_with_pings_between_stay_on_the_fast_path() -> None:
    conn, t, s = connect()
    wire = frame(b"ab", 0x02) + frame(b"hi", 0x89) + frame(b"cd", 0x00) + frame(b"ef", 0x80) + frame(b"z")
    for i in range(0, len(wire), 3):  # split across reads as well
        feed(conn, wire[i:i + 3])
    assert s.got == [("binary", b"abcdef"), ("text", b"z")]
    assert conn._fast and conn.reassembly.opcode == 0 and conn.reassembly.parts == []
    assert [f.opcode for f in server_frames(bytes(t.out).split(b"\r\n\r\n", 1)[1])] == [Opcode.PONG]


@pytest.mark.parametrize("wire,code", [
    (frame(b"x", 0x80), 1002),  # a continuation with no message open
    (frame(b"x", 0x01) + frame(b"y"), 1002),  # a whole message inside a fragmented one
    (frame(b"x", 0x01) + frame(b"y", 0x02), 1002),  # a new fragmented one inside it
    (frame(b"a" * 3000, 0x01) + frame(b"b" * 1200, 0x00), 1009),  # 4200 > max_message_bytes 4096
], ids=["orphan-continuation", "whole-inside-fragmented", "new-inside-fragmented", "too-long"])  # masks are random
def test_bad_fragment_sequences_close_with_their_code(wire: bytes, code: int) -> None:
    conn, t, s = connect(4096)
    feed(conn, wire)
    assert s.got == [] and [c for c, _ in closes(t)] == [code]
    assert conn.reassembly.parts == []
    assert conn.server.counters[f"ws_refused_frame_{code}"] == 1


def test_frames_in_the_same_read_as_the_head_take_the_fast_path() -> None:
    conn, t, s = connect()
    conn2 = type(conn)(conn.server)
    t2 = Transport()
    conn2.connection_made(t2)  # type: ignore[arg-type]
    feed(conn2, REQ + frame(b"first") + frame(b"se", 0x01))
    feed(conn2, frame(b"cond", 0x80))
    assert conn2._fast and b"101" in t2.out
    assert s.got == [("text", b"first"), ("text", b"second")]


def test_a_frame_flood_is_closed_1008_and_reading_stops() -> None:
    conn, t, s = with_pausable(max_frames_per_s=100)
    feed(conn, b"".join(frame(b"\x00", 0x82) for _ in range(150)))
    assert len(s.got) == 100 and t.paused
    assert closes(t) == [(1008, "policy: more than 100 frames/s")]
    assert conn.server.counters["ws_closed_frame_rate"] == 1
    feed(conn, frame(b"late"))  # nothing more is read
    assert len(s.got) == 100


def test_one_byte_fragments_count_as_frames() -> None:
    conn, t, s = with_pausable(max_frames_per_s=50)
    feed(conn, frame(b"a", 0x01) + b"".join(frame(b"b", 0x00) for _ in range(80)))
    assert s.got == [] and closes(t) == [(1008, "policy: more than 50 frames/s")]
    assert conn.reassembly.parts == []


def test_a_byte_flood_is_closed_1008() -> None:
    conn, t, s = with_pausable(max_bytes_per_s=4096)
    for _ in range(3):
        feed(conn, frame(b"x" * 2000, 0x82))
    assert len(s.got) == 2 and closes(t) == [(1008, "policy: more than 4096 bytes/s")]
    assert conn.server.counters["ws_closed_byte_rate"] == 1


def test_a_ping_flood_is_closed_1008_after_its_budget_of_pongs() -> None:
    conn, t, s = with_pausable(max_control_frames_per_s=5)
    feed(conn, b"".join(frame(b"p", 0x89) for _ in range(40)))
    kinds = [f.opcode for f in server_frames(bytes(t.out))]  # this transport saw no handshake
    assert kinds == [Opcode.PONG] * 5 + [Opcode.CLOSE]
    assert closes(t) == [(1008, "policy: more than 5 control frames/s")] and t.paused


def test_a_ping_while_the_send_buffer_is_full_is_closed_1008() -> None:
    conn, t, s = with_pausable()
    t.buffered = conn.max_buffer + 1
    feed(conn, frame(b"p", 0x89))
    assert closes(t) == [(1008, "policy: send buffer full (pongs not read)")]
    assert conn.server.counters["ws_closed_send_buffer"] == 1


def test_the_budget_window_starts_again() -> None:
    b = FrameBudget(10, 100, 2)
    assert b.read(60, 0.0) and b.frames_left() == 10
    b.spend(10)
    assert b.frames_left() == 0 and not b.read(41, 0.5)
    assert b.control_frame() and b.control_frame() and not b.control_frame()
    assert b.read(100, 1.0) and b.frames_left() == 10 and b.control_frame()
    unlimited = FrameBudget(0, 0, 0)
    assert unlimited.read(1 << 40, 0.0) and unlimited.frames_left() > 1 << 40


def test_reassembly_bounds_and_order() -> None:
    r = Reassembly(10)
    assert r.check(0x80, 1) == (1002, "unexpected continuation frame")
    assert r.check(0x01, 6) is None and r.add(0x01, b"abcdef") is None
    assert r.check(0x81, 1) == (1002, "expected a continuation frame")
    assert r.check(0x00, 5) == (1009, "message too big")
    assert r.check(0x80, 4) is None and r.add(0x80, b"ghij") == (1, b"abcdefghij")
    assert r.opcode == 0 and r.size == 0


def test_half_open_table_caps() -> None:
    table: HalfOpenTable[int] = HalfOpenTable(4, 2, exempt=lambda s: s == "proxy")
    assert table.admit(1, "a") == (True, None) and table.admit(2, "a") == (True, None)
    assert table.admit(3, "a") == (False, None)  # a's share is full: refused, nothing evicted
    assert table.admit(4, "b") == (True, None) and table.admit(5, "proxy") == (True, None)
    assert table.admit(6, "proxy") == (True, 1)  # at the cap: the oldest gives way
    assert table.admit(7, "proxy") == (True, 2) and table.admit(8, "proxy") == (True, 4)
    assert len(table) == 4 and table.per_source == {"proxy": 4}
    assert table.remove(5) and not table.remove(5) and table.per_source == {"proxy": 3}
    table.track(9, "c")
    table.track(9, "c")
    assert table.per_source["c"] == 1 and 9 in table


def test_auto_cap_follows_the_file_limit() -> None:
    assert auto_cap(1024) == 128 and auto_cap(20000) == 2500
    assert auto_cap(64) == 16 and auto_cap(1 << 20) == 4096
    assert 16 <= auto_cap() <= 4096


@pytest.mark.parametrize("table,key", [
    ({"max_half_open": 0}, "websocket.max_half_open"),
    ({"max_half_open": "many"}, "websocket.max_half_open"),
    ({"max_half_open_per_source": -1}, "websocket.max_half_open_per_source"),
    ({"max_frames_per_s": -1}, "websocket.max_frames_per_s"),
    ({"max_control_frames_per_s": -1}, "websocket.max_control_frames_per_s"),
    ({"max_bytes_per_s": 1000}, "websocket.max_bytes_per_s"),  # below max_message_bytes
])
def test_config_refuses_bad_limits(table: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        WebSocketConfig.from_section(table)


def test_config_defaults() -> None:
    c = WebSocketConfig.from_section({})
    assert (c.max_half_open, c.max_half_open_per_source) == ("auto", 64)
    assert (c.max_frames_per_s, c.max_bytes_per_s, c.max_control_frames_per_s) == (1000, 1 << 20, 20)
    assert WebSocketConfig.from_section({"max_half_open": 300}).max_half_open == 300


class _FullTable:
    """A listening socket whose accept() fails as with a full file table."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.calls = 0

    def fileno(self) -> int:
        return self.fd

    def accept(self) -> None:
        self.calls += 1
        raise OSError(errno.EMFILE, "Too many open files")


def test_accept_errors_pause_accepting_and_log_one_line(loop: asyncio.AbstractEventLoop,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    counters: dict[str, int] = {}
    acceptor = Acceptor(loop, lambda s, p: None, LogLimiter(logging.getLogger("t.accept")),
                        lambda k: counters.__setitem__(k, counters.get(k, 0) + 1))
    r, w = socket.socketpair()
    try:
        lsock = _FullTable(r.fileno())
        acceptor.sockets.append(lsock)  # type: ignore[arg-type]
        loop.add_reader(r.fileno(), acceptor._readable, lsock)
        with caplog.at_level(logging.ERROR, "t.accept"):
            for _ in range(50):  # the loop would call it again and again while the fd stays readable
                acceptor._readable(lsock)  # type: ignore[arg-type]
        assert lsock.calls == 50  # one accept per call: no spin inside
        assert counters == {"ws_accept_errors": 50, "ws_accept_errors_fd": 50}
        assert len(caplog.records) == 1 and "file table is full" in caplog.records[0].getMessage()
        assert not loop.remove_reader(r.fileno())  # paused: the reader is gone ...
        assert list(acceptor._paused) == [r.fileno()]  # ... with one timer to resume it
        acceptor._resume(lsock)  # type: ignore[arg-type]
        assert loop.remove_reader(r.fileno()) and not acceptor._paused
    finally:
        acceptor.sockets.clear()
        r.close()
        w.close()
