"""One call's session: the commands a service sends into it, and the connection that carries it.

brisvox dials the service once per call (a re-dial of the same session after a drop says
``resume: true``): a :class:`Session` lives for the call, a :class:`Link` for one
connection of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from .errors import CommandError, CommandRefused, CommandTimeout, NotLive, ToolError
from .tools import CallInfo, Tool, ToolContext

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger("brisvox_agent")

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20  # 1 MiB, either way
MAX_SAY_CHARS = 1000
MAX_ERROR_CHARS = 1000
MAX_ID_CHARS = 64  # brisvox's bound on ids
MAX_REASON_CHARS = 200
MAX_TARGET_CHARS = 256
MAX_PENDING_COMMANDS = 64
DIAL_TIMEOUT = 110.0  # a SIP dial is acked once answered: brisvox waits up to 100 s
DIAL_VIA = ("sip", "twilio")
EVENT_QUEUE = 256
ANSWERED_KEPT = 4096  # ids answered, remembered so a result goes once per id
EVENTS = ("user_turn", "bot_turn", "tool_outcome", "hangup")


@dataclass(frozen=True)
class Event:
    """A call event (only those the service subscribed to arrive)."""

    name: str
    epoch: int | None = None
    text: str | None = None
    call_id: str | None = None
    tool: str | None = None
    outcome: str | None = None
    reason: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_frame(cls, frame: Mapping[str, Any]) -> Event:
        def text(k: str) -> str | None:
            v = frame.get(k)
            return v if isinstance(v, str) else None

        epoch = frame.get("epoch")
        return cls(name=str(frame["name"]), epoch=epoch if type(epoch) is int else None,
                   text=text("text"), call_id=text("call_id"), tool=text("tool"),
                   outcome=text("outcome"), reason=text("reason"), raw=dict(frame))


@dataclass(frozen=True)
class Dialed:
    """A call brisvox placed for the service (``dial``): over SIP the new call's ``call_id``
    (answered) and its signalling times in ms after the INVITE (``ringing_at_ms``: the first
    18x, ``progress_at_ms``: the first 18x with early media, ``answered_at_ms``: the 200;
    None when the callee never sent it), through Twilio its ``call_sid`` and Twilio's
    ``status`` (queued)."""

    via: str
    call_id: str = ""
    call_sid: str = ""
    status: str = ""
    ringing_at_ms: int | None = None
    progress_at_ms: int | None = None
    answered_at_ms: int | None = None


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(frame: Mapping[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                      default=_default)


def _bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class Session:
    """A call as the service sees it. ``state`` is yours (kept across re-dials of the call)."""

    def __init__(self, agent: Agent, session_id: str, call: CallInfo, *, resume: bool,
                 local_tools: Iterable[str]) -> None:
        self.agent = agent
        self.id = session_id
        self.call = call
        self.resume = resume
        self.local_tools: tuple[str, ...] = tuple(local_tools)
        self.state: dict[str, Any] = {}
        self.tools: dict[str, Tool] = {}  # declared in the accept
        self.subscribed: tuple[str, ...] = ()
        self.registered: tuple[str, ...] = ()  # from session.ready
        self.refused: tuple[Mapping[str, Any], ...] = ()  # from session.ready
        self.errors: Counter[str] = Counter()  # error frames brisvox sent, by code
        self.ready = asyncio.Event()
        self.hung_up = False
        self.hangup_reason: str | None = None
        self._link: Link | None = None

    @property
    def live(self) -> bool:
        return self._link is not None and not self._link.closed and not self.hung_up

    # -- commands ------------------------------------------------------------------------

    async def command(self, name: str, *, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send a command and wait for its ``command.ack``; raise a CommandError unless ok.
        Returns the ack's fields besides ``type``, ``id`` and ``ok`` (what a ``dial`` made)."""
        link = self._link
        if link is None or link.closed or self.hung_up:
            raise NotLive(name, "the session is not live")
        return await link.command(name, fields, self.agent.command_timeout if timeout is None else timeout)

    async def say(self, text: str, *, timeout: float | None = None) -> None:
        """Say a line into the call."""
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_SAY_CHARS:
            raise CommandError("say", f"the text must be 1..{MAX_SAY_CHARS} characters")
        await self.command("say", text=text, timeout=timeout)

    async def note(self, text: str, *, timeout: float | None = None) -> None:
        """Add a system note to the model's context."""
        if not isinstance(text, str) or not text.strip():
            raise CommandError("note", "the text must not be empty")
        await self.command("note", text=text, timeout=timeout)

    async def transfer(self, target: str, *, timeout: float | None = None) -> None:
        """Transfer the call to one of the agent's transfer targets."""
        if not isinstance(target, str) or not target or len(target) > MAX_TARGET_CHARS:
            raise CommandError("transfer", f"the target must be 1..{MAX_TARGET_CHARS} characters")
        await self.command("transfer", target=target, timeout=timeout)

    async def end_call(self, reason: str = "done", *, timeout: float | None = None) -> None:
        """End the call."""
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise CommandError("end_call", f"the reason is at most {MAX_REASON_CHARS} characters")
        await self.command("end_call", reason=reason, timeout=timeout)

    async def dial(self, target: str, *, agent: str | None = None, via: str = "sip",
                   timeout: float | None = None, trunk: str | None = None) -> Dialed:
        """Have brisvox place a NEW outbound call (the agent file's ``[agent_link] allow_dial`` and
        ``dial_targets`` must allow ``target``); ``agent`` runs it. Over SIP the ack comes once the
        callee answered (so the default ``timeout`` is :data:`DIAL_TIMEOUT`), through Twilio once
        Twilio queued the call. ``trunk``: over SIP, the ``[[sip.trunks]]`` entry to dial through.
        Raises CommandRefused with brisvox's reason (``busy``, ...)."""
        if not isinstance(target, str) or not target or len(target) > MAX_TARGET_CHARS:
            raise CommandError("dial", f"the target must be 1..{MAX_TARGET_CHARS} characters")
        if via not in DIAL_VIA:
            raise CommandError("dial", "via must be sip or twilio")
        fields: dict[str, Any] = {"target": target, "via": via}
        if agent:
            fields["agent"] = agent
        if trunk:
            if via != "sip" or len(trunk) > 32:
                raise CommandError("dial", "a trunk (at most 32 characters) is dialled via sip")
            fields["trunk"] = trunk
        ack = await self.command("dial", timeout=DIAL_TIMEOUT if timeout is None else timeout, **fields)

        def ms(key: str) -> int | None:
            v = ack.get(key)
            return v if type(v) is int and v >= 0 else None

        return Dialed(via=str(ack.get("via") or via), call_id=str(ack.get("call_id") or ""),
                      call_sid=str(ack.get("call_sid") or ""), status=str(ack.get("status") or ""),
                      ringing_at_ms=ms("ringing_at_ms"), progress_at_ms=ms("progress_at_ms"),
                      answered_at_ms=ms("answered_at_ms"))

    async def set_tools(self, names: Iterable[str]) -> None:
        """Narrow the tools offered to the model from its next response on (``tools.set``)."""
        wanted = list(dict.fromkeys(names))
        unknown = [n for n in wanted if n not in self.tools]
        if unknown:
            raise ValueError(f"not declared in this session: {unknown}")
        link = self._link
        if link is None or link.closed or self.hung_up:
            raise NotLive("tools.set", "the session is not live")
        await link.send({"type": "tools.set", "names": wanted})


