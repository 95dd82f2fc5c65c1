"""The AudioSocket listener's connection bookkeeping, on a real gateway core (not started) and a
stand-in transport: a peer that stops reading is closed and counted, every slot is released once."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from brisvox.gateway.audiosocket.listener import AudioSocketConn, AudioSocketServer
from brisvox.gateway.config import AudioSocketConfig, GatewaySettings
from brisvox.gateway.transports import assemble


class Transport(asyncio.Transport):
    """What asyncio hands a protocol: the peer's address, writes kept, close recorded."""

    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer
        self.written = bytearray()
        self.closing = False
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.peer, 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.aborted = self.closing = True


def server(**cfg: Any) -> AudioSocketServer:
    core = assemble(GatewaySettings(), instance=f"asl{os.getpid()}")
    core.loop = asyncio.get_running_loop()
    return AudioSocketServer(core, AudioSocketConfig(enabled=True, **cfg))


def test_a_peer_that_stops_reading_is_closed_and_counted():
    async def go() -> None:
        srv = server()
        conn, t = AudioSocketConn(srv), Transport("127.0.0.1")
        conn.connection_made(t)
        assert t.high == 256 * 1024 and srv.stats()["audiosocket_connections_open"] == 1
        conn.pause_writing()  # asyncio: more than the high-water mark is queued
        assert t.closing and conn.closed and srv.stats()["audiosocket_slow_reader"] == 1
        conn.connection_lost(None)
        conn.connection_lost(None)
        assert srv.stats()["audiosocket_connections_open"] == 0 and not srv.per_source

    asyncio.run(go())


def test_slots_are_per_source_and_released_once():
    async def go() -> None:
        srv = server(max_connections_per_source=2, max_connections=3, allow=("10.0.0.0/8", "::ffff:192.0.2.0/120"))
        conns = []
        for peer in ("10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3", "203.0.113.9", "::ffff:10.0.0.4"):
            c, t = AudioSocketConn(srv), Transport(peer)
            c.connection_made(t)
            conns.append((c, t))
        why = ("", "", "source", "", "full", "allow", "full")  # what each one meets at accept
        assert [w for (_, t), w in zip(conns, why, strict=True) if t.aborted] == [w for w in why if w]
        st = srv.stats()
        assert (st["audiosocket_refused_source_connections"], st["audiosocket_refused_connections"],
                st["audiosocket_refused_allowlist"], st["audiosocket_connections_open"]) == (1, 2, 1, 3)
        for c, _ in conns:
            c.connection_lost(None)
        assert srv.stats()["audiosocket_connections_open"] == 0 and not srv.per_source
        # an IPv4-mapped source is read as IPv4, and an IPv4-mapped entry admits IPv4 sources
        assert srv.allowed("::ffff:10.1.2.3") and srv.allowed("192.0.2.1") and not srv.allowed("192.0.3.1")
        assert not srv.allowed("not an address")

    asyncio.run(go())
