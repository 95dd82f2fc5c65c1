"""The browser playground on the WebSocket listener: a page to talk to an agent.

Owns :class:`Playground` (one per WebSocket server, there only when
:func:`enabled`: ``[websocket] playground``, unset = on only when the listener is
on a loopback address) and the HTTP requests under :data:`PREFIX`:

* ``GET /playground`` (and its ``app.js``, ``worklet.js``, ``style.css``): the page,
  static files of ``brisvox/gateway/ws/playground_page/`` (package data, read once);
* ``GET /playground/agents``: ``{"agents": [...], "rate", "ttl_s"}``, the agents a native
  route serves (its ``agent`` and ``agents``), the only ones the page can reach;
* ``POST /playground/token?agent=NAME``: ``{"token", "path", "ttl_s"}``, a signed native
  token (:func:`brisvox.gateway.ws.auth.mint_token`) for that agent and the playground only
  (audience :data:`~brisvox.gateway.ws.auth.PLAYGROUND_AUD`: every route refuses it),
  :data:`TTL_S` seconds (at most ``max_token_ttl_s``), single-use; only for
  ``Authorization: Bearer <native_secret>`` (the page asks the operator for it), on a
  ``playground_only`` listener, or on a loopback one with ``trust_loopback = true``; else
  401: loading the page is not enough to call;
* the WebSocket upgrade of ``/playground/ws/<agent>?token=...``: the native protocol
  (:class:`~brisvox.gateway.carriers.native.NativeSession`, the page asks ``"events": true``).

The key of the tokens is ``native_secret``, or, without one, a random key of this
process (never written anywhere), so a playground call always needs a token the page
got from this process (a token of ``brisvox token`` works too when the secret is set).

Invariants:

* Every request under :data:`PREFIX` passes the listener's per-source handshake and
  connection limits first (the server checks them before it asks here).
* Same origin only: a request under :data:`PREFIX` whose ``Host`` is not a loopback name
  while the listener is on loopback is refused (403 ``ws_refused_playground_host``: a
  DNS-rebinding page cannot reach it). The token POST and the WebSocket upgrade need an
  ``Origin`` that is the page's own (``http(s)://<Host>``) or an exact ``allowed_origins``
  entry (``"*"`` does not count here); else 403 ``ws_refused_origin``. The upgrade without
  ``Origin`` (a server-side client) still needs the token.
* The upgrade needs a live, unspent token for exactly the agent of its path (a
  playground token or one of ``brisvox token``; or the static ``native_secret``), else
  401 (``ws_refused_auth``, ``ws_refused_token_expired``, ``ws_refused_token_agent``,
  ``ws_refused_token_replay``, ``ws_refused_token_ttl``: the native route's checks,
  :func:`ws_auth.token_auth`); an
  agent no native route serves is 404 (``ws_refused_agent``, as is minting for it).
* A POST elsewhere goes to Twilio's webhook when ``twiml_path`` is set, else it is
  refused 400 ``ws_refused_handshake`` as the websockets library refuses it.
* A POST's head is at most :data:`MAX_HEAD` bytes and its body at most :data:`MAX_BODY`
  (read and ignored: the agent is in the query), else 431/413 and the connection closes;
  every answer closes the connection (``Connection: close``); counted ``ws_playground_<what>``.
"""

from __future__ import annotations

import functools
import hmac
import logging
import secrets
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Request, parse_headers, parse_line
from websockets.streams import StreamReader

from brisvox.gateway.config import AGENT_RE, WsRoute, is_loopback
from brisvox.gateway.control.twiml import http_answer
from brisvox.gateway.ws.auth import BAD_ORIGIN, PLAYGROUND_AUD, Refusal, mint_token, token_auth

if TYPE_CHECKING:
    from brisvox.gateway.ws.server import WebSocketServer, WsConnection

log = logging.getLogger("brisvox.gateway.ws.playground")

