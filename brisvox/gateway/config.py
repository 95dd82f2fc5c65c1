"""Parsed ``[gateway]``, ``[sip]``, ``[websocket]`` and ``[audiosocket]`` sections of ``brisvoxd.toml``.

Owns the gateway's configuration: defaults, validation and the names of the
keys. Each class is a config section (:func:`brisvox.config.schema.section`, the one
validator of every config table) with ``from_section(table, where)`` (registered in
``brisvox/config/sections.py``); an unknown key, a wrong type or an out-of-range value
raises ``ConfigError`` naming the dotted key.

Defaults are loopback only: SIP/UDP on 127.0.0.1:5060, WebSocket on
127.0.0.1:8765 with Twilio Media Streams at ``/twilio`` and the native
protocol at ``/ws``. Nothing listens on a public address unless configured.

``[gateway] max_calls`` is ``"auto"`` by default (:meth:`GatewayConfig.call_limit`):
:data:`AUTO_CALLS_PER_CORE` calls per core the daemon may run on (its CPU
affinity), the capacity measured by the load benchmark (docs/BENCHMARKS.md)
rounded down, and fewer on a host where the end-of-turn model is dearer: once
a worker reports the Smart Turn inference time its boot self-benchmark measured
(``smart_turn_ms`` in its Topology row), at most
:data:`AUTO_SMART_TURN_MS_PER_CORE` / ``smart_turn_ms`` calls per core (the
slowest worker counts). So a default daemon refuses (SIP 503, WebSocket 1013)
rather than admit a call it cannot serve in real time, on a fast host and on
a slow one. An explicit integer within 1..:data:`MAX_CALLS_LIMIT` replaces it
and is never changed. The parsed value is ``"auto"`` or that int.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, section
from brisvox.config.secrets import SECRET_KEYS, resolve_secrets  # secret key forms
from brisvox.gateway.fault_budget import (
    DEFAULT_MAX_FAULTS,
    DEFAULT_WINDOW_S,
    MAX_FAULTS_LIMIT,
    MAX_WINDOW_S,
    FaultBudget,
)
from brisvox.gateway.rate_limits import parse_rates
from brisvox.runtime.cpu import usable_cores  # the gateway's max_calls auto: affinity and CPU quota
from brisvox.wire.native import RATES as NATIVE_RATES
from brisvox.wire.sdp import SrtpPolicy

AGENT_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# The protocols a ``[[websocket.routes]]`` entry may name. The transport registry
# (brisvox/gateway/transports.py) has one WebSocket row per name and refuses to load if the two
# disagree; this module names them itself so that the configuration, at the bottom of the
# gateway, imports no transport (the registry sits on top and imports every leg).
WEBSOCKET_PROTOCOLS = ("twilio", "native", "plivo", "telnyx", "vonage", "exotel", "asterisk_ws", "freeswitch")

# Calls per core of ``max_calls = "auto"``: the load benchmark held 125 calls on 2 cores
# (with the load generator on the same cores), rounded down to leave headroom.
AUTO_CALLS_PER_CORE = 60
# ... and at most this many ms of boot-measured Smart Turn inference per core: the held levels
# of the load benchmark times the worker's boot figure, per core, were 62.5 x 19.6 = 1225
# (2026-11-30 sweep) and 50 x 28 = 1400 (2026-12-02, a slower day): 1200 stays under both.
AUTO_SMART_TURN_MS_PER_CORE = 1200.0
MAX_CALLS_LIMIT = 100_000


def auto_max_calls(cores: int | None = None, smart_turn_ms: float | None = None) -> int:
    """``max_calls = "auto"``: :data:`AUTO_CALLS_PER_CORE` per usable core, or fewer when a
    worker measured ``smart_turn_ms`` per inference (:data:`AUTO_SMART_TURN_MS_PER_CORE`); >= 1."""
    n = cores if cores is not None else usable_cores()
    per_core = float(AUTO_CALLS_PER_CORE)
    if smart_turn_ms is not None and smart_turn_ms > 0:
        per_core = min(per_core, AUTO_SMART_TURN_MS_PER_CORE / smart_turn_ms)
    return max(1, int(per_core * n))


def parse_max_calls(value: Any, key: str) -> int | Literal["auto"]:
    """``"auto"`` (kept: :meth:`GatewayConfig.call_limit`) or an integer within 1..:data:`MAX_CALLS_LIMIT`."""
    if value == "auto":
        return "auto"
    if type(value) is not int:
        raise ConfigError(key, f'expected "auto" or an integer, got {value!r}')
    if not 1 <= value <= MAX_CALLS_LIMIT:
        raise ConfigError(key, f"must be within 1..{MAX_CALLS_LIMIT} (or \"auto\"), got {value}")
    return value


def _networks(name: str, values: tuple[str, ...]) -> None:
    """Every entry of ``values`` is an IP address or a CIDR network (host bits allowed)."""
    for i, net in enumerate(values):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError as e:
            raise ConfigError(f"{name}[{i}]", f"expected an IP address or a CIDR network: {e}") from None


def _agent(key: str, name: str) -> None:
    if not AGENT_RE.match(name):
        raise ConfigError(key, f"invalid agent name {name!r} (letters, digits, _ and -)")


Port = Annotated[int, Field(ge=0, le=65535)]
Positive = Annotated[int, Field(gt=0)]
PositiveS = Annotated[float, Field(gt=0)]


@section
class GatewayConfig:
    """``[gateway]``: the call table, pacing and the echo line-test agent."""

    max_calls: int | Literal["auto"] = "auto"  # see the module docstring and call_limit
    position_interval_ms: Positive = 100  # Playback report period per agent
    ring_seconds: float = Field(default=8.0, gt=0, le=60)  # capacity of each call ring (rounded up to a power of two)
    tts_rate: int = Field(default=22050, ge=8000, le=48000)  # rate of the tts ring for pipeline calls
    agent_timeout_s: PositiveS = 2.0  # CallStart -> CallAccepted
    detach_timeout_s: PositiveS = 10.0  # CallEnd -> CallEnded; rings are unlinked after it
    echo_delay_ms: int = Field(default=300, ge=0, le=5000)  # the echo agent plays the caller back this much later
    echo_use_workers: bool = True  # echo through a worker's resampling (in->in16->tts->out)
    echo_mark_ms: Positive = 1000  # the echo agent places a mark every this much output
    echo_digit_clears: bool = True  # a DTMF digit makes the echo agent Clear (barge-in line test)
    max_marks: Positive = 64  # pending marks per call (more are refused and counted)
    max_dtmf_queue: Positive = 32  # queued outbound DTMF digits per call
    uvloop: bool = False  # run the gateway loop on uvloop when installed
    pause_max_ms: int = Field(default=2500, ge=100, le=10000)  # an agent's Pause (barge-in candidate) is released by itself after this
    # every transport: a call older than this is hung up ("max call duration"; 0: no limit)
    max_call_s: float = Field(default=14400.0, ge=0)
    # live calls one source address may hold (SIP: the signalling source; WebSocket: the client after
    # trusted_proxies); 0: a quarter of the call limit (at least 1). Beyond: SIP 503, WebSocket 1013
    max_calls_per_source: int = Field(default=0, ge=0, le=MAX_CALLS_LIMIT)

    @field_validator("max_calls", mode="before")
    @classmethod
    def _max_calls(cls, value: Any) -> int | Literal["auto"]:
        return parse_max_calls(value, "")

    def call_limit(self, smart_turn_ms: float | None = None, cores: int | None = None) -> int:
        """The call table's limit: the explicit ``max_calls``, or "auto" for this host
        (:func:`auto_max_calls`; ``smart_turn_ms``: the slowest worker's boot figure)."""
        if self.max_calls == "auto":
            return auto_max_calls(cores, smart_turn_ms)
        return self.max_calls

    def source_call_limit(self, call_limit: int) -> int:
        """``max_calls_per_source``, its 0 resolved against the call table's ``call_limit``."""
        return self.max_calls_per_source or max(1, call_limit // 4)

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "gateway") -> GatewayConfig:
        return from_table(cls, table, where)


def _trunk(key: str, trunk: str) -> None:
    """``[sip] trunk``: ``ip:port`` (an IPv6 address in brackets), no DNS name."""
    host, _, port = trunk.strip().rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        ok = 0 < int(port) < 65536
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(key, f"expected \"ip:port\" (e.g. \"192.0.2.10:5060\"), got {trunk[:60]!r}")


SIP_AUTH_MODES = ("ip", "digest", "ip_or_digest")
NEVER_INLINE = "never inline: use secret_env, secret_file or secret_credential"


@dataclass(frozen=True, slots=True)
class SipUser:
    """One ``[[sip.users]]`` entry: a SIP user's name (the Request-URI user, and the digest
    username under ``[sip] auth = "digest"``), the agent its calls reach, and its digest
    secret (read from ``secret_env`` / ``secret_file`` / ``secret_credential``, never inline;
    ``""``: the user cannot authenticate)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]{1,64}$")]
    agent: str
    secret: str = field(default="", repr=False)


def _entry_secret(entry: Any, where: str) -> Any:
    """An array entry with its ``secret`` read from its ``secret_env`` / ``secret_file`` /
    ``secret_credential`` form (brisvox/config/secrets.py); an inline ``secret`` is refused."""
    if not isinstance(entry, dict):
        return entry  # the schema names the wrong type
    if entry.get("secret") not in (None, ""):
        raise ConfigError(f"{where}.secret", NEVER_INLINE)
    return resolve_secrets(entry, where, ("secret",))


@dataclass(frozen=True, slots=True)
class SipListener:
    """One ``[[sip.listeners]]`` entry: SIP over ``tcp`` or ``tls`` on ``host:port`` (the
    ``[sip] host/port`` UDP listener is always there). TLS: ``cert_file`` and ``key_file``
    (PEM, read at start), TLS 1.2 or newer with the platform's ciphers; with
    ``client_ca_file`` a client certificate is asked for and checked (``require_client_cert``:
    a client without a valid one is refused in the handshake)."""

    transport: Literal["tcp", "tls"]
    port: Port
    host: str = "127.0.0.1"
    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""  # TLS: the CAs a client certificate is checked against ("": none asked)
    require_client_cert: bool = False  # TLS: refuse a client without a valid certificate (needs client_ca_file)


@dataclass(frozen=True, slots=True)
class SipTrunk:
    """One ``[[sip.trunks]]`` entry: a carrier or PBX brisvox registers with and dials through.

    ``registrar`` is where REGISTER and the trunk's outbound INVITEs go (``ip[:port]``, no DNS;
    ``outbound_proxy`` instead when set); ``username`` / ``auth_user`` / ``realm`` / ``secret``
    answer its digest challenges (the secret from ``secret_env`` / ``secret_file`` /
    ``secret_credential``, never inline); INVITEs from ``addresses`` (default: the registrar's
    address) are the trunk's calls and run ``agent``. Only UDP: SIP over TCP and TLS is not
    built: TCP and TLS need a ``[[sip.listeners]]`` entry of that transport (our Contact)."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,32}$")]
    registrar: str
    username: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+*#-]{1,64}$")]
    transport: Literal["udp", "tcp", "tls"] = "udp"  # tcp/tls: a [[sip.listeners]] entry of it is needed
    auth_user: str = ""  # the digest username ("": username)
    realm: str = ""  # the realm the credentials answer ("": any realm that challenges)
    secret: str = field(default="", repr=False)
    expires: int = Field(default=600, ge=60, le=86400)  # the registration asked for (s)
    register: bool = True  # false: an IP trunk: no REGISTER, its credentials still answer challenges
    outbound_proxy: str = ""  # "ip[:port]": REGISTER and INVITEs go there instead of the registrar
    agent: str = ""  # the agent of its calls ("": [sip] default_agent)
    addresses: tuple[str, ...] = ()  # source networks of its INVITEs (default: the registrar's address)
    keepalive_s: float = Field(default=30.0, ge=0, le=3600)  # an OPTIONS to the registrar this often (0: never)
    contact_user: str = ""  # the user of the Contact we register ("": username)

    @property
    def registrar_addr(self) -> tuple[str, int]:
        host, port = _hostport(self.registrar)
        return host, port

    @property
    def next_hop(self) -> tuple[str, int]:
        return _hostport(self.outbound_proxy) if self.outbound_proxy else self.registrar_addr

    @property
    def domain(self) -> str:
        """The host of the trunk's URIs (the registrar's, as written)."""
        return self.registrar.strip().removeprefix("sip:").removeprefix("sips:")

    @property
    def networks(self) -> tuple[str, ...]:
        return self.addresses or (self.registrar_addr[0],)


