"""The ``[audiosocket]`` listener: Asterisk's AudioSocket connections over TCP, and their limits.

Owns :class:`AudioSocketServer` (the :class:`~brisvox.gateway.core.host.Listener` of the
``audiosocket`` registry row: the listening socket, every connection, the admission
counters) and :class:`AudioSocketConn`, one connection: its bytes framed by
:class:`~brisvox.wire.audiosocket.Decoder` (``[audiosocket] max_message_bytes``) and handed
to its :class:`~brisvox.gateway.audiosocket.leg.AudioSocketLeg`.

Invariants:

* AudioSocket has no authentication: a connection from outside ``[audiosocket] allow`` is
  closed at accept, before a byte is read (``audiosocket_refused_allowlist``); beyond
  ``max_connections`` or a source's ``max_connections_per_source`` it is closed too
  (``audiosocket_refused_connections`` / ``audiosocket_refused_source_connections``). A
  source's live calls are bounded again at admission (``[gateway] max_calls_per_source``).
* A connection without its UUID message within ``first_message_s`` is closed
  (``audiosocket_first_message_timeout``); a call without inbound audio for
  ``media_timeout_s`` is hung up by the core's media timer ("media timeout"), so a stalled
  or slow peer holds nothing for long.
* A framing error ends the connection through the leg's refusal (counted, logged bounded).
* A peer that does not read (its write buffer above :data:`WRITE_HIGH`) is closed
  (``audiosocket_slow_reader``).
* Every connection's slot and per-source count is released exactly once, when it is lost.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from brisvox.config.exposure import as_networks
from brisvox.gateway.audiosocket.leg import AudioSocketLeg
from brisvox.gateway.config import AudioSocketConfig
from brisvox.wire.audiosocket import AudioSocketError, Decoder

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost

__all__ = ["AudioSocketConn", "AudioSocketServer"]

log = logging.getLogger("brisvox.gateway.audiosocket")

WRITE_HIGH = 256 * 1024  # bytes queued to a peer that does not read (over 2 minutes of 8 kHz audio): beyond, closed
COUNTERS = ("audiosocket_accepted", "audiosocket_refused_allowlist", "audiosocket_refused_connections",
            "audiosocket_refused_source_connections", "audiosocket_first_message_timeout",
            "audiosocket_slow_reader")


class AudioSocketConn(asyncio.Protocol):
    """One AudioSocket connection (see the module docstring)."""

    def __init__(self, owner: AudioSocketServer) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.source = ""
        self.closed = False
        self.decoder = Decoder(owner.cfg.max_message_bytes)
        self.leg = AudioSocketLeg(owner.host, self, owner.cfg)
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername") or ("", 0)
        self.source = str(peer[0])
        why = self.owner.admit(self)
        if why:
            self.owner.count(f"audiosocket_refused_{why}")
            self.closed = True
            transport.abort()  # type: ignore[attr-defined]
            return
        self.timer = self.owner.host.call_later(self.owner.cfg.first_message_s, self._no_uuid)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            messages = self.decoder.feed(data)
        except AudioSocketError as e:
            self.leg.refuse(e)
            return
        for m in messages:
            self.leg.on_message(m)
            if self.closed:
                return
        if self.timer is not None and self.leg.call_uuid:
            self.timer.cancel()
            self.timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.owner.forget(self)
        self.leg.ended("closed")

    def pause_writing(self) -> None:  # asyncio's high-water mark: the peer reads slower than we write
        self.owner.count("audiosocket_slow_reader")
        self.close()
        self.leg.ended("slow reader")

    # -- the leg's connection -------------------------------------------------------------------

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

    def _no_uuid(self) -> None:
        self.timer = None
        if not self.closed and not self.leg.call_uuid:
            self.owner.count("audiosocket_first_message_timeout")
            self.close()


class AudioSocketServer:
    """The ``[audiosocket]`` listener (see the module docstring)."""

    def __init__(self, host: CallHost, cfg: AudioSocketConfig) -> None:
        self.host = host
        self.cfg = cfg
        self.nets = [n for entry in cfg.allow for n in as_networks(entry)]  # IPv4-mapped entries as IPv4
        self.server: asyncio.base_events.Server | None = None
        self.conns: set[AudioSocketConn] = set()
        self.per_source: Counter[str] = Counter()
        self.counters: Counter[str] = Counter()

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: AudioSocketConn(self), self.cfg.host, self.cfg.port,
                                               backlog=512)
        host, port = self.server.sockets[0].getsockname()[:2]
        log.info("AudioSocket on %s:%d", host, port)
        return str(host), int(port)

    async def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
        for c in list(self.conns):
            c.close()

    def drain(self) -> None:
        """Nothing to tell Asterisk: a draining gateway refuses new calls at their admission."""

    def reload(self, cfg: Any) -> dict[str, str]:
        """Nothing of ``[audiosocket]`` changes live: it applies at the gateway's next start."""
        return {}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        out.update(self.counters)
        out["audiosocket_connections_open"] = len(self.conns)
        return out

    def count(self, name: str) -> None:
        self.counters[name] += 1

    # -- connections -------------------------------------------------------------------------

    def allowed(self, source: str) -> bool:
        """Whether a connection from ``source`` (an IP address; IPv4-mapped IPv6 read as IPv4) is taken."""
        try:
            ip = ipaddress.ip_address(source)
        except ValueError:
            return False
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return any(ip in n or (mapped is not None and mapped in n) for n in self.nets)

    def admit(self, conn: AudioSocketConn) -> str:
        """Why a new connection is closed at accept ("": it is taken)."""
        src = conn.source
        if not self.allowed(src):
            return "allowlist"
        if len(self.conns) >= self.cfg.max_connections:
            return "connections"
        if self.per_source[src] >= self.cfg.max_connections_per_source:
            return "source_connections"
        self.conns.add(conn)
        self.per_source[src] += 1
        self.count("audiosocket_accepted")
        return ""

    def forget(self, conn: AudioSocketConn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        self.per_source[conn.source] -= 1
        if self.per_source[conn.source] <= 0:
            del self.per_source[conn.source]
