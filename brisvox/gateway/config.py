"""Parsed ``[gateway]``, ``[sip]`` and ``[websocket]`` sections of ``brisvoxd.toml``.

Owns the gateway's configuration: defaults, validation and the names of the
keys. Each class is a frozen dataclass with ``from_section(table, where)``
(registered in ``brisvox/config/sections.py``); an unknown key, a wrong type
or an out-of-range value raises ``ConfigError`` naming the dotted key.

Defaults are loopback only: SIP/UDP on 127.0.0.1:5060, WebSocket on
127.0.0.1:8765 with Twilio Media Streams at ``/twilio`` and the native
protocol at ``/ws``. Nothing listens on a public address unless configured.

``[gateway] max_calls`` is ``"auto"`` by default: :data:`AUTO_CALLS_PER_CORE`
calls per core the daemon may run on (its CPU affinity, read when the section
is parsed), the capacity measured by the load benchmark (docs/BENCHMARKS.md)
rounded down, so a default daemon refuses (SIP 503, WebSocket 1013) rather
than admit a call it cannot serve in real time. An explicit integer within
1..:data:`MAX_CALLS_LIMIT` replaces it. The parsed value is always an int.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from brisvox.config.errors import ConfigError
from brisvox.config.secrets import SECRET_KEYS, resolve_secrets  # secret key forms
from brisvox.gateway.fault_budget import (
    DEFAULT_MAX_FAULTS,
    DEFAULT_WINDOW_S,
    MAX_FAULTS_LIMIT,
    MAX_WINDOW_S,
    FaultBudget,
)
from brisvox.gateway.rate_limits import parse_rates
from brisvox.gateway.transports import websocket_protocols
from brisvox.wire.native import RATES as NATIVE_RATES

AGENT_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# Calls per core of ``max_calls = "auto"``: the load benchmark held 125 calls on 2 cores
# (with the load generator on the same cores), rounded down to leave headroom.
AUTO_CALLS_PER_CORE = 60
MAX_CALLS_LIMIT = 100_000


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; a forked child inherits it), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def auto_max_calls(cores: int | None = None) -> int:
    """``max_calls = "auto"``: :data:`AUTO_CALLS_PER_CORE` per usable core."""
    return AUTO_CALLS_PER_CORE * (cores if cores is not None else usable_cores())


def parse_max_calls(value: Any, key: str, cores: int | None = None) -> int:
    """``"auto"`` (:func:`auto_max_calls`) or an integer within 1..:data:`MAX_CALLS_LIMIT`."""
    if value == "auto":
        return auto_max_calls(cores)
    if type(value) is not int:
        raise ConfigError(key, f'expected "auto" or an integer, got {value!r}')
    if not 1 <= value <= MAX_CALLS_LIMIT:
        raise ConfigError(key, f"must be within 1..{MAX_CALLS_LIMIT} (or \"auto\"), got {value}")
    return value


def _check_type(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is bool:
        if type(value) is not bool:
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if hint is int:
        if type(value) is not int:
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if type(value) not in (int, float):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if type(value) is not str:
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"expected an array, got {value!r}")
        (inner,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        return tuple(_check_type(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {value!r}")
        return dict(value)
    raise ConfigError(key, f"unsupported type {hint!r}")  # pragma: no cover


def _parse(cls: type, table: dict[str, Any] | None, where: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    table = dict(table or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(names))})")
    out: dict[str, Any] = {}
    for name, value in table.items():
        if name in skip:
            continue
        out[name] = _check_type(value, hints[name], f"{where}.{name}")
    return out


def _positive(where: str, **values: float) -> None:
    for k, v in values.items():
        if v <= 0:
            raise ConfigError(f"{where}.{k}", f"must be > 0, got {v}")


def _port(where: str, name: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}.{name}", f"port out of range: {port}")


def _networks(where: str, name: str, values: tuple[str, ...]) -> None:
    """Every entry of ``values`` is an IP address or a CIDR network (host bits allowed)."""
    for i, net in enumerate(values):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError as e:
            raise ConfigError(f"{where}.{name}[{i}]", f"expected an IP address or a CIDR network: {e}") from None


def _agent(key: str, name: str) -> None:
    if not AGENT_RE.match(name):
        raise ConfigError(key, f"invalid agent name {name!r} (letters, digits, _ and -)")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """``[gateway]``: the call table, pacing and the echo line-test agent."""

    max_calls: int = field(default_factory=auto_max_calls)  # "auto" in the file: see the module docstring
    position_interval_ms: int = 100  # Playback report period per agent
    ring_seconds: float = 8.0  # capacity of each call ring (rounded up to a power of two)
    tts_rate: int = 22050  # rate of the tts ring for pipeline calls
    agent_timeout_s: float = 2.0  # CallStart -> CallAccepted
    detach_timeout_s: float = 10.0  # CallEnd -> CallEnded; rings are unlinked after it
    echo_delay_ms: int = 300  # the echo agent plays the caller back this much later
    echo_use_workers: bool = True  # echo through a worker's resampling (in->in16->tts->out)
    echo_mark_ms: int = 1000  # the echo agent places a mark every this much output
    echo_digit_clears: bool = True  # a DTMF digit makes the echo agent Clear (barge-in line test)
    max_marks: int = 64  # pending marks per call (more are refused and counted)
    max_dtmf_queue: int = 32  # queued outbound DTMF digits per call
    uvloop: bool = False  # run the gateway loop on uvloop when installed
    pause_max_ms: int = 2500  # an agent's Pause (barge-in candidate) is released by itself after this

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "gateway") -> GatewayConfig:
        max_calls = parse_max_calls((table or {}).get("max_calls", "auto"), f"{where}.max_calls")
        cfg = cls(**_parse(cls, table, where, skip=("max_calls",)), max_calls=max_calls)
        _positive(where, position_interval_ms=cfg.position_interval_ms,
                  ring_seconds=cfg.ring_seconds, agent_timeout_s=cfg.agent_timeout_s,
                  detach_timeout_s=cfg.detach_timeout_s, echo_mark_ms=cfg.echo_mark_ms,
                  max_marks=cfg.max_marks, max_dtmf_queue=cfg.max_dtmf_queue)
        if cfg.echo_delay_ms < 0 or cfg.echo_delay_ms > 5000:
            raise ConfigError(f"{where}.echo_delay_ms", "must be within 0..5000")
        if not 8000 <= cfg.tts_rate <= 48000:
            raise ConfigError(f"{where}.tts_rate", "must be within 8000..48000")
        if cfg.ring_seconds > 60:
            raise ConfigError(f"{where}.ring_seconds", "at most 60 s")
        if not 100 <= cfg.pause_max_ms <= 10000:
            raise ConfigError(f"{where}.pause_max_ms", "must be within 100..10000")
        return cfg


def _trunk(where: str, trunk: str) -> None:
    """``[sip] trunk``: ``ip:port`` (an IPv6 address in brackets), no DNS name."""
    host, _, port = trunk.strip().rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        ok = 0 < int(port) < 65536
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(where, f"expected \"ip:port\" (e.g. \"192.0.2.10:5060\"), got {trunk[:60]!r}")


@dataclass(frozen=True, slots=True)
class SipConfig:
    """``[sip]``: the SIP user agent (server side, UDP) and its RTP ports."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 5060
    public_host: str = ""  # address in Contact/Via/SDP (default: host)
    rtp_port_min: int = 20000
    rtp_port_max: int = 30000
    allow: tuple[str, ...] = ("127.0.0.0/8",)  # source networks accepted (SIP and RTP)
    default_agent: str = "default"
    users: dict[str, str] = field(default_factory=lambda: {"echo": "echo"})  # request-URI user -> agent
    codecs: tuple[str, ...] = ("PCMU", "PCMA")  # our preference when the offer allows both
    t1_ms: int = 500
    t2_ms: int = 4000
    t4_ms: int = 5000
    ring_ms: int = 0  # delay between 180 Ringing and 200 OK
    jitter_ms: int = 60  # reordering window of the RTP jitter buffer
    max_buffered_packets: int = 32  # per call: jitter buffer slots
    max_message_bytes: int = 16384
    rtp_timeout_s: float = 60.0  # hang up after this long without RTP (0: never; held calls exempt)
    user_agent: str = "brisvox"
    rtp_latch: str = "sdp"  # accept RTP only from the SDP's address ("sdp") or the first source ("first")
    max_transactions: int = 4096  # server transactions at once; beyond it new requests get 503
    invite_rate: tuple[str, ...] = ("10/second", "100/minute")  # new INVITEs per source address
    options_rate: tuple[str, ...] = ("20/second",)  # OPTIONS per source address
    # SIP proxies (Kamailio, an SBC) whose second Via names the caller: the rate limits key on it
    trusted_proxies: tuple[str, ...] = ()
    # outbound calls (brisvoxd dial): "ip:port" every outbound INVITE goes to ("": only sip: URIs
    # with an IP address, sent there); a number is dialled as sip:NUMBER@trunk
    trunk: str = ""
    dial_ring_timeout_s: float = 60.0  # an outbound call not answered by then is cancelled

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "sip") -> SipConfig:
        cfg = cls(**_parse(cls, table, where))
        _port(where, "port", cfg.port)
        _port(where, "rtp_port_min", cfg.rtp_port_min)
        _port(where, "rtp_port_max", cfg.rtp_port_max)
        if cfg.rtp_port_min and cfg.rtp_port_max - cfg.rtp_port_min < 2:
            raise ConfigError(f"{where}.rtp_port_max", "must leave room for at least one even port above rtp_port_min")
        _networks(where, "allow", cfg.allow)
        _networks(where, "trusted_proxies", cfg.trusted_proxies)
        _agent(f"{where}.default_agent", cfg.default_agent)
        for user, agent in cfg.users.items():
            if type(agent) is not str:
                raise ConfigError(f"{where}.users.{user}", "expected an agent name")
            _agent(f"{where}.users.{user}", agent)
        for i, c in enumerate(cfg.codecs):
            if c not in ("PCMU", "PCMA"):
                raise ConfigError(f"{where}.codecs[{i}]", f"unsupported codec {c!r} (PCMU, PCMA)")
        if not cfg.codecs:
            raise ConfigError(f"{where}.codecs", "at least one codec")
        _positive(where, t1_ms=cfg.t1_ms, t2_ms=cfg.t2_ms, t4_ms=cfg.t4_ms, jitter_ms=cfg.jitter_ms,
                  max_buffered_packets=cfg.max_buffered_packets, max_message_bytes=cfg.max_message_bytes)
        if cfg.rtp_timeout_s < 0:
            raise ConfigError(f"{where}.rtp_timeout_s", "must be >= 0")
        if cfg.max_message_bytes > 65535:
            raise ConfigError(f"{where}.max_message_bytes", "a UDP datagram holds at most 65535 bytes")
        if cfg.rtp_latch not in ("sdp", "first"):
            raise ConfigError(f"{where}.rtp_latch", f"expected \"sdp\" or \"first\", got {cfg.rtp_latch!r}")
        if not 16 <= cfg.max_transactions <= 1_000_000:
            raise ConfigError(f"{where}.max_transactions", "must be within 16..1000000")
        for key in ("invite_rate", "options_rate"):
            for i, rate in enumerate(getattr(cfg, key)):
                try:
                    parse_rates((rate,))
                except ValueError as e:
                    raise ConfigError(f"{where}.{key}[{i}]", f"expected e.g. \"10/second\": {e}") from None
        if cfg.trunk:
            _trunk(f"{where}.trunk", cfg.trunk)
        if not 0 < cfg.dial_ring_timeout_s <= 600:
            raise ConfigError(f"{where}.dial_ring_timeout_s", "must be within (0, 600]")
        if cfg.public_host:
            try:
                ipaddress.ip_address(cfg.public_host)
            except ValueError:
                raise ConfigError(f"{where}.public_host", "expected an IP address (it is the SDP's c= address)") from None
        return cfg

    @property
    def advertised_host(self) -> str:
        return self.public_host or self.host