def _hostport(s: str) -> tuple[str, int]:
    from brisvox.wire.sip_message import split_hostport

    host, port = split_hostport(s.strip().removeprefix("sip:"))
    return host, port or 5060


def _check_trunk(i: int, t: SipTrunk, allow: tuple[str, ...]) -> None:
    key = f"trunks[{i}]"
    for k in ("registrar", "outbound_proxy"):
        v = getattr(t, k)
        if not v:
            continue
        try:
            host, _ = _hostport(v)
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"{key}.{k}", f"expected \"ip[:port]\" (no DNS name), got {v[:60]!r}") from None
        nets = [ipaddress.ip_network(n, strict=False) for n in allow]
        if not any(ipaddress.ip_address(host) in n for n in nets):
            raise ConfigError(f"{key}.{k}", f"{host} is not in sip.allow (its answers would be dropped)")
    _networks(f"{key}.addresses", t.addresses)
    if t.agent:
        _agent(f"{key}.agent", t.agent)
    if (t.register or t.realm or t.auth_user) and not t.secret:
        raise ConfigError(f"{key}.secret_env", "the trunk's secret is needed (secret_env, secret_file or "
                          "secret_credential; register = false for an IP trunk without credentials)")


@section
class SipConfig:
    """``[sip]``: the SIP user agent (server side, UDP) and its RTP ports.

    ``users`` is either the table form (``[sip.users]``: Request-URI user -> agent) or the
    array form (``[[sip.users]]``: :class:`SipUser`, with a secret for digest
    authentication); :attr:`user_agents` and :meth:`user_secret` read both."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: Port = 5060
    public_host: str = ""  # address in Contact/Via/SDP (default: host)
    rtp_port_min: Port = 20000
    rtp_port_max: Port = 30000
    allow: tuple[str, ...] = ("127.0.0.0/8",)  # source networks accepted (SIP and RTP)
    # agent for a request-URI user not in ``users`` ("": such an INVITE is refused 404)
    default_agent: str = ""
    # request-URI user -> agent ([sip.users]), or [[sip.users]] entries with a digest secret each
    users: dict[str, str] | tuple[SipUser, ...] = field(default_factory=lambda: {"echo": "echo"})
    # who may place a call: "ip" (a source inside allow), "digest" (every new INVITE answers a
    # digest challenge as one of [[sip.users]]), "ip_or_digest" (sources in auth_networks by
    # address, every other source by digest)
    auth: Literal["ip", "digest", "ip_or_digest"] = "ip"
    auth_realm: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{1,64}$")] = "brisvox"
    auth_networks: tuple[str, ...] = ()  # auth = "ip_or_digest": the sources that need no challenge
    auth_nonce_s: float = Field(default=30.0, gt=0, le=3600)  # a challenge's nonce lifetime (then stale)
    # the challenges a 401 offers, in this order (RFC 8760: SHA-256 first; a client that reads only the
    # first, such as SIPp 3.6, needs "MD5" first)
    auth_algorithms: tuple[Literal["SHA-256", "MD5"], ...] = Field(default=("SHA-256", "MD5"), min_length=1)
    # failed digest answers per source and per user; beyond: 403 until the window passes
    auth_failures: tuple[str, ...] = ("5/minute",)
    # our preference when the offer allows both
    codecs: tuple[Literal["PCMU", "PCMA"], ...] = Field(default=("PCMU", "PCMA"), min_length=1)
    t1_ms: Positive = 500
    t2_ms: Positive = 4000
    t4_ms: Positive = 5000
    ring_ms: int = Field(default=0, ge=0)  # delay between 180 Ringing and 200 OK
    jitter_ms: Positive = 60  # reordering window of the RTP jitter buffer
    max_buffered_packets: Positive = 32  # per call: jitter buffer slots
    max_message_bytes: int = Field(default=16384, gt=0, le=65535)  # a UDP datagram holds at most 65535 bytes
    rtp_timeout_s: float = Field(default=60.0, ge=0)  # hang up after this long without RTP (0: never; held calls exempt)
    hold_timeout_s: float = Field(default=3600.0, ge=0)  # hang up a call held this long ("hold timeout"; 0: never)
    # RFC 4028 session timers: the interval we ask for (0: none asked; a peer's is still honoured) and
    # the shortest we accept (a shorter ask is answered 422; 90 is the RFC's minimum)
    session_expires_s: int = Field(default=1800, ge=0, le=86400)
    min_se_s: int = Field(default=90, ge=90, le=86400)
    # re-INVITEs and UPDATEs one dialog may bring (moving windows); beyond: 491 (sip_refresh_storm)
    refresh_rate: tuple[str, ...] = ("3/second", "30/minute")
    user_agent: str = "brisvox"
    # accept RTP only from the SDP's address ("sdp") or the first source ("first")
    rtp_latch: Literal["sdp", "first"] = "sdp"
    # SRTP with SDES keys (RFC 4568/3711): "off" (RTP only; an RTP/SAVP offer is refused 488),
    # "optional" (SRTP when the peer offers or accepts it, else RTP), "required" (SRTP only)
    srtp: Literal["off", "optional", "required"] = "off"
    # SDES keys travel in the SDP: they are sent and taken only on TLS signalling unless this is true
    srtp_allow_insecure_signalling: bool = False
    # where requests and RTP go when a message names an address outside allow: "strict" refuses the
    # call (403/488); "signalling_source" (NAT'd peers) sends to the address the INVITE came from
    nat: Literal["strict", "signalling_source"] = "strict"
    max_transactions: int = Field(default=4096, ge=16, le=1_000_000)  # server transactions at once; beyond: 503
    invite_rate: tuple[str, ...] = ("10/second", "100/minute")  # new INVITEs per source address
    options_rate: tuple[str, ...] = ("20/second",)  # OPTIONS per source address
    # every other request per source address (not ACK, not a retransmission): BYE, CANCEL, INFO, ...
    other_rate: tuple[str, ...] = ("50/second",)
    # 503 refusals answered per source address; beyond: dropped unanswered (sip_refused_flood)
    refusal_rate: tuple[str, ...] = ("10/second",)
    # server transactions one source may hold at once (0: max_transactions // 8); beyond: 503
    max_transactions_per_source: int = Field(default=0, ge=0, le=1_000_000)
    # SIP proxies (Kamailio, an SBC) whose second Via names the caller: the rate limits key on it
    trusted_proxies: tuple[str, ...] = ()
    # outbound calls (brisvoxd dial): "ip:port" every outbound INVITE goes to ("": only sip: URIs
    # with an IP address, sent there); a number is dialled as sip:NUMBER@trunk
    trunk: str = ""
    trunks: tuple[SipTrunk, ...] = ()  # [[sip.trunks]]: registration, digest credentials, inbound matching
    listeners: tuple[SipListener, ...] = ()  # [[sip.listeners]]: SIP over TCP and TLS besides UDP
    max_connections: int = Field(default=2048, ge=1, le=1_000_000)  # TCP/TLS connections at once
    max_connections_per_source: int = Field(default=32, ge=1, le=1_000_000)  # ... from one address
    connection_idle_s: float = Field(default=600.0, gt=0, le=86400)  # a connection without traffic is closed
    first_message_s: float = Field(default=10.0, gt=0, le=600)  # no whole message by then: closed
    tls_handshake_timeout_s: float = Field(default=5.0, gt=0, le=120)  # a stalled handshake is closed
    connect_timeout_s: float = Field(default=5.0, gt=0, le=60)  # our TCP/TLS connect (and TLS handshake)
    tls_ca_file: str = ""  # CAs our TLS connections verify the peer with ("": the system's)
    tls_verify_server: bool = True  # false: a lab without certificates (the peer is not verified)
    dial_ring_timeout_s: float = Field(default=60.0, gt=0, le=600)  # an outbound call not answered by then is cancelled

    def __post_init__(self) -> None:  # cross-key and format checks; keys relative to [sip]
        if self.rtp_port_min and self.rtp_port_max - self.rtp_port_min < 2:
            raise ConfigError("rtp_port_max", "must leave room for at least one even port above rtp_port_min")
        _networks("allow", self.allow)
        _networks("trusted_proxies", self.trusted_proxies)
        if self.default_agent:
            _agent("default_agent", self.default_agent)
        if isinstance(self.users, dict):
            for user, agent in self.users.items():
                _agent(f"users.{user}", agent)
        else:
            seen: set[str] = set()
            for i, u in enumerate(self.users):
                _agent(f"users[{i}].agent", u.agent)
                if u.name in seen:
                    raise ConfigError(f"users[{i}].name", f"{u.name!r} is given twice")
                seen.add(u.name)
        _networks("auth_networks", self.auth_networks)
        if self.auth != "ip" and not any(self.user_secret(u) for u in self.user_agents):
            raise ConfigError("auth", f"auth = {self.auth!r} needs [[sip.users]] entries with a secret "
                              "(secret_env, secret_file or secret_credential)")
        if self.auth == "ip_or_digest" and not self.auth_networks:
            raise ConfigError("auth_networks", 'auth = "ip_or_digest" needs the networks that are '
                              'authenticated by address (else use auth = "digest")')
        if self.session_expires_s and self.session_expires_s < self.min_se_s:
            raise ConfigError("session_expires_s", f"must be 0 (no session timer asked) or at least min_se_s "
                              f"({self.min_se_s})")
        for key in ("invite_rate", "options_rate", "other_rate", "refusal_rate", "refresh_rate", "auth_failures"):
            for i, rate in enumerate(getattr(self, key)):
                try:
                    parse_rates((rate,))
                except ValueError as e:
                    raise ConfigError(f"{key}[{i}]", f"expected e.g. \"10/second\": {e}") from None
        if self.max_transactions_per_source > self.max_transactions:
            raise ConfigError("max_transactions_per_source",
                              f"must be at most max_transactions ({self.max_transactions})")
        names = [t.name for t in self.trunks]
        for i, t in enumerate(self.trunks):
            if names.index(t.name) != i:
                raise ConfigError(f"trunks[{i}].name", f"{t.name!r} is given twice")
            _check_trunk(i, t, self.allow)
        for i, lst in enumerate(self.listeners):
            try:
                ipaddress.ip_address(lst.host)
            except ValueError:
                raise ConfigError(f"listeners[{i}].host", f"expected an IP address, got {lst.host[:60]!r}") from None
            if lst.transport == "tls":
                for k in ("cert_file", "key_file") + (("client_ca_file",) if lst.client_ca_file else ()):
                    path = getattr(lst, k)
                    if not path or not os.access(path, os.R_OK):
                        raise ConfigError(f"listeners[{i}].{k}", f"a readable PEM file is needed for TLS, got {path!r}")
            if lst.require_client_cert and not (lst.transport == "tls" and lst.client_ca_file):
                raise ConfigError(f"listeners[{i}].require_client_cert", "needs transport = \"tls\" and client_ca_file")
        have = {lst.transport for lst in self.listeners}
        for i, t in enumerate(self.trunks):
            if t.transport != "udp" and t.transport not in have:
                raise ConfigError(f"trunks[{i}].transport", f"{t.transport} needs a [[sip.listeners]] entry with "
                                  f"transport = \"{t.transport}\" (the Contact calls come back to)")
        if self.srtp == "required" and not self.srtp_allow_insecure_signalling and \
                not any(lst.transport == "tls" for lst in self.listeners):
            raise ConfigError("srtp", 'srtp = "required" takes SDES keys only over TLS: add a [[sip.listeners]] '
                              'entry with transport = "tls" (or set srtp_allow_insecure_signalling = true)')
        if self.tls_ca_file and not os.access(self.tls_ca_file, os.R_OK):
            raise ConfigError("tls_ca_file", f"not a readable file: {self.tls_ca_file!r}")
        if self.trunk and self.trunk not in names:
            _trunk("trunk", self.trunk)
        if self.public_host:
            try:
                ipaddress.ip_address(self.public_host)
            except ValueError:
                raise ConfigError("public_host", "expected an IP address (it is the SDP's c= address)") from None

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "sip") -> SipConfig:
        raw = dict(table or {})
        for key in ("users", "trunks"):  # [[sip.users]], [[sip.trunks]]: secret_env/_file/_credential, never inline
            entries = raw.get(key)
            if isinstance(entries, list):
                raw[key] = [_entry_secret(e, f"{where}.{key}[{i}]") for i, e in enumerate(entries)]
        return from_table(cls, raw, where)

    def trunk_named(self, name: str) -> SipTrunk | None:
        return next((t for t in self.trunks if t.name == name), None)

    @property
    def user_agents(self) -> dict[str, str]:
        """Request-URI user (and digest username) -> the agent its calls reach."""
        if isinstance(self.users, dict):
            return self.users
        return {u.name: u.agent for u in self.users}

    def user_secret(self, name: str) -> str | None:
        """The digest secret of user ``name``; None for no such user or one without a secret."""
        if isinstance(self.users, dict):
            return None
        return next((u.secret or None for u in self.users if u.name == name), None)

    @property
    def advertised_host(self) -> str:
        return self.public_host or self.host

    @property
    def srtp_policy(self) -> SrtpPolicy:
        """``srtp`` and ``srtp_allow_insecure_signalling`` as the SDP layer takes them."""
        return SrtpPolicy(self.srtp, self.srtp_allow_insecure_signalling)

    @property
    def transactions_per_source(self) -> int:
        """``max_transactions_per_source``, its 0 resolved: an eighth of ``max_transactions``."""
        return self.max_transactions_per_source or max(1, self.max_transactions // 8)


@dataclass(frozen=True, slots=True)
class WsRoute:
    """One WebSocket path: ``protocol`` (a WebSocket transport of
    :data:`WEBSOCKET_PROTOCOLS`, each a row of :data:`brisvox.gateway.transports.TRANSPORTS`) and the agent it serves.

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


