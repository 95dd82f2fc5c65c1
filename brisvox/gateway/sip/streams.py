"""SIP over TCP and TLS (RFC 3261 section 18): the ``[[sip.listeners]]`` and their connections.

Owns :class:`SipStreams`, held by the transaction layer
(:class:`~brisvox.gateway.sip.transactions.SipTransactions`) below the seam:
the listening sockets, every connection, its framing
(:class:`~brisvox.wire.sip_stream.StreamFramer`) and its limits. A whole
message is handed up to the same intake as a UDP datagram (``deliver``), with
its transport and its connection, so every admission rule of the UDP path
applies to it unchanged; what the transaction layer sends to a (transport,
address) goes out on the connection that address names.

Invariants:

* A connection from outside ``[sip] allow`` is closed at accept, before a
  byte is read (``sip_refused_allowlist``); beyond ``max_connections`` or a
  source's ``max_connections_per_source`` it is closed too
  (``sip_refused_connections`` / ``sip_refused_source_connections``).
* A TLS handshake that fails or stalls past ``tls_handshake_timeout_s``
  costs no call, transaction or slot: asyncio's SSL layer ends it before the
  connection is made (so it never reaches :meth:`StreamConn.connection_made`).
* A connection that delivers no whole message within ``first_message_s``,
  or carries nothing for ``connection_idle_s``, is closed (``sip_stream_idle``).
* Framing errors (a Content-Length over ``max_message_bytes``, none at all, a
  head without end) are answered when the head can be (513, 400) and the
  connection is closed (``sip_stream_framing_<kind>``).
* A peer that does not read (its connection's write buffer above
  :data:`WRITE_HIGH`) is closed (``sip_stream_slow_reader``).
* A keepalive ping (CRLFCRLF, RFC 5626 section 4.4.1) is answered with CRLF.
* Addresses a connection's requests name (Via sent-by, Contact) become its
  aliases, so a request to the peer (an in-dialog BYE) goes out on the
  connection the peer opened (RFC 5923's reuse); aliases die with it. No
  connection to an address: one is opened (``connect_timeout_s``; TLS
  verifies the peer against ``tls_ca_file`` or the system's CAs, its IP
  address as the name, unless ``tls_verify_server = false``), what waits for
  it is bounded (:data:`MAX_PENDING` messages), and a connect that fails
  drops them (``sip_stream_connect_failed``): the client transaction times out.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any

from brisvox.gateway.config import SipConfig, SipListener
from brisvox.gateway.sip.counters import SipCounters
from brisvox.wire.sip_stream import PING, FramingError, StreamFramer

__all__ = ["SipStreams", "StreamConn"]

log = logging.getLogger("brisvox.gateway.sip")

Addr = tuple[str, int]
WRITE_HIGH = 1 << 20  # bytes queued to a peer that does not read: beyond, it is closed
MAX_PENDING = 16  # messages waiting for one connection we open
Deliver = Callable[[bytes, Addr, str, "StreamConn"], None]
Refuse = Callable[[FramingError, "StreamConn"], None]


def server_context(lst: SipListener) -> ssl.SSLContext:
    """TLS 1.2 or newer, the platform's ciphers, our certificate; a client certificate asked for
    and checked against ``client_ca_file`` when set (required with ``require_client_cert``)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(lst.cert_file, lst.key_file)
    if lst.client_ca_file:
        ctx.load_verify_locations(lst.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if lst.require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_context(cfg: SipConfig) -> ssl.SSLContext:
    """TLS 1.2 or newer; the peer verified against ``tls_ca_file`` (or the system's CAs) unless
    ``tls_verify_server`` is false."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.tls_ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not cfg.tls_verify_server:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class StreamConn(asyncio.Protocol):
    """One TCP or TLS connection (see the module docstring)."""

    def __init__(self, owner: SipStreams, transport_name: str) -> None:
        self.owner = owner
        self.name = transport_name  # "TCP" | "TLS", as a Via writes it
        self.transport: asyncio.Transport | None = None
        self.peer: Addr = ("", 0)
        self.framer = StreamFramer(owner.cfg.max_message_bytes)
        self.timer: asyncio.TimerHandle | None = None
        self.got_message = False
        self.last_rx = 0.0
        self.aliases: set[Addr] = set()
        self.closed = False

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername") or ("", 0)
        self.peer = (str(peer[0]), int(peer[1]))
        why = self.owner.admit(self)
        if why:
            self.owner.counters.refuse(why, "SIP %s connection from %s closed at accept", self.name, self.peer[0])
            self.closed = True
            transport.abort()  # type: ignore[attr-defined]
            return
        self.last_rx = self.owner.loop.time()
        self._arm(self.owner.cfg.first_message_s)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = self.owner.loop.time()
        try:
            messages = self.framer.feed(data)
        except FramingError as e:
            self.owner.counters.count(f"sip_stream_framing_{e.kind}")
            self.owner.refuse(e, self)
            self.close()
            return
        for m in messages:
            if self.closed:
                return
            if m is PING or m == PING:
                self.write(b"\r\n")
                continue
            if not self.got_message:
                self.got_message = True
                self._arm(self.owner.cfg.connection_idle_s)
            self.owner.deliver(m, self.peer, self.name, self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.owner.forget(self)

    def pause_writing(self) -> None:  # asyncio's high-water mark: the peer reads slower than we write
        self.owner.counters.count("sip_stream_slow_reader")
        self.close()

    # -- ours ------------------------------------------------------------------------------

    def write(self, data: bytes) -> bool:
        t = self.transport
        if self.closed or t is None or t.is_closing():
            return False
        t.write(data)
        return True

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def _arm(self, after: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.owner.loop.call_later(after, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        now = self.owner.loop.time()
        limit = self.owner.cfg.connection_idle_s if self.got_message else self.owner.cfg.first_message_s
        if now - self.last_rx >= limit - 1e-3:
            self.owner.counters.count("sip_stream_idle")
            self.close()
        else:
            self._arm(limit - (now - self.last_rx))


class SipStreams:
    """The TCP/TLS listeners and connections of one SIP user agent (see the module docstring)."""

    def __init__(self, cfg: SipConfig, allowed: Callable[[str], bool], counters: SipCounters,
                 deliver: Deliver, refuse: Refuse, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.allowed = allowed
        self.counters = counters
        self.deliver = deliver
        self.refuse = refuse
        self.loop = loop
        self.servers: list[asyncio.base_events.Server] = []
        self.ports: dict[str, int] = {}  # "TCP" / "TLS" -> the port we listen on
        self.conns: set[StreamConn] = set()
        self.per_source: Counter[str] = Counter()
        self.by_addr: dict[tuple[str, Addr], StreamConn] = {}
        self.pending: dict[tuple[str, Addr], list[bytes]] = {}  # connects under way, what waits for them
        self._client_ctx: ssl.SSLContext | None = None

    async def start(self) -> dict[str, Addr]:
        out: dict[str, Addr] = {}
        for lst in self.cfg.listeners:
            name = lst.transport.upper()
            ctx = server_context(lst) if lst.transport == "tls" else None
            server = await self.loop.create_server(
                lambda name=name: StreamConn(self, name), lst.host, lst.port, ssl=ctx, backlog=512,
                ssl_handshake_timeout=self.cfg.tls_handshake_timeout_s if ctx else None)
            self.servers.append(server)
            host, port = server.sockets[0].getsockname()[:2]
            self.ports.setdefault(name, port)
            out[name.lower()] = (host, port)
            log.info("SIP over %s on %s:%d", name, host, port)
        return out

    def close(self) -> None:
        for s in self.servers:
            s.close()
        for c in list(self.conns):
            c.close()
        self.pending.clear()

    def stats(self) -> dict[str, int]:
        out = {f"sip_stream_connections_{n.lower()}": 0 for n in self.ports}
        for c in self.conns:
            k = f"sip_stream_connections_{c.name.lower()}"
            out[k] = out.get(k, 0) + 1
        return out

    # -- connections -------------------------------------------------------------------------

    def admit(self, conn: StreamConn) -> str:
        """Why a new connection is closed at accept ("": it is taken)."""
        src = conn.peer[0]
        if not self.allowed(src):
            return "allowlist"
        if len(self.conns) >= self.cfg.max_connections:
            return "connections"
        if self.per_source[src] >= self.cfg.max_connections_per_source:
            return "source_connections"
        self.conns.add(conn)
        self.per_source[src] += 1
        self.by_addr[(conn.name, conn.peer)] = conn
        self.counters.count(f"sip_stream_accepted_{conn.name.lower()}")
        return ""

    def forget(self, conn: StreamConn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        src = conn.peer[0]
        self.per_source[src] -= 1
        if self.per_source[src] <= 0:
            del self.per_source[src]
        for a in (conn.peer, *conn.aliases):
            if self.by_addr.get((conn.name, a)) is conn:
                del self.by_addr[(conn.name, a)]

    def alias(self, conn: StreamConn, addr: Addr) -> None:
        """Requests to ``addr`` over this transport go out on ``conn`` (at most 4 aliases a connection)."""
        if conn.closed or addr in conn.aliases or len(conn.aliases) >= 4:
            return
        conn.aliases.add(addr)
        self.by_addr[(conn.name, addr)] = conn

    def send(self, data: bytes, addr: Addr, transport: str, conn: StreamConn | None = None) -> bool:
        """``data`` to ``addr`` on ``conn`` or the connection ``addr`` names; False when none is open."""
        c = conn if conn is not None and not conn.closed else self.by_addr.get((transport, addr))
        if c is not None and c.write(data):
            return True
        key = (transport, addr)
        waiting = self.pending.get(key)
        if waiting is None:
            if conn is not None:  # a response whose connection is gone: the peer retries on a new one
                self.counters.count("sip_stream_no_connection")
                return False
            self.pending[key] = [data]
            self.loop.create_task(self._connect(key))
        elif len(waiting) < MAX_PENDING:
            waiting.append(data)
        else:
            self.counters.count("sip_stream_pending_full")
            return False
        return True

    async def _connect(self, key: tuple[str, Addr]) -> None:
        """Open a connection to ``key`` (we are the client), then send what waits for it."""
        transport, addr = key
        ctx = None
        if transport == "TLS":
            if self._client_ctx is None:
                self._client_ctx = client_context(self.cfg)
            ctx = self._client_ctx
        conn: StreamConn | None = None
        try:
            _, proto = await asyncio.wait_for(self.loop.create_connection(
                lambda: StreamConn(self, transport), addr[0], addr[1], ssl=ctx,
                server_hostname=addr[0] if ctx is not None else None), self.cfg.connect_timeout_s)
            conn = proto
        except (OSError, TimeoutError, ssl.SSLError) as e:
            self.counters.count("sip_stream_connect_failed")
            self.counters.log_limit("sip_stream_connect", "SIP over %s to %s:%d: connect failed: %s", transport,
                                    addr[0], addr[1], str(e)[:120] or type(e).__name__, level=logging.WARNING)
        waiting = self.pending.pop(key, [])
        if conn is None or conn.closed:
            return
        self.counters.count(f"sip_stream_connected_{transport.lower()}")
        self.alias(conn, addr)
        for data in waiting:
            conn.write(data)

    def ping(self, transport: str, addr: Addr) -> tuple[StreamConn, int] | None:
        """An RFC 5626 keepalive ping (CRLFCRLF) on the connection to ``addr``; what
        :meth:`ponged` needs, or None when there is no open connection."""
        c = self.by_addr.get((transport, addr))
        if c is None or c.closed:
            return None
        mark = c.framer.crlfs_seen
        return (c, mark) if c.write(PING) else None

    @staticmethod
    def ponged(token: tuple[StreamConn, int]) -> bool:
        """Whether the peer answered that ping (a CRLF since) on a connection still open."""
        c, mark = token
        return not c.closed and c.framer.crlfs_seen > mark

    def describe(self) -> dict[str, Any]:
        return {"ports": dict(self.ports), "connections": len(self.conns)}
