"""The courier: the outbound role's service that delivers the outbox's rows to their endpoints.

Owns :class:`Courier` (``async run(stop)``, a service of :mod:`brisvox.outbound.process`) and
:class:`Endpoints`, the book from a row's endpoint id (scope, URL) to the endpoint's
settings and secret: the daemon's ``[[webhooks]]`` (secrets read at parse time) and every
agent file's (``agent:<name>``: the file re-read when it changed, its secrets read from
their source then).

One attempt: the URL's host is resolved again and refused when it reaches a private
address without ``allow_private`` (a name may change after ``brisvoxd check``); the
connection then goes to the address that was checked, never to a second resolution
(:func:`pinned`: the request is addressed to that IP, with the URL's ``Host`` header and,
for ``https://``, its host name for SNI and the certificate check, httpcore's
``sni_hostname``), so a name that answers a public address to the check and a private one
to the connect (DNS rebinding) cannot reach the private one; the body is POSTed with ``Content-Type: application/json``, ``Brisvox-Signature`` (signed at the
attempt: :mod:`~brisvox.outbound.webhooks.signing`), ``Brisvox-Event-Id`` and
``Brisvox-Event-Type``; redirects are not followed; the whole attempt, connect to last
byte, is bounded by the endpoint's ``timeout_s``, and at most :data:`MAX_RESPONSE` bytes
of the answer are read (the rest is not). A 2xx answer delivers the row; anything else
(a status, a timeout, a refused connection, a refused address) is a failed attempt,
scheduled again by :func:`~brisvox.outbound.webhooks.outbox.after_failure` (Retry-After
honoured), or given up at the horizon.

Invariants: at most ``concurrency`` attempts in flight; the outbox is only touched from
one thread (a single-thread executor, so a busy file never stalls the loop); a row is
claimed with a lease longer than its attempt can last, so a courier that dies mid-attempt
leaves it due again; on stop, attempts in flight get :data:`STOP_GRACE_S`, then are
cancelled (their rows come due again when the lease ends: at least once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import os
import time
import tomllib
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table
from brisvox.outbound.webhooks.config import (
    DAEMON_SCOPE,
    AgentWebhook,
    Resolver,
    WebhookSettings,
    literal_address,
    refused_addresses,
    resolve_host,
    url_syntax,
)
from brisvox.outbound.webhooks.outbox import Outbox, Row, after_failure
from brisvox.outbound.webhooks.signing import HEADER, sign
from brisvox.runtime.histogram import Histogram
from brisvox.runtime.log_limit import LogLimiter
from brisvox.runtime.retry import RetryPolicy, parse_retry_after

log = logging.getLogger("brisvox.webhooks.courier")

MAX_RESPONSE = 64 * 1024  # bytes of an answer read at most
CONCURRENCY = 8
LEASE_MARGIN_S = 30.0
IDLE_POLL_S = 0.25  # how often the file is looked at when nothing is due (other processes insert)
STOP_GRACE_S = 2.0
RESOLVE_TIMEOUT_S = 5.0
PRUNE_EVERY_S = 3600.0
COUNTS_EVERY_S = 1.0
USER_AGENT = "brisvox-webhooks/1"
# seconds from an event's creation to its delivery: 50 ms to a day
DELIVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What an attempt needs of one webhook."""

    url: str
    secret: str = field(repr=False)
    settings: WebhookSettings

    def policy(self) -> RetryPolicy:
        s = self.settings
        return RetryPolicy(base=s.retry_base_s, multiplier=2.0, cap=s.retry_cap_s, jitter="full")


