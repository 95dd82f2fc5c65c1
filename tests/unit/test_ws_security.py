"""The WebSocket server's admission rules, pure: config validation, Origin, tokens, agent lists.

* a non-loopback listener without the credential of a routed protocol is a
  config error naming the key; ``allow_unauthenticated`` lets it start;
* ``route()`` marks an agent a route does not list as not allowed (the
  route's own agent always is);
* ``origin_refusal``: no Origin passes, a listed one passes, another is 403;
* native auth: the static secret, a valid token for the path's agent, and
  nothing else (expired, another agent, a bad MAC, garbage: 401);
* the Twilio signature: missing and bad are 403, the right one passes;
* ``close_reason`` cuts to 123 bytes of UTF-8 at a character boundary.
"""

from __future__ import annotations

import time

import pytest
from websockets.datastructures import Headers

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import WebSocketConfig, WsRoute, is_loopback
from brisvox.gateway.ws import auth as ws_auth
from brisvox.wire import native, twilio, ws_framing

ROUTES = [{"path": "/ws", "protocol": "native", "agent": "default", "agents": ["sales"]}]


def cfg(**kw) -> WebSocketConfig:
    return WebSocketConfig.from_section(kw)


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("", False), ("10.0.0.5", False), ("gw.example", False)])
def test_loopback(host, loop):
    assert is_loopback(host) is loop


def test_a_public_listener_needs_every_routed_credential():
    with pytest.raises(ConfigError, match=r"websocket\.native_secret.*0\.0\.0\.0"):
        cfg(host="0.0.0.0", twilio_auth_token="t")
    with pytest.raises(ConfigError, match=r"websocket\.twilio_auth_token"):
        cfg(host="0.0.0.0", native_secret="s")
    assert cfg(host="0.0.0.0", native_secret="s", twilio_auth_token="t").host == "0.0.0.0"
    # only the protocols it routes: a native-only listener needs no Twilio token
    assert cfg(host="0.0.0.0", native_secret="s", routes=ROUTES).routes[0].protocol == "native"
    assert cfg(host="0.0.0.0", allow_unauthenticated=True).allow_unauthenticated
    assert cfg(host="0.0.0.0", enabled=False).host == "0.0.0.0"
    assert cfg().missing_credentials() == [("native_secret", "native"), ("twilio_auth_token", "twilio")]


@pytest.mark.parametrize(("table", "key"), [
    ({"handshakes_per_s": -1}, "websocket.handshakes_per_s"),
    ({"max_connections_per_source": -5}, "websocket.max_connections_per_source"),
    ({"allowed_origins": ["example.com"]}, "websocket.allowed_origins[0]"),
    ({"routes": [{"path": "/ws", "protocol": "native", "agents": ["../etc"]}]}, "websocket.routes[0].agents[0]"),
    ({"routes": [{"path": "/ws", "protocol": "native", "agents": "sales"}]}, "websocket.routes[0].agents"),
])
def test_bad_values_name_their_key(table, key):
    with pytest.raises(ConfigError) as e:
        WebSocketConfig.from_section(table)
    assert e.value.key == key


def test_a_route_admits_its_own_agent_and_its_list_only():
    c = cfg(routes=ROUTES)
    assert c.route("/ws").agent == "default" and c.route("/ws").allowed
    assert c.route("/ws/default").allowed and c.route("/ws/sales").allowed
    other = c.route("/ws/secret_agent?x=1")
    assert other is not None and other.agent == "secret_agent" and not other.allowed
    assert c.route("/nowhere") is None
    # the default routes: nothing by name but their own agent
    assert not cfg().route("/ws/echo").allowed and cfg().route("/twilio/default").allowed


def test_origin_allow_list():
    assert ws_auth.origin_refusal(cfg(), Headers()) is None  # Twilio, server-side clients
    assert ws_auth.origin_refusal(cfg(), Headers({"Origin": "https://evil.example"})) is ws_auth.BAD_ORIGIN
    c = cfg(allowed_origins=["https://app.example.com"])
    assert ws_auth.origin_refusal(c, Headers({"Origin": "https://APP.example.com/"})) is None
    assert ws_auth.origin_refusal(c, Headers({"Origin": "http://app.example.com"})) is ws_auth.BAD_ORIGIN
    assert ws_auth.origin_refusal(cfg(allowed_origins=["*"]), Headers({"Origin": "null"})) is None
    two = Headers([("Origin", "https://app.example.com"), ("Origin", "https://evil.example")])
    assert ws_auth.origin_refusal(c, two) is ws_auth.BAD_ORIGIN