class Link:
    """One WebSocket connection of a session: reads frames, runs tools, carries commands."""

    def __init__(self, agent: Agent, ws: ServerConnection, session: Session) -> None:
        self.agent = agent
        self.ws = ws
        self.session = session
        self.closed = False
        self.running: dict[str, tuple[asyncio.Task[None], ToolContext, Tool]] = {}
        self.answered: dict[str, None] = {}  # insertion-ordered set, bounded
        self.pending: dict[str, tuple[str, asyncio.Future[dict[str, Any]]]] = {}
        self.events: asyncio.Queue[Event | None] = asyncio.Queue(EVENT_QUEUE)
        self._next_command = 0

    # -- sending ---------------------------------------------------------------------------

    async def send(self, frame: Mapping[str, Any]) -> None:
        await self.ws.send(dumps(frame))

    async def error(self, code: str, message: str, ref: str | None = None) -> None:
        frame: dict[str, Any] = {"type": "error", "code": code, "message": _bounded(message)}
        if ref is not None:
            frame["ref"] = _bounded(ref, MAX_ID_CHARS)
        with contextlib.suppress(ConnectionClosed):
            await self.send(frame)

    async def command(self, name: str, fields: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        if len(self.pending) >= MAX_PENDING_COMMANDS:
            raise CommandError(name, f"{MAX_PENDING_COMMANDS} commands are waiting for their ack")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not self.session.ready.is_set():
            try:
                await asyncio.wait_for(self.session.ready.wait(), timeout)
            except TimeoutError:
                raise CommandTimeout(name, "the session was not ready in time") from None
        self._next_command += 1
        cid = f"k{self._next_command}"
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.pending[cid] = (name, fut)
        try:
            try:
                await self.send({"type": "command", "id": cid, "name": name, **fields})
            except ConnectionClosed:
                raise NotLive(name, "the connection closed") from None
            try:
                return await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise CommandTimeout(name, f"no command.ack within {timeout:g} s") from None
        finally:
            self.pending.pop(cid, None)

    # -- tools -----------------------------------------------------------------------------

    async def on_tool_call(self, frame: Mapping[str, Any]) -> None:
        rid, name, args = frame.get("id"), frame.get("name"), frame.get("arguments", {})
        key, epoch, call_id = frame.get("idempotency_key"), frame.get("epoch"), frame.get("call_id")
        deadline = frame.get("deadline_ms")
        if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_CHARS:
            await self.error("bad_message", "tool.call: id must be a string of 1..64", "tool.call")
            return
        if not (isinstance(name, str) and isinstance(args, dict) and isinstance(key, str)
                and type(epoch) is int and isinstance(call_id, str)
                and (deadline is None or type(deadline) is int)):
            await self.error("bad_message", "tool.call: name, arguments (object), idempotency_key, "
                             "epoch (int) and call_id are required", rid)
            return
        if rid in self.running or rid in self.answered:
            await self.error("bad_message", "tool.call: this id was already called", rid)
            return
        tool = self.session.tools.get(name)
        if tool is None:
            await self._result(rid, {"ok": False, "error": {"message": f"unknown tool {name!r}"}})
            return
        if len(self.running) >= self.agent.max_concurrency:
            await self._result(rid, {"ok": False, "error": {
                "message": f"busy: {self.agent.max_concurrency} tool calls are running"}})
            return
        ctx = ToolContext(session=self.session, id=rid, tool=name, call_id=call_id,
                          idempotency_key=key, epoch=epoch, deadline_ms=deadline)
        task = asyncio.create_task(self._run(tool, ctx, args), name=f"brisvox-tool-{name}-{rid}")
        self.running[rid] = (task, ctx, tool)
        self.agent._keep(task)

    async def _run(self, tool: Tool, ctx: ToolContext, args: Mapping[str, Any]) -> None:
        body: dict[str, Any]
        try:
            try:
                value = await tool.invoke(ctx, args)
            except asyncio.CancelledError:
                if ctx.cancelled.is_set():
                    return  # cancelled by brisvox (or the connection's end): nothing to send
                raise
            except ToolError as e:
                body = {"ok": False, "error": {"message": _bounded(str(e) or "the tool failed")}}
            except Exception as e:
                log.exception("tool %s (%s) raised", tool.name, ctx.id)
                body = {"ok": False, "error": {"message": _bounded(str(e) or type(e).__name__)}}
            else:
                body = {"ok": True, "result": value}
        finally:
            self.running.pop(ctx.id, None)
        await self._result(ctx.id, body, ctx)

    def _encode(self, rid: str, body: Mapping[str, Any]) -> str:
        try:
            text = dumps({"type": "tool.result", "id": rid, **body})
        except (TypeError, ValueError) as e:
            log.error("tool call %s: the result is not JSON: %s", rid, e)
            return dumps({"type": "tool.result", "id": rid, "ok": False,
                          "error": {"message": _bounded(f"the result is not JSON: {e}")}})
        size = len(text.encode())
        if size > self.agent.max_result_bytes:
            log.error("tool call %s: the result is %d bytes", rid, size)
            return dumps({"type": "tool.result", "id": rid, "ok": False, "error": {
                "message": f"the result is too large ({size} bytes, at most {self.agent.max_result_bytes})"}})
        return text

    async def _result(self, rid: str, body: Mapping[str, Any], ctx: ToolContext | None = None) -> None:
        if (ctx is not None and ctx.cancelled.is_set()) or self.closed or rid in self.answered:
            return  # after its cancel, or the connection's end: brisvox would not read it
        self.answered[rid] = None
        while len(self.answered) > ANSWERED_KEPT:
            self.answered.pop(next(iter(self.answered)))
        try:
            await self.ws.send(self._encode(rid, body))
        except ConnectionClosed:
            log.warning("tool result %s not sent: the connection closed", rid)

    def on_tool_cancel(self, frame: Mapping[str, Any]) -> None:
        rid, reason = frame.get("id"), frame.get("reason")
        entry = self.running.get(rid) if isinstance(rid, str) else None
        if entry is None:
            return  # finished already, or never known: nothing to stop
        task, ctx, tool = entry
        ctx.cancel_reason = reason if isinstance(reason, str) else None
        ctx.cancelled.set()
        if tool.kind == "read_only":
            task.cancel()  # a read has no effect to finish; a SideEffect runs to completion

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        worker = asyncio.create_task(self._events(), name=f"brisvox-events-{self.session.id}")
        try:
            while True:
                try:
                    message = await self.ws.recv()
                except ConnectionClosed:
                    break
                frame = await self._parse(message)
                if frame is not None:
                    await self.dispatch(frame)
        except asyncio.CancelledError:
            worker.cancel()
            raise
        finally:
            self.close()
        # brisvox closes right after the hang-up: the handlers still run (bounded), unheard
        try:
            self.events.put_nowait(None)
        except asyncio.QueueFull:
            worker.cancel()
        try:
            await asyncio.wait_for(worker, self.agent.drain_timeout)
        except (TimeoutError, asyncio.CancelledError):
            log.warning("session %s: event handlers cut short at the end of the connection", self.session.id)

    async def _parse(self, message: str | bytes) -> dict[str, Any] | None:
        if isinstance(message, bytes):
            code = "too_large" if len(message) > MAX_FRAME_BYTES else "bad_message"
            await self.error(code, "binary frames are not part of the protocol", "binary")
            return None
        if len(message) > MAX_FRAME_BYTES or (
                len(message) * 4 > MAX_FRAME_BYTES and len(message.encode()) > MAX_FRAME_BYTES):
            await self.error("too_large", f"a frame is at most {MAX_FRAME_BYTES} bytes", "frame")
            return None
        try:
            frame = json.loads(message)
        except ValueError:
            await self.error("bad_message", "not JSON", "frame")
            return None
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            await self.error("bad_message", "a frame is a JSON object with a string type", "frame")
            return None
        return frame

    async def dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "tool.call":
            await self.on_tool_call(frame)
        elif kind == "tool.cancel":
            self.on_tool_cancel(frame)
        elif kind == "event":
            await self.on_event(frame)
        elif kind == "command.ack":
            self.on_ack(frame)
        elif kind == "session.ready":
            self.on_ready(frame)
        elif kind == "error":
            self.on_error(frame)
        elif kind == "session.offer":
            await self.error("bad_message", "this connection's offer was answered already", kind)
        else:
            await self.error("unknown_type", f"unknown type {kind!r}", kind)

    def on_ready(self, frame: Mapping[str, Any]) -> None:
        tools, refused = frame.get("tools"), frame.get("refused")
        s = self.session
        s.registered = tuple(t for t in tools if isinstance(t, str)) if isinstance(tools, list) else ()
        s.refused = tuple(r for r in refused if isinstance(r, dict)) if isinstance(refused, list) else ()
        for r in s.refused:
            log.warning("session %s: brisvox refused the tool %s: %s", s.id, r.get("name"), r.get("error"))
        s.ready.set()

    def on_ack(self, frame: Mapping[str, Any]) -> None:
        cid = frame.get("id")
        entry = self.pending.get(cid) if isinstance(cid, str) else None
        if entry is None or entry[1].done():
            return
        name, fut = entry
        if frame.get("ok") is True:
            fut.set_result({k: v for k, v in frame.items() if k not in ("type", "id", "ok")})
        else:
            err = frame.get("error")
            fut.set_exception(CommandRefused(name, str(err) if err else "refused"))

    def on_error(self, frame: Mapping[str, Any]) -> None:
        code, message, ref = frame.get("code"), frame.get("message"), frame.get("ref")
        self.session.errors[str(code)] += 1
        entry = self.pending.get(ref) if isinstance(ref, str) else None
        if entry is not None and not entry[1].done():
            entry[1].set_exception(CommandRefused(entry[0], f"{code}: {message}"))
            return
        log.warning("session %s: brisvox error %s (%s): %s", self.session.id, code, ref, message)

    async def on_event(self, frame: Mapping[str, Any]) -> None:
        name = frame.get("name")
        if not isinstance(name, str):
            await self.error("bad_message", "event: name must be a string", "event")
            return
        if name == "hangup":
            self.session.hung_up = True
            reason = frame.get("reason")
            self.session.hangup_reason = reason if isinstance(reason, str) else None
        if name not in self.session.subscribed:
            if name == "hangup":
                await self._hangup()
            return  # not subscribed: nobody to tell
        try:
            self.events.put_nowait(Event.from_frame(frame))
        except asyncio.QueueFull:
            log.warning("session %s: event %s dropped (%d waiting)", self.session.id, name, EVENT_QUEUE)

    async def _events(self) -> None:
        while True:
            event = await self.events.get()
            if event is None:
                return
            for handler in self.agent._handlers.get(event.name, ()):
                try:
                    await handler(self.session, event)
                except Exception:
                    log.exception("session %s: the %s handler raised", self.session.id, event.name)
            if event.name == "hangup":
                await self._hangup()

    async def _hangup(self) -> None:
        self.agent._forget(self.session)
        with contextlib.suppress(Exception):
            await self.ws.close(1000, "hangup")

    def close(self) -> None:
        """The connection ended: stop reads, let SideEffects finish unheard, fail commands."""
        if self.closed:
            return
        self.closed = True
        for task, ctx, tool in list(self.running.values()):
            ctx.cancel_reason = ctx.cancel_reason or "disconnected"
            ctx.cancelled.set()
            if tool.kind == "read_only":
                task.cancel()
        for name, fut in list(self.pending.values()):
            if not fut.done():
                fut.set_exception(NotLive(name, "the connection closed"))
        if self.session._link is self:
            self.session._link = None
