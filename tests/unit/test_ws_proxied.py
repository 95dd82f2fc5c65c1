"""The WebSocket listener behind a load balancer (HAProxy), on a real gateway core with
real TCP connections on loopback (each client binds its own 127.x address, so a test
picks who the peer is):

* ``X-Forwarded-For`` from a ``[websocket] trusted_proxies`` peer makes the forwarded
  client the source of the handshake rate and the open-connection count (rightmost
  entry not itself a proxy, every header joined in order); from any other peer it is
  ignored (counted); a malformed one from a proxy leaves the peer (counted); the
  open-connection count goes back to nothing once every connection closed;
* ``GET /healthz`` needs no credential and answers 200 ``ok``, 503 ``full`` and 503
  ``draining`` (Retry-After, Connection: close) as admission would (``HEAD``: the
  headers alone); a flood of it is limited on its own (429) and leaves the handshake
  allowance of calls untouched.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core.gateway_core import GatewayCore
from brisvox.gateway.transports import assemble
from brisvox.gateway.ws.server import HEALTHZ_PER_S
from tests.unit.test_sip_admission_props import segments, settle

_seq = itertools.count(1)
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def addr(net: int) -> str:
    """A loopback address no other test of this process uses (the rate windows are per process)."""
    n = next(_seq)
    return f"127.{net}.{(os.getpid() + n // 250) % 250}.{n % 250 + 1}"


def upgrade(path: str = "/ws", headers: tuple[str, ...] = ()) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return (f"GET {path} HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode()


def plain(path: str, headers: tuple[str, ...] = ()) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"GET {path} HTTP/1.1\r\nHost: gw\r\n{extra}\r\n".encode()


class Client:
    """One TCP connection from ``source``: the response head (and body for a refusal)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, source: str) -> Client:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        return cls(r, w)

    async def ask(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(data)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 3)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        body = b""
        if status != 101:
            body = await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))), 3)
        return status, headers, body

    def close(self) -> None:
        self.writer.close()


