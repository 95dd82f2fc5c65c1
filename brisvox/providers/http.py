"""The shared HTTP clients of the provider adapters: ONE pooled client per origin.

Owns how every HTTP/SSE adapter (OpenAI-compatible, OpenAI, Anthropic, Gemini,
OpenAI speech) reaches its vendor, so that no call pays a TCP + TLS handshake
on its first request and a ``warm()`` warms a pool the other calls share:

* :func:`shared_client` hands out one ``httpx.AsyncClient`` per
  (event loop, origin, HTTP/2, connect timeout, keep-alive, verify) from a process-wide map, so
  every call of an agent process reuses the same keep-alive connections and a
  ``warm()`` really warms the pool the next request uses. Credentials are
  never part of the client: adapters send them in per-request headers, so
  different keys share connections. The map holds at most
  :data:`MAX_CLIENTS` entries; a new one at a full map evicts the least
  recently used (counted in :data:`POOL_STATS`).
* HTTP/2 is enabled for ``https`` origins (ALPN decides; many concurrent LLM
  streams multiplex onto one TLS connection); plaintext origins (Ollama,
  vLLM on loopback, the test servers) speak HTTP/1.1 with keep-alive.
* Library choice: httpx (+ h2). It has explicit connect/read/write/pool
  timeouts, a bounded connection pool, streamed responses that release the
  connection on close, and HTTP/2; aiohttp (the other candidate) has no
  HTTP/2 client.
* :func:`status_error` maps an HTTP status to the stable
  :class:`~brisvox.providers.base.ProviderError` kinds (400/404/413/422
  ``bad_request`` and 401/403 ``auth`` are not retryable; 429
  ``rate_limited`` and 5xx ``server`` are). :func:`transport_error` maps
  httpx exceptions. Error bodies are read bounded and never logged whole.
  ``Retry-After`` is parsed by :func:`brisvox.runtime.retry.parse_retry_after`
  (re-exported here as :func:`parse_retry_after`).
* :func:`post_stream` is the one streamed POST of every adapter: the shared
  client, per-request timeouts, a non-200 status mapped by
  :func:`status_error` (its body read bounded), and every httpx error raised
  while the response is open (the handshake or any later chunk) mapped by
  :func:`transport_error`; leaving the ``async with`` closes the response
  (which releases the connection).
* Keep-alive (:mod:`brisvox.providers.keepalive`): TCP keepalive on every socket (idle
  30 s, interval 10 s, 3 probes), an HTTP/2 PING every 20 s on an idle connection (10 s to
  answer, else it is closed) and an idle pool expiry of 300 s, so the first turn after a
  quiet minute reuses the connection ``warm()`` opened.
* ``verify``: an ``ssl.SSLContext`` trusting a private CA (a self-hosted endpoint, the
  tests' loopback server); default: the system's CAs. It is part of the client's key.
* Proxy variables of the environment are ignored (``trust_env=False``):
  a voice call must not detour through a proxy nobody configured for it.

Clients are bound to the event loop that created them; a client of a loop
that has closed is dropped from the map on the next lookup.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from brisvox.providers.base import ProviderError
from brisvox.providers.keepalive import KEEPALIVE, PING_STATS, Keepalive, KeepaliveTransport
from brisvox.runtime.retry import parse_retry_after

MAX_CLIENTS = 64
MAX_ERROR_BODY = 4096


@dataclass(slots=True)
class PoolStats:
    built: int = 0
    reused: int = 0
    evicted: int = 0


POOL_STATS = PoolStats()

_Key = tuple[int, str, bool, float, Keepalive, int]
# the verify context is held with its client: its id in the key stays unique while the entry lives
_clients: OrderedDict[_Key, tuple[weakref.ref[asyncio.AbstractEventLoop], httpx.AsyncClient, Any]] = OrderedDict()


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (default ports made explicit)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ProviderError("bad_request", f"not an http(s) URL: {url!r}", retryable=False)
    port = u.port or (443 if u.scheme == "https" else 80)
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{u.scheme}://{host}:{port}"


def shared_client(url: str, *, connect_timeout: float = 5.0, max_connections: int = 100,
                  keepalive: Keepalive = KEEPALIVE, verify: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """The process's client for ``url``'s origin on the running loop (built once)."""
    loop = asyncio.get_running_loop()
    origin = origin_of(url)
    http2 = origin.startswith("https://")
    key: _Key = (id(loop), origin, http2, connect_timeout, keepalive, id(verify) if verify is not None else 0)
    got = _clients.get(key)
    if got is not None:
        ref, client, _ = got
        if ref() is loop and not client.is_closed:
            _clients.move_to_end(key)
            POOL_STATS.reused += 1
            return client
        del _clients[key]
    _prune()
    while len(_clients) >= MAX_CLIENTS:
        _, (_, old, _) = _clients.popitem(last=False)
        POOL_STATS.evicted += 1
        _close_later(old)
    client = httpx.AsyncClient(
        transport=KeepaliveTransport(keepalive=keepalive, max_connections=max_connections, http2=http2,
                                     verify=verify if verify is not None else True),
        trust_env=False,
        timeout=httpx.Timeout(connect=connect_timeout, read=30.0, write=5.0, pool=5.0),
        follow_redirects=False,
    )
    _clients[key] = (weakref.ref(loop), client, verify)
    POOL_STATS.built += 1
    return client


def _prune() -> None:
    for key, (ref, client, _) in list(_clients.items()):
        loop = ref()
        if loop is None or loop.is_closed() or client.is_closed:
            del _clients[key]


def _close_later(client: httpx.AsyncClient) -> None:
    try:
        asyncio.get_running_loop().create_task(client.aclose())
    except RuntimeError:
        pass


async def close_all() -> None:
    """Close the clients of the running loop (process shutdown, tests)."""
    loop = asyncio.get_running_loop()
    for key, (ref, client, _) in list(_clients.items()):
        if ref() is loop:
            del _clients[key]
            await client.aclose()


def pool_entries() -> int:
    return len(_clients)


def provider_http_stats() -> dict[str, int]:
    """The process's shared-client counters (the agent reports them: ``provider_http.*``)."""
    return {"clients": len(_clients), "clients_built": POOL_STATS.built, "clients_reused": POOL_STATS.reused,
            "clients_evicted": POOL_STATS.evicted, "pings_sent": PING_STATS.sent,
            "pings_answered": PING_STATS.answered, "pings_unanswered": PING_STATS.unanswered,
            "goaway_closed": PING_STATS.goaway}


