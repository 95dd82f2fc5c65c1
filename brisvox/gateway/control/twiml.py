"""Twilio's incoming-call webhook on the WebSocket listener: ``POST <twiml_path>`` answers TwiML.

Owns :class:`Webhook` (one per WebSocket server, there only when
``[websocket] twiml_path`` is set) and :class:`WebhookRequest`, the plain
HTTP/1.1 POST one connection carries instead of a WebSocket handshake: the
server hands a connection's bytes here when they start with ``POST `` and no
session exists. The answer is the TwiML that connects the call to this
gateway's Twilio route (:func:`render`)::

    <Response><Connect><Stream url="wss://<host><route>[/<agent>]">
      <Parameter name="From" value="..."/><Parameter name="To" value="..."/>
      <Parameter name="brisvox_stream_token" value="<one-time token>"/>
    </Stream></Connect></Response>

The stream URL is ``public_url`` (``https`` -> ``wss``, ``http`` -> ``ws``) or
``wss://<Host>``, then the path of the first ``twilio`` route, then
``/<agent>`` when the query names an agent other than the route's own. The
token is the webhook's :class:`~brisvox.gateway.control.stream_tokens.StreamTokens`'
(held here, redeemed by the Twilio stream's ``start``: :func:`webhook_of`), bound
to the form's CallSid and AccountSid and the agent.

Invariants:

* A request is checked in this order, the first failing check answering
  with a status and a counter (every request counts ``ws_twiml``): the
  head at most :data:`MAX_HEAD` bytes (431 ``ws_refused_twiml_size``), the
  source's rate (``twiml_requests_per_s``, its own moving 1 s window in the
  process's ``limits`` storage, counted for every request, refused or not:
  429 ``ws_refused_rate``), a request line ``POST <path> HTTP/1.x`` and header
  lines ``name: value`` (a token name, no control character, no obs-fold: 400
  ``ws_refused_twiml_form``), none of :data:`SINGLE` repeated and a
  ``Content-Length`` of ASCII digits (400 ``ws_refused_twiml_header``), no
  ``Transfer-Encoding``, a ``Content-Length`` at all and of at most
  :data:`MAX_FORM` bytes (411, 413: ``ws_refused_twiml_size``), Content-Type
  ``application/x-www-form-urlencoded`` (415 ``ws_refused_twiml_type``), the
  path (404 ``ws_refused_path``), the form and, without ``public_url``, the
  ``Host`` (400 ``ws_refused_twiml_form``), the signature (403
  ``ws_refused_twiml_signature``), one CallSid and one AccountSid of letters
  and digits (400 ``ws_refused_twiml_form``), the AccountSid equal to
  ``twilio_account_sid`` when that is set (403 ``ws_refused_twiml_account``),
  the agent (404 ``ws_refused_twiml_agent``: ``agent=`` must be one the Twilio
  route admits), a free slot in the token table (503
  ``ws_refused_twiml_tokens``). An answered one counts ``ws_twiml_ok``. Then
  the connection closes. Every refusal is one line of the server's
  :class:`~brisvox.runtime.log_limit.LogLimiter` (per counter, per minute);
  a request whose reading raised anyway is answered 500 (``ws_twiml_errors``,
  logged the same way), never left unanswered.
* The signature is Twilio's for a POST (:func:`brisvox.gateway.ws.auth.twilio_signed`:
  HMAC-SHA1, keyed with ``twilio_auth_token``, of the webhook URL followed by
  the form's parameters sorted by name, each name then value, base64). The
  URL is ``public_url`` (``wss`` -> ``https``, ``ws`` -> ``http``) or
  ``https://<Host>``, plus the path and query as sent. Without the token
  the webhook is open only on a loopback listener or with
  ``allow_unauthenticated`` (else 403 ``ws_refused_unconfigured``).
* ``POST <twiml_path>/status`` is Twilio's status callback of a call this gateway created
  (:mod:`brisvox.gateway.control.twilio_status`): the same head checks, then the same form,
  Host, signature (of that URL) and AccountSid checks (:meth:`Webhook.verified`), counted
  ``ws_twilio_status`` and refused as ``ws_refused_twilio_status_form``/``_signature``/``_account``;
  then one ``CallStatus`` Twilio defines (else 400 ``ws_refused_twilio_status_form``), recorded
  in :attr:`Webhook.statuses` and answered 200 with no body (``ws_twilio_status_ok``). The
  TwiML fetch of an outbound call records it ``in-progress`` (Twilio fetches ``Url`` at the
  answer) and puts the parameters its dial carried (:meth:`~brisvox.gateway.control.twilio_status.CallStatuses.carry`)
  among the stream's, under the From/To/direction the gateway sets.
* A request that never completes is dropped by the server's handshake timeout.
* Every value placed in the TwiML is XML-escaped; the From/To parameters are
  cut to :data:`MAX_PARAM` characters, a dial's to ``MAX_PARAM_VALUE`` (the dial checked them). A call whose form says ``Direction=outbound-...``
  (one :mod:`brisvox.gateway.control.twilio_dial` placed) also gets ``direction = "outbound"``.
"""

