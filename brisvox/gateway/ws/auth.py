"""Who may open a media stream: the Origin allow-list, the native secret or a signed
token (native and Telnyx routes), and the Twilio and Plivo request signatures.

Owns the handshake checks of the WebSocket server: :func:`origin_refusal`
(every route) and the check each protocol declares in its registry row
(:mod:`brisvox.gateway.transports`, ``Transport.auth``). A protocol check takes
the WebSocket config, the resolved route, the request path and headers, and
returns a :class:`Grant` (let in, with what a signed token fixes) or a
:class:`Refusal` (HTTP status, body, the counter to bump). Also
:func:`mint_token`, the issuer of the native protocol's signed tokens
(``brisvox token``; the format is :mod:`brisvox.wire.native`).

Invariants:

* A check that is not configured (no ``native_secret``, no ``plivo_auth_token``)
  lets everyone in only with ``allow_unauthenticated``, or on a loopback listener
  with ``trust_loopback = true`` (:func:`unconfigured`); else it refuses every
  request (403 ``ws_refused_unconfigured``): loopback is not trusted by default (a
  same-host TLS proxy makes it public). Twilio's check without
  ``twilio_auth_token`` lets everyone in (its one-time stream token is checked at
  ``start``: :mod:`brisvox.gateway.control.stream_tokens`). A configured check never
  lets in a request without its credential.
* A signed token is let in once: after every other check passed its ``jti`` is
  spent (:class:`~brisvox.gateway.ws.spent_tokens.SpentTokens`, one table per
  process: :data:`SPENT`); presented again before it expires it is refused 401
  ``ws_refused_token_replay`` (503 ``ws_refused_token_table`` when
  ``spent_tokens_max`` live ids are held). A token whose lifetime (``exp - iat``,
  or what is left of it, ``exp - now``) exceeds ``max_token_ttl_s`` is refused 401
  ``ws_refused_token_ttl``. A token names its audience: a playground token
  (:data:`PLAYGROUND_AUD`) is refused on every route (401
  ``ws_refused_token_route``); it opens only the playground's own WebSocket.
* A listener with ``playground_only`` refuses every native route (404
  ``ws_refused_playground_only``): it serves the playground alone.
* Secrets, token MACs and signatures are compared in constant time
  (``hmac.compare_digest``); a refusal body never says which part was wrong
  beyond "bad", "expired" or "not for this agent".
* Native: the credential is ``Authorization: Bearer <c>`` or ``?token=<c>``;
  ``c`` is the static ``native_secret`` (server-side clients: any agent the
  route admits) or a signed token for exactly the agent the path names, not
  expired; else 401. Twilio: ``X-Twilio-Signature`` = HMAC-SHA1 of
  ``public_url`` (or ``wss://<Host>``) + path, keyed with the auth token; else 403
  (:func:`twilio_signed`, which the TwiML webhook's POST shares, with its form:
  :mod:`brisvox.gateway.control.twiml`).
  Plivo: ``X-Plivo-Signature-V3`` (or ``-Ma-V3``) is one of the V3 signatures
  of the same URL and ``X-Plivo-Signature-V3-Nonce``, keyed with
  ``plivo_auth_token`` (:func:`brisvox.wire.plivo.signature`); else 403.
  A Plivo route without it is :func:`unconfigured` (first invariant).
  Telnyx does not sign its media WebSocket: the credential is the stream
  token Telnyx sends as ``x-telnyx-streaming-auth-token`` (the Call Control
  ``stream_auth_token``), else ``?token=<c>`` in the ``stream_url``; ``c`` is
  checked as a native one (``native_secret``, or a signed token for the
  route's agent, whose parameters replace the stream's); else 401. A Telnyx
  route without ``native_secret`` is :func:`unconfigured`, as is a native one.
  Vonage signs its webhooks, not its WebSocket (the endpoint's
  ``authorization`` of type ``custom`` sends a value of the application's
  choosing): the credential is the native one, ``Authorization: Bearer <c>``
  or ``?token=<c>`` in the endpoint's ``uri``, checked as a Telnyx token
  (a signed token's parameters replace the connected event's headers);
  without ``native_secret`` the same :func:`unconfigured` rule holds.
  Exotel signs nothing (IP whitelisting or Basic auth in the applet's URL):
  the credential is the password of ``Authorization: Basic`` (what Exotel
  sends for ``wss://user:<c>@host/path``; the user name is free), else
  ``?token=<c>``, checked as a Telnyx token; the header, when sent, is the
  credential; without ``native_secret`` the same :func:`unconfigured` rule holds.
  Asterisk's chan_websocket (:func:`asterisk_ws_auth`) is checked as Exotel is:
  ``websocket_client.conf``'s ``username``/``password`` send ``Authorization: Basic``
  (the password is the credential), else ``?token=<c>`` in its ``uri`` (or the dial
  string's ``v(token=...)``); the same :func:`unconfigured` rule holds.
  FreeSWITCH's mod_audio_stream (:func:`freeswitch_auth`) is checked as Vonage is:
  ``Authorization: Bearer <c>`` (the channel variable ``STREAM_EXTRA_HEADERS``
  adds it) or ``?token=<c>`` in the ``wss-url``; the same :func:`unconfigured` rule holds.
* Origin: a request without an ``Origin`` header (Twilio, server-side
  clients) passes; one with it passes only if ``allowed_origins`` holds
  ``"*"`` or that origin (case-insensitive, without a trailing ``/``); else
  403. A header repeated where one is expected counts as a bad credential.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from brisvox.gateway.config import is_loopback
from brisvox.gateway.ws import spent_tokens
from brisvox.gateway.ws.spent_tokens import SpentTokens
from brisvox.wire import exotel, native, plivo, telnyx, twilio


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    text: str
    counter: str


@dataclass(frozen=True, slots=True)
class Grant:
    """A request let in; ``params`` are the call parameters a signed token fixes (they
    replace the ones the client's ``start`` carries), None when there were none."""

    params: dict[str, str] | None = None


OPEN = Grant()
BAD_TOKEN = Refusal(401, "bad or missing token\n", "ws_refused_auth")
EXPIRED_TOKEN = Refusal(401, "token expired\n", "ws_refused_token_expired")
WRONG_AGENT = Refusal(401, "token not for this agent\n", "ws_refused_token_agent")
BAD_SIGNATURE = Refusal(403, "bad X-Twilio-Signature\n", "ws_refused_signature")
BAD_PLIVO_SIGNATURE = Refusal(403, "bad X-Plivo-Signature-V3\n", "ws_refused_signature")
UNCONFIGURED = Refusal(403, "no credential configured for this route\n", "ws_refused_unconfigured")
BAD_ORIGIN = Refusal(403, "origin not allowed\n", "ws_refused_origin")
REPLAYED_TOKEN = Refusal(401, "token already used\n", "ws_refused_token_replay")
LONG_TOKEN = Refusal(401, "token lifetime too long\n", "ws_refused_token_ttl")
WRONG_ROUTE = Refusal(401, "token not for this route\n", "ws_refused_token_route")
TOKENS_FULL = Refusal(503, "too many live tokens\n", "ws_refused_token_table")
PLAYGROUND_ONLY = Refusal(404, "this listener serves the playground only\n", "ws_refused_playground_only")
MAX_TTL_S = 7 * 86400  # mint_token refuses a longer lifetime
PLAYGROUND_AUD = "playground"  # the audience of the playground's tokens (brisvox/gateway/ws/playground.py)
ROUTES_AUD = ("",)  # the audiences a route lets in: tokens of ``brisvox token`` / mint_token
SPENT = SpentTokens()  # the process's spent token ids (module invariants)


def _one(headers: Mapping[str, str], name: str) -> str | None:
    """The single value of header ``name``: "" when absent, None when repeated."""
    get_all = getattr(headers, "get_all", None)
    if get_all is not None:
        values = get_all(name)
        return "" if not values else values[0] if len(values) == 1 else None
    return headers.get(name, "")


def origin_refusal(cfg: Any, headers: Mapping[str, str]) -> Refusal | None:
    origin = _one(headers, "Origin")
    if origin == "":
        return None
    allowed = cfg.allowed_origins
    if "*" in allowed:
        return None
    if origin is not None:
        want = origin.rstrip("/").lower()
        if any(want == a.rstrip("/").lower() for a in allowed):
            return None
    return BAD_ORIGIN


def _credentials(path: str, headers: Mapping[str, str]) -> list[str] | None:
    auth = _one(headers, "Authorization")
    if auth is None:
        return None
    out = [auth[7:].strip()] if auth.startswith("Bearer ") else []
    out += parse_qs(urlsplit(path).query).get("token", [])[:1]
    return [c for c in out if c]


def native_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    if cfg.playground_only:
        return PLAYGROUND_ONLY
    if not cfg.native_secret:
        return unconfigured(cfg)
    return _secret_or_token(cfg, cfg.native_secret, route, _credentials(path, headers))


def token_auth(cfg: Any, secret: str, route: Any, path: str, headers: Mapping[str, str],
               audiences: tuple[str, ...] = ROUTES_AUD) -> Refusal | Grant:
    """The native credential checked against ``secret`` whatever the config says (the
    playground's key: ``native_secret`` or its own, brisvox/gateway/ws/playground.py), a
    signed token only for one of ``audiences``."""
    return _secret_or_token(cfg, secret, route, _credentials(path, headers), audiences)


def _secret_or_token(cfg: Any, secret: str, route: Any, creds: list[str] | None,
                     audiences: tuple[str, ...] = ROUTES_AUD) -> Refusal | Grant:
    """The first of ``creds`` that is ``secret`` itself or a live signed token for the route's
    agent and one of ``audiences``, within ``max_token_ttl_s``, not spent before (it is now)."""
    if not creds:
        return BAD_TOKEN
    refusal = BAD_TOKEN
    now = time.time()
    for cred in creds:
        if hmac.compare_digest(cred.encode(), secret.encode()):
            return OPEN
        try:
            tok = native.open_token(secret, cred, now)
        except native.TokenError as e:
            if refusal is BAD_TOKEN and e.kind == "expired":
                refusal = EXPIRED_TOKEN
            continue
        if not hmac.compare_digest(tok.agent.encode(), route.agent.encode()):
            refusal = WRONG_AGENT
        elif tok.aud not in audiences:
            refusal = WRONG_ROUTE
        elif max(tok.exp - tok.iat, tok.exp - now) > cfg.max_token_ttl_s:
            refusal = LONG_TOKEN
        else:
            spent = SPENT.spend(tok.jti, tok.exp, now, cfg.spent_tokens_max)
            if spent == spent_tokens.SPENT:
                return Grant(tok.params)
            refusal = REPLAYED_TOKEN if spent == spent_tokens.REPLAYED else TOKENS_FULL
    return refusal


def telnyx_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    if not cfg.native_secret:
        return unconfigured(cfg)
    header = _one(headers, telnyx.AUTH_HEADER)
    if header is None:
        return BAD_TOKEN
    creds = [header] if header else parse_qs(urlsplit(path).query).get("token", [])[:1]
    return _secret_or_token(cfg, cfg.native_secret, route, [c for c in creds if c])


def vonage_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    return _bearer_or_query(cfg, route, path, headers)


def freeswitch_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    return _bearer_or_query(cfg, route, path, headers)


def _bearer_or_query(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    """``Authorization: Bearer`` or ``?token=``, checked as a Telnyx token (module invariants:
    Vonage, FreeSWITCH)."""
    if not cfg.native_secret:
        return unconfigured(cfg)
    return _secret_or_token(cfg, cfg.native_secret, route, _credentials(path, headers))


def exotel_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    return _basic_or_query(cfg, route, path, headers)


def asterisk_ws_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    return _basic_or_query(cfg, route, path, headers)


def _basic_or_query(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    """The password of ``Authorization: Basic`` (the header, when sent, is the credential),
    else ``?token=``, checked as a Telnyx token (module invariants: Exotel, Asterisk)."""
    if not cfg.native_secret:
        return unconfigured(cfg)
    header = _one(headers, "Authorization")
    if header is None:
        return BAD_TOKEN
    creds = [exotel.basic_password(header)] if header else parse_qs(urlsplit(path).query).get("token", [])[:1]
    return _secret_or_token(cfg, cfg.native_secret, route, [c for c in creds if c])


def twilio_signed(token: str, headers: Mapping[str, str], url: str,
                  params: Iterable[tuple[str, str]] = ()) -> bool:
    """``X-Twilio-Signature`` (one, non-empty) is Twilio's signature of ``url`` and the
    POST ``params`` (none for the WebSocket's GET), keyed with ``token``."""
    sig = _one(headers, "X-Twilio-Signature")
    if not sig:
        return False
    expect = twilio.signature(token, url, list(params))
    return hmac.compare_digest(sig.encode(), expect.encode())


def twilio_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    if not cfg.twilio_auth_token:
        return OPEN
    base = cfg.public_url or f"wss://{_one(headers, 'Host') or ''}"
    return OPEN if twilio_signed(cfg.twilio_auth_token, headers, base + path) else BAD_SIGNATURE


def unconfigured(cfg: Any) -> Refusal | Grant:
    """The check of a route whose credential is not configured: open on a loopback listener
    with ``trust_loopback``, or with ``allow_unauthenticated``, else every request refused."""
    trusted = cfg.trust_loopback and is_loopback(cfg.host)
    return OPEN if trusted or cfg.allow_unauthenticated else UNCONFIGURED


def plivo_auth(cfg: Any, route: Any, path: str, headers: Mapping[str, str]) -> Refusal | Grant:
    token = cfg.plivo_auth_token
    if not token:
        return unconfigured(cfg)
    nonce = _one(headers, "X-Plivo-Signature-V3-Nonce")
    sigs = [_one(headers, "X-Plivo-Signature-V3"), _one(headers, "X-Plivo-Signature-Ma-V3")]
    if not nonce or None in sigs or not any(sigs):
        return BAD_PLIVO_SIGNATURE
    url = (cfg.public_url or f"wss://{_one(headers, 'Host') or ''}") + path
    ok = any(plivo.signature_matches(token, url, nonce, s) for s in sigs if s)
    return OPEN if ok else BAD_PLIVO_SIGNATURE


def mint_token(secret: str, agent: str, ttl_s: float = 300.0, params: dict[str, str] | None = None,
               now: float | None = None, aud: str = "") -> str:
    """A signed single-use token for the native route serving ``agent`` (``aud`` "": the routes;
    :data:`PLAYGROUND_AUD`: the playground only), valid ``ttl_s`` seconds from ``now``
    (default: the wall clock), with a random ``jti``. Raises ValueError without a secret or a
    sane TTL (a gateway lets in at most its ``max_token_ttl_s``)."""
    if not secret:
        raise ValueError("no native_secret: set [websocket] native_secret to issue tokens")
    if not 0 < ttl_s <= MAX_TTL_S:
        raise ValueError(f"ttl must be within 0..{MAX_TTL_S} s, got {ttl_s}")
    t = time.time() if now is None else now
    return native.sign_token(secret, agent, int(t + ttl_s), params, iat=int(t), aud=aud)