PREFIX = "/playground"
WS_PREFIX = f"{PREFIX}/ws/"
TTL_S = 60
RATE = 16000  # the rate the page's worklets speak (the browser resamples the microphone to it)
MAX_HEAD = 8192
MAX_BODY = 1024
PAGE_DIR = Path(__file__).with_name("playground_page")
FILES = {"": ("index.html", "text/html; charset=utf-8"), "/": ("index.html", "text/html; charset=utf-8"),
         "/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/worklet.js": ("worklet.js", "text/javascript; charset=utf-8"),
         "/style.css": ("style.css", "text/css; charset=utf-8")}
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
           "Content-Security-Policy": "default-src 'self'; connect-src 'self' ws: wss:; "
                                      "frame-ancestors 'none'"}
BAD_HOST = Refusal(403, "host not allowed\n", "ws_refused_playground_host")
NO_AGENT = Refusal(404, "no such agent\n", "ws_refused_agent")


def enabled(cfg: Any) -> bool:
    """``[websocket] playground``, or unset: on exactly when the listener is on loopback (or
    ``playground_only``)."""
    if cfg.playground is None:
        return bool(cfg.enabled) and (cfg.playground_only or is_loopback(cfg.host))
    return bool(cfg.enabled) and cfg.playground


def native_agents(cfg: Any) -> list[str]:
    """The agents a native route serves (its ``agent``, then its ``agents``), in order, once each."""
    names: dict[str, None] = {}
    for r in cfg.routes:
        if r.protocol == "native":
            names.update(dict.fromkeys((r.agent, *r.agents)))
    return list(names)


def owns(path: str) -> bool:
    p = path.split("?", 1)[0]
    return p == PREFIX or p.startswith(PREFIX + "/")


def _host_name(host: str) -> str:
    """``Host`` without its port (an IPv6 literal without its brackets)."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def response(status: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> bytes:
    """A whole HTTP/1.1 answer with the page's headers; it closes the connection."""
    return http_answer(status, body, ctype, HEADERS)


