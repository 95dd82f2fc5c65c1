"""The agent service: a WebSocket server that brisvox dials, once per call."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import ssl as ssl_module
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ._auth import (
    CLOCK_WINDOW_S,
    NONCE_CAPACITY,
    NONCE_FULL,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    NonceCache,
    verify,
)
from .errors import Refuse
from .session import EVENTS, MAX_FRAME_BYTES, PROTOCOL_VERSION, Event, Link, Session, dumps
from .tools import CallInfo, Tool, ToolFn, make_tool

log = logging.getLogger("brisvox_agent")

MAX_TOOLS = 64
EventHandler = Callable[[Session, Event], Awaitable[None]]
SessionHook = Callable[[Session], Awaitable[Iterable[str] | None] | Iterable[str] | None]
F = TypeVar("F", bound=ToolFn)
H = TypeVar("H", bound=EventHandler)
S = TypeVar("S", bound=SessionHook)


class Agent:
    """An agent service. Declare tools with :meth:`tool`, events with :meth:`on`, then
    ``await agent.serve()`` (forever) or ``async with agent: ...``.

    ``secret`` is the shared secret of the agent file's ``[agent_link]`` (or name its
    environment variable with ``secret_env``). ``port=0`` binds a free port (see ``.port``).
    The upgrade is refused (401, the reason in the body, counted in ``handshakes_refused``)
    unless its signature matches, its timestamp is within ``clock_window`` seconds (30) of
    this clock and its nonce is new within that window; with ``nonce_capacity`` live nonces
    held, new handshakes get 503 until the oldest leave the window.
    """

    def __init__(self, secret: str | bytes | None = None, *, secret_env: str | None = None,
                 host: str = "127.0.0.1", port: int = 9100, path: str | None = "/brisvox",
                 ssl: ssl_module.SSLContext | None = None, max_concurrency: int = 32,
                 command_timeout: float = 5.0, accept_timeout: float = 4.0,
                 offer_timeout: float = 10.0, max_result_bytes: int = MAX_FRAME_BYTES - 1024,
                 clock_window: float = CLOCK_WINDOW_S, ping_interval: float = 10.0,
                 ping_timeout: float = 20.0, resume_grace: float = 60.0,
                 drain_timeout: float = 10.0, nonce_capacity: int = NONCE_CAPACITY) -> None:
        if secret is None and secret_env:
            secret = os.environ.get(secret_env)
        if not secret:
            raise ValueError("the shared secret is empty (pass secret= or set secret_env's variable)")
        self._secret = secret
        self.host, self._port, self.path, self.ssl = host, port, path, ssl
        self.max_concurrency = max_concurrency
        self.command_timeout = command_timeout
        self.accept_timeout = accept_timeout
        self.offer_timeout = offer_timeout
        self.max_result_bytes = max_result_bytes
        self.clock_window = clock_window
        self._nonces = NonceCache(clock_window, nonce_capacity)  # a replayed handshake is refused
        self.handshakes_refused: Counter[str] = Counter()  # refused upgrades by reason (brisvox_agent._auth)
        self.ping_interval, self.ping_timeout = ping_interval, ping_timeout
        self.resume_grace = resume_grace
        self.drain_timeout = drain_timeout  # event handlers and SideEffects after a close
        self.tools: dict[str, Tool] = {}
        self.sessions: dict[str, Session] = {}  # live (or dropped, within resume_grace)
        self._handlers: dict[str, list[EventHandler]] = {}
        self._session_hook: SessionHook | None = None
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._expiry: dict[str, asyncio.TimerHandle] = {}

    # -- declarations ----------------------------------------------------------------------

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(self, fn: None = None, /, *, name: str | None = None, description: str | None = None,
             kind: str = "read_only", timeout_ms: int = 5000, filler_after_ms: int | None = None,
             repeatable: bool = False, confirm: bool = False,
             parameters: Mapping[str, Any] | None = None, offer: bool = True) -> Callable[[F], F]: ...

    def tool(self, fn: F | None = None, /, *, name: str | None = None, description: str | None = None,
             kind: str = "read_only", timeout_ms: int = 5000, filler_after_ms: int | None = None,
             repeatable: bool = False, confirm: bool = False,
             parameters: Mapping[str, Any] | None = None, offer: bool = True) -> F | Callable[[F], F]:
        """Declare ``async def f(ctx, **args)`` (or ``f(ctx, args: dict)``) as a tool.

        The schema is ``parameters`` or derived from the type hints; the description is
        ``description`` or the docstring. ``offer=False``: declared only in the sessions
        whose ``on_session`` hook names it.
        """

        def register(f: F) -> F:
            t = make_tool(f, name=name, description=description, kind=kind, timeout_ms=timeout_ms,
                          filler_after_ms=filler_after_ms, repeatable=repeatable, confirm=confirm,
                          parameters=parameters, offer=offer)
            if t.name in self.tools:
                raise ValueError(f"tool {t.name!r} is declared twice")
            if len(self.tools) >= MAX_TOOLS:
                raise ValueError(f"at most {MAX_TOOLS} tools per agent service")
            self.tools[t.name] = t
            return f

        return register(fn) if fn is not None else register

    def on(self, event: str) -> Callable[[H], H]:
        """Handle a call event (``async def h(session, event)``); subscribed because handled."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}: one of {EVENTS}")

        def register(h: H) -> H:
            fn: Any = h
            if not inspect.iscoroutinefunction(fn):
                raise TypeError("an event handler is an `async def h(session, event)`")
            self._handlers.setdefault(event, []).append(h)
            return h

        return register

    def on_session(self, hook: S) -> S:
        """``hook(session)`` runs on each offer: ``raise Refuse(reason)`` to refuse the call, or
        return the names of extra (``offer=False``) tools to declare in this session."""
        self._session_hook = hook
        return hook

    # -- the server ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is not None:
            for sock in self._server.sockets:
                return int(sock.getsockname()[1])
        return self._port

    @property
    def url(self) -> str:
        return f"{'wss' if self.ssl else 'ws'}://{self.host}:{self.port}{self.path or '/'}"

    async def start(self) -> None:
        if self._server is not None:
            return
        # The hard cap of the socket is above the protocol's 1 MiB: a frame between the two
        # is answered with an `error` (too_large) and the call goes on.
        self._server = await serve(self._handle, self.host, self._port, ssl=self.ssl,
                                   process_request=self._process_request,
                                   max_size=4 * MAX_FRAME_BYTES, ping_interval=self.ping_interval,
                                   ping_timeout=self.ping_timeout, close_timeout=5)
        log.info("agent service listening on %s", self.url)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        running = [t for t in self._tasks if not t.done()]
        if running:  # SideEffects finish their effect (bounded); ReadOnly ones were cancelled
            _, late = await asyncio.wait(running, timeout=self.drain_timeout)
            for t in late:
                t.cancel()
        for handle in self._expiry.values():
            handle.cancel()
        self._expiry.clear()

    async def serve(self) -> None:
        """Serve until cancelled."""
        await self.start()
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.close()

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        if self.path is not None and urlsplit(request.path).path != self.path:
            return conn.respond(HTTPStatus.NOT_FOUND, "not found\n")
        why = verify(self._secret, request.headers.get(SESSION_HEADER),
                     request.headers.get(SIGNATURE_HEADER), window=self.clock_window, nonces=self._nonces)
        if why is not None:
            status = HTTPStatus.SERVICE_UNAVAILABLE if why == NONCE_FULL else HTTPStatus.UNAUTHORIZED
            self.handshakes_refused[why] += 1
            n = self.handshakes_refused[why]
            if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a flood of refusals logs a handful of lines
                log.warning("handshake refused (%d): %s (%d so far)", status.value, why, n)
            return conn.respond(status, f"{why}\n")
        return None

    # -- one connection --------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        signed = ws.request.headers.get(SESSION_HEADER, "")
        try:
            offer = await asyncio.wait_for(self._offer(ws), self.offer_timeout)
        except (TimeoutError, ConnectionClosed):
            with contextlib.suppress(Exception):
                await ws.close(1008, "no session.offer")
            return
        sid = offer.get("session")
        if sid != signed or offer.get("v") != PROTOCOL_VERSION:
            why = ("the offer's session is not the signed one" if sid != signed
                   else f"protocol version {offer.get('v')!r} is not supported (1)")
            await self._refuse(ws, str(sid), why)
            return
        session, fresh = self._session_for(offer, signed)
        if fresh:
            extra = await self._decide(ws, session)
            if extra is None:
                return
            session.tools = self._tools_for(session, extra)
            session.subscribed = tuple(sorted(self._handlers))
        link = Link(self, ws, session)
        old = session._link
        if old is not None:  # a re-dial while the old connection looked alive: it is over
            old.close()
            self._keep(asyncio.create_task(old.ws.close(1001, "superseded")))
        session._link = link
        session.ready.clear()
        self._cancel_expiry(session.id)
        self.sessions[session.id] = session
        try:
            await link.send({"type": "session.accept", "session": session.id,
                             "tools": [t.declaration() for t in session.tools.values()],
                             "subscribe": list(session.subscribed)})
            await link.run()
        except ConnectionClosed:
            pass
        finally:
            link.close()
            if session.hung_up:
                self._forget(session)
            elif session._link is None:
                self._expire_later(session)

    async def _offer(self, ws: ServerConnection) -> dict[str, Any]:
        while True:
            message = await ws.recv()
            frame: Any = None
            if isinstance(message, str) and len(message) <= MAX_FRAME_BYTES:
                with contextlib.suppress(ValueError):
                    frame = json.loads(message)
            if isinstance(frame, dict) and frame.get("type") == "session.offer" \
                    and isinstance(frame.get("session"), str):
                return frame
            await ws.send(dumps({"type": "error", "code": "bad_message",
                                 "message": "the first frame is a session.offer", "ref": "frame"}))

    def _session_for(self, offer: Mapping[str, Any], sid: str) -> tuple[Session, bool]:
        known = self.sessions.get(sid)
        if offer.get("resume") is True and known is not None and not known.hung_up:
            known.resume = True
            return known, False
        call = offer.get("call")
        local = offer.get("local_tools")
        session = Session(self, sid, CallInfo.from_offer(call if isinstance(call, dict) else {}, sid),
                          resume=offer.get("resume") is True,
                          local_tools=[t for t in local if isinstance(t, str)] if isinstance(local, list) else ())
        return session, True

    async def _decide(self, ws: ServerConnection, session: Session) -> list[str] | None:
        """The hook's extra tool names, or None when the session was refused."""
        if self._session_hook is None:
            return []
        try:
            async with asyncio.timeout(self.accept_timeout):
                out = self._session_hook(session)
                if inspect.isawaitable(out):
                    out = await out
        except Refuse as r:
            await self._refuse(ws, session.id, r.reason)
            return None
        except TimeoutError:
            await self._refuse(ws, session.id, "the service did not decide in time")
            return None
        except Exception:
            log.exception("session %s: the on_session hook raised", session.id)
            await self._refuse(ws, session.id, "the service failed to accept the call")
            return None
        if out is None:
            return []
        if isinstance(out, str):
            return [out]
        return [n for n in out if isinstance(n, str)]

    def _tools_for(self, session: Session, extra: list[str]) -> dict[str, Tool]:
        for n in extra:
            if n not in self.tools:
                log.error("session %s: on_session named %r, which is not a declared tool", session.id, n)
        return {t.name: t for t in self.tools.values() if t.offer or t.name in extra}

    async def _refuse(self, ws: ServerConnection, sid: str, reason: str) -> None:
        log.info("session %s refused: %s", sid, reason)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(dumps({"type": "session.refuse", "session": sid, "reason": reason[:200]}))
            await ws.close(1000, "refused")

    # -- bookkeeping -----------------------------------------------------------------------

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget(self, session: Session) -> None:
        self._cancel_expiry(session.id)
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]

    def _cancel_expiry(self, sid: str) -> None:
        handle = self._expiry.pop(sid, None)
        if handle is not None:
            handle.cancel()

    def _expire_later(self, session: Session) -> None:
        """A dropped session is kept ``resume_grace`` seconds for a re-dial, then forgotten."""
        self._cancel_expiry(session.id)

        def expire() -> None:
            self._expiry.pop(session.id, None)
            if session._link is None:
                self._forget(session)

        self._expiry[session.id] = asyncio.get_running_loop().call_later(self.resume_grace, expire)