class Endpoints:
    """Endpoint id (scope, url) -> :class:`Endpoint`; None when it is no longer configured."""

    def __init__(self, cfg: Any, env: Any = None) -> None:
        self.cfg = cfg
        self.env = env
        self.daemon = {h.url: Endpoint(h.url, h.secret, h) for h in cfg.section("webhooks").hooks}
        self.agents_dir = Path(cfg.section("agents").agents_path(getattr(cfg, "path", None)))
        self._agents: dict[str, tuple[float, dict[str, Endpoint]]] = {}
        self.errors: dict[str, str] = {}  # scope -> why its file gave no endpoints

    def get(self, scope: str, url: str) -> Endpoint | None:
        if scope == DAEMON_SCOPE:
            return self.daemon.get(url)
        if scope.startswith("agent:"):
            return self.agent_endpoints(scope[len("agent:"):]).get(url)
        return None

    def agent_endpoints(self, name: str) -> dict[str, Endpoint]:
        """The ``[[webhooks]]`` of the agent file ``name`` (re-read when it changed), by URL."""
        if not name or "/" in name or name.startswith("."):
            return {}
        path = self.agents_dir / f"{name}.toml"
        try:
            mtime = path.stat().st_mtime
        except OSError as e:
            self.errors[f"agent:{name}"] = f"{path}: {e.strerror}"
            return {}
        hit = self._agents.get(name)
        if hit is not None and hit[0] == mtime:
            return hit[1]
        book: dict[str, Endpoint] = {}
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            for i, entry in enumerate(data.get("webhooks") or []):
                where = f"{path.name}: webhooks[{i}]"
                hook = from_table(AgentWebhook, entry, where)
                book[hook.url] = Endpoint(hook.url, hook.resolve_secret(where, self.env), hook)
            self.errors.pop(f"agent:{name}", None)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as e:
            self.errors[f"agent:{name}"] = str(e)[:300]
            book = {}
        self._agents[name] = (mtime, book)
        return book


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    status: int = 0
    retry_after: float | None = None
    kind: str = ""  # the failure's kind for the metrics: status, timeout, connect, address, ...