def timeout(read: float, connect: float = 5.0, write: float = 5.0) -> httpx.Timeout:
    """Per-request timeouts: ``read`` bounds the wait for each chunk of a stream."""
    return httpx.Timeout(connect=connect, read=read, write=write, pool=connect)


def status_error(status: int, body: bytes = b"", retry_after: float | None = None) -> ProviderError:
    """``retry_after`` (a parsed ``Retry-After``) is kept on 429 and 5xx errors."""
    detail = f"HTTP {status}"
    text = body[:MAX_ERROR_BODY].decode("utf-8", "replace").strip()
    if text:
        detail += ": " + text[:300]
    if status in (401, 403):
        return ProviderError("auth", detail, retryable=False)
    if status == 429:
        return ProviderError("rate_limited", detail, retryable=True, retry_after=retry_after)
    if status in (400, 404, 405, 409, 413, 415, 422):
        return ProviderError("bad_request", detail, retryable=False)
    if status >= 500:
        return ProviderError("server", detail, retryable=True, retry_after=retry_after)
    return ProviderError("protocol", detail, retryable=False)


def transport_error(e: BaseException) -> ProviderError:
    if isinstance(e, httpx.ConnectTimeout | httpx.PoolTimeout):
        return ProviderError("connect", f"{type(e).__name__}")
    if isinstance(e, httpx.TimeoutException):
        return ProviderError("timeout", f"{type(e).__name__}")
    if isinstance(e, httpx.ConnectError):
        return ProviderError("connect", str(e)[:200])
    if isinstance(e, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return ProviderError("closed", f"{type(e).__name__}: {str(e)[:200]}")
    if isinstance(e, httpx.HTTPError):
        return ProviderError("protocol", f"{type(e).__name__}: {str(e)[:200]}")
    return ProviderError("connect", f"{type(e).__name__}: {str(e)[:200]}")


async def read_bounded(resp: httpx.Response, limit: int = MAX_ERROR_BODY) -> bytes:
    """At most ``limit`` bytes of a streamed response body (the rest is discarded)."""
    buf = bytearray()
    try:
        async for chunk in resp.aiter_bytes():
            buf += chunk
            if len(buf) >= limit:
                break
    except httpx.HTTPError:
        pass
    return bytes(buf[:limit])


@asynccontextmanager
async def post_stream(url: str, payload: bytes, headers: dict[str, str], *, read_timeout: float,
                      connect_timeout: float) -> AsyncIterator[httpx.Response]:
    """POST ``payload`` to ``url`` on the shared client and hold the streamed 200 response open.

    A non-200 status raises :func:`status_error`; an httpx error raised inside the
    block (reading the body included) is re-raised as :func:`transport_error`."""
    client = shared_client(url, connect_timeout=connect_timeout)
    try:
        async with client.stream("POST", url, content=payload, headers=headers,
                                 timeout=timeout(read_timeout, connect_timeout)) as resp:
            if resp.status_code != 200:
                raise status_error(resp.status_code, await read_bounded(resp),
                                   parse_retry_after(resp.headers.get("retry-after")))
            yield resp
    except httpx.HTTPError as e:
        raise transport_error(e) from None


async def warm_origin(url: str, budget: float, connect_timeout: float = 5.0,
                      headers: dict[str, str] | None = None, *, keepalive: Keepalive = KEEPALIVE,
                      verify: ssl.SSLContext | None = None) -> None:
    """Open a pooled connection to ``url``'s origin with an unauthenticated HEAD.

    Uses the same shared client as the adapter's requests (same ``connect_timeout``
    key); ``budget`` bounds this warm-up. Any HTTP status counts as warm (the point
    is the TCP/TLS handshake); transport failures raise ProviderError."""
    client = shared_client(url, connect_timeout=connect_timeout, keepalive=keepalive, verify=verify)
    b = min(budget, connect_timeout)
    try:
        resp = await client.head(origin_of(url) + "/", headers=headers or {}, timeout=timeout(b, b))
        await resp.aclose()
    except httpx.HTTPError as e:
        raise transport_error(e) from None


def merge_headers(*parts: dict[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in parts:
        if p:
            out.update(p)
    return out


def json_or_none(body: bytes) -> Any:
    import orjson

    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def drain(chunks: Any, limit: int = 65536, wait: float = 0.5) -> bool:
    """Read what is left of a response after its last event (bounded), so the
    connection goes back to the pool instead of being closed. False if the rest
    did not end within ``limit`` bytes / ``wait`` seconds (the connection is
    then dropped by the response's close; nothing else is lost)."""
    n = 0
    try:
        async with asyncio.timeout(wait):
            async for c in chunks:
                n += len(c)
                if n > limit:
                    return False
    except (TimeoutError, httpx.HTTPError):
        return False
    return True
