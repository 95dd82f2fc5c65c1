"""Twilio's incoming-call webhook on the WebSocket listener: ``POST <twiml_path>`` answers TwiML.

Owns :class:`Webhook` (one per WebSocket server, there only when
``[websocket] twiml_path`` is set) and :class:`WebhookRequest`, the plain
HTTP/1.1 POST one connection carries instead of a WebSocket handshake: the
server hands a connection's bytes here when they start with ``POST `` and no
session exists. The answer is the TwiML that connects the call to this
gateway's Twilio route (:func:`render`)::

    <Response><Connect><Stream url="wss://<host><route>[/<agent>]">
      <Parameter name="From" value="..."/><Parameter name="To" value="..."/>
    </Stream></Connect></Response>

The stream URL is ``public_url`` (``https`` -> ``wss``, ``http`` -> ``ws``) or
``wss://<Host>``, then the path of the first ``twilio`` route, then
``/<agent>`` when the query names an agent other than the route's own.

Invariants:

* A request is checked in this order, the first failing check answering
  with a status and a counter (every request counts ``ws_twiml``): the
  head at most :data:`MAX_HEAD` bytes (431), no ``Transfer-Encoding``, a
  ``Content-Length`` of at most :data:`MAX_FORM` bytes (411, 413:
  ``ws_refused_twiml_size``), Content-Type ``application/x-www-form-urlencoded``
  (415 ``ws_refused_twiml_type``), the source's handshake rate (429
  ``ws_refused_rate``, the same window as the handshakes), the path (404
  ``ws_refused_path``), the form and, without ``public_url``, the ``Host``
  (400 ``ws_refused_twiml_form``), the
  signature (403 ``ws_refused_twiml_signature``), the agent (404
  ``ws_refused_twiml_agent``: ``agent=`` must be one the Twilio route
  admits). An answered one counts ``ws_twiml_ok``. Then the connection closes.
* The signature is Twilio's for a POST (:func:`brisvox.gateway.ws.auth.twilio_signed`:
  HMAC-SHA1, keyed with ``twilio_auth_token``, of the webhook URL followed by
  the form's parameters sorted by name, each name then value, base64). The
  URL is ``public_url`` (``wss`` -> ``https``, ``ws`` -> ``http``) or
  ``https://<Host>``, plus the path and query as sent. Without the token
  the webhook is open only on a loopback listener or with
  ``allow_unauthenticated`` (else 403 ``ws_refused_unconfigured``).
* A request that never completes is dropped by the server's handshake timeout.
* Every value placed in the TwiML is XML-escaped; the From/To parameters are
  cut to :data:`MAX_PARAM` characters. A call whose form says ``Direction=outbound-...``
  (one :mod:`brisvox.gateway.control.twilio_dial` placed) also gets ``direction = "outbound"``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, parse_qsl, urlsplit
from xml.sax.saxutils import quoteattr

from websockets.datastructures import Headers
from websockets.http11 import Request

from brisvox.gateway.config import AGENT_RE
from brisvox.gateway.ws.auth import Refusal, twilio_signed, unconfigured

if TYPE_CHECKING:
    from brisvox.gateway.ws.server import WebSocketServer, WsConnection

MAX_HEAD = 8192
MAX_FORM = 16384  # Twilio's voice webhook form is about 1-2 KiB
MAX_PARAM = 128
FORM_TYPE = "application/x-www-form-urlencoded"
PASSED = ("From", "To")  # form fields passed to the stream as <Parameter> (the call's numbers)


def render(stream_url: str, params: dict[str, str]) -> bytes:
    """The TwiML answer that connects the call to ``stream_url`` with ``params``."""
    inner = "".join(f"<Parameter name={quoteattr(k)} value={quoteattr(v[:MAX_PARAM])}/>"
                    for k, v in params.items())
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url={quoteattr(stream_url)}>'
            f"{inner}</Stream></Connect></Response>").encode()


def origin(cfg: Any, host: str, websocket: bool) -> str:
    """``scheme://host`` of the stream (``websocket``) or of the webhook itself."""
    base = cfg.public_url or f"wss://{host}"
    scheme, rest = base.split("://", 1)
    secure = scheme in ("https", "wss")
    return f"{('wss' if secure else 'ws') if websocket else ('https' if secure else 'http')}://{rest}"


def stream_url(cfg: Any, host: str, agent: str) -> str | None:
    """The Twilio route's URL for ``agent`` ("" : the route's own); None if no route admits it."""
    route = next((r for r in cfg.routes if r.protocol == "twilio"), None)
    if route is None or (agent and not (AGENT_RE.match(agent) and route.admits(agent))):
        return None
    path = route.path if not agent or agent == route.agent else f"{route.path.rstrip('/')}/{agent}"
    return origin(cfg, host, True) + path