class Courier:
    """See the module docstring. ``clock``: wall seconds (rows outlive the process)."""

    name = "webhooks"

    def __init__(self, cfg: Any, path: str | os.PathLike[str], *, concurrency: int = CONCURRENCY,
                 clock: Callable[[], float] = time.time, resolve: Resolver = resolve_host,
                 transport: Any = None, random: Callable[[], float] | None = None) -> None:
        self.path = Path(path)
        self.endpoints = Endpoints(cfg)
        self.concurrency = concurrency
        self.clock = clock
        self.resolve = resolve
        self.transport = transport
        self.random = random
        self.log_limit = LogLimiter(log)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")
        self.outbox: Outbox | None = None
        self.in_flight: set[asyncio.Task[None]] = set()
        self.counters: dict[str, int] = {"attempts": 0, "delivered": 0, "failed": 0, "gave_up": 0, "unknown_endpoint": 0}
        self.failures: dict[str, int] = {}  # by kind
        self.latency = Histogram(DELIVERY_BUCKETS)
        self.state: dict[str, Any] = {"pending": 0, "delivered": 0, "gave_up": 0, "oldest_pending_age_s": 0.0}
        self._wake = asyncio.Event()

    async def db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def run(self, stop: asyncio.Event) -> None:
        import httpx

        self.outbox = await self.db(Outbox, self.path, "NORMAL")  # settles: see the outbox's durability note
        outbox = self.outbox
        await self.db(outbox.prune, self.clock())
        next_prune = time.monotonic() + PRUNE_EVERY_S
        next_counts = 0.0
        client = httpx.AsyncClient(follow_redirects=False, trust_env=False, transport=self.transport,
                                   headers={"User-Agent": USER_AGENT},
                                   limits=httpx.Limits(max_connections=self.concurrency * 2,
                                                       max_keepalive_connections=self.concurrency))
        log.info("webhook courier: outbox %s, %d daemon endpoint(s)", self.path, len(self.endpoints.daemon))
        try:
            while not stop.is_set():
                free = self.concurrency - len(self.in_flight)
                rows = await self.db(outbox.claim, self.clock(), free, self.lease_s()) if free > 0 else []
                for row in rows:
                    t = asyncio.create_task(self.attempt(client, row))
                    self.in_flight.add(t)
                    t.add_done_callback(self._done)
                if time.monotonic() >= next_counts:  # a scan of the table: once a second
                    self.state = await self.db(outbox.counts, self.clock())
                    next_counts = time.monotonic() + COUNTS_EVERY_S
                if time.monotonic() >= next_prune:
                    await self.db(outbox.prune, self.clock())
                    next_prune = time.monotonic() + PRUNE_EVERY_S
                if rows and len(self.in_flight) < self.concurrency:
                    continue  # more may be due
                await self._idle(stop, outbox)
        finally:
            await self._stop_attempts()
            await client.aclose()
            await self.db(outbox.close)
            self.pool.shutdown(wait=True)

    def lease_s(self) -> float:
        longest = max([e.settings.timeout_s for e in self.endpoints.daemon.values()] or [0.0])
        return max(60.0, longest) + RESOLVE_TIMEOUT_S + LEASE_MARGIN_S

    async def _idle(self, stop: asyncio.Event, outbox: Outbox) -> None:
        due = await self.db(outbox.next_due)
        wait = IDLE_POLL_S if due is None else min(IDLE_POLL_S, max(0.0, due - self.clock()))
        self._wake.clear()
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=max(0.01, wait), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def _done(self, t: asyncio.Task[None]) -> None:
        self.in_flight.discard(t)
        self._wake.set()  # a slot is free
        if not t.cancelled() and t.exception() is not None:
            log.error("webhook attempt failed unexpectedly: %r", t.exception())

    async def _stop_attempts(self) -> None:
        if self.in_flight:
            await asyncio.wait(list(self.in_flight), timeout=STOP_GRACE_S)
        for t in list(self.in_flight):
            t.cancel()
        if self.in_flight:
            await asyncio.wait(list(self.in_flight), timeout=1.0)

    async def attempt(self, client: Any, row: Row) -> None:
        """One delivery attempt of ``row``, settled in the outbox."""
        assert self.outbox is not None
        ep = self.endpoints.get(row.scope, row.url)
        now = self.clock()
        if ep is None:
            self.counters["unknown_endpoint"] += 1
            self.counters["gave_up"] += 1
            self.log_limit("unknown_endpoint", "webhook %s %s: %s %s is no longer configured; given up",
                           row.type, row.event_id, row.scope, row.url[:80])
            await self.db(self.outbox.give_up, row.seq, now, "endpoint no longer configured", False)
            return
        self.counters["attempts"] += 1
        out = await self.post(client, ep, row)
        now = self.clock()
        if out.ok:
            self.counters["delivered"] += 1
            self.latency.observe(max(0.0, now - row.created))
            await self.db(self.outbox.delivered, row.seq, now)
            return
        self.counters["failed"] += 1
        self.failures[out.kind] = self.failures.get(out.kind, 0) + 1
        nxt = after_failure(row.created, row.attempts + 1, now, ep.settings.horizon_s, ep.policy(),
                            out.retry_after, self.random)
        if nxt is None:
            self.counters["gave_up"] += 1
            log.warning("webhook %s %s to %s given up after %d attempts (horizon %.0fs): %s", row.type,
                        row.event_id, ep.url[:80], row.attempts + 1, ep.settings.horizon_s, out.error)
            await self.db(self.outbox.give_up, row.seq, now, out.error)
        else:
            self.log_limit(f"attempt:{row.scope}:{ep.url[:80]}", "webhook to %s failed (%s); retrying", ep.url[:80],
                           out.error, level=logging.INFO)
            await self.db(self.outbox.retry, row.seq, nxt, out.error)

    async def check_address(self, ep: Endpoint) -> tuple[str, str | None]:
        """(the address to connect to, why the endpoint's host may not be reached now or None).

        The host is resolved once; every address must be public unless ``allow_private``;
        the first one is the one the attempt connects to (:func:`pinned`)."""
        host, _ = url_syntax(ep.url)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                addresses = literal_address(host) or await loop.run_in_executor(None, self.resolve, host)
        except (OSError, TimeoutError) as e:
            return "", f"{host} does not resolve: {e}"
        if not addresses:
            return "", f"{host} does not resolve: no address"
        bad = [] if ep.settings.allow_private else refused_addresses(addresses)
        if bad:
            return "", f"{host} resolves to {', '.join(bad[:3])} (not public; allow_private is false)"
        return addresses[0], None

    async def post(self, client: Any, ep: Endpoint, row: Row) -> Outcome:
        import httpx

        address, refused = await self.check_address(ep)
        if refused is not None:
            return Outcome(False, refused, kind="address")
        headers = {"Content-Type": "application/json", HEADER: sign(ep.secret, row.body, int(self.clock())),
                   "Brisvox-Event-Id": row.event_id, "Brisvox-Event-Type": row.type}
        url, extensions = pinned(ep.url, address, headers)
        timeout = ep.settings.timeout_s
        try:
            async with asyncio.timeout(timeout):
                async with client.stream("POST", url, content=row.body, headers=headers, extensions=extensions,
                                         timeout=httpx.Timeout(timeout)) as resp:
                    got = 0
                    async for chunk in resp.aiter_raw():
                        got += len(chunk)
                        if got >= MAX_RESPONSE:
                            break  # the rest is not read: the connection is closed, not reused
                    status = resp.status_code
                    retry_after = parse_retry_after(resp.headers.get("retry-after"))
        except TimeoutError:
            return Outcome(False, f"no answer within {timeout:g}s", kind="timeout")
        except httpx.TimeoutException as e:
            return Outcome(False, f"timeout: {type(e).__name__}", kind="timeout")
        except httpx.ConnectError as e:
            return Outcome(False, f"connect: {str(e)[:200] or type(e).__name__}", kind="connect")
        except httpx.HTTPError as e:
            return Outcome(False, f"{type(e).__name__}: {str(e)[:200]}", kind="http")
        if 200 <= status < 300:
            return Outcome(True, status=status)
        return Outcome(False, f"HTTP {status}", status=status, retry_after=retry_after, kind="status")

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "in_flight": len(self.in_flight), "failures": dict(self.failures),
                "outbox": dict(self.state), "latency": self.latency.wire(),
                "log_suppressed": dict(self.log_limit.suppressed)}