async def once(port: int, source: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    c = await Client.open(port, source)
    try:
        return await c.ask(data)
    finally:
        c.close()


async def raw(port: int, source: str, data: bytes) -> bytes:
    """Everything the server sends on one connection until it closes it."""
    r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        w.write(data)
        return await asyncio.wait_for(r.read(), 3)
    finally:
        w.close()


async def started(max_calls: int = 8, **ws: Any) -> tuple[GatewayCore, Any, int]:
    # every call from 127.0.0.1 (or one forwarded client) without a credential: a trusted loopback listener
    # and no per-source share, as the cases here are about the connection limits
    settings = GatewaySettings(GatewayConfig(echo_use_workers=False, max_calls=max_calls,
                                             max_calls_per_source=max_calls),
                               SipConfig(enabled=False), WebSocketConfig(port=0, trust_loopback=True, **ws))
    core = assemble(settings, instance=f"wp{os.getpid()}x{next(_seq)}")
    eps = await core.start()
    return core, core.listeners["websocket"], int(eps["websocket"].rsplit(":", 1)[1])


def test_forwarded_for_from_a_trusted_proxy_is_the_source_and_ignored_from_others():
    async def run() -> None:
        proxy, stranger = addr(20), addr(21)
        core, server, port = await started(handshakes_per_s=2, max_connections_per_source=2,
                                           trusted_proxies=[f"{proxy}/32", "10.8.0.0/16"])
        live: list[Client] = []
        try:
            # six clients through one proxy, all at once: each has its own handshake window
            clients = [f"203.0.113.{next(_seq) % 200 + 1}" for _ in range(6)]
            for c in clients:
                cl = await Client.open(port, proxy)
                status, _, _ = await cl.ask(upgrade(headers=(f"X-Forwarded-For: {c}",)))
                assert status == 101
                live.append(cl)
            assert server.counters["ws_forwarded"] == 6
            assert await settle(lambda: server.per_source == {c: 1 for c in clients})  # none on the proxy
            # one client through the proxy: its window (2 a second) and its open connections (2)
            one = f"198.51.100.{next(_seq) % 200 + 1}"
            codes = []
            for _ in range(3):
                cl = await Client.open(port, proxy)
                codes.append((await cl.ask(upgrade(headers=(f"X-Forwarded-For: {one}",))))[0])
                live.append(cl)
            assert codes == [101, 101, 429]
            # the rightmost entry that is not a proxy, every header joined in order
            chained = (f"X-Forwarded-For: 192.0.2.77, {one}", "X-Forwarded-For: 10.8.3.4, 10.8.0.1")
            cl = await Client.open(port, proxy)
            assert (await cl.ask(upgrade(headers=chained)))[0] == 429  # still `one`'s window
            live.append(cl)
            # a stranger's header is ignored: its own address is the source, limited at 2
            codes = []
            for i in range(3):
                codes.append((await once(port, stranger, upgrade(headers=(f"X-Forwarded-For: 192.0.2.{i + 1}",))))[0])
            assert codes == [101, 101, 429]
            assert server.counters["ws_forwarded_ignored"] == 3
            # a malformed header from the proxy: the proxy is the source (counted, logged bounded)
            bad = []
            for value in ("unknown", "192.0.2.1, not-an-ip", "", "192.0.2.1,,"):
                bad.append((await once(port, proxy, upgrade(headers=(f"X-Forwarded-For: {value}",))))[0])
            assert bad == [101, 101, 429, 429]  # the proxy's own window: 2 a second
            assert server.counters["ws_forwarded_malformed"] == 4
            assert server.counters["ws_refused_rate"] == 5  # one's 2, the stranger's, the proxy's 2
            for cl in live:
                cl.close()
            # every count taken back from the key it was counted under
            assert await settle(lambda: server.per_source == {} and not server.connections)
        finally:
            for cl in live:
                cl.close()
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_open_connections_per_source_count_the_forwarded_client():
    async def run() -> None:
        proxy = addr(22)
        core, server, port = await started(handshakes_per_s=0, max_connections_per_source=2,
                                           trusted_proxies=[proxy])
        live: list[Client] = []
        try:
            codes = []
            for client in ("192.0.2.10", "192.0.2.10", "192.0.2.10", "192.0.2.11", "192.0.2.11"):
                cl = await Client.open(port, proxy)
                codes.append((await cl.ask(upgrade(headers=(f"X-Forwarded-For: {client}",))))[0])
                if codes[-1] == 101:
                    live.append(cl)
                else:
                    cl.close()
            assert codes == [101, 101, 503, 101, 101]  # 2 per client, however many via the proxy
            assert server.counters["ws_refused_connections"] == 1
            assert await settle(lambda: server.per_source == {"192.0.2.10": 2, "192.0.2.11": 2})
            for cl in live:
                cl.close()
            assert await settle(lambda: server.per_source == {} and not server.connections)
        finally:
            for cl in live:
                cl.close()
            await core.stop()

    asyncio.run(run())


def test_healthz_answers_as_admission_would_without_a_credential():
    async def run() -> None:
        src = addr(23)
        core, server, port = await started(max_calls=1, native_secret="s3cret")
        try:
            assert (await once(port, src, upgrade()))[0] == 401  # calls need the credential
            status, headers, body = await once(port, src, plain("/healthz"))
            assert (status, body, headers["connection"]) == (200, b"ok\n", "close")
            assert "retry-after" not in headers
            assert (await once(port, src, upgrade("/healthz?probe=1")))[:3:2] == (200, b"ok\n")
            head = await raw(port, src, b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and b"\r\nContent-Length: 3\r\n" in head
            assert head.endswith(b"\r\n\r\n") and head.count(b"\r\n\r\n") == 1  # no body after the head
            call = core.admit("native", "echo", 8000)  # the one slot taken
            status, headers, body = await once(port, src, plain("/healthz"))
            assert (status, body, headers["retry-after"], headers["connection"]) == (503, b"full\n", "10", "close")
            assert core.table.refused == {}  # asking is not a refused call
            core.transport_ended(call, "test")
            core.abandon(call)
            assert (await once(port, src, plain("/healthz")))[:3:2] == (200, b"ok\n")
            core.drain()
            status, headers, body = await once(port, src, plain("/healthz"))
            assert (status, body, headers["retry-after"]) == (503, b"draining\n", "30")
            assert server.counters["ws_healthz"] == 6 and server.counters["ws_healthz_unavailable"] == 2
            assert "ws_refused_rate" not in server.counters
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_a_healthz_flood_is_limited_on_its_own_and_calls_keep_their_allowance():
    async def run() -> None:
        src = addr(24)
        core, server, port = await started(handshakes_per_s=2)
        try:
            n = HEALTHZ_PER_S + 10
            got = await asyncio.gather(*(once(port, src, plain("/healthz")) for _ in range(n)))
            codes = [g[0] for g in got]
            assert codes.count(200) >= HEALTHZ_PER_S and 429 in codes and set(codes) == {200, 429}
            assert server.counters["ws_healthz"] == n
            assert server.counters["ws_refused_healthz_rate"] == codes.count(429)
            # the calls' handshake window of the same source is untouched: 2, then 429
            codes = [(await once(port, src, upgrade()))[0] for _ in range(3)]
            assert codes == [101, 101, 429]
            assert server.counters["ws_refused_rate"] == 1
        finally:
            await core.stop()

    asyncio.run(run())
