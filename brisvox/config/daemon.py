"""The daemon configuration: ``brisvoxd.toml`` loaded with tomllib, fully validated.

Owns the ``[daemon]`` section (runtime and state directories, child counts,
restart policy, health probes, shutdown timing, memory limits, metrics,
logging) and the assembly of the whole file: every other top-level section is
parsed by the class registered for it in ``brisvox/config/sections.py``.

Invariants:

* Loading either returns a complete :class:`DaemonConfig` or raises
  :class:`ConfigError` naming the key (``daemon.workers``, ``gateway.port``);
  unknown sections and unknown keys are errors, never ignored.
* ``config.section(name)`` returns the parsed frozen dataclass of a section,
  default-constructed when the file does not have it.
* Nothing here opens sockets or creates directories; :mod:`brisvox.runtime.paths`
  turns the settings into directories.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from brisvox.config.env_values import resolve_env_networks
from brisvox.config.errors import ConfigError
from brisvox.config.lines import key_lines, line_of, split_key
from brisvox.config.schema import from_table, section

CONFIG_ENV = "BRISVOX_CONFIG"
SYSTEM_CONFIG = Path("/etc/brisvox/brisvoxd.toml")
ROLES = ("gateway", "worker", "agent", "outbound")


@section
class RestartPolicy:
    """How crashed children come back (``[daemon.restart]``)."""

    backoff_initial_s: float = Field(default=0.1, ge=0.0, le=60.0)
    backoff_max_s: float = Field(default=30.0, ge=0.0, le=3600.0)
    backoff_reset_s: float = Field(default=60.0, ge=1.0)
    boot_failures_max: int = Field(default=3, ge=1, le=1000)
    storm_restarts: int = Field(default=10, ge=1)
    storm_window_s: float = Field(default=60.0, ge=1.0)
    storm_delay_s: float = Field(default=10.0, ge=0.0)


@section
class HealthPolicy:
    """Handshake and liveness probes (``[daemon.health]``)."""

    init_timeout_s: float = Field(default=60.0, ge=0.5)
    ping_interval_s: float = Field(default=1.0, ge=0.05, le=60.0)
    pong_timeout_s: float = Field(default=5.0, ge=0.1)
    heartbeat_timeout_s: float = Field(default=10.0, ge=0.1)
    orphan_exit_s: float = Field(default=5.0, ge=0.0)

    def __post_init__(self) -> None:
        if self.pong_timeout_s <= self.ping_interval_s:
            raise ConfigError("pong_timeout_s", "must be longer than ping_interval_s")


@section
class ShutdownPolicy:
    """Stop and drain timing (``[daemon.shutdown]``)."""

    ack_timeout_s: float = Field(default=2.0, ge=0.05)
    grace_s: float = Field(default=10.0, ge=0.0)
    drain_timeout_s: float = Field(default=900.0, ge=0.0)
    term_timeout_s: float = Field(default=5.0, ge=0.05)


@section
class MemoryLimit:
    """PSS thresholds of one role in MiB; 0 disables the threshold."""

    warn_mb: int = Field(default=0, ge=0)
    limit_mb: int = Field(default=0, ge=0)

    def __post_init__(self) -> None:
        if self.warn_mb and self.limit_mb and self.warn_mb > self.limit_mb:
            raise ConfigError("warn_mb", f"must not exceed limit_mb ({self.limit_mb})")


@section
class MemoryPolicy:
    """Per-role PSS limits (``[daemon.memory]``): warn, then restart."""

    check_interval_s: float = Field(default=5.0, ge=0.2)
    gateway: MemoryLimit = field(default_factory=lambda: MemoryLimit(512, 1024))
    worker: MemoryLimit = field(default_factory=lambda: MemoryLimit(2048, 3072))
    agent: MemoryLimit = field(default_factory=lambda: MemoryLimit(1024, 2048))
    outbound: MemoryLimit = field(default_factory=lambda: MemoryLimit(256, 512))

    def for_role(self, role: str) -> MemoryLimit:
        lim: MemoryLimit = getattr(self, role)
        return lim


@section
class MetricsSettings:
    """The supervisor's HTTP endpoint (``[daemon.metrics]``)."""

    listen: str = "127.0.0.1:9464"

    def __post_init__(self) -> None:
        if self.listen:
            parse_listen(self.listen, "listen")

    def address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen, "listen") if self.listen else None


@section
class LogSettings:
    """Log lines of every process (``[daemon.log]``)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "text"] = "auto"  # auto: text on a terminal, else json


@section
class DaemonSection:
    """``[daemon]``: what the supervisor itself needs."""

    runtime_dir: str = ""
    state_dir: str = ""
    workers: int = Field(default=2, ge=1, le=256)
    agents: int = Field(default=1, ge=1, le=256)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    shutdown: ShutdownPolicy = field(default_factory=ShutdownPolicy)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    log: LogSettings = field(default_factory=LogSettings)
    # start (and pass `brisvoxd check`) although a public SIP listener's [sip] allow admits the
    # whole Internet (brisvox/config/exposure.py); only behind a firewall that filters the sources
    unsafe_open_sip: bool = False

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> DaemonSection:
        return from_table(cls, table, where)


def parse_listen(value: str, key: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` -> (host, port); only loopback addresses are allowed."""
    import ipaddress

    host, sep, port_s = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ConfigError(key, f"expected 'host:port', got {value!r}")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(key, f"expected a loopback IP address, got {host!r}") from None
    if not ip.is_loopback:
        raise ConfigError(key, f"metrics listen only on loopback (127.0.0.0/8, ::1), got {host}")
    return host, int(port_s)