def pinned(url: str, address: str, headers: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """``url`` addressed to ``address`` (an IP the check passed), and the request's extensions.

    The URL's host goes into ``headers`` as ``Host`` (with a non-default port) and, for
    ``https://``, into the ``sni_hostname`` extension: httpcore sends it as SNI and checks
    the server's certificate against it, so TLS verification stays against the name.
    A host that is already an IP literal is left as it is."""
    host, parts = url_syntax(url)
    if literal_address(host):
        return url, {}
    ip = ipaddress.ip_address(address.split("%")[0])
    netloc = f"[{ip}]" if ip.version == 6 else str(ip)
    default = 443 if parts.scheme == "https" else 80
    if parts.port is not None and parts.port != default:
        netloc += f":{parts.port}"
        headers["Host"] = f"{host}:{parts.port}"
    else:
        headers["Host"] = host
    extensions: dict[str, Any] = {"sni_hostname": host} if parts.scheme == "https" else {}
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), extensions


def service(rt: Any) -> Courier | None:
    """The courier of the outbound role (None when no webhook is configured anywhere)."""
    from brisvox.outbound.webhooks.outbox import outbox_path
    from brisvox.outbound.webhooks.wanted import webhooks_wanted
    from brisvox.runtime.paths import state_dir

    if not webhooks_wanted(rt.config):
        return None
    return Courier(rt.config, outbox_path(state_dir(rt.config)))
