"""The agent link of one call: brisvox's side of docs/AGENT_PROTOCOL.md, in the agent process.

Owns :class:`AgentLink`: ONE WebSocket per call to the agent service, dialled with the
signed handshake (``X-Brisvox-Signature``), the ``session.offer`` / accept-or-refuse
exchange (:data:`~brisvox.agent.link.messages.OFFER_TIMEOUT`), the registration of each
accepted declaration as an ordinary tool of the call's registry whose body is the RPC
(``tool.call`` -> ``tool.result``), ``session.ready``; then the reader (one dispatch
table: message class -> handler), the bounded writer queue (events, acks, errors,
cancels), the re-dials, and the runner's observer seam (:mod:`brisvox.agent.pipeline.llm.observer`).

Invariants:

* Every await is bounded: the dial and the offer by ``connect_timeout`` and 5 s, a send
  by :data:`SEND_TIMEOUT`, a ReadOnly call by the engine's timeout (it cancels the body:
  ``tool.cancel`` goes out, a later result is ``late``), a SideEffect call by
  ``side_effect_wait`` (then it raises :class:`UnknownOutcome`: the engine records the
  key lost, answers ``unknown_outcome``, never runs it again), the close by 1 s.
* A remote call fails at once (``tool_failed``) while the link is not up or 32 calls
  wait; a link that goes down fails every waiting ReadOnly call (``tool_failed``) and
  makes every waiting SideEffect call's outcome unknown.
* A remote tool never shadows an agent-file tool (refused at the handshake, told in
  ``session.ready``); a tool narrowed away by ``tools.set`` is neither offered nor run
  (``screened``: the runner answers ``unknown_tool``).
* Nothing the service sends ends the caller's call by itself: a bad frame is answered
  with a typed ``error`` and counted; a command is acked (``ok: false`` when over the
  rate, outside a live call, over its bound, or not allowed).
* A ``dial`` places a NEW call through the gateway (its ``dial`` command, a request over
  the call's link, bounded by :data:`DIAL_WAIT`): only with ``[agent_link] allow_dial`` and a
  target ``dial_targets`` lists (:meth:`~brisvox.agent.link.config.LinkConfig.may_dial`),
  ``via`` ``sip`` or ``twilio``, one at a time per call; its ack carries the new call's id
  (SIP, once answered) or Twilio's CallSid (once Twilio queued it), or the gateway's reason.
* The link's life is the call's: :meth:`bind` watches the actor, sends ``hangup`` (when
  subscribed) after its record is built and closes the socket. ``hangup`` is the last event:
  one the call's teardown produces after it (a last turn settled late) is dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    Message,
    SystemMessage,
    UserMessage,
)
from brisvox.agent.link import messages as m
from brisvox.agent.link.config import LinkConfig
from brisvox.agent.link.state import LinkState, Phase, TokenBucket, Waiting
from brisvox.agent.tool_engine.registry import (
    IdempotencyKey,
    RegistryError,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
)
from brisvox.providers.base import ProviderError
from brisvox.providers.ws_common import TaskSet, close_ws, send_bounded, ws_connect

log = logging.getLogger("brisvox.agent.link")

SEND_TIMEOUT = 2.0
PING_INTERVAL = 10.0  # ping_timeout 20 s (ws_common): a peer silent for 30 s is down
TRANSPORT_MAX = 4 * m.MAX_FRAME_BYTES  # beyond the protocol's 1 MiB: answered too_large, not a dropped socket
REDIAL_DELAYS = (0.2, 0.5, 1.0)
DIAL_WAIT = {"sip": 100.0, "twilio": 20.0}  # SIP: [sip] dial_ring_timeout_s (60 s) + Timer B + the agent's start
OUT_QUEUE = 256
MAX_NOTES = 16


class LinkRefused(Exception):
    """The call cannot have its agent service: refused, unreachable, or a bad handshake."""


class UnknownOutcome(Exception):
    """A SideEffect call whose result never came (waited out, or the link went down):
    not a ToolError, so the engine records it lost with ``unknown_outcome``."""


class AgentLink:
    def __init__(self, cfg: LinkConfig, secret: str, *, session: str, call: Mapping[str, Any],
                 registry: ToolRegistry, telephony: Any = None, transfer_targets: tuple[str, ...] = (),
                 fallback_line: str = "") -> None:
        self.cfg, self.secret, self.session, self.call = cfg, secret, session, dict(call)
        self.registry = registry
        self.local_tools = registry.names()  # the agent file's tools: never shadowed
        self.telephony, self.transfer_targets, self.fallback_line = telephony, transfer_targets, fallback_line
        self.st = LinkState()
        self.stats = self.st.stats
        self.waiting = Waiting()
        self.remote: dict[str, ToolSpec] = {}  # every remote tool registered in this call
        self.refused: list[tuple[str, str]] = []  # of the last handshake
        self.ws: ClientConnection | None = None
        self.tasks = TaskSet()
        self.bucket = TokenBucket()
        self.actor: Any = None
        self.notes: deque[str] = deque(maxlen=MAX_NOTES)
        self._out: asyncio.Queue[str] | None = None
        self._epoch = 0
        self._bot_from = 0  # context index from which assistant text is not reported yet
        self._handlers: dict[type, Callable[[Any], None]] = {
            m.ToolResult: self._on_result, m.ToolsSet: self._on_tools_set, m.Command: self._on_command,
            m.Accept: self._out_of_handshake, m.Refuse: self._out_of_handshake,
        }
        self._commands: dict[str, Callable[[m.Command], None]] = {
            "say": self._say, "note": self._note, "transfer": self._transfer, "end_call": self._end_call,
            "dial": self._dial_out,
        }
        self._dialing = False
        self._hung_up = False  # the hangup event went out: no event may follow it

    # -- the handshake --------------------------------------------------------------------
    async def open(self) -> None:
        """Dial, offer, register the accepted tools. Raises :class:`LinkRefused`."""
        try:
            self.ws = await self._dial(resume=False)
        except LinkRefused:
            self.st.go(Phase.CLOSED)
            raise
        self.st.go(Phase.UP)
        self._out = asyncio.Queue(OUT_QUEUE)
        self.tasks.spawn(self._writer())
        self.tasks.spawn(self._reader(self.ws))

    async def _dial(self, resume: bool) -> ClientConnection:
        self.stats.dials += 1
        try:
            ws = await ws_connect(self.cfg.url, m.sign(self.secret, self.session, time.time()),
                                  self.cfg.connect_timeout, max_size=TRANSPORT_MAX, ping_interval=PING_INTERVAL)
        except ProviderError as e:
            raise LinkRefused(f"agent service {e.kind}: {e.detail}"[:200]) from None
        try:
            await send_bounded(ws, m.offer(self.session, self.call, self.local_tools, resume), SEND_TIMEOUT)
            async with asyncio.timeout(m.OFFER_TIMEOUT):
                answer = await self._answer(ws)
            if isinstance(answer, m.Refuse):
                raise LinkRefused(f"the agent service refused the call: {answer.reason}"[:200])
            registered = self._accepted(answer)
            await send_bounded(ws, m.ready(registered, self.refused), SEND_TIMEOUT)
        except (TimeoutError, ConnectionClosed, ProviderError) as e:
            await close_ws(ws, 1.0)
            what = "no answer to the offer within 5 s" if isinstance(e, TimeoutError) else type(e).__name__
            raise LinkRefused(f"agent service: {what}") from None
        except LinkRefused:
            await close_ws(ws, 1.0)
            raise
        return ws

    async def _answer(self, ws: ClientConnection) -> m.Accept | m.Refuse:
        while True:
            raw = await ws.recv()
            try:
                msg = m.parse(raw)
            except m.BadFrame as e:
                self.stats.bad_frames += 1
                await send_bounded(ws, m.error(e.code, e.message, e.ref), SEND_TIMEOUT)
                continue
            if isinstance(msg, m.Accept | m.Refuse):
                return msg
            await send_bounded(ws, m.error("bad_message", "answer the offer first", type(msg).__name__), SEND_TIMEOUT)

    def _accepted(self, acc: m.Accept) -> list[str]:
        """Register the declarations (a resume keeps what is registered); the offered set."""
        registered: list[str] = []
        self.refused = list(acc.refused)
        seen: set[str] = set()
        for d in acc.tools:
            if d.name in seen:
                self.refused.append((d.name, "declared twice"))
                continue
            seen.add(d.name)
            spec = m.decl_spec(d)
            if isinstance(spec, str):
                self.refused.append((d.name, spec))
            elif d.name in self.remote:
                registered.append(d.name)  # a resume: the first declaration stays registered
            elif d.name in self.local_tools or d.name in self.registry:
                self.refused.append((d.name, "collides with a tool of the agent file"))
            else:
                try:
                    self.registry.register(spec, self._body(d.name))
                except RegistryError as e:
                    self.refused.append((d.name, str(e)[:200]))
                    continue
                self.remote[d.name] = spec
                registered.append(d.name)
        self.st.set_declared(registered)
        self.st.narrow = None
        self.st.subscribed = acc.subscribe
        return registered

    # -- the RPC ----------------------------------------------------------------------------
    def _body(self, name: str) -> Tool:
        async def remote_tool(args: dict[str, Any], ctx: ToolContext) -> Any:
            return await self.call_tool(name, args, ctx)
        return remote_tool

    async def call_tool(self, name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        spec = self.remote[name]
        if name not in self.st.offered():
            raise ToolError(f"{name} is not offered")
        ws = self.ws
        if not self.st.up or ws is None or self.waiting.full():
            self.stats.failed_fast += 1
            raise ToolError("the agent service is not connected" if not self.st.up
                            else "too many calls wait for the agent service")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        p = self.waiting.add(name, spec.side_effect, fut)
        self.stats.calls += 1
        key = IdempotencyKey(ctx.session, ctx.epoch, ctx.call).hex()
        try:
            await send_bounded(ws, m.tool_call(p.rid, ctx.call, name, args, key, ctx.epoch,
                                               int(spec.timeout * 1000)), SEND_TIMEOUT)
            if spec.side_effect:
                async with asyncio.timeout(self.cfg.side_effect_wait):  # the slot was answered at spec.timeout
                    return await fut
            return await fut  # the engine bounds it (timeout, barge-in: cancelled)
        except ProviderError:
            self.waiting.take(p.rid)
            self.stats.failed_fast += 1
            raise ToolError("the agent service is not connected") from None
        except TimeoutError:
            self.waiting.give_up(p.rid)
            self.stats.unknown_outcomes += 1
            raise UnknownOutcome(f"no result within side_effect_wait ({self.cfg.side_effect_wait:g} s)") from None
        except asyncio.CancelledError:
            if self.waiting.give_up(p.rid) is not None:
                hung_up = self.st.final or (self.actor is not None and self.actor.hung_up)
                reason = "hangup" if hung_up else ("barge_in" if ctx.cancel.cancelled else "timeout")
                self.stats.cancels += 1
                self._send_soon(m.tool_cancel(p.rid, reason))
            raise

    # -- inbound ------------------------------------------------------------------------------
    async def _reader(self, ws: ClientConnection) -> None:
        try:
            async for raw in ws:
                self.on_frame(raw)
        except ConnectionClosed:
            pass
        finally:
            if ws is self.ws and self.st.up:
                self._down()

    def on_frame(self, raw: str | bytes) -> None:
        try:
            msg = m.parse(raw)
        except m.BadFrame as e:
            self.stats.bad_frames += 1
            self._error(e.code, e.message, e.ref)
            return
        self._handlers[type(msg)](msg)

    def _out_of_handshake(self, msg: Any) -> None:
        self._error("bad_message", "the session is accepted already", type(msg).__name__)

    def _on_result(self, r: m.ToolResult) -> None:
        p = self.waiting.take(r.id)
        if p is None:
            if self.waiting.was_given_up(r.id):
                self.stats.late_results += 1
                self._error("late", "the call was cancelled or waited out: its result is ignored", r.id)
            else:
                self.stats.unknown_ids += 1
                self._error("unknown_id", "no call waits under this id", r.id)
            return
        self.stats.results += 1
        fut = p.box
        if not fut.done():
            if r.ok:
                fut.set_result(r.result)
            else:
                fut.set_exception(ToolError(r.error))

    def _on_tools_set(self, t: m.ToolsSet) -> None:
        bad = self.st.set_narrow(t.names)
        if bad:
            self._error("invalid_tool", f"not declared: {', '.join(bad)[:150]}", "tools.set")

    # -- commands -----------------------------------------------------------------------------
    def _on_command(self, c: m.Command) -> None:
        self.stats.commands += 1
        if not self.bucket.take(asyncio.get_running_loop().time()):
            return self._ack(c, False, "rate_limited")
        if self.actor is None or self.actor.hung_up or self.st.final:
            return self._ack(c, False, "not_live")
        self._commands[c.name](c)

    def _ack(self, c: m.Command, ok: bool, error: str = "", **data: str | int) -> None:
        if not ok:
            self.stats.commands_refused += 1
        self._send_soon(m.ack(c.id, ok, error, **data))

    def _text(self, c: m.Command) -> str | None:
        text = c.text.strip()
        if not text or len(text) > m.MAX_TEXT:
            self._ack(c, False, f"text must be 1..{m.MAX_TEXT} characters")
            return None
        return text

    def _say(self, c: m.Command) -> None:
        from brisvox.agent.pipeline.stage.pipeline_frames import Greet

        text = self._text(c)
        if text is None:
            return
        if not self.actor.idle():
            return self._ack(c, False, "busy: the caller or the bot is speaking")
        self.actor.entry.put_nowait(Greet(text))  # a bot turn of its own (the turn driver's BotTurn)
        self._ack(c, True)

    def _note(self, c: m.Command) -> None:
        text = self._text(c)
        if text is not None:
            self.notes.append(text)  # enters the context at the next settle (on_settled)
            self._ack(c, True)

    def _transfer(self, c: m.Command) -> None:
        if self.telephony is None or c.target not in self.transfer_targets:
            return self._ack(c, False, "not a transfer target")

        async def run() -> None:
            ok, detail = await self.telephony.transfer(c.target, 10.0)
            self._ack(c, bool(ok), "" if ok else (detail or "the transfer failed"))
        self.tasks.spawn(run())

    def _dial_out(self, c: m.Command) -> None:
        via = c.via or "sip"
        if via not in m.DIAL_VIA:
            return self._ack(c, False, "via must be sip or twilio")
        if c.trunk and via != "sip":
            return self._ack(c, False, "a trunk is dialled via sip")
        if not self.cfg.may_dial(c.target):
            self.stats.dials_refused += 1
            return self._ack(c, False, "not allowed: [agent_link] allow_dial and dial_targets"
                             if not self.cfg.allow_dial else "not a dial target ([agent_link] dial_targets)")
        dial = getattr(self.telephony, "dial", None)
        if dial is None:
            return self._ack(c, False, "no telephony")
        if self._dialing:
            return self._ack(c, False, "a dial is in progress")
        self._dialing = True
        self.stats.calls_dialled += 1

        async def run() -> None:
            try:
                ok, data, error = await dial(c.target, c.agent, via, DIAL_WAIT[via], trunk=c.trunk)
            finally:
                self._dialing = False
            ids: dict[str, str | int] = {k: str(data[k])[:128] for k in ("call_id", "call_sid", "status") if data.get(k)}
            ids.update({k: v for k in m.DIAL_TIMES if type(v := data.get(k)) is int and v >= 0})
            self._ack(c, bool(ok), "" if ok else (error or "the dial failed")[:200], via=via, **(ids if ok else {}))
        self.tasks.spawn(run())

    def _end_call(self, c: m.Command) -> None:
        if self.telephony is None:
            return self._ack(c, False, "no telephony")
        self._ack(c, True)
        self.telephony.hangup(c.reason or "agent_service")

    # -- the observer seam (pipeline/observer.py) -----------------------------------------------
    def on_user_turn(self, epoch: int, text: str) -> None:
        self._epoch = epoch
        self._event("user_turn", epoch=epoch, text=text[:4 * m.MAX_TEXT])

    def on_settled(self, ctx: Context) -> list[Message]:
        msgs = ctx.messages
        if self._bot_from > len(msgs):  # a flow swapped the context in
            self._bot_from = max((i + 1 for i, x in enumerate(msgs) if isinstance(x, UserMessage)), default=0)
        heard = [x.text.strip() for x in msgs[self._bot_from:] if isinstance(x, AssistantMessage) and x.text.strip()]
        self._bot_from = len(msgs)
        if heard:
            self._event("bot_turn", epoch=self._epoch, text=" ".join(heard)[:4 * m.MAX_TEXT])
        notes: list[Message] = [SystemMessage(f"[agent service] {n}") for n in self.notes]
        self.notes.clear()
        self._bot_from += len(notes)
        return notes

    def on_tool_outcome(self, epoch: int, call_id: str, tool: str, outcome: str) -> None:
        self._event("tool_outcome", call_id=call_id, tool=tool, outcome=outcome)

    def offered(self, specs: list[ToolSpec]) -> list[ToolSpec]:
        offered = self.st.offered()
        out = [s for s in specs if s.name not in self.remote or s.name in offered]
        have = {s.name for s in out}
        extra = [self.remote[n] for n in offered if n not in have]  # registered by a resume
        return sorted([*out, *extra], key=lambda s: s.name) if extra else out

    def screened(self, name: str) -> bool:
        return name in self.remote and name not in self.st.offered()

    # -- outbound -----------------------------------------------------------------------------
    def _event(self, name: str, **fields: Any) -> None:
        if self._hung_up:  # hangup is the last event (docs/AGENT_PROTOCOL.md): a late settle's is dropped
            self.stats.events_dropped += 1
            return
        self._hung_up = name == "hangup"
        if name in self.st.subscribed:
            if self._send_soon(m.event(name, **fields)):
                self.stats.events_sent += 1
            else:
                self.stats.events_dropped += 1

    def _error(self, code: str, message: str, ref: str = "") -> None:
        self.stats.errors_sent += 1
        self._send_soon(m.error(code, message, ref))

    def _send_soon(self, text: str) -> bool:
        q = self._out
        if q is None or not self.st.up:
            return False
        try:
            q.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    async def _writer(self) -> None:
        q = self._out
        assert q is not None
        while True:
            text = await q.get()
            try:
                if self.ws is not None and self.st.up:
                    with contextlib.suppress(ProviderError):
                        await send_bounded(self.ws, text, SEND_TIMEOUT)
            finally:
                q.task_done()

    # -- down, re-dial, close -----------------------------------------------------------------
    def _down(self) -> None:
        self.st.go(Phase.DOWN)
        log.warning("call %s: the agent service link dropped; re-dialling", self.session)
        self._fail_waiting("the agent service link dropped")
        self.tasks.spawn(self._redial())

    def _fail_waiting(self, why: str) -> None:
        for p in self.waiting.drain():
            if not p.box.done():
                if p.side_effect:
                    self.stats.unknown_outcomes += 1
                    p.box.set_exception(UnknownOutcome(why))
                else:
                    p.box.set_exception(ToolError(why))

    async def _redial(self) -> None:
        for delay in REDIAL_DELAYS:
            await asyncio.sleep(delay)
            if self.st.phase is not Phase.DOWN:
                return
            self.stats.redials += 1
            try:
                ws = await self._dial(resume=True)
            except LinkRefused as e:
                log.info("call %s: re-dial failed: %s", self.session, e)
                continue
            if self.st.phase is not Phase.DOWN:  # hung up meanwhile
                await close_ws(ws, 1.0)
                return
            self.ws = ws
            self.stats.resumes += 1
            self.st.go(Phase.UP)
            self.tasks.spawn(self._reader(ws))
            return
        if self.st.phase is Phase.DOWN:
            self.st.go(Phase.GONE)
            log.warning("call %s: the agent service is gone; its tools answer tool_failed", self.session)
            if self.cfg.required:
                self._give_up_call()

    def _give_up_call(self) -> None:
        from brisvox.agent.pipeline.stage.pipeline_frames import Greet

        a = self.actor
        if a is None or a.hung_up:
            return
        if self.fallback_line and a.idle():
            a.entry.put_nowait(Greet(self.fallback_line))
        if self.telephony is not None:
            self.telephony.hangup("agent_link_down")  # after the line played out

    def bind(self, actor: Any) -> None:
        """The call's actor is built: hook the runner (events, notes, narrowing), watch the end."""
        self.actor = actor
        runner = getattr(actor, "runner", None)
        if runner is not None and hasattr(runner, "observer"):
            runner.observer = self
            self.fallback_line = self.fallback_line or str(getattr(runner.cfg, "fallback_line", ""))
        self.tasks.spawn(self._watch(actor))

    async def _watch(self, actor: Any) -> None:
        await actor.wait()
        self._event("hangup", reason=actor.end_reason or "hangup")
        await self.aclose()

    async def aclose(self) -> None:
        """End the link (idempotent, bounded): queued frames get 1 s, then the socket closes."""
        if self.st.phase is Phase.CLOSED:
            return
        was_up = self.st.up
        q = self._out
        if was_up and q is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await q.join()
        self.st.go(Phase.CLOSED)
        self._fail_waiting("the call ended")
        if self.ws is not None:
            await close_ws(self.ws, 1.0)
        self.tasks.cancel()
        log.info("call %s: agent link closed: %s", self.session,
                 " ".join(f"{k}={v}" for k, v in self.stats.as_dict().items() if v))