from __future__ import annotations

import hmac
import logging
import re
import traceback
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, parse_qsl, urlsplit
from xml.sax.saxutils import quoteattr

from limits import RateLimitItemPerSecond, strategies
from websockets.datastructures import Headers
from websockets.http11 import Request

from brisvox.gateway.config import AGENT_RE
from brisvox.gateway.control.stream_tokens import Binding, StreamTokens
from brisvox.gateway.control.twilio_rest import SID_RE
from brisvox.gateway.control.twilio_status import CallStatuses, status_path
from brisvox.gateway.rate_limits import process_storage
from brisvox.gateway.ws.auth import Refusal, twilio_signed, unconfigured
from brisvox.wire.jsontext import MAX_PARAM_VALUE
from brisvox.wire.twilio import TOKEN_PARAM

if TYPE_CHECKING:
    from brisvox.gateway.ws.server import WebSocketServer, WsConnection

MAX_HEAD = 8192
MAX_FORM = 16384  # Twilio's voice webhook form is about 1-2 KiB
MAX_PARAM = 128
FORM_TYPE = "application/x-www-form-urlencoded"
PASSED = ("From", "To")  # form fields passed to the stream as <Parameter> (the call's numbers)
# headers a request may carry once (a repeated one is 400: which of two Hosts was signed?)
SINGLE = ("Host", "Content-Type", "Content-Length", "X-Twilio-Signature", "Transfer-Encoding")
_REQUEST_LINE = re.compile(r"POST (/[!-~]*) HTTP/1\.[01]", re.ASCII)
_HEADER_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*", re.ASCII)
_LENGTH = re.compile(r"[0-9]{1,9}", re.ASCII)


