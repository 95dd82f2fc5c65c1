"""The WebSocket server: TCP connections, the opening handshake, routing, auth.

Owns WebSocket connections (the websockets library's Sans-I/O protocol
driven from an ``asyncio.BufferedProtocol``: no task per connection, and
sends are plain synchronous writes the pacer can make from its tick), the
route of a request path to a protocol (a WebSocket transport of the registry,
:mod:`brisvox.gateway.transports`: Twilio Media Streams or native) and an
agent, and the handshake check the protocol's registry row declares
(``Transport.auth``, :mod:`brisvox.gateway.ws.auth`).

The hot path (50 messages a second each way per call) stays out of the
library where it costs most: every read lands in ONE receive buffer shared by
all connections (``recv_into``; a plain ``asyncio.Protocol`` makes asyncio
allocate a fresh 256 KiB bytes object per read, about 17 us each); once the
handshake is done, complete unfragmented data frames are split and unmasked
here (:mod:`brisvox.wire.ws_framing`, unmasked by the library's C
``apply_mask``), fragmented messages are reassembled here too
(:class:`~brisvox.gateway.ws.inbound.Reassembly`), control frames go to the
library whole, and only a frame the library must refuse (reserved bits, no
mask, an unknown opcode, over ``max_message_bytes``) hands it the rest of the
stream, which it fails with its code; outbound data frames are written with a
prebuilt header while the connection is open. The request head is fed to the
library alone (up to its blank line), so frames sent in the same read as the
head take the fast path as well.

Invariants:

* Accept time (:mod:`brisvox.gateway.ws.listener`, before a transport or a
  protocol exists): a TCP peer that already holds ``max_half_open_per_source``
  half-open connections (accepted, not upgraded; a trusted proxy has no such
  cap) gets its new one reset at once (``ws_dropped_half_open_source``); with
  ``max_half_open`` half-open connections in all (default: from the file
  limit, :func:`~brisvox.gateway.ws.half_open.auto_cap`) the oldest one is
  reset to make room (``ws_evicted_half_open``), so a health check or a
  caller's handshake still gets in while a flood holds the table. One
  LogLimiter line each; live calls are never half-open.
* After the handshake a connection's frames, bytes and control frames per
  second are within ``max_frames_per_s``, ``max_bytes_per_s`` and
  ``max_control_frames_per_s`` (:class:`~brisvox.gateway.ws.inbound.FrameBudget`),
  and a control frame is answered only while its unsent bytes are within
  ``max_send_buffer_bytes``; otherwise the connection is closed 1008 with
  the reason (``ws_closed_frame_rate``, ``ws_closed_byte_rate``,
  ``ws_closed_control_rate``, ``ws_closed_send_buffer``), nothing more it
  sent is read and the TCP connection is dropped within ``CLOSE_TIMEOUT_S``.
* A message larger than ``max_message_bytes`` fails the connection with
  close code 1009 before it is buffered (the frame header is enough; for a
  fragmented one, the fragment that would pass it); a
  handshake that does not finish in ``HANDSHAKE_TIMEOUT_S`` is dropped.
* A request's source (the key of every per-source limit) is its TCP peer's
  address, or, when the peer is one of ``trusted_proxies`` and the request
  has ``X-Forwarded-For``, the client that header names
  (:func:`brisvox.gateway.proxies.forwarded_client`: counted
  ``ws_forwarded``; from any other peer the header is ignored,
  ``ws_forwarded_ignored``; one that names no IP address leaves the peer,
  ``ws_forwarded_malformed``). It is fixed before any check below, and a
  connection's open-connection count moves with it: ``released`` takes back
  exactly the count ``opened`` (or the move) gave.
* ``GET /healthz`` (any query, upgrade or not; ``HEAD`` gets the headers only)
  is the load balancer's health check, answered before the checks below (no
  credential): 200 ``ok``, or 503 ``draining`` / ``full`` with Retry-After
  whenever a new call would be refused now
  (:meth:`~brisvox.gateway.core.host.CallHost.refusal`), then the connection
  closes; counted ``ws_healthz``. Its own per-source limit
  (:data:`HEALTHZ_PER_S`, 429 ``ws_refused_healthz_rate`` beyond) takes
  nothing of the handshake allowance of real calls. With ``twiml_path`` set, a
  ``POST`` is Twilio's call webhook instead (:mod:`brisvox.gateway.control.twiml`);
  under ``/playground`` (when on) a GET, POST or upgrade is the browser playground's
  (:mod:`brisvox.gateway.ws.playground`), after the source's two limits below.
* Before any session exists a request is checked in this order, and the
  first failing check refuses it with an HTTP status and a counter: the
  source's handshake rate (``handshakes_per_s``, moving 1 s window: 429
  ``ws_refused_rate``), its open connections (``max_connections_per_source``:
  503 ``ws_refused_connections``), the path (404 ``ws_refused_path``), the
  ``Origin`` (403 ``ws_refused_origin``), the protocol's credential (401
  native, 403 Twilio: :mod:`brisvox.gateway.ws.auth`), the route's agent
  list (404 ``ws_refused_agent``; the body does not list the agents).
* A route whose registry row names a ``subprotocol`` (chan_websocket's ``media``)
  answers it in ``Sec-WebSocket-Protocol`` when the request offers it; no other
  subprotocol is ever selected.
* Bad input (a malformed handshake, a refusal, a session that raised) is
  logged through one :class:`~brisvox.runtime.log_limit.LogLimiter`: a line
  per kind per minute at most, never a traceback per message. The
  websockets library's own log (:class:`~brisvox.gateway.ws.log.LibraryLog`) writes nothing per
  connection: its INFO lines (connection open, HTTP response sent,
  connection closed) are dropped -- the counters say it --, its warnings
  and errors go through the same limiter.
* Every close frame's reason is cut to 123 bytes of UTF-8 at a character
  boundary (:func:`brisvox.wire.ws_framing.close_reason`), so a close never
  raises whatever the reason holds.
* Outbound data beyond ``max_send_buffer_bytes`` of unsent bytes is not
  queued (the send returns False and the caller counts a drop): a slow
  reader can never make the gateway buffer without bound.
* One connection's failure (exception in its session) closes that
  connection with 1011 and touches nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from limits import RateLimitItemPerSecond, strategies
from websockets.exceptions import InvalidState
from websockets.frames import Opcode, apply_mask
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from brisvox.gateway.config import HEALTHZ_PATH, WebSocketConfig, WsRoute, is_loopback
from brisvox.gateway.control import twilio_rest
from brisvox.gateway.control import twiml as twiml_webhook
from brisvox.gateway.core.leg import SESSION_LOG
from brisvox.gateway.metrics import WS_FLOOD_COUNTERS
from brisvox.gateway.proxies import (
    DIRECT,
    FORWARDED,
    MALFORMED,
    TrustedProxies,
    forwarded_client,
)
from brisvox.gateway.rate_limits import process_storage
from brisvox.gateway.ws import playground
from brisvox.gateway.ws.auth import OPEN as OPEN_GRANT
from brisvox.gateway.ws.auth import Grant, Refusal, origin_refusal
from brisvox.gateway.ws.half_open import HalfOpenTable, auto_cap
from brisvox.gateway.ws.inbound import FrameBudget, Reassembly
from brisvox.gateway.ws.listener import Acceptor
from brisvox.gateway.ws.log import LibraryLog
from brisvox.runtime.log_limit import LogLimiter
from brisvox.wire import ws_framing

if TYPE_CHECKING:
    from brisvox.gateway.core.host import CallHost

log = logging.getLogger("brisvox.gateway.ws")

HANDSHAKE_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 2.0
RECV_BUFFER_BYTES = 65536  # the one receive buffer of all connections (a read never exceeds it)
OPEN = State.OPEN
CLOSED = State.CLOSED
HEALTHZ_PER_S = 50  # /healthz requests per source per second (moving window); 429 beyond
HEALTHZ_RETRY_AFTER = {"draining": "30", "full": "10"}  # as the SIP OPTIONS answer says it


class Session(Protocol):
    def on_text(self, data: bytes) -> None: ...

    def on_binary(self, data: bytes) -> None: ...

    def on_closed(self, code: int, reason: str) -> None: ...


AuthCheck = Callable[[Any, WsRoute, str, Mapping[str, str]], "Refusal | Grant"]  # cfg, route, path, headers
SessionFactory = Callable[["CallHost", "WsConnection", WsRoute], Session]


def offered_subprotocols(headers: Any) -> list[str]:
    """The subprotocols a request's ``Sec-WebSocket-Protocol`` headers offer (RFC 6455 4.1)."""
    get_all = getattr(headers, "get_all", None)
    values = get_all("Sec-WebSocket-Protocol") if get_all is not None else [headers.get("Sec-WebSocket-Protocol", "")]
    return [p.strip() for v in values for p in (v or "").split(",") if p.strip()]


