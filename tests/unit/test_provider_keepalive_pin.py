"""The httpcore internals brisvox/providers/keepalive.py relies on (its docstring lists
them) are still there: this fails on another httpcore version or when one of them changed
name or shape, before a silently dead PING round could reach production."""

from __future__ import annotations

import inspect

import httpcore
import httpx

from brisvox.providers import keepalive as ka


def test_the_pinned_httpcore_version_is_installed() -> None:
    assert httpcore.__version__ == ka.HTTPCORE_VERSION == "1.0.9"


def test_the_internals_the_ping_round_uses_exist() -> None:
    t = ka.KeepaliveTransport(http2=True)
    assert isinstance(t._pool, httpcore.AsyncConnectionPool)
    assert t._pool.connections == []
    assert t._pool._keepalive_expiry == ka.KEEPALIVE.pool_expiry == 300.0
    assert t._pool._socket_options == ka.KEEPALIVE.socket_options()
    assert "self._connection" in inspect.getsource(httpcore.AsyncHTTPConnection.__init__)
    h2c = httpcore.AsyncHTTP2Connection
    init = inspect.getsource(h2c.__init__)
    assert "self._h2_state = h2.connection.H2Connection" in init and "self._connection_terminated" in init
    for name in ("is_idle", "is_available", "aclose", "_write_outgoing_data", "_receive_events"):
        assert callable(getattr(h2c, name)), name
    assert list(inspect.signature(h2c._write_outgoing_data).parameters) == ["self", "request"]
    assert list(inspect.signature(h2c._receive_events).parameters) == ["self", "request", "stream_id"]
    src = inspect.getsource(h2c._receive_events)
    # one read under the read lock, every stream's events dispatched, GOAWAY remembered
    assert "async with self._read_lock" in src and "self._events[event.stream_id].append(event)" in src
    assert "self._connection_terminated = event" in src
    assert '"read"' in inspect.getsource(h2c._read_incoming_data)


def test_the_transport_is_an_httpx_transport() -> None:
    assert issubclass(ka.KeepaliveTransport, httpx.AsyncHTTPTransport)