@section
class _RouteTable:
    """One ``[[websocket.routes]]`` entry as written in the file (see :class:`WsRoute`)."""

    path: Annotated[str, Field(pattern=r"^/")]
    protocol: str
    agent: str = "default"
    agents: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.path.rstrip("/") == HEALTHZ_PATH:
            raise ConfigError("path", f"{HEALTHZ_PATH} is the listener's health check, not a route")
        if self.protocol not in WEBSOCKET_PROTOCOLS:
            raise ConfigError("protocol", f"expected one of {', '.join(WEBSOCKET_PROTOCOLS)}, got {self.protocol!r}")
        _agent("agent", self.agent)
        for j, name in enumerate(self.agents):
            _agent(f"agents[{j}]", name)


def _routes(routes_raw: Any) -> tuple[WsRoute, ...]:
    """``[[websocket.routes]]`` -> routes (errors keyed relative to ``routes``)."""
    if not isinstance(routes_raw, list | tuple):
        raise ConfigError("", "expected an array of tables")
    routes = []
    for i, r in enumerate(routes_raw):
        if isinstance(r, WsRoute):  # built in code
            routes.append(r)
            continue
        if not isinstance(r, dict):
            raise ConfigError(f"[{i}]", "expected a table {path, protocol, agent, agents}")
        t = from_table(_RouteTable, r, f"[{i}]")
        routes.append(WsRoute(t.path.rstrip("/") or "/", t.protocol, t.agent, tuple(dict.fromkeys(t.agents))))
    return tuple(routes)