class RouteTransport(Protocol):
    """What the server needs of a route's transport (a row of the registry,
    :data:`brisvox.gateway.transports.TRANSPORTS`, which the registry passes in)."""

    @property
    def session(self) -> SessionFactory | None: ...

    @property
    def auth(self) -> AuthCheck | None: ...

    @property
    def subprotocol(self) -> str: ...


class WsConnection(asyncio.BufferedProtocol):
    """One WebSocket connection (see module invariants)."""

    def __init__(self, server: WebSocketServer) -> None:
        self.server = server
        self.proto = ServerProtocol(max_size=server.cfg.max_message_bytes, logger=server.library_log)
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.route: WsRoute | None = None
        self.request: Request | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.source = ""  # the client's IP (the peer's, or the one a trusted proxy forwarded): the limits' key
        self.counted_as = ""  # the key of the server's open-connection count this connection holds
        self.grant: Grant = OPEN_GRANT  # what the handshake's credential fixes (a signed token's params)
        self.closed = False
        self.evicted = False  # dropped from the half-open table before its transport existed
        cfg = server.cfg
        self.budget = FrameBudget(cfg.max_frames_per_s, cfg.max_bytes_per_s, cfg.max_control_frames_per_s)
        self.reassembly = Reassembly(cfg.max_message_bytes)
        self._stopped = False  # closed for abuse: nothing more it sends is read
        self._tail = b""  # the last bytes of the request head so far (its blank line may straddle reads)
        self._timer: asyncio.TimerHandle | None = None
        self._close_code = 1006
        self._close_reason = ""
        self.max_buffer = server.cfg.max_send_buffer_bytes
        self.max_size = server.cfg.max_message_bytes
        self._refused = False  # the handshake was refused (and counted once)
        self._fast = False  # frames are split here (set once the handshake is done)
        self._pending = b""  # the start of an incomplete frame (fast mode)
        self.webhook: twiml_webhook.WebhookRequest | playground.PostRequest | None = None  # a POST being read

    # -- asyncio.Protocol ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self.peer = transport.get_extra_info("peername") or ("", 0)
        self.source = str(self.peer[0]) if self.peer else ""
        if self.evicted:  # the half-open table gave its place to a newer connection meanwhile
            self._abort()
            return
        self.server.opened(self)
        self._timer = self.server.loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.rx_view

    def buffer_updated(self, nbytes: int) -> None:
        view = self.server.rx_view
        if not self._fast:
            self.data_received(bytes(view[:nbytes]))
            return
        if self._stopped or not self._budget_read(nbytes):
            return
        if self._pending:
            data: bytes | memoryview = self._pending + view[:nbytes]
            self._pending = b""
            self._receive_frames(data, len(data))
        else:
            self._receive_frames(view, nbytes)

    def _budget_read(self, nbytes: int) -> bool:
        if self.budget.read(nbytes, self.server.loop.time()):
            return True
        self._abuse("ws_closed_byte_rate", f"policy: more than {self.budget.max_bytes} bytes/s")
        return False

    def _head_end(self, data: bytes) -> int:
        """Where the request head ends in ``data`` (just after its blank line), or -1 if not in it."""
        probe = self._tail + data
        i = probe.find(b"\r\n\r\n")
        if i < 0:
            self._tail = probe[-3:]
            return -1
        return i + 4 - len(self._tail)

    def data_received(self, data: bytes) -> None:
        """The library's path: the request head (the library sees nothing after its blank line
        before the upgrade), and the stream after a frame it must refuse."""
        if self.webhook is not None or (data[:5] == b"POST " and self.session is None and self.server.webhook):
            self.webhook = self.webhook or self.server.webhook.request(self)  # type: ignore[union-attr]
            self.webhook.feed(data)
            return
        proto = self.proto
        shaking = self.session is None
        rest = b""
        if shaking and not self._refused:
            cut = self._head_end(data)
            if cut >= 0:
                data, rest = data[:cut], data[cut:]
        proto.receive_data(data)
        self._events()
        if shaking and self.session is None and proto.handshake_exc is not None and not self._refused:
            self._bad_handshake(proto.handshake_exc)
        if shaking and self.session is not None and proto.state is OPEN and not proto.reader.buffer:
            # the library saw the head and nothing after it: its parser waits at a frame
            # boundary, so every frame from here on is split here
            self._fast = True
        self._flush()
        if rest and not self.closed:
            if self._fast:
                if self._budget_read(len(rest)):
                    self._receive_frames(rest, len(rest))
            else:
                proto.receive_data(rest)
                self._events()
                self._flush()

    def _events(self) -> None:
        try:
            for ev in self.proto.events_received():
                if isinstance(ev, Request):
                    self._handshake(ev)
                else:
                    self._frame(ev)
        except Exception as e:  # noqa: BLE001 - one connection's failure closes that connection
            self._session_error(e)

    def _receive_frames(self, data: bytes | memoryview, end: int) -> None:
        """Fast mode: deliver the messages of the complete frames of ``data[:end]`` (see ws_framing),
        within the connection's frame budget. Closing (our close sent), data is dropped and control
        frames still go to the library; once closed, nothing more is looked at."""
        proto = self.proto
        scan = ws_framing.scan
        max_size = self.max_size
        budget = self.budget
        left = budget.frames_left()
        granted = left
        pos = 0
        try:
            while pos < end:
                kind, h, n = scan(data, pos, end, True, max_size)
                if kind == ws_framing.MORE:
                    self._pending = bytes(data[pos:end])
                    return
                if kind == ws_framing.OTHER:
                    break
                left -= 1
                if left < 0:
                    self._abuse("ws_closed_frame_rate", f"policy: more than {budget.max_frames} frames/s")
                    return
                start = pos + h
                first = data[pos]
                if kind == ws_framing.CONTROL:
                    if not self._control_allowed():
                        return
                    proto.receive_data(bytes(data[pos:start + n]))
                    pos = start + n
                    self._events()
                    self._flush()  # a pong or close echo goes out before anything sent after it
                    if proto.state is CLOSED or self.closed:
                        return
                    continue
                reasm = self.reassembly
                if kind == ws_framing.FRAGMENT or reasm.opcode:
                    refusal = reasm.check(first, n)
                    if refusal is not None:
                        self._refuse_frame(*refusal)
                        return
                # websockets' C apply_mask takes any buffer (no copy of the view); its stub says bytes
                payload = apply_mask(data[start:start + n], data[start - 4:start])  # type: ignore[arg-type]
                pos = start + n
                if kind == ws_framing.FRAGMENT:
                    done = reasm.add(first, payload)
                    if done is None:
                        continue
                    first = ws_framing.TEXT if done[0] == 1 else ws_framing.BINARY
                    payload = done[1]
                s = self.session
                if s is not None and proto.state is OPEN:
                    if first == ws_framing.TEXT:
                        s.on_text(payload)
                    else:
                        s.on_binary(payload)
                if self.closed or self._stopped:
                    return
            else:
                return
        except Exception as e:  # noqa: BLE001 - one connection's failure closes that connection
            self._session_error(e)
            return
        finally:
            budget.spend(granted - max(left, 0))
        # a frame the library must refuse: it takes the rest and fails the connection with its code
        self._fast = False
        self.reassembly.reset()
        if not self.closed:
            proto.receive_data(bytes(data[pos:end]))
            self._events()
        self._flush()

    def _control_allowed(self) -> bool:
        """A control frame may be answered: within its budget, and our unsent bytes within the bound."""
        if not self.budget.control_frame():
            self._abuse("ws_closed_control_rate",
                        f"policy: more than {self.budget.max_control} control frames/s")
            return False
        t = self.transport
        if t is not None and t.get_write_buffer_size() > self.max_buffer:
            self._abuse("ws_closed_send_buffer", "policy: send buffer full (pongs not read)")
            return False
        return True

    def _refuse_frame(self, code: int, reason: str) -> None:
        """A fragment the fast path refuses (RFC 6455: 1002; over max_message_bytes: 1009)."""
        self.server.count("ws_refused_frame_1009" if code == 1009 else "ws_refused_frame_1002")
        self.server.bad(f"ws_frame_{code}", "websocket from %s: %s, closed %d", self.source, reason, code,
                        level=logging.INFO)
        self.reassembly.reset()
        self.close(code, reason)

    def _abuse(self, counter: str, reason: str) -> None:
        """Over a budget: close 1008 with ``reason``, read nothing more; the close timer drops it."""
        self.server.count(counter)
        self.server.bad(counter, "websocket from %s closed 1008: %s", self.source, reason, level=logging.INFO)
        self._stopped = True
        self.reassembly.reset()
        self.close(1008, reason)
        t = self.transport
        if t is not None and not t.is_closing():
            try:
                t.pause_reading()
            except (RuntimeError, AttributeError):  # already paused or closing
                pass

    def _session_error(self, e: Exception) -> None:
        self.server.count("ws_session_errors")
        self.server.bad("ws_session_error", "websocket session of %s failed: %s",
                        self.source, traceback.format_exc(limit=6).rstrip(), level=logging.ERROR)
        self.close(1011, "internal error")

    def eof_received(self) -> bool | None:
        self.proto.receive_eof()
        self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.reassembly.reset()
        self.server.released(self)
        if self.proto.close_rcvd is not None:
            self._close_code = self.proto.close_rcvd.code
            self._close_reason = self.proto.close_rcvd.reason
        if self.session is not None:
            s, self.session = self.session, None
            s.on_closed(self._close_code, self._close_reason)

    # -- handshake ----------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        if self.session is None and not self.closed:
            self.server.count("ws_handshake_timeouts")
            self._abort()

    def _bad_handshake(self, exc: BaseException) -> None:
        """The library refused the request itself (not HTTP, no upgrade, a bad key): it
        answered 400 or 426; counted and logged, bounded."""
        self._refused = True
        self.server.count("ws_refused_handshake")
        self.server.bad("ws_bad_handshake", "websocket handshake from %s refused: %s",
                        self.source, f"{type(exc).__name__}: {exc}"[:200], level=logging.INFO)

    def reject(self, status: int, text: str, counter: str, retry_after: bool = False) -> None:
        """Refuse the handshake with an HTTP answer (counted, logged, bounded)."""
        self._refused = True
        self.server.count(counter)
        self.server.bad(counter, "websocket handshake from %s refused: %d %s", self.source, status,
                        text.strip(), level=logging.INFO)
        resp = self.proto.reject(status, text)
        if retry_after:
            resp.headers["Retry-After"] = "1"
        self.proto.send_response(resp)

    def answer(self, resp: Any) -> None:
        """Answer the request with ``resp`` (a page, a health check): not a handshake, never counted as one."""
        self._refused = True
        self.proto.send_response(resp)

    def _healthz(self, req: Request) -> None:
        """``GET /healthz`` (module invariants): the answer, then the connection closes."""
        server = self.server
        server.count("ws_healthz")
        if not server.healthz_allowed(self.source):
            self.reject(429, "too many health checks\n", "ws_refused_healthz_rate", retry_after=True)
            return
        self._refused = True  # answered: nothing of it is a handshake
        refusal = server.host.refusal()
        resp = self.proto.reject(503 if refusal else 200, f"{refusal}\n" if refusal else "ok\n")
        if refusal:
            server.count("ws_healthz_unavailable")
            resp.headers["Retry-After"] = HEALTHZ_RETRY_AFTER.get(refusal, "10")
        if req.method == "HEAD":
            resp.body = b""  # the headers of the GET answer (Content-Length included), no body
        self.proto.send_response(resp)

    def _handshake(self, req: Request) -> None:
        """The checks of the module invariants, in order; the first failing one answers."""
        server = self.server
        cfg = server.cfg
        server.resolve_source(self, req)
        if req.path.split("?", 1)[0] == HEALTHZ_PATH:
            self._healthz(req)
            return
        if not server.handshake_allowed(self.source):
            self.reject(429, "too many handshakes\n", "ws_refused_rate", retry_after=True)
            return
        if not server.connections_allowed(self.source):
            self.reject(503, "too many connections\n", "ws_refused_connections", retry_after=True)
            return
        if server.playground is not None and playground.owns(req.path):
            return server.playground.handshake(self, req)  # its page, agents, its own WebSocket checks
        route = cfg.route(req.path)
        if route is None:
            self.reject(404, "no such path\n", "ws_refused_path")
            return
        refusal: Refusal | None = origin_refusal(cfg, req.headers)
        if refusal is None:
            auth = server.transports[route.protocol].auth  # the protocol's own check (registry row)
            verdict = auth(cfg, route, req.path, req.headers) if auth is not None else OPEN_GRANT
            if isinstance(verdict, Refusal):
                refusal = verdict
            else:
                self.grant = verdict
        if refusal is not None:
            self.reject(refusal.status, refusal.text, refusal.counter)
            return
        if not route.allowed:
            self.reject(404, "no such agent on this route\n", "ws_refused_agent")
            return
        self.accept(req, route)

    def accept(self, req: Request, route: WsRoute) -> None:
        """The checks passed: the 101 answer, and ``route``'s protocol session."""
        server = self.server
        resp = self.proto.accept(req)
        sub = server.transports[route.protocol].subprotocol
        if sub and resp.status_code == 101 and sub in offered_subprotocols(req.headers):
            resp.headers["Sec-WebSocket-Protocol"] = sub  # the one the route speaks, when the peer asks for it
        self.proto.send_response(resp)
        if resp.status_code != 101:
            self._bad_handshake(self.proto.handshake_exc or ValueError(f"status {resp.status_code}"))
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.route = route
        self.request = req
        server.half_open.remove(self)  # upgraded: no longer half-open
        self.session = server.make_session(self, route, req)

    # -- frames -----------------------------------------------------------------

    def _frame(self, frame: Any) -> None:
        """A frame the library parsed: control frames (the fast path hands it those), and whole data
        frames only in a stream it is failing anyway (the fast path reassembles every fragment)."""
        op = frame.opcode
        if op is Opcode.TEXT or op is Opcode.BINARY:
            if frame.fin:
                self._message(op, frame.data)
        elif op is Opcode.CLOSE:
            if self.proto.close_rcvd is not None:
                self._close_code = self.proto.close_rcvd.code
                self._close_reason = self.proto.close_rcvd.reason

    def _message(self, op: Opcode, data: bytes) -> None:
        s = self.session
        if s is None:
            return
        if op is Opcode.TEXT:
            s.on_text(data)
        else:
            s.on_binary(data)

    # -- sending --------------------------------------------------------------------

    def _flush(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        for chunk in self.proto.data_to_send():
            if chunk:
                t.write(chunk)
            elif t.can_write_eof():
                try:
                    t.write_eof()
                except OSError:  # the peer reset first (ENOTCONN): nothing is left to close cleanly
                    self.server.count("ws_eof_after_reset")
                    self._abort()
                    return
        if self.proto.close_expected() and self._timer is None:
            self._timer = self.server.loop.call_later(CLOSE_TIMEOUT_S, self._abort)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def evict(self) -> None:
        """The half-open table dropped it for a newer connection: reset now (or once it has a transport)."""
        self.evicted = True
        self._abort()

    def can_send(self) -> bool:
        t = self.transport
        return t is not None and not self.closed and t.get_write_buffer_size() <= self.max_buffer

    def send_text(self, data: bytes) -> bool:
        """Send a text message (``data`` is UTF-8). False if dropped (closed or backed up)."""
        return self._send(data, ws_framing.TEXT)

    def send_binary(self, data: bytes) -> bool:
        return self._send(data, ws_framing.BINARY)

    def _send(self, data: bytes, first: int) -> bool:
        if not self.can_send():
            return False
        proto = self.proto
        if proto.state is OPEN:
            # a whole data frame: nothing of the library's state depends on it (its output
            # buffer is always flushed, so nothing it queued can be overtaken)
            self.transport.write(ws_framing.header(len(data), first) + data)  # type: ignore[union-attr]
            return True
        try:
            if first == ws_framing.TEXT:
                proto.send_text(data)
            else:
                proto.send_binary(data)
        except InvalidState:
            return False
        self._flush()
        return True

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (the TCP close follows, bounded by a timer)."""
        if self.closed:
            return
        reason = ws_framing.close_reason(reason)
        self._close_code = code
        self._close_reason = reason
        try:
            self.proto.send_close(code, reason)
        except InvalidState:
            pass
        except Exception as e:  # noqa: BLE001 - e.g. a close code the library refuses: drop the connection
            self.server.bad("ws_close_error", "websocket close %d failed: %s", code, e, level=logging.ERROR)
            self._abort()
            return
        self._flush()


class WebSocketServer:
    """Listens on the configured address and hands connections to sessions."""

    def __init__(self, host: CallHost, cfg: WebSocketConfig, transports: Mapping[str, RouteTransport]) -> None:
        self.host = host
        self.cfg = cfg
        self.transports = transports  # protocol -> its registry row (brisvox/gateway/transports.py)
        self.loop = asyncio.get_event_loop()
        self.acceptor: Acceptor | None = None  # the listening sockets, once started
        self.connections: set[WsConnection] = set()
        self.counters: dict[str, int] = {}
        self.per_source: dict[str, int] = {}  # source IP -> open connections
        self.bad = LogLimiter(log)
        self.library_log = LibraryLog(self.bad)
        # per-source handshake rate: limits' moving window in the process's one storage
        self._rate = RateLimitItemPerSecond(cfg.handshakes_per_s) if cfg.handshakes_per_s > 0 else None
        self._limiter = strategies.MovingWindowRateLimiter(process_storage()) if self._rate else None
        self._healthz_rate = RateLimitItemPerSecond(HEALTHZ_PER_S)
        self._healthz_limiter = strategies.MovingWindowRateLimiter(process_storage())
        self.proxies = TrustedProxies(cfg.trusted_proxies)
        # accepted, not yet upgraded: the accept-time caps (the global one resolved again at start)
        self.half_open: HalfOpenTable[WsConnection] = HalfOpenTable(
            self.half_open_cap(), cfg.max_half_open_per_source, self.proxies.trusts)
        self.twilio_api = twilio_rest.from_config(cfg)  # Twilio call control (None without twilio_account_sid)
        self.playground = playground.Playground(self) if playground.enabled(cfg) else None
        twiml = twiml_webhook.Webhook(self) if cfg.twiml_path else None  # POSTs: the webhook's, the playground's
        self.webhook = playground.PostRouter(self.playground, twiml) if self.playground else twiml
        # every read of every connection lands here and is consumed (or copied) at once
        self.rx_view = memoryview(bytearray(RECV_BUFFER_BYTES))

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def half_open_cap(self) -> int:
        """``max_half_open``, or for ``"auto"`` the rule of :func:`~brisvox.gateway.ws.half_open.auto_cap`
        on this process's soft file limit now."""
        cap = self.cfg.max_half_open
        return auto_cap() if cap == "auto" else cap

    def admit(self, sock: socket.socket, peer: tuple[Any, ...]) -> WsConnection | None:
        """Accept time (:class:`~brisvox.gateway.ws.listener.Acceptor`, module invariants): the
        protocol of a new connection from ``peer``, or None to reset it at once."""
        source = str(peer[0]) if peer else ""
        kept, evicted = False, None
        if not self.half_open.source_full(source):  # (no protocol object is built for a refused one)
            conn = WsConnection(self)
            kept, evicted = self.half_open.admit(conn, source)
        if not kept:
            self.count("ws_dropped_half_open_source")
            self.bad("ws_dropped_half_open_source", "websocket: %s holds %d half-open connections "
                     "(max_half_open_per_source): new ones are reset", source, self.half_open.per_source_cap,
                     level=logging.WARNING)
            return None
        if evicted is not None:
            self.count("ws_evicted_half_open")
            self.bad("ws_evicted_half_open", "websocket: %d half-open connections (max_half_open): the "
                     "oldest is reset for each new one (last from %s)", self.half_open.cap, evicted.source,
                     level=logging.WARNING)
            evicted.evict()
        return conn

    def opened(self, conn: WsConnection) -> None:
        self.connections.add(conn)
        self.half_open.track(conn, conn.source)  # a no-op for one admitted at accept time
        conn.counted_as = conn.source
        self.per_source[conn.source] = self.per_source.get(conn.source, 0) + 1

    def _uncount(self, key: str) -> None:
        n = self.per_source.get(key, 0) - 1
        if n > 0:
            self.per_source[key] = n
        else:
            self.per_source.pop(key, None)

    def released(self, conn: WsConnection) -> None:
        self.half_open.remove(conn)
        if conn in self.connections:
            self.connections.discard(conn)
            self._uncount(conn.counted_as)  # the key it was counted under, whatever source says now

    def resolve_source(self, conn: WsConnection, req: Request) -> None:
        """``conn.source`` := the client behind a trusted proxy (module invariants); its
        open-connection count moves to that key."""
        peer = str(conn.peer[0]) if conn.peer else ""
        client, how = forwarded_client(self.proxies, peer, req.headers.get_all("X-Forwarded-For"))
        if how == DIRECT:
            return
        self.count("ws_forwarded" if how == FORWARDED else f"ws_forwarded_{how}")
        if how == MALFORMED:
            self.bad("ws_forwarded_malformed", "X-Forwarded-For from trusted proxy %s names no IP address: "
                     "limited as the proxy's own", peer, level=logging.INFO)
        if client != conn.source:
            conn.source = client
            if conn in self.connections:
                self._uncount(conn.counted_as)
                conn.counted_as = client
                self.per_source[client] = self.per_source.get(client, 0) + 1

    def handshake_allowed(self, source: str) -> bool:
        """Counts one handshake of ``source``; False beyond ``handshakes_per_s``."""
        if self._limiter is None or self._rate is None:
            return True
        return self._limiter.hit(self._rate, "ws_handshake", source)

    def healthz_allowed(self, source: str) -> bool:
        """Counts one ``/healthz`` of ``source`` (its own window, not the handshakes');
        False beyond :data:`HEALTHZ_PER_S`."""
        return self._healthz_limiter.hit(self._healthz_rate, "ws_healthz", source)

    def connections_allowed(self, source: str) -> bool:
        """``source``'s open connections (this one included) are within the cap."""
        cap = self.cfg.max_connections_per_source
        return cap <= 0 or self.per_source.get(source, 0) <= cap

    def _warn_unauthenticated(self) -> None:
        missing = self.cfg.missing_credentials()
        if not missing:
            return
        keys = ", ".join(f"{k} ({p} routes)" for k, p in missing)
        if is_loopback(self.cfg.host) and self.cfg.trust_loopback:
            log.info("websocket: no %s: trust_loopback: unauthenticated on loopback %s (a request with an "
                     "Origin header gets 403 unless allowed_origins lets it in)", keys, self.cfg.host)
        elif is_loopback(self.cfg.host):
            log.warning("websocket: no %s: those routes refuse every request (403) until a credential is "
                        "set, or [websocket] trust_loopback = true", keys)
        else:
            log.warning("websocket: allow_unauthenticated: anyone who reaches %s:%d can place calls "
                        "(no %s)", self.cfg.host, self.cfg.port, keys)

    async def start(self) -> tuple[str, int]:
        self.loop = asyncio.get_running_loop()
        self._warn_unauthenticated()
        self.half_open.cap = self.half_open_cap()  # the file limit as it is now, at listener start
        self.acceptor = Acceptor(self.loop, self.admit, self.bad, self.count)
        return await self.acceptor.start(self.cfg.host, self.cfg.port, backlog=512)

    def drain(self) -> None:
        """Nothing to tell anyone: a draining gateway refuses new streams at their admission (1013)."""

    def reload(self, cfg: Any) -> dict[str, str]:
        """Nothing of ``[websocket]`` changes live: it applies at the gateway's next start."""
        return {}

    async def shutdown(self) -> None:
        await self.stop()
        if self.twilio_api is not None:
            await self.twilio_api.aclose()

    async def stop(self) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
        for c in list(self.connections):
            c.close(1001, "going away")
        await asyncio.sleep(0)  # the close frames written, before the transports go
        for c in list(self.connections):
            c._abort()

    def make_session(self, conn: WsConnection, route: WsRoute, req: Request) -> Session:
        """The session of ``route``'s protocol (the transport registry's factory)."""
        self.count(f"ws_connections_{route.protocol}")
        make = self.transports[route.protocol].session
        assert make is not None  # config validation admits only WebSocket transports
        return make(self.host, conn, route)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(WS_FLOOD_COUNTERS, 0)
        out.update(self.counters, **(self.twilio_api.counters if self.twilio_api else {}))
        out["ws_connections_open"] = len(self.connections)
        out["ws_half_open"] = len(self.half_open)
        out["ws_half_open_cap"] = self.half_open.cap
        out["ws_log_suppressed"] = sum(self.bad.suppressed.values()) + sum(SESSION_LOG.suppressed.values())
        return out

