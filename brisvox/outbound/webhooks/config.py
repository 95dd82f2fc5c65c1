"""Webhook endpoints: ``[[webhooks]]`` of ``brisvoxd.toml`` and of an agent file, and their URL rules.

Owns the keys of one webhook (docs/CONFIGURATION.md "Webhooks"): ``url``, ``events``
(default: every event), the signing secret, ``allow_private``, ``timeout_s`` and
``horizon_s``; the daemon-wide array (:class:`WebhooksConfig`, registered for the
top-level ``[[webhooks]]`` in :mod:`brisvox.config.sections`); and the refusals
``brisvoxd check`` and ``brisvoxd start`` apply (:func:`check_webhooks`).

The secret: in ``brisvoxd.toml`` it is read at parse time from ``secret_env`` /
``secret_file`` / ``secret_credential`` (:mod:`brisvox.config.secrets`, as
``[[sip.users]]`` does), never inline; in an agent file the same three keys are kept as
given (an agent file never holds a secret) and :meth:`AgentWebhook.resolve_secret` reads
the source when the courier needs it.

URL rules (:func:`url_problems`):

* ``https://`` only, but ``http://`` to a loopback host (``127.0.0.0/8``, ``::1``,
  ``localhost``); no user:password in the URL, no fragment, at most 2000 characters;
* every address the host resolves to must be public (``ipaddress``'s ``is_global``:
  not private, loopback, link-local, shared, reserved, multicast), unless
  ``allow_private = true``; a loopback receiver therefore needs ``allow_private``
  too. A name that does not resolve where the check runs is a warning (the courier
  checks again before each delivery and retries).

Invariants: parsing either returns frozen sections or raises :class:`ConfigError`
naming the key (``webhooks[1].url``); a URL is given once per scope (the daemon's, or one
agent's); nothing here logs a secret (``repr=False``).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import Field

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, section
from brisvox.config.secrets import resolve_secrets

EventName = Literal["call.started", "call.answered", "call.ended", "tool.called", "campaign.row.done"]
EVENTS: tuple[EventName, ...] = ("call.started", "call.answered", "call.ended", "tool.called", "campaign.row.done")
NEVER_INLINE = "never inline: use secret_env, secret_file or secret_credential"
MAX_URL = 2000
DAEMON_SCOPE = "daemon"

Resolver = Callable[[str], list[str]]


def agent_scope(agent: str) -> str:
    """The outbox scope of an agent file's webhooks."""
    return f"agent:{agent}"


def url_syntax(url: str) -> tuple[str, urllib.parse.SplitResult]:
    """(host, parts) of a webhook URL, or ConfigError("url", why) when its form is refused."""
    if not url or len(url) > MAX_URL or any(c.isspace() for c in url):
        raise ConfigError("url", f"expected an https:// URL of at most {MAX_URL} characters without spaces")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise ConfigError("url", f"not a URL: {e}") from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host:
        raise ConfigError("url", f"expected https://host/..., got {url[:80]!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError("url", "no user or password in the URL: the receiver checks the signature")
    if parts.fragment:
        raise ConfigError("url", "no #fragment in a webhook URL")
    if parts.scheme == "http" and not is_loopback_host(host):
        raise ConfigError("url", f"http:// only to a loopback host (127.0.0.1, ::1, localhost); use https:// "
                          f"for {host}")
    return host, parts


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def literal_address(host: str) -> list[str]:
    """``[host]`` when the host is an IP address literal, else []."""
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        return []


def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (a literal: itself); OSError when it does not resolve."""
    if lit := literal_address(host):
        return lit
    infos = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def refused_addresses(addresses: Iterable[str]) -> list[str]:
    """The addresses a webhook may not reach without ``allow_private`` (not globally routable)."""
    out = []
    for a in addresses:
        ip = ipaddress.ip_address(a.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_global:
            out.append(str(ip))
    return out


def url_problems(url: str, allow_private: bool, resolve: Resolver | None = resolve_host) -> tuple[list[str], list[str]]:
    """(errors, warnings) of one URL: its form, and (``resolve`` not None) where it points."""
    try:
        host, _ = url_syntax(url)
    except ConfigError as e:
        return [e.message], []
    if resolve is None or allow_private:
        return [], []
    try:
        addresses = literal_address(host) or resolve(host)
    except OSError as e:
        return [], [f"{host} does not resolve here ({e.strerror or e}); the courier checks again at delivery"]
    bad = refused_addresses(addresses)
    if bad:
        return [f"{host} resolves to {', '.join(bad[:4])}, not a public address (set allow_private = true for "
                "a receiver on a private network or on this host)"], []
    return [], []


@section
class WebhookSettings:
    """What every webhook has, in the daemon's file and in an agent file."""

    url: Annotated[str, Field(min_length=1, max_length=MAX_URL)]
    events: tuple[EventName, ...] = Field(default=EVENTS, min_length=1, max_length=len(EVENTS))
    allow_private: bool = False  # the URL may resolve to a private or loopback address
    timeout_s: float = Field(default=10.0, ge=0.5, le=60.0)  # one delivery attempt, connect to last byte
    horizon_s: float = Field(default=86400.0, ge=1.0, le=30 * 86400.0)  # retried this long, then given up
    retry_base_s: float = Field(default=1.0, ge=0.05, le=3600.0)  # the first retry's delay (then doubling)
    retry_cap_s: float = Field(default=600.0, ge=0.05, le=86400.0)  # no retry waits longer

    def __post_init__(self) -> None:
        url_syntax(self.url)
        if self.retry_cap_s < self.retry_base_s:
            raise ConfigError("retry_cap_s", f"must be at least retry_base_s ({self.retry_base_s:g})")
        if len(set(self.events)) != len(self.events):
            raise ConfigError("events", "an event is listed twice")


@section
class Webhook(WebhookSettings):
    """One ``[[webhooks]]`` entry of ``brisvoxd.toml``; ``secret`` read from its source at parse time."""

    secret: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        WebhookSettings.__post_init__(self)
        if not self.secret:
            raise ConfigError("secret_env", "a webhook needs its signing secret: secret_env, secret_file or "
                              "secret_credential")


SecretRef = Annotated[str, Field(min_length=1, max_length=4096)]


@section
class AgentWebhook(WebhookSettings):
    """One ``[[webhooks]]`` entry of an agent file: the secret's source, never the secret."""

    secret_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] | None = None
    secret_file: SecretRef | None = None
    secret_credential: SecretRef | None = None

    def __post_init__(self) -> None:
        WebhookSettings.__post_init__(self)
        given = [k for k in ("secret_env", "secret_file", "secret_credential") if getattr(self, k)]
        if len(given) != 1:
            raise ConfigError("secret_env", "give exactly one of secret_env, secret_file, secret_credential")

    def resolve_secret(self, where: str, env: Mapping[str, str] | None = None) -> str:
        """The secret its source holds (ConfigError naming ``where``.<key> when it cannot be read)."""
        table = {k: v for k in ("secret_env", "secret_file", "secret_credential") if (v := getattr(self, k))}
        secret: str = resolve_secrets(table, where, ("secret",), env)["secret"]
        return secret