def _twilio_control(cfg: Any) -> None:
    """The Twilio REST and webhook keys of ``[websocket]`` (docs/CONFIGURATION.md)."""
    if cfg.twilio_account_sid and not re.match(r"^AC[0-9a-fA-F]{32}$", cfg.twilio_account_sid):
        raise ConfigError("twilio_account_sid", "expected AC followed by 32 hex digits")
    if cfg.twilio_account_sid and not cfg.twilio_auth_token:
        raise ConfigError("twilio_auth_token", "required with twilio_account_sid (the REST API's password)")
    if not re.match(r"^https?://[^/\s]+$", cfg.twilio_api_base):
        raise ConfigError("twilio_api_base", "expected http(s)://host[:port] without a path")
    path = cfg.twiml_path
    status = path.rstrip("/") + "/status"  # the status callbacks' (brisvox/gateway/control/twilio_status.py)
    if path and (not re.match(r"^/[A-Za-z0-9/_.-]*$", path) or HEALTHZ_PATH in (path, status)
                 or any(r.path in (path, status) for r in cfg.routes)):
        raise ConfigError("twiml_path", f"expected a path starting with / that is neither {HEALTHZ_PATH} nor a route's "
                          "(nor is its /status)")
    if cfg.twilio_from and not re.match(r"^\+[1-9][0-9]{1,14}$", cfg.twilio_from):
        raise ConfigError("twilio_from", "expected an E.164 number (+ and 2 to 15 digits)")
    if cfg.twilio_require_stream_token and not path:
        raise ConfigError("twilio_require_stream_token", "needs twiml_path: only the gateway's own webhook issues "
                          "stream tokens (set it false when you serve the TwiML yourself)")