@dataclass(frozen=True, slots=True)
class WsRoute:
    """One WebSocket path: ``protocol`` (a WebSocket transport of
    :data:`brisvox.gateway.transports.TRANSPORTS`: twilio | native) and the agent it serves.

    ``agents`` are the agents ``<path>/<name>`` may pick besides ``agent`` (the
    path itself always serves ``agent``); nothing else in ``agents_dir`` is
    reachable through the route. ``allowed`` is False only on a route
    :meth:`WebSocketConfig.route` resolved for a name not on that list (the
    server refuses it)."""

    path: str
    protocol: str
    agent: str
    agents: tuple[str, ...] = ()
    allowed: bool = True

    def admits(self, name: str) -> bool:
        return name == self.agent or name in self.agents


HEALTHZ_PATH = "/healthz"  # answered by the WebSocket listener itself (docs/OPERATIONS.md), never routed
DEFAULT_ROUTES = (WsRoute("/twilio", "twilio", "default"), WsRoute("/ws", "native", "default"))
ROUTE_KEYS = ("path", "protocol", "agent", "agents")


def is_loopback(host: str) -> bool:
    """``host`` (a listen address) accepts connections from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # "", "0.0.0.0"-like names and host names: assume reachable from outside


def _routes(routes_raw: Any, where: str) -> tuple[WsRoute, ...]:
    if not isinstance(routes_raw, list):
        raise ConfigError(f"{where}.routes", "expected an array of tables")
    routes = []
    for i, r in enumerate(routes_raw):
        key = f"{where}.routes[{i}]"
        if not isinstance(r, dict):
            raise ConfigError(key, "expected a table {path, protocol, agent, agents}")
        extra = sorted(set(r) - set(ROUTE_KEYS))
        if extra:
            raise ConfigError(f"{key}.{extra[0]}", f"unknown key ({', '.join(ROUTE_KEYS)})")
        path, proto, agent = r.get("path"), r.get("protocol"), r.get("agent", "default")
        if type(path) is not str or not path.startswith("/"):
            raise ConfigError(f"{key}.path", "expected a path starting with /")
        if path.rstrip("/") == HEALTHZ_PATH:
            raise ConfigError(f"{key}.path", f"{HEALTHZ_PATH} is the listener's health check, not a route")
        if proto not in websocket_protocols():
            raise ConfigError(f"{key}.protocol", f"expected one of {', '.join(websocket_protocols())}")
        if type(agent) is not str:
            raise ConfigError(f"{key}.agent", "expected an agent name")
        _agent(f"{key}.agent", agent)
        agents = _check_type(r.get("agents", []), tuple[str, ...], f"{key}.agents")
        for j, name in enumerate(agents):
            _agent(f"{key}.agents[{j}]", name)
        routes.append(WsRoute(path.rstrip("/") or "/", proto, agent, tuple(dict.fromkeys(agents))))
    return tuple(routes)


def _twilio_control(cfg: Any, where: str) -> None:
    """The Twilio REST and webhook keys of ``[websocket]`` (docs/CONFIGURATION.md)."""
    if cfg.twilio_account_sid and not re.match(r"^AC[0-9a-fA-F]{32}$", cfg.twilio_account_sid):
        raise ConfigError(f"{where}.twilio_account_sid", "expected AC followed by 32 hex digits")
    if cfg.twilio_account_sid and not cfg.twilio_auth_token:
        raise ConfigError(f"{where}.twilio_auth_token", "required with twilio_account_sid (the REST API's password)")
    if not re.match(r"^https?://[^/\s]+$", cfg.twilio_api_base):
        raise ConfigError(f"{where}.twilio_api_base", "expected http(s)://host[:port] without a path")
    if not 0 < cfg.twilio_api_timeout_s <= 30:
        raise ConfigError(f"{where}.twilio_api_timeout_s", "must be > 0 and at most 30")
    path = cfg.twiml_path
    if path and (not re.match(r"^/[A-Za-z0-9/_.-]*$", path) or path == HEALTHZ_PATH
                 or any(r.path == path for r in cfg.routes)):
        raise ConfigError(f"{where}.twiml_path", "expected a path starting with / that is neither "
                          f"{HEALTHZ_PATH} nor a route's")


@dataclass(frozen=True, slots=True)
class WebSocketConfig:
    """``[websocket]``: the WebSocket server (Twilio Media Streams and native).

    Invariants (checked by :meth:`from_section`): a listener on a non-loopback
    address has a credential for every protocol it routes (``native_secret``
    for native, Telnyx, Vonage and Exotel routes, ``twilio_auth_token`` for Twilio routes,
    ``plivo_auth_token`` for Plivo routes) unless
    ``allow_unauthenticated`` says otherwise; the per-source limits are >= 0
    (0: no limit)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8765
    routes: tuple[WsRoute, ...] = DEFAULT_ROUTES
    max_message_bytes: int = 262144  # a larger frame closes the connection (1009)
    max_send_buffer_bytes: int = 262144  # per connection; beyond it outbound audio is dropped, counted
    native_secret: str = ""  # native routes: the static secret, and the key of signed tokens
    twilio_auth_token: str = ""  # validate X-Twilio-Signature when set
    plivo_auth_token: str = ""  # validate X-Plivo-Signature-V3 when set
    public_url: str = ""  # scheme://host the signature was computed over (default wss://<Host>)
    # Twilio call control (transfer, hang-up) through the REST API: the account's SID (plain;
    # the API's password is twilio_auth_token), the API's origin, each request's timeout
    twilio_account_sid: str = ""
    twilio_api_base: str = "https://api.twilio.com"
    twilio_api_timeout_s: float = 4.0  # two attempts stay within the agent's 9.5 s wait for a TransferResult
    twiml_path: str = ""  # POST here answers Twilio's incoming-call webhook with TwiML ("": none)
    allow_unauthenticated: bool = False  # lab only: a non-loopback listener without credentials
    allowed_origins: tuple[str, ...] = ()  # Origin values let in ("*": any); no Origin is always let in
    handshakes_per_s: int = 20  # per source IP, moving 1 s window (HTTP 429 beyond; 0: no limit)
    max_connections_per_source: int = 200  # open connections per source IP (HTTP 503 beyond; 0: no limit)
    # load balancers (HAProxy) whose X-Forwarded-For names the client: the per-source limits key on it
    trusted_proxies: tuple[str, ...] = ()
    start_timeout_s: float = 10.0  # close a connection that never sends start
    native_rates: tuple[int, ...] = NATIVE_RATES
    # a live call survives malformed messages (counted, dropped) up to this many within fault_window_s
    fault_max: int = DEFAULT_MAX_FAULTS
    fault_window_s: float = DEFAULT_WINDOW_S
    hangup_on_error: bool = False  # the first malformed message of a live call ends it

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "websocket") -> WebSocketConfig:
        raw = dict(table or {})
        # -- secrets (brisvox/config/secrets.py): each key of SECRET_KEYS["websocket"] may be given as
        # <key>_env, <key>_file or <key>_credential; the value read replaces those forms here.
        raw = resolve_secrets(raw, where, SECRET_KEYS["websocket"])
        # -- end secrets
        routes_raw = raw.pop("routes", None)
        cfg = cls(**_parse(cls, raw, where))
        if routes_raw is not None:
            cfg = dataclasses.replace(cfg, routes=_routes(routes_raw, where))
        _port(where, "port", cfg.port)
        _positive(where, max_message_bytes=cfg.max_message_bytes,
                  max_send_buffer_bytes=cfg.max_send_buffer_bytes, start_timeout_s=cfg.start_timeout_s)
        for i, rate in enumerate(cfg.native_rates):
            if rate not in NATIVE_RATES:
                raise ConfigError(f"{where}.native_rates[{i}]", f"unsupported rate {rate} ({NATIVE_RATES})")
        if cfg.public_url and not re.match(r"^(wss?|https?)://[^/]+$", cfg.public_url):
            raise ConfigError(f"{where}.public_url", "expected scheme://host[:port] without a path")
        _twilio_control(cfg, where)
        if not 0 <= cfg.fault_max <= MAX_FAULTS_LIMIT:
            raise ConfigError(f"{where}.fault_max", f"must be within 0..{MAX_FAULTS_LIMIT}, got {cfg.fault_max}")
        if not 0 < cfg.fault_window_s <= MAX_WINDOW_S:
            raise ConfigError(f"{where}.fault_window_s",
                              f"must be > 0 and at most {MAX_WINDOW_S:g}, got {cfg.fault_window_s}")
        for name in ("handshakes_per_s", "max_connections_per_source"):
            if getattr(cfg, name) < 0:
                raise ConfigError(f"{where}.{name}", f"must be >= 0 (0: no limit), got {getattr(cfg, name)}")
        _networks(where, "trusted_proxies", cfg.trusted_proxies)
        for i, origin in enumerate(cfg.allowed_origins):
            if origin != "*" and not re.match(r"^[a-z][a-z0-9+.-]*://[^/\s]+$|^null$", origin, re.I):
                raise ConfigError(f"{where}.allowed_origins[{i}]",
                                  f"expected scheme://host[:port] (as browsers send it) or \"*\", got {origin!r}")
        if cfg.enabled and not is_loopback(cfg.host) and not cfg.allow_unauthenticated:
            for key, proto in cfg.missing_credentials():
                raise ConfigError(f"{where}.{key}",
                                  f"required: {where}.host {cfg.host!r} is not a loopback address and a route "
                                  f"serves {proto} (set {where}.{key}, or {where}.allow_unauthenticated = true "
                                  "for a lab)")
        return cfg

    def missing_credentials(self) -> list[tuple[str, str]]:
        """``(key, protocol)`` for every routed protocol whose credential is not set."""
        protos = {r.protocol for r in self.routes}
        out = []
        if "native" in protos and not self.native_secret:
            out.append(("native_secret", "native"))
        if "twilio" in protos and not self.twilio_auth_token:
            out.append(("twilio_auth_token", "twilio"))
        if "telnyx" in protos and not self.native_secret:  # the stream token is a native credential
            out.append(("native_secret", "telnyx"))
        if "vonage" in protos and not self.native_secret:  # so is Vonage's Authorization or ?token=
            out.append(("native_secret", "vonage"))
        if "exotel" in protos and not self.native_secret:  # and Exotel's Basic password or ?token=
            out.append(("native_secret", "exotel"))
        if "plivo" in protos and not self.plivo_auth_token:
            out.append(("plivo_auth_token", "plivo"))
        return out

    def fault_budget(self) -> FaultBudget:
        """The fault budget of every live WebSocket call (:mod:`brisvox.gateway.fault_budget`)."""
        return FaultBudget(self.fault_max, self.fault_window_s, self.hangup_on_error)

    def route(self, path: str) -> WsRoute | None:
        """Route for a request path: exact match, or ``<route>/<agent>`` for another agent
        (``allowed`` False when the route does not list it: see :class:`WsRoute`)."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        for r in self.routes:
            if r.path == path:
                return r
        for r in self.routes:
            prefix = r.path.rstrip("/") + "/"
            if path.startswith(prefix):
                agent = path[len(prefix):]
                if AGENT_RE.match(agent):
                    return WsRoute(path, r.protocol, agent, r.agents, r.admits(agent))
        return None


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The three sections together, as the gateway core takes them."""

    gateway: GatewayConfig = GatewayConfig()
    sip: SipConfig = SipConfig()
    websocket: WebSocketConfig = WebSocketConfig()

    @classmethod
    def from_tables(cls, tables: dict[str, Any]) -> GatewaySettings:
        return cls(
            GatewayConfig.from_section(tables.get("gateway")),
            SipConfig.from_section(tables.get("sip")),
            WebSocketConfig.from_section(tables.get("websocket")),
        )