@section
class WebhooksConfig:
    """The daemon-wide ``[[webhooks]]`` array (empty: none). Each entry is validated on its own
    (:func:`from_section`), so an error names ``webhooks[<i>].<key>``."""

    hooks: tuple[Webhook, ...] = Field(default=(), max_length=64)

    ARRAY = True  # brisvox.config.daemon.parse_config: this top-level key is an array of tables

    @classmethod
    def from_section(cls, table: Any, where: str = "webhooks") -> WebhooksConfig:
        if isinstance(table, Mapping) and not table:
            return cls()
        if not isinstance(table, list):
            raise ConfigError(where, "expected an array of tables [[webhooks]]")
        hooks = []
        for i, entry in enumerate(table):
            key = f"{where}[{i}]"
            if not isinstance(entry, Mapping):
                raise ConfigError(key, "expected a table")
            if entry.get("secret") not in (None, ""):
                raise ConfigError(f"{key}.secret", NEVER_INLINE)
            hooks.append(from_table(Webhook, resolve_secrets(entry, key, ("secret",)), key))
        duplicate_urls(hooks, where)
        return cls(hooks=tuple(hooks))


def duplicate_urls(hooks: Sequence[WebhookSettings], where: str) -> None:
    seen: set[str] = set()
    for i, h in enumerate(hooks):
        if h.url in seen:
            raise ConfigError(f"{where}[{i}].url", f"{h.url[:80]!r} is given twice")
        seen.add(h.url)


def check_webhooks(cfg: Any, resolve: Resolver | None = resolve_host,
                   agent_hooks: Iterable[tuple[str, Sequence[AgentWebhook]]] = ()) -> tuple[list[str], list[str]]:
    """(errors, warnings) of every webhook the daemon config ``cfg`` and the agent files
    (``agent_hooks``: (agent name, its hooks)) declare, one line each naming the key."""
    errors: list[str] = []
    warnings: list[str] = []
    named: list[tuple[str, WebhookSettings]] = [(f"webhooks[{i}]", h) for i, h in
                                                enumerate(cfg.section("webhooks").hooks)]
    for agent, hooks in agent_hooks:
        named += [(f"agent {agent!r}: webhooks[{i}]", h) for i, h in enumerate(hooks)]
    for key, hook in named:
        errs, warns = url_problems(hook.url, hook.allow_private, resolve)
        errors += [f"{key}.url: {m}" for m in errs]
        warnings += [f"{key}.url: {m}" for m in warns]
    return errors, warnings
