"""The WebSocket side's log stays bounded whatever peers do, connection after connection.

Found by the fuzz campaign (``python -m bench fuzz``): every connection wrote
the websockets library's INFO lines ("connection open", "HTTP response sent
(404 Not Found)", "connection closed"), and every Twilio connection closed
for a malformed message, and every call's first dropped message and budget
close, wrote a line of its own -- a peer opening connections could write the
log at its own pace. Now:

* the library's protocol objects log through :class:`LibraryLog`: nothing
  below WARNING, warnings and errors one line per level per minute (with the
  exception's type, no traceback);
* the sessions' lines go through one limiter (``SESSION_LOG``): one line per
  site per minute, the rest counted and exported (``ws_log_suppressed``).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from brisvox.gateway.carriers import native as native_ws
from brisvox.gateway.carriers import stream_session
from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.transports import TRANSPORTS
from brisvox.gateway.ws.server import WebSocketServer, WsConnection
from brisvox.runtime.log_limit import LogLimiter
from tests.unit.test_gateway_ws_fastpath import REQ, Session, Transport, feed, frame
from tests.unit.test_gateway_ws_faults import session

N = 50


@pytest.fixture(autouse=True)
def loop():
    lp = asyncio.new_event_loop()
    asyncio.set_event_loop(lp)
    yield lp
    asyncio.set_event_loop(None)
    lp.close()


@pytest.fixture
def fresh_session_log(monkeypatch):
    lim = LogLimiter(logging.getLogger("brisvox.gateway.ws"))
    monkeypatch.setattr(stream_session, "SESSION_LOG", lim)  # the carrier streams' (Twilio's) log
    monkeypatch.setattr(native_ws, "SESSION_LOG", lim)
    return lim


def _conn(server: WebSocketServer, request: bytes) -> tuple[WsConnection, Transport]:
    conn = WsConnection(server)
    t = Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    feed(conn, request)
    return conn, t


def test_connections_opened_refused_and_closed_write_no_line_each(caplog) -> None:
    server = WebSocketServer(None, WebSocketConfig(handshakes_per_s=0), TRANSPORTS)  # type: ignore[arg-type]
    server.make_session = lambda conn, route, req: Session()  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG)
    for _ in range(N):
        conn, t = _conn(server, REQ)
        assert t.out.startswith(b"HTTP/1.1 101")
        feed(conn, frame(b"\x03\xe8", 0x88))  # the client closes
        conn.connection_lost(None)
        _, t = _conn(server, REQ.replace(b"GET /twilio ", b"GET /nope "))
        assert t.out.startswith(b"HTTP/1.1 404")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("websockets")] == []
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and server.counters["ws_refused_path"] == N


def test_library_errors_are_bounded_and_name_the_exception(caplog) -> None:
    server = WebSocketServer(None, WebSocketConfig(), TRANSPORTS)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    for _ in range(N):
        try:
            raise ValueError("boom")
        except ValueError:
            server.library_log.error("parser failed", exc_info=True)
    lines = [r for r in caplog.records if "parser failed" in r.getMessage()]
    assert len(lines) == 1 and "ValueError: boom" in lines[0].getMessage() and lines[0].exc_info is None
    assert server.stats()["ws_log_suppressed"] >= N - 1


def test_twilio_connections_closed_for_bad_input_log_once(caplog, fresh_session_log) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(N):
        s, host, conn, _ = session("twilio", start=False)
        s.on_text(b"{not json")
        assert conn.closed
    lines = [r for r in caplog.records if "closing" in r.getMessage()]
    assert len(lines) == 1 and fresh_session_log.suppressed == {"twilio_bad_json": N - 1}


@pytest.mark.parametrize("kind", ["twilio", "native"])
def test_calls_closed_by_their_fault_budget_log_once_per_site(caplog, fresh_session_log, kind) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(N):
        s, host, conn, clock = session(kind, fault_max=2, fault_window_s=10.0)
        for _ in range(3):
            s.on_text(b"{not json")
            clock.t += 0.01
        assert conn.closed
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("brisvox.gateway")]
    assert len(lines) == 2, lines  # the first call's first dropped message, and its close
    assert sum(fresh_session_log.suppressed.values()) == 2 * (N - 1)