def http_answer(status: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
                headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer to a POST read off the WebSocket listener; it closes the connection."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode() + body


class Webhook:
    """The webhook of one WebSocket server (see the module docstring)."""

    def __init__(self, server: WebSocketServer) -> None:
        self.server = server
        self.cfg = server.cfg
        self.path = server.cfg.twiml_path

    def request(self, conn: WsConnection) -> WebhookRequest:
        return WebhookRequest(self, conn)

    def refuse(self, conn: WsConnection, status: int, text: str, counter: str) -> bytes:
        self.server.count(counter)
        self.server.bad(counter, "twiml webhook from %s refused: %d %s", conn.source, status, text,
                        level=logging.INFO)
        return http_answer(status, f"{text}\n".encode())

    def answer(self, conn: WsConnection, path: str, headers: Headers, form: bytes) -> bytes:
        """The response to a complete request (the checks after the size and type)."""
        server, cfg = self.server, self.cfg
        server.resolve_source(conn, Request(path, headers, "POST"))
        if not server.handshake_allowed(conn.source):
            return self.refuse(conn, 429, "too many requests", "ws_refused_rate")
        if path.split("?", 1)[0] != self.path:
            return self.refuse(conn, 404, "no such path", "ws_refused_path")
        try:
            pairs = parse_qsl(form.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(form),
                              max_num_fields=200)
        except (UnicodeDecodeError, ValueError):
            return self.refuse(conn, 400, "bad form", "ws_refused_twiml_form")
        host = headers.get("Host", "")
        if not cfg.public_url and not _plain_host(host):
            return self.refuse(conn, 400, "bad Host", "ws_refused_twiml_form")
        if cfg.twilio_auth_token:
            signed = origin(cfg, host, False) + path
            if not twilio_signed(cfg.twilio_auth_token, headers, signed, pairs):
                return self.refuse(conn, 403, "bad X-Twilio-Signature", "ws_refused_twiml_signature")
        else:
            verdict = unconfigured(cfg)
            if isinstance(verdict, Refusal):
                return self.refuse(conn, verdict.status, verdict.text.strip(), verdict.counter)
        agent = parse_qs(urlsplit(path).query).get("agent", [""])[0]
        url = stream_url(cfg, host, agent)
        if url is None:
            return self.refuse(conn, 404, "no such agent", "ws_refused_twiml_agent")
        form_dict = dict(pairs)
        params = {k: form_dict[k] for k in PASSED if k in form_dict}
        if form_dict.get("Direction", "").startswith("outbound"):  # a call we placed (twilio_dial)
            params["direction"] = "outbound"
        server.count("ws_twiml_ok")
        return http_answer(200, render(url, params), "text/xml")


def _plain_host(host: str) -> bool:
    return bool(host) and len(host) <= 255 and all(c.isalnum() or c in ".-:[]" for c in host)


class WebhookRequest:
    """One POST being read from one connection (module invariants)."""

    def __init__(self, hook: Webhook, conn: WsConnection) -> None:
        self.hook = hook
        self.conn = conn
        self.buf = bytearray()
        self.head: tuple[str, Headers, int] | None = None  # path, headers, Content-Length
        self.done = False
        hook.server.count("ws_twiml")

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    self._send(self.hook.refuse(self.conn, 431, "request head too large", "ws_refused_twiml_size"))
                return
            if end > MAX_HEAD:
                self._send(self.hook.refuse(self.conn, 431, "request head too large", "ws_refused_twiml_size"))
                return
            refused = self._head(bytes(self.buf[:end]))
            del self.buf[:end + 4]
            if refused is not None:
                self._send(refused)
                return
        assert self.head is not None
        path, headers, length = self.head
        if len(self.buf) >= length:
            self._send(self.hook.answer(self.conn, path, headers, bytes(self.buf[:length])))

    def _head(self, raw: bytes) -> bytes | None:
        """Parse the request line and headers; the refusal to send, or None."""
        hook, conn = self.hook, self.conn
        try:
            lines = raw.decode("latin-1").split("\r\n")
            _, path, _ = lines[0].split(" ", 2)
            headers = Headers()
            for line in lines[1:]:
                name, value = line.split(":", 1)
                headers[name.strip()] = value.strip()
        except ValueError:
            return hook.refuse(conn, 400, "malformed request", "ws_refused_twiml_form")
        if "Transfer-Encoding" in headers:
            return hook.refuse(conn, 411, "Content-Length required", "ws_refused_twiml_size")
        lengths = headers.get_all("Content-Length")
        if len(set(lengths)) != 1 or not lengths[0].isdigit():
            return hook.refuse(conn, 411, "Content-Length required", "ws_refused_twiml_size")
        length = int(lengths[0])
        if length > MAX_FORM:
            return hook.refuse(conn, 413, "form too large", "ws_refused_twiml_size")
        ctype = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if ctype != FORM_TYPE:
            return hook.refuse(conn, 415, f"Content-Type must be {FORM_TYPE}", "ws_refused_twiml_type")
        self.head = (path, headers, length)
        return None

    def _send(self, response: bytes) -> None:
        self.done = True
        t = self.conn.transport
        if t is not None and not t.is_closing():
            t.write(response)
            t.close()