def render(stream_url: str, params: dict[str, str], token: str = "") -> bytes:
    """The TwiML answer that connects the call to ``stream_url`` with ``params`` (and the
    stream's one-time ``token`` as the :data:`~brisvox.wire.twilio.TOKEN_PARAM` parameter)."""
    inner = "".join(f"<Parameter name={quoteattr(k)} value={quoteattr(v[:MAX_PARAM_VALUE])}/>"
                    for k, v in params.items())
    if token:
        inner += f"<Parameter name={quoteattr(TOKEN_PARAM)} value={quoteattr(token)}/>"
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
        self.tokens = StreamTokens(server.cfg.twilio_stream_token_ttl_s, server.cfg.twilio_stream_tokens_max)
        self.status_path = status_path(server.cfg.twiml_path)
        self.statuses = CallStatuses(count=server.count)  # the calls created here (twilio_dial)
        per_s = server.cfg.twiml_requests_per_s
        self._rate = RateLimitItemPerSecond(per_s) if per_s > 0 else None
        self._limiter = strategies.MovingWindowRateLimiter(process_storage()) if self._rate else None

    def request(self, conn: WsConnection) -> WebhookRequest:
        return WebhookRequest(self, conn)

    def allowed(self, source: str) -> bool:
        """Counts one request of ``source``; False beyond ``twiml_requests_per_s``."""
        if self._limiter is None or self._rate is None:
            return True
        return self._limiter.hit(self._rate, "ws_twiml", source)

    def refuse(self, conn: WsConnection, status: int, text: str, counter: str,
               headers: dict[str, str] | None = None) -> bytes:
        self.server.count(counter)
        self.server.bad(counter, "twiml webhook from %s refused: %d %s", conn.source, status, text,
                        level=logging.INFO)
        return http_answer(status, f"{text}\n".encode(), headers=headers)

    def failed(self, conn: WsConnection) -> bytes:
        """The answer when reading the request raised (a defect, not bad input): 500, counted
        ``ws_twiml_errors``, logged bounded (one line a minute, with the traceback)."""
        self.server.count("ws_twiml_errors")
        self.server.bad("ws_twiml_error", "twiml webhook from %s failed: %s", conn.source,
                        traceback.format_exc(limit=6).rstrip(), level=logging.ERROR)
        return http_answer(500, b"internal error\n")

    def answer(self, conn: WsConnection, path: str, headers: Headers, form: bytes) -> bytes:
        """The response to a complete request (the checks after the head's)."""
        cfg = self.cfg
        where = path.split("?", 1)[0]
        if where == self.status_path:
            return self.status(conn, path, headers, form)
        if where != self.path:
            return self.refuse(conn, 404, "no such path", "ws_refused_path")
        checked = self.verified(conn, path, headers, form, "twiml")
        if isinstance(checked, bytes):
            return checked
        fields, call_sid, account_sid, host = checked
        agent = parse_qs(urlsplit(path).query).get("agent", [""])[0]
        url = stream_url(cfg, host, agent)
        if url is None:
            return self.refuse(conn, 404, "no such agent", "ws_refused_twiml_agent")
        route_agent = agent or next(r.agent for r in cfg.routes if r.protocol == "twilio")
        token = self.tokens.issue(Binding(call_sid, account_sid, route_agent))
        if token is None:
            return self.refuse(conn, 503, "too many calls waiting for their stream", "ws_refused_twiml_tokens",
                               {"Retry-After": "1"})
        outbound = fields.get("Direction", [""])[0].startswith("outbound")  # a call we placed (twilio_dial)
        params = self.statuses.params(call_sid) if outbound else {}  # the dial's (a campaign row's variables)
        params.update({k: fields[k][0][:MAX_PARAM] for k in PASSED if k in fields})
        if outbound:
            params["direction"] = "outbound"
            self.statuses.record(call_sid, "in-progress")  # Twilio fetches the Url once the callee answered
        self.server.count("ws_twiml_ok")
        return http_answer(200, render(url, params, token), "text/xml")

    def status(self, conn: WsConnection, path: str, headers: Headers, form: bytes) -> bytes:
        """A status callback of a call this gateway created: verified as the call webhook is, then
        recorded (:class:`~brisvox.gateway.control.twilio_status.CallStatuses`); 200 with no body."""
        self.server.count("ws_twilio_status")
        checked = self.verified(conn, path, headers, form, "twilio_status")
        if isinstance(checked, bytes):
            return checked
        fields, call_sid, _account, _host = checked
        statuses = fields.get("CallStatus", [])
        if len(statuses) != 1 or not self.statuses.record(call_sid, statuses[0]):
            return self.refuse(conn, 400, "form without one known CallStatus", "ws_refused_twilio_status_form")
        self.server.count("ws_twilio_status_ok")
        return http_answer(200, b"")

    def verified(self, conn: WsConnection, path: str, headers: Headers, form: bytes,
                 kind: str) -> bytes | tuple[dict[str, list[str]], str, str, str]:
        """The checks both POSTs share (module invariants): ``(fields, CallSid, AccountSid, Host)``
        of a signed form of this account, else the refusal to send (counted ``ws_refused_<kind>_*``)."""
        cfg = self.cfg
        try:
            pairs = parse_qsl(form.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(form),
                              max_num_fields=200)
        except (UnicodeDecodeError, ValueError):
            return self.refuse(conn, 400, "bad form", f"ws_refused_{kind}_form")
        host = headers.get("Host", "")
        if not cfg.public_url and not _plain_host(host):
            return self.refuse(conn, 400, "bad Host", f"ws_refused_{kind}_form")
        if cfg.twilio_auth_token:
            signed = origin(cfg, host, False) + path
            if not twilio_signed(cfg.twilio_auth_token, headers, signed, pairs):
                return self.refuse(conn, 403, "bad X-Twilio-Signature", f"ws_refused_{kind}_signature")
        else:
            verdict = unconfigured(cfg)
            if isinstance(verdict, Refusal):
                return self.refuse(conn, verdict.status, verdict.text.strip(), verdict.counter)
        fields: dict[str, list[str]] = {}
        for k, v in pairs:
            fields.setdefault(k, []).append(v)
        call_sid, account_sid = (_sid(fields, k) for k in ("CallSid", "AccountSid"))
        if call_sid is None or account_sid is None:
            return self.refuse(conn, 400, "form without one valid CallSid and AccountSid", f"ws_refused_{kind}_form")
        if cfg.twilio_account_sid and not hmac.compare_digest(account_sid.encode(), cfg.twilio_account_sid.encode()):
            return self.refuse(conn, 403, "not this gateway's Twilio account", f"ws_refused_{kind}_account")
        return fields, call_sid, account_sid, host


