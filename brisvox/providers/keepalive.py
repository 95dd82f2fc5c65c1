"""Keep-alive of the provider HTTP connections: TCP keepalive, HTTP/2 PING while idle.

Owns :class:`Keepalive` (the numbers) and :class:`KeepaliveTransport`, the httpx transport
every shared provider client (:func:`brisvox.providers.http.shared_client`) is built on:

* TCP keepalive on every socket (``SO_KEEPALIVE``; ``TCP_KEEPIDLE`` 30 s,
  ``TCP_KEEPINTVL`` 10 s, ``TCP_KEEPCNT`` 3): a peer that vanished without a FIN/RST
  (NAT timeout, a dead host) is found by the kernel in at most 30 + 3 x 10 = 60 s of
  silence, HTTP/1.1 and HTTP/2 alike.
* HTTP/2 PING while idle: every ``ping_interval`` (20 s) each pooled HTTP/2 connection
  with no stream open gets a PING; the peer must answer within ``ping_timeout`` (10 s),
  else the connection is closed (the pool then drops it and the next request opens a
  fresh one instead of stalling on a dead one). A GOAWAY that arrives while idle is
  read by the same PING round and the connection is closed then, not at the next turn.
  A connection with a stream open is not pinged: its request reads the connection
  (and its read timeout applies).
* The pool keeps an idle connection ``pool_expiry`` (300 s), so the first turn after a
  quiet minute reuses the warm connection (httpx's default is 5 s).

httpx/httpcore have no PING keep-alive option; this module relies on httpcore 1.0.9
(:data:`HTTPCORE_VERSION`) internals, all read here and nowhere else:
``httpx.AsyncHTTPTransport._pool`` (an ``httpcore.AsyncConnectionPool``), its public
``connections``; ``AsyncHTTPConnection._connection`` (the ``AsyncHTTP2Connection`` once
ALPN chose h2); on it ``is_idle()``, ``is_available()``, ``aclose()``, ``_h2_state``
(the h2 ``H2Connection``), ``_write_outgoing_data(request)`` and
``_receive_events(request)``, which takes the connection's read lock, reads ONCE with
the request's ``read`` timeout and dispatches every event to its stream exactly as a
request's own read does: so a request that starts during a PING round finds its
response events where it looks for them. A PING counts as answered when the peer sends
anything within ``ping_timeout`` (an idle peer sends nothing unprompted but the ACK; a
GOAWAY closes the connection anyway). ``tests/unit/test_provider_keepalive_pin.py``
fails when the installed httpcore is another version or these names changed.

Invariants: at most one pinger task per transport, started by a request on the
transport's loop and ended by :meth:`KeepaliveTransport.aclose` (or when the pool is
empty); a PING round never raises (a failure closes that connection only); every wait
is bounded (``ping_timeout`` for the PING's write and its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

log = logging.getLogger("brisvox.providers.http")

HTTPCORE_VERSION = "1.0.9"


@dataclass(frozen=True, slots=True)
class Keepalive:
    """The keep-alive numbers (seconds; counts for ``tcp_count``)."""

    tcp_idle: int = 30
    tcp_interval: int = 10
    tcp_count: int = 3
    ping_interval: float = 20.0
    ping_timeout: float = 10.0
    pool_expiry: float = 300.0

    def socket_options(self) -> list[tuple[int, int, int]]:
        opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, value in (("TCP_KEEPIDLE", self.tcp_idle), ("TCP_KEEPINTVL", self.tcp_interval),
                            ("TCP_KEEPCNT", self.tcp_count)):
            opt = getattr(socket, name, None)
            if opt is not None:  # Linux has all three; other platforms keep the system's numbers
                opts.append((socket.IPPROTO_TCP, opt, value))
        return opts


KEEPALIVE = Keepalive()


@dataclass(slots=True)
class PingStats:
    """Process-wide: PINGs sent, answered, connections closed for want of an answer, and
    connections closed because the peer had said GOAWAY while they were idle."""

    sent: int = 0
    answered: int = 0
    unanswered: int = 0
    goaway: int = 0


PING_STATS = PingStats()


def _h2_connections(pool: httpcore.AsyncConnectionPool) -> list[Any]:
    out = []
    for conn in pool.connections:
        h2c = getattr(conn, "_connection", None)
        if isinstance(h2c, httpcore.AsyncHTTP2Connection):
            out.append(h2c)
    return out


async def ping_once(h2c: Any, timeout: float) -> bool:  # noqa: ASYNC109 - the PING's own bound
    """Send one PING on an idle HTTP/2 connection and wait ``timeout`` for the answer;
    unanswered, or the peer said GOAWAY: close the connection. True: answered."""
    req = httpcore.Request("GET", "https://ping.invalid/",
                           extensions={"timeout": {"read": timeout, "write": timeout}})
    PING_STATS.sent += 1
    try:
        async with asyncio.timeout(2 * timeout):
            h2c._h2_state.ping(b"brisvox\x00")
            await h2c._write_outgoing_data(req)
            await h2c._receive_events(req)
        ok = True
    except Exception:  # noqa: BLE001 - a timeout, a reset, a protocol error: all mean dead
        ok = False
    if h2c._connection_terminated is not None:  # GOAWAY (now or earlier): no new stream may start
        PING_STATS.goaway += 1
        log.info("closing an idle HTTP/2 provider connection: the peer said GOAWAY")
    elif ok:
        PING_STATS.answered += 1
        return True
    else:
        PING_STATS.unanswered += 1
        log.info("closing an HTTP/2 provider connection: its PING was not answered within %.0f s", timeout)
    with contextlib.suppress(Exception):
        await h2c.aclose()
    return False


class KeepaliveTransport(httpx.AsyncHTTPTransport):
    """An ``httpx.AsyncHTTPTransport`` with TCP keepalive, the idle pool expiry and the
    HTTP/2 PING round of :class:`Keepalive` (see the module docs)."""

    def __init__(self, *, keepalive: Keepalive = KEEPALIVE, max_connections: int = 100, http2: bool = False,
                 verify: Any = True) -> None:
        super().__init__(
            verify=verify,
            http2=http2,
            trust_env=False,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=keepalive.pool_expiry),
            socket_options=keepalive.socket_options(),
        )
        self.keepalive = keepalive
        self.http2 = http2
        self._pinger: asyncio.Task[None] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.http2 and (self._pinger is None or self._pinger.done()):
            self._pinger = asyncio.get_running_loop().create_task(self._ping_loop(), name="provider-h2-ping")
        return await super().handle_async_request(request)

    async def _ping_loop(self) -> None:
        ka = self.keepalive
        while True:
            await asyncio.sleep(ka.ping_interval)
            try:
                if not self._pool.connections:
                    return  # nothing pooled: the next request starts the loop again
                idle = [c for c in _h2_connections(self._pool) if c.is_idle() and c.is_available()]
            except Exception:  # an httpcore that changed under us: say so once, never break requests
                log.exception("the HTTP/2 PING round cannot read the connection pool; PINGs are off")
                self.http2 = False
                return
            if idle:
                await asyncio.gather(*(ping_once(c, ka.ping_timeout) for c in idle))

    async def aclose(self) -> None:
        task, self._pinger = self._pinger, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await super().aclose()