class Playground:
    """The playground of one WebSocket server (see the module docstring)."""

    def __init__(self, server: WebSocketServer) -> None:
        self.server = server
        self.cfg = server.cfg
        self.key = self.cfg.native_secret or secrets.token_urlsafe(32)  # per process without a secret
        self.agents = native_agents(self.cfg)
        self.ttl_s = int(min(TTL_S, self.cfg.max_token_ttl_s))  # the gateway lets in no longer lifetime
        self._files: dict[str, bytes] = {}

    # -- checks ---------------------------------------------------------------------------
    def host_refusal(self, headers: Headers) -> Refusal | None:
        hosts = headers.get_all("Host")
        if len(hosts) != 1:
            return BAD_HOST
        if is_loopback(self.cfg.host) and not is_loopback(_host_name(hosts[0].strip().lower())):
            return BAD_HOST
        return None

    def origin_refusal(self, headers: Headers, required: bool) -> Refusal | None:
        """Same origin (``http(s)://<Host>``) or an exact ``allowed_origins`` entry."""
        origins = headers.get_all("Origin")
        if not origins:
            return BAD_ORIGIN if required else None
        if len(origins) > 1:
            return BAD_ORIGIN
        origin = origins[0].strip().rstrip("/").lower()
        host = headers.get("Host", "").strip().lower()
        own = {f"http://{host}", f"https://{host}"}
        if self.cfg.public_url:
            scheme, rest = self.cfg.public_url.lower().split("://", 1)
            own.add(f"{'https' if scheme in ('https', 'wss') else 'http'}://{rest}")
        listed = {a.rstrip("/").lower() for a in self.cfg.allowed_origins if a != "*"}
        return None if origin in own or origin in listed else BAD_ORIGIN

    # -- GET and the upgrade (the server's handshake path) ------------------------------------
    def handshake(self, conn: WsConnection, req: Request) -> None:
        """Answer a GET under :data:`PREFIX`: a file, the agents, or the WebSocket route."""
        self.server.count("ws_playground_requests")
        path = req.path.split("?", 1)[0]
        refusal = self.host_refusal(req.headers)
        if refusal is None and path.startswith(WS_PREFIX):
            self._upgrade(conn, req, path[len(WS_PREFIX):])
            return
        if refusal is not None:
            conn.reject(refusal.status, refusal.text, refusal.counter)
            return
        if path == f"{PREFIX}/agents":
            body = orjson.dumps({"agents": self.agents, "rate": RATE, "ttl_s": self.ttl_s})
            self._send(conn, 200, body, "application/json")
            return
        file = FILES.get(path[len(PREFIX):])
        if file is None:
            conn.reject(404, "no such path\n", "ws_refused_path")
            return
        self._send(conn, 200, self._file(file[0]), file[1])

    def _upgrade(self, conn: WsConnection, req: Request, agent: str) -> None:
        refusal = self.origin_refusal(req.headers, required=False)
        if refusal is None and not (AGENT_RE.match(agent) and agent in self.agents):
            refusal = NO_AGENT
        route = WsRoute(f"{WS_PREFIX}{agent}", "native", agent)
        if refusal is None:
            verdict = token_auth(self.cfg, self.key, route, req.path, req.headers, (PLAYGROUND_AUD, ""))
            if isinstance(verdict, Refusal):
                refusal = verdict
            else:
                conn.grant = verdict
        if refusal is not None:
            conn.reject(refusal.status, refusal.text, refusal.counter)
            return
        self.server.count("ws_playground_calls")
        conn.accept(req, route)

    def _file(self, name: str) -> bytes:
        body = self._files.get(name)
        if body is None:
            body = self._files[name] = (PAGE_DIR / name).read_bytes()
        return body

    def _send(self, conn: WsConnection, status: int, body: bytes, ctype: str) -> None:
        resp = conn.proto.reject(status, "")
        for k, v in {"Content-Type": ctype, "Content-Length": str(len(body)), **HEADERS}.items():
            if k in resp.headers:  # a Headers value is a list: replace it, do not add one
                del resp.headers[k]
            resp.headers[k] = v
        resp.body = body
        conn.answer(resp)

    # -- POST /playground/token -------------------------------------------------------------
    def token(self, conn: WsConnection, path: str, headers: Headers) -> bytes:
        """The answer to a complete POST under :data:`PREFIX` (its head read, body ignored)."""
        server = self.server
        server.count("ws_playground_requests")
        server.resolve_source(conn, Request(path, headers))
        if not server.handshake_allowed(conn.source):
            return self._refuse(conn, Refusal(429, "too many requests\n", "ws_refused_rate"))
        if path.split("?", 1)[0] != f"{PREFIX}/token":
            return self._refuse(conn, Refusal(404, "no such path\n", "ws_refused_path"))
        refusal = self.host_refusal(headers) or self.origin_refusal(headers, required=True)
        if refusal is not None:
            return self._refuse(conn, refusal)
        if not self.may_mint(headers):
            return self._refuse(conn, Refusal(401, "the operator's credential is needed\n", "ws_refused_auth"))
        agent = parse_qs(urlsplit(path).query).get("agent", [""])[0]
        if agent not in self.agents:
            return self._refuse(conn, NO_AGENT)
        server.count("ws_playground_tokens")
        token = mint_token(self.key, agent, self.ttl_s, aud=PLAYGROUND_AUD)
        body = {"token": token, "path": f"{WS_PREFIX}{agent}", "ttl_s": self.ttl_s}
        return response(200, orjson.dumps(body), "application/json")

    def may_mint(self, headers: Headers) -> bool:
        """Who gets a token: the holder of ``native_secret`` (:meth:`operator`), anyone on a
        ``playground_only`` listener or on a loopback one with ``trust_loopback``."""
        cfg = self.cfg
        return self.operator(headers) or cfg.playground_only or (cfg.trust_loopback and is_loopback(cfg.host))

    def operator(self, headers: Headers) -> bool:
        """``Authorization: Bearer <native_secret>``: who may mint on a listener others can reach."""
        got = headers.get_all("Authorization")
        if len(got) != 1 or not got[0].startswith("Bearer ") or not self.cfg.native_secret:
            return False
        return hmac.compare_digest(got[0][7:].strip().encode(), self.cfg.native_secret.encode())

    def _refuse(self, conn: WsConnection, r: Refusal) -> bytes:
        self.server.count(r.counter)
        self.server.bad(r.counter, "playground request from %s refused: %d %s", conn.source, r.status,
                        r.text.strip(), level=logging.INFO)
        return response(r.status, r.text.encode())