def _sid(fields: dict[str, list[str]], name: str) -> str | None:
    """The form's one ``name``, when it is a Twilio SID (letters and digits); else None."""
    values = fields.get(name, [])
    return values[0] if len(values) == 1 and SID_RE.fullmatch(values[0]) else None


def webhook_of(server: Any) -> Webhook | None:
    """The TwiML webhook of a WebSocket server: its ``webhook`` itself, or the one the
    playground's POST router hands non-playground POSTs to; None without ``twiml_path``."""
    hook = getattr(server, "webhook", None)
    if not isinstance(hook, Webhook):
        hook = getattr(hook, "twiml", None)
    return hook if isinstance(hook, Webhook) else None


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
        try:
            self._feed(data)
        except Exception:  # noqa: BLE001 - a defect answers 500, logged bounded; the listener goes on
            self._send(self.hook.failed(self.conn))

    def _feed(self, data: bytes) -> None:
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end > MAX_HEAD or (end < 0 and len(self.buf) > MAX_HEAD):
                hook, conn = self.hook, self.conn
                self._send(hook.refuse(conn, 429, "too many requests", "ws_refused_rate", {"Retry-After": "1"})
                           if not hook.allowed(conn.source)
                           else hook.refuse(conn, 431, "request head too large", "ws_refused_twiml_size"))
                return
            if end < 0:
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
        lines = raw.decode("latin-1").split("\r\n")
        first = _REQUEST_LINE.fullmatch(lines[0])
        headers = Headers()
        malformed = first is None
        for line in lines[1:]:
            m = _HEADER_LINE.fullmatch(line)
            if m is None:  # no colon, a bad name, a control character, an obs-fold continuation
                malformed = True
                break
            headers[m.group(1)] = m.group(2)
        if not malformed:  # the source (a trusted proxy's X-Forwarded-For) before its rate
            hook.server.resolve_source(conn, Request(first.group(1), headers, "POST"))  # type: ignore[union-attr]
        if not hook.allowed(conn.source):
            return hook.refuse(conn, 429, "too many requests", "ws_refused_rate", {"Retry-After": "1"})
        if malformed:
            return hook.refuse(conn, 400, "malformed request", "ws_refused_twiml_form")
        assert first is not None
        path = first.group(1)
        repeated = next((n for n in SINGLE if len(headers.get_all(n)) > 1), None)
        if repeated is not None:
            return hook.refuse(conn, 400, f"repeated {repeated} header", "ws_refused_twiml_header")
        if "Transfer-Encoding" in headers:
            return hook.refuse(conn, 411, "Content-Length required", "ws_refused_twiml_size")
        lengths = headers.get_all("Content-Length")
        if not lengths:
            return hook.refuse(conn, 411, "Content-Length required", "ws_refused_twiml_size")
        if not _LENGTH.fullmatch(lengths[0]):
            return hook.refuse(conn, 400, "bad Content-Length", "ws_refused_twiml_header")
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