def _load_class(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


# what makes the daemon start its ``outbound`` child (brisvox/outbound/process.py): any of these says so
OUTBOUND_WANTED: tuple[str, ...] = ("brisvox.outbound.webhooks.wanted:webhooks_wanted",
                                     "brisvox.outbound.campaign.config:campaigns_wanted")


def section_parsers() -> dict[str, str]:
    from brisvox.config.sections import SECTION_PARSERS

    return {"daemon": "brisvox.config.daemon:DaemonSection", **SECTION_PARSERS}


@dataclass(frozen=True)
class DaemonConfig:
    """The whole parsed file. ``daemon`` is the ``[daemon]`` section."""

    daemon: DaemonSection = field(default_factory=DaemonSection)
    sections: Mapping[str, Any] = field(default_factory=dict)
    path: str | None = None

    def section(self, name: str) -> Any:
        """The parsed dataclass of section ``name`` (defaults when absent)."""
        if name == "daemon":
            return self.daemon
        if name in self.sections:
            return self.sections[name]
        parsers = section_parsers()
        if name not in parsers:
            raise KeyError(f"no config section {name!r} is registered")
        return _load_class(parsers[name]).from_section({}, name)

    def with_counts(self, workers: int | None = None, agents: int | None = None) -> DaemonConfig:
        """Override the child counts (``brisvoxd start --workers N --agents M``)."""
        d = self.daemon
        if workers is not None:
            if workers < 1:
                raise ConfigError("daemon.workers", f"--workers must be >= 1, got {workers}")
            d = dataclasses.replace(d, workers=workers)
        if agents is not None:
            if agents < 1:
                raise ConfigError("daemon.agents", f"--agents must be >= 1, got {agents}")
            d = dataclasses.replace(d, agents=agents)
        return dataclasses.replace(self, daemon=d)

    def count(self, role: str) -> int:
        if role == "outbound":
            return 1 if self.wants_outbound else 0
        return {"gateway": 1, "worker": self.daemon.workers, "agent": self.daemon.agents}[role]

    @functools.cached_property
    def wants_outbound(self) -> bool:
        """Whether the daemon runs its ``outbound`` child: when something it hosts is configured
        (:data:`OUTBOUND_WANTED`: each ``module:function(config) -> bool``). Decided once per
        loaded configuration (a reload loads a new one)."""
        return any(_load_class(ref)(self) for ref in OUTBOUND_WANTED)


def parse_config(data: Mapping[str, Any], path: str | None = None) -> DaemonConfig:
    """A parsed TOML document -> :class:`DaemonConfig` (raises ConfigError with ``path``)."""
    try:
        parsers = section_parsers()
        parsed: dict[str, Any] = {}
        for name, table in data.items():
            if name not in parsers:
                raise ConfigError(name, f"unknown section (known: {', '.join(sorted(parsers))})")
            cls = _load_class(parsers[name])
            if isinstance(table, list) and getattr(cls, "ARRAY", False):  # [[webhooks]]: an array of tables
                parsed[name] = cls.from_section(table, name)
                continue
            if not isinstance(table, dict):
                raise ConfigError(name, f"expected a table [{name}], got a {type(table).__name__}")
            table = resolve_env_networks(table, name)  # [sip] allow_env (brisvox/config/env_values.py)
            parsed[name] = cls.from_section(table, name)
        daemon = parsed.pop("daemon", None) or DaemonSection()
        return DaemonConfig(daemon=daemon, sections=parsed, path=path)
    except ConfigError as e:
        raise e.with_path(path) if path else e from None


def load_config(path: str | os.PathLike[str] | None) -> DaemonConfig:
    """Read and validate ``path``; ``None`` gives the defaults."""
    if path is None:
        return DaemonConfig()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError("(file)", f"cannot read: {e.strerror}", str(p)) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError("(file)", f"not UTF-8: {e}", str(p)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("(syntax)", str(e), str(p)) from None
    try:
        return parse_config(data, str(p))
    except ConfigError as e:  # name the line too: <file>:<line>: <key>: <message>
        raise e.with_path(str(p), line_of(key_lines(raw.decode("utf-8")), split_key(e.key))) from None


def find_config(explicit: str | None = None) -> Path | None:
    """``--config`` wins, then ``$BRISVOX_CONFIG``, then /etc/brisvox/brisvoxd.toml."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    if SYSTEM_CONFIG.is_file():
        return SYSTEM_CONFIG
    return None