def _head(read_line: Any) -> Generator[None, None, tuple[str, Headers]]:
    line = yield from parse_line(read_line)
    _method, path, _proto = bytes(line).split(b" ", 2)
    headers = yield from parse_headers(read_line)
    return path.decode("ascii", "surrogateescape"), headers


def parse_head(raw: bytes) -> tuple[str, Headers]:
    """``(path, headers)`` of a request head ending in a blank line (the websockets
    library's own parsers); raises ValueError when it is not one."""
    reader = StreamReader()
    reader.feed_data(raw)
    reader.feed_eof()
    gen = _head(functools.partial(reader.read_line))
    try:
        next(gen)
    except StopIteration as done:
        out: tuple[str, Headers] = done.value
        return out
    except Exception as e:  # noqa: BLE001 - anything the parsers raise is a bad request
        raise ValueError(f"{type(e).__name__}: {e}") from None
    raise ValueError("incomplete request head")


class PostRouter:
    """The server's POST handler (``WebSocketServer.webhook``): a POST under :data:`PREFIX`
    goes to the playground, any other to Twilio's webhook (``twiml``, when configured)."""

    def __init__(self, playground: Playground, twiml: Any) -> None:
        self.playground = playground
        self.twiml = twiml

    def request(self, conn: WsConnection) -> PostRequest:
        return PostRequest(self, conn)


class PostRequest:
    """One POST being read (module invariants); the first line decides who reads it."""

    def __init__(self, router: PostRouter, conn: WsConnection) -> None:
        self.router = router
        self.conn = conn
        self.buf = bytearray()
        self.inner: Any = None  # the TwiML webhook's request, once the path says so
        self.head: tuple[str, Headers, int] | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.feed(data)
            return
        if self.done:
            return
        self.buf += data
        if self.head is None and not self._route():
            return
        if self.head is not None and len(self.buf) >= self.head[2]:
            path, headers, _ = self.head
            self._send(self.router.playground.token(self.conn, path, headers))

    def _route(self) -> bool:
        """True once the head is read here; hands a non-playground POST on."""
        pg = self.router.playground
        first = self.buf.find(b"\r\n")
        if first < 0 and len(self.buf) <= MAX_HEAD:
            return False
        parts = bytes(self.buf[:max(first, 0)]).split(b" ")
        path = parts[1].decode("latin-1") if len(parts) == 3 else ""
        if first >= 0 and not owns(path):
            if self.router.twiml is not None:
                self.inner = self.router.twiml.request(self.conn)
                self.inner.feed(bytes(self.buf))
            else:  # as the websockets library answers a POST: not a handshake
                self._send(pg._refuse(self.conn, Refusal(400, "not a WebSocket handshake\n", "ws_refused_handshake")))
            return False
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or end > MAX_HEAD:
            if end > MAX_HEAD or len(self.buf) > MAX_HEAD:
                self._send(pg._refuse(self.conn, Refusal(431, "request head too large\n", "ws_playground_size")))
            return False
        try:
            path, headers = parse_head(bytes(self.buf[:end + 4]))
            lengths = headers.get_all("Content-Length")
            length = int(lengths[0]) if lengths else 0
            if len(lengths) > 1 or "Transfer-Encoding" in headers or not 0 <= length <= MAX_BODY:
                raise OverflowError
        except ValueError:
            self._send(pg._refuse(self.conn, Refusal(400, "malformed request\n", "ws_playground_malformed")))
            return False
        except OverflowError:
            self._send(pg._refuse(self.conn, Refusal(413, "body too large\n", "ws_playground_size")))
            return False
        del self.buf[:end + 4]
        self.head = (path, headers, length)
        return True

    def _send(self, answer: bytes) -> None:
        self.done = True
        t = self.conn.transport
        if t is not None and not t.is_closing():
            t.write(answer)
            t.close()