def test_native_auth_static_secret_and_tokens():
    c = cfg(native_secret="s3cret", routes=ROUTES)
    sales, default = c.route("/ws/sales"), c.route("/ws")

    def check(route: WsRoute, path: str, **headers: str) -> ws_auth.Refusal | ws_auth.Grant:
        return ws_auth.native_auth(c, route, path, Headers(headers))

    assert check(sales, "/ws/sales") is ws_auth.BAD_TOKEN
    assert check(sales, "/ws/sales?token=s3cret") is ws_auth.OPEN
    assert check(sales, "/ws/sales", Authorization="Bearer s3cret") is ws_auth.OPEN
    good = ws_auth.mint_token("s3cret", "sales", 60, {"lang": "fr"})
    grant = check(sales, f"/ws/sales?token={good}")
    assert isinstance(grant, ws_auth.Grant) and grant.params == {"lang": "fr"}
    assert check(sales, "/ws/sales", Authorization=f"Bearer {good}") is ws_auth.REPLAYED_TOKEN  # single-use
    again = ws_auth.mint_token("s3cret", "sales", 60, {"lang": "fr"})
    assert check(sales, "/ws/sales", Authorization=f"Bearer {again}") == grant
    assert check(default, f"/ws?token={ws_auth.mint_token('s3cret', 'sales', 60)}") is ws_auth.WRONG_AGENT
    long = ws_auth.mint_token("s3cret", "sales", c.max_token_ttl_s + 60)
    assert check(sales, f"/ws/sales?token={long}") is ws_auth.LONG_TOKEN
    future = native.sign_token("s3cret", "sales", int(time.time()) + 86400, iat=int(time.time()) + 86400 - 60)
    assert check(sales, f"/ws/sales?token={future}") is ws_auth.LONG_TOKEN  # what is left of it counts too
    pg = ws_auth.mint_token("s3cret", "sales", 60, aud=ws_auth.PLAYGROUND_AUD)
    assert check(sales, f"/ws/sales?token={pg}") is ws_auth.WRONG_ROUTE  # the playground's only
    old = ws_auth.mint_token("s3cret", "sales", 60, now=1000.0)
    assert check(sales, f"/ws/sales?token={old}") is ws_auth.EXPIRED_TOKEN
    forged = ws_auth.mint_token("other", "sales", 60)
    assert check(sales, f"/ws/sales?token={forged}") is ws_auth.BAD_TOKEN
    head, mac = good.split(".")
    tampered = native._b64(b'{"agent":"sales","exp":99999999999}') + "." + mac
    assert check(sales, f"/ws/sales?token={tampered}") is ws_auth.BAD_TOKEN
    for junk in ("a.b", "....", "x" * 5000, "%%%.%%%", head):
        assert check(sales, "/ws/sales", Authorization=f"Bearer {junk}") is ws_auth.BAD_TOKEN
    # a repeated Authorization header is not a credential
    two = Headers([("Authorization", "Bearer s3cret"), ("Authorization", "Bearer x")])
    assert ws_auth.native_auth(c, sales, "/ws/sales", two) is ws_auth.BAD_TOKEN
    # without a secret the route is open only on a trusted loopback listener (or a lab's)
    assert ws_auth.native_auth(cfg(), default, "/ws", Headers()) is ws_auth.UNCONFIGURED
    assert ws_auth.native_auth(cfg(trust_loopback=True), default, "/ws", Headers()) is ws_auth.OPEN
    assert ws_auth.native_auth(cfg(allow_unauthenticated=True), default, "/ws", Headers()) is ws_auth.OPEN


def test_mint_token_refuses_without_a_secret_or_with_a_silly_ttl():
    with pytest.raises(ValueError, match="native_secret"):
        ws_auth.mint_token("", "a")
    for ttl in (0, -1, ws_auth.MAX_TTL_S + 1):
        with pytest.raises(ValueError, match="ttl"):
            ws_auth.mint_token("s", "a", ttl)
    tok = native.open_token("s", ws_auth.mint_token("s", "a", 300, now=1000.0), 1200.0)
    assert (tok.agent, tok.exp, tok.params, tok.iat, tok.aud) == ("a", 1300, None, 1000, "") and len(tok.jti) >= 16
    with pytest.raises(native.TokenError) as e:
        native.open_token("s", ws_auth.mint_token("s", "a", 300, now=1000.0), 1300.0)
    assert e.value.kind == "expired"