@section
class WebSocketConfig:
    """``[websocket]``: the WebSocket server (Twilio Media Streams and native).

    Invariants (checked when it is built): a listener on a non-loopback
    address has a credential for every protocol it routes (``native_secret``
    for native, Telnyx, Vonage and Exotel routes, ``twilio_auth_token`` for Twilio routes,
    ``plivo_auth_token`` for Plivo routes) unless
    ``allow_unauthenticated`` says otherwise; the per-source limits are >= 0
    (0: no limit)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: Port = 8765
    routes: tuple[WsRoute, ...] = DEFAULT_ROUTES
    max_message_bytes: Positive = 262144  # a larger frame closes the connection (1009)
    max_send_buffer_bytes: Positive = 262144  # per connection; beyond it outbound audio is dropped, counted
    native_secret: str = ""  # native routes: the static secret, and the key of signed tokens
    twilio_auth_token: str = ""  # validate X-Twilio-Signature when set
    plivo_auth_token: str = ""  # validate X-Plivo-Signature-V3 when set
    public_url: str = Field(default="", pattern=r"^((wss?|https?)://[^/]+)?$")  # scheme://host the signature was computed over (default wss://<Host>)
    # Twilio call control (transfer, hang-up) through the REST API: the account's SID (plain;
    # the API's password is twilio_auth_token), the API's origin, each request's timeout
    twilio_account_sid: str = ""
    twilio_api_base: str = "https://api.twilio.com"
    twilio_api_timeout_s: float = Field(default=4.0, gt=0, le=30)  # two attempts stay within the agent's 9.5 s wait for a TransferResult
    twiml_path: str = ""  # POST here answers Twilio's incoming-call webhook with TwiML ("": none)
    twilio_from: str = ""  # outbound Twilio calls (dial --via twilio): the caller id, E.164 ("": none)
    # webhook POSTs per source IP, moving 1 s window (HTTP 429 beyond; 0: no limit)
    twiml_requests_per_s: int = Field(default=10, ge=0)
    # a Twilio stream must carry the one-time token the webhook put in its TwiML (unset: true when
    # twiml_path is set; true needs twiml_path; false: a stream without one is let in, its callSid trusted)
    twilio_require_stream_token: bool | None = None
    twilio_stream_token_ttl_s: float = Field(default=30.0, gt=0, le=600)  # from the webhook's answer to the stream's start
    twilio_stream_tokens_max: int = Field(default=1024, ge=1, le=1_000_000)  # issued, not yet expired; beyond: HTTP 503
    allow_unauthenticated: bool = False  # lab only: a non-loopback listener without credentials
    allowed_origins: tuple[str, ...] = ()  # Origin values let in ("*": any); no Origin is always let in
    handshakes_per_s: int = Field(default=20, ge=0)  # per source IP, moving 1 s window (HTTP 429 beyond; 0: no limit)
    max_connections_per_source: int = Field(default=200, ge=0)  # open connections per source IP (HTTP 503 beyond; 0: no limit)
    # accepted, not upgraded (brisvox/gateway/ws/half_open.py): all ("auto": an eighth of the soft
    # RLIMIT_NOFILE at listener start, 16..4096; at the cap the oldest is reset) and per TCP peer
    # (beyond: the new one is reset; 0: no limit; trusted proxies exempt)
    max_half_open: int | Literal["auto"] = "auto"
    max_half_open_per_source: int = Field(default=64, ge=0, le=1_000_000)
    # per connection after the handshake (brisvox/gateway/ws/inbound.py; close 1008 beyond; 0: no limit)
    max_frames_per_s: int = Field(default=1000, ge=0)  # frames of any kind (a media stream sends 50)
    max_bytes_per_s: int = Field(default=1_048_576, ge=0)  # bytes read (native PCM16 at 48 kHz: 96 KB/s)
    max_control_frames_per_s: int = Field(default=20, ge=0)  # pings, pongs, close
    # load balancers (HAProxy) whose X-Forwarded-For names the client: the per-source limits key on it
    trusted_proxies: tuple[str, ...] = ()
    start_timeout_s: PositiveS = 10.0  # close a connection that never sends start
    media_timeout_s: float = Field(default=20.0, ge=0)  # a live call with no inbound media this long is closed 1000 (0: never)
    # signed tokens (native, Telnyx, Vonage, Exotel, the playground): the longest lifetime (exp - iat) let in,
    # and how many used ones are remembered until they expire (a replay is refused 401; beyond: 503)
    max_token_ttl_s: float = Field(default=3600.0, gt=0, le=7 * 86400)
    spent_tokens_max: int = Field(default=65536, ge=1, le=1_000_000)
    # a loopback listener trusts its clients (true): a route without its credential is open and the playground
    # mints tokens without one; false (default): loopback is like any other address (docs/SECURITY.md)
    trust_loopback: bool = False
    native_rates: tuple[int, ...] = NATIVE_RATES
    # a live call survives malformed messages (counted, dropped) up to this many within fault_window_s
    fault_max: int = Field(default=DEFAULT_MAX_FAULTS, ge=0, le=MAX_FAULTS_LIMIT)
    fault_window_s: float = Field(default=DEFAULT_WINDOW_S, gt=0, le=MAX_WINDOW_S)
    hangup_on_error: bool = False  # the first malformed message of a live call ends it
    # the browser playground (GET /playground, brisvox/gateway/ws/playground.py): unset = on only when
    # host is a loopback address; true on any other address needs native_secret
    playground: bool | None = None
    # the listener serves the playground only: its token POST needs no credential, every route is refused
    # (404); the routes (native only) name the agents the playground reaches
    playground_only: bool = False

    @field_validator("routes", mode="before")
    @classmethod
    def _parse_routes(cls, value: Any) -> tuple[WsRoute, ...]:
        return _routes(value)

    @field_validator("max_half_open", mode="before")
    @classmethod
    def _max_half_open(cls, value: Any) -> int | Literal["auto"]:
        if value == "auto":
            return "auto"
        if type(value) is not int or not 1 <= value <= 1_000_000:
            raise ConfigError("", f'expected "auto" or an integer within 1..1000000, got {value!r}')
        return value

    @field_validator("max_bytes_per_s")
    @classmethod
    def _max_bytes_per_s(cls, value: int, info: ValidationInfo) -> int:
        size = info.data.get("max_message_bytes", 0)
        if 0 < value < size:
            raise ConfigError("", f"must be 0 or at least max_message_bytes ({size}): one message "
                              "of the largest size would close its connection")
        return value

    def __post_init__(self) -> None:  # cross-key and format checks; keys relative to [websocket]
        for i, rate in enumerate(self.native_rates):
            if rate not in NATIVE_RATES:
                raise ConfigError(f"native_rates[{i}]", f"unsupported rate {rate} ({NATIVE_RATES})")
        _twilio_control(self)
        _networks("trusted_proxies", self.trusted_proxies)
        for i, origin in enumerate(self.allowed_origins):
            if origin != "*" and not re.match(r"^[a-z][a-z0-9+.-]*://[^/\s]+$|^null$", origin, re.I):
                raise ConfigError(f"allowed_origins[{i}]",
                                  f"expected scheme://host[:port] (as browsers send it) or \"*\", got {origin!r}")
        if self.enabled and not is_loopback(self.host) and not self.allow_unauthenticated:
            for key, proto in self.missing_credentials():
                raise ConfigError(key, f"required: websocket.host {self.host!r} is not a loopback address and a "
                                  f"route serves {proto} (set websocket.{key}, or websocket.allow_unauthenticated "
                                  "= true for a lab)")
        for i, r in enumerate(self.routes):  # the playground's paths (brisvox/gateway/ws/playground.py)
            if r.path == "/playground" or r.path.startswith("/playground/"):
                raise ConfigError(f"routes[{i}].path", "/playground is the browser playground's, not a route")
        if self.trust_loopback and not is_loopback(self.host):
            raise ConfigError("trust_loopback", f"websocket.host {self.host!r} is not a loopback address")
        if self.playground_only and (self.playground is False or any(r.protocol != "native" for r in self.routes)):
            raise ConfigError("playground_only", "needs the playground on and native routes only (they name its agents)")
        if self.playground and self.enabled and not is_loopback(self.host) and not self.native_secret:
            raise ConfigError("playground", f"needs websocket.native_secret: websocket.host {self.host!r} is not "
                              "a loopback address (the playground lets whoever loads its page place calls)")

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "websocket") -> WebSocketConfig:
        # secrets (brisvox/config/secrets.py): each key of SECRET_KEYS["websocket"] may be given as
        # <key>_env, <key>_file or <key>_credential; the value read replaces those forms here.
        raw = resolve_secrets(dict(table or {}), where, SECRET_KEYS["websocket"])
        return from_table(cls, raw, where)

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
        if "asterisk_ws" in protos and not self.native_secret:  # chan_websocket's Basic password or ?token=
            out.append(("native_secret", "asterisk_ws"))
        if "freeswitch" in protos and not self.native_secret:  # mod_audio_stream's Bearer or ?token=
            out.append(("native_secret", "freeswitch"))
        if "plivo" in protos and not self.plivo_auth_token:
            out.append(("plivo_auth_token", "plivo"))
        return out

    @property
    def stream_token_required(self) -> bool:
        """``twilio_require_stream_token``, unset resolved: required when ``twiml_path`` is set."""
        req = self.twilio_require_stream_token
        return bool(self.twiml_path) if req is None else req

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


AUDIOSOCKET_RATES = (8000, 16000, 24000, 32000, 44100, 48000)  # AudioSocket's slin kinds the gateway carries


@section
class AudioSocketConfig:
    """``[audiosocket]``: Asterisk's AudioSocket (``AudioSocket()`` app, ``Dial(AudioSocket/...)``), a TCP listener.

    Invariants (checked when it is built): the protocol has no authentication, so ``allow`` (the
    source networks a connection may come from) is never empty, and a listener on a non-loopback
    address refuses to start with an ``allow`` that admits the whole Internet
    (:func:`brisvox.config.exposure.wide_networks`: a public network wider than a /8 or a /16)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: Port = 9092
    allow: tuple[str, ...] = ("127.0.0.0/8", "::1/128")  # source networks a connection may come from
    agent: str = "default"  # the agent every AudioSocket call reaches
    rate: int = 8000  # the slin rate Asterisk sends (8000: the AudioSocket() app); audio of another rate is refused
    max_message_bytes: int = Field(default=8192, ge=16, le=65535)  # a longer payload length ends the connection
    first_message_s: PositiveS = 5.0  # a connection without its UUID message this long is closed
    media_timeout_s: float = Field(default=20.0, ge=0)  # a call without inbound audio this long is hung up (0: never)
    max_connections: int = Field(default=1024, ge=1, le=1_000_000)  # open connections (beyond: closed at accept)
    max_connections_per_source: int = Field(default=64, ge=1, le=1_000_000)  # open connections per source address

    def __post_init__(self) -> None:
        from brisvox.config.exposure import wide_networks

        _networks("allow", self.allow)
        _agent("agent", self.agent)
        if self.rate not in AUDIOSOCKET_RATES:
            raise ConfigError("rate", f"expected one of {AUDIOSOCKET_RATES}, got {self.rate}")
        if not self.allow:
            raise ConfigError("allow", "empty: AudioSocket has no authentication, the allow list is its only gate")
        wide = wide_networks(self.allow)
        if self.enabled and not is_loopback(self.host) and wide:
            raise ConfigError("allow", f"admits {', '.join(wide)}, the whole Internet, on the AudioSocket listener "
                              f"{self.host}:{self.port} (audiosocket.host): AudioSocket has no authentication, "
                              "so anyone reaching the port places agent calls. Narrow audiosocket.allow to your "
                              "Asterisk servers' addresses (e.g. allow = [\"10.0.0.5/32\"]) or bind "
                              "audiosocket.host to 127.0.0.1 (docs/SECURITY.md, \"AudioSocket\")")

    @classmethod
    def from_section(cls, table: dict[str, Any] | None, where: str = "audiosocket") -> AudioSocketConfig:
        return from_table(cls, table, where)


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's sections together, as the gateway core takes them."""

    gateway: GatewayConfig = GatewayConfig()
    sip: SipConfig = SipConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    audiosocket: AudioSocketConfig = AudioSocketConfig()

    @classmethod
    def from_tables(cls, tables: dict[str, Any]) -> GatewaySettings:
        return cls(
            GatewayConfig.from_section(tables.get("gateway")),
            SipConfig.from_section(tables.get("sip")),
            WebSocketConfig.from_section(tables.get("websocket")),
            AudioSocketConfig.from_section(tables.get("audiosocket")),
        )