def test_twilio_signature_missing_bad_and_good():
    c = cfg(twilio_auth_token="tok", public_url="wss://example.com")
    route = c.route("/twilio")
    sig = twilio.signature("tok", "wss://example.com/twilio")
    assert ws_auth.twilio_auth(c, route, "/twilio", Headers()) is ws_auth.BAD_SIGNATURE
    assert ws_auth.twilio_auth(c, route, "/twilio", Headers({"X-Twilio-Signature": "bad"})) is ws_auth.BAD_SIGNATURE
    assert ws_auth.twilio_auth(c, route, "/twilio/x", Headers({"X-Twilio-Signature": sig})) is ws_auth.BAD_SIGNATURE
    assert ws_auth.twilio_auth(c, route, "/twilio", Headers({"X-Twilio-Signature": sig})) is ws_auth.OPEN
    no_url = cfg(twilio_auth_token="tok")
    sig_host = twilio.signature("tok", "wss://gw.example:8443/twilio")
    assert ws_auth.twilio_auth(no_url, route, "/twilio", Headers({"X-Twilio-Signature": sig_host,
                                                                    "Host": "gw.example:8443"})) is ws_auth.OPEN


@pytest.mark.parametrize("reason", ["é" * 200, "a" * 200, "日本語" * 70, "😀" * 50, "ok", "", "\ud800 lone",
                                    "x" * 122 + "é"])
def test_close_reason_is_cut_by_bytes_at_a_character_boundary(reason):
    out = ws_framing.close_reason(reason)
    raw = out.encode("utf-8")  # encodable: no lone surrogate left
    assert len(raw) <= 123
    assert reason.encode("utf-8", "replace").startswith(raw)
    if len(reason.encode("utf-8", "replace")) <= 123:
        assert raw == reason.encode("utf-8", "replace")
    else:
        assert len(raw) > 119  # at most one character (4 bytes) short of the limit


def test_an_unauthenticated_public_listener_is_a_warning_at_start(caplog):
    import asyncio
    import logging

    from brisvox.gateway.transports import TRANSPORTS
    from brisvox.gateway.ws.server import WebSocketServer

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        with caplog.at_level(logging.INFO, logger="brisvox.gateway.ws"):
            WebSocketServer(None, cfg(host="0.0.0.0", allow_unauthenticated=True), TRANSPORTS)._warn_unauthenticated()  # type: ignore[arg-type]
            WebSocketServer(None, cfg(), TRANSPORTS)._warn_unauthenticated()  # type: ignore[arg-type]
            WebSocketServer(None, cfg(trust_loopback=True), TRANSPORTS)._warn_unauthenticated()  # type: ignore[arg-type]
            WebSocketServer(None, cfg(native_secret="s", twilio_auth_token="t"), TRANSPORTS)._warn_unauthenticated()  # type: ignore[arg-type]
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    recs = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(recs) == 3
    assert recs[0][0] == logging.WARNING and "allow_unauthenticated" in recs[0][1] and "native_secret" in recs[0][1]
    assert recs[1][0] == logging.WARNING and "refuse every request" in recs[1][1]  # loopback, not trusted
    assert recs[2][0] == logging.INFO and "trust_loopback" in recs[2][1]


def test_refusals_through_the_connection_are_counted_once_and_logged_bounded():
    import asyncio

    from brisvox.gateway.transports import TRANSPORTS
    from brisvox.gateway.ws.server import WebSocketServer, WsConnection
    from tests.unit.test_gateway_ws_fastpath import REQ, Transport, feed

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        server = WebSocketServer(None, cfg(handshakes_per_s=1), TRANSPORTS)  # type: ignore[arg-type]
        outs = []
        for req in [b"NOT HTTP AT ALL\r\n\r\n"] * 30 + [REQ.replace(b"Host: x\r\n", b"Origin: https://e.x\r\n"),
                                                        REQ, REQ]:
            conn = WsConnection(server)
            t = Transport()
            conn.connection_made(t)  # type: ignore[arg-type]
            feed(conn, req)
            outs.append(bytes(t.out))
            conn.connection_lost(None)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    c = server.counters
    assert c["ws_refused_handshake"] == 30  # the library's own refusals, once per connection
    assert outs[30].startswith(b"HTTP/1.1 403") and c["ws_refused_origin"] == 1
    assert outs[31].startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in outs[31]  # beyond 1/s
    assert c["ws_refused_rate"] == 2
    # one line per kind (bad handshake, origin, rate), the rest counted
    assert server.bad.lines == 3 and sum(server.bad.suppressed.values()) == 30
    assert server.per_source == {} and not server.connections
