"""The built-in telephony tools: ``end_call``, ``send_dtmf`` (repeatable), ``transfer_call``.

Owns their specs and bodies. All three are SideEffect tools (never
run twice for one call, never speculative); ``send_dtmf`` is declared
repeatable (pressing the same IVR digit again in a later response is a new
action), ``end_call`` and ``transfer_call`` are not. Their effects go out
through a :class:`TelephonyPort` the call actor gives them, which turns them
into the control frames of ``ipc/frames.py`` (Hangup, SendDtmf, Transfer ->
TransferResult) on the call's link to the gateway. The gateway carries them
out on the call's transport (SIP BYE / RFC 4733 / REFER, or Twilio's
WebSocket close / REST).

Per-call state lives in the port (one transfer per call), so a call
registers these tools on its own registry (:func:`telephony_tools`).

Fail closed: ``transfer_call`` exists only with a non-empty
``transfer_targets`` (without one it is not offered at all) and transfers only
to a listed target; the loader puts it behind the confirmation gate unless the
agent file says ``confirm_transfer = false``
(:func:`brisvox.agent.tool_engine.loader.build_registry`). The port
also carries an agent service's ``dial`` (:meth:`LinkTelephony.dial`: the
gateway's ``dial`` command as a request, bounded by its wait; no tool of the
model's dials).
``warm_transfer`` (a warm transfer: the caller waits on hold while the person at the target
hears a summary and accepts or declines; :mod:`brisvox.agent.host.warm_transfer`) exists only
with ``transfer_targets`` too, runs at most once per call (a second call is refused), and
hands the whole sequence to the port (:meth:`LinkTelephony.warm_transfer`, bound by the call
actor to its :class:`~brisvox.agent.host.call_warm.CallWarm`); its result tells the model what
the caller heard. ``transfer_call`` takes an optional ``summary`` (the REFER's
``X-Transfer-Summary``: CR/LF and control characters refused, at most
:data:`SUMMARY_MAX` characters). A refused target or summary is a typed refusal, counted in
:data:`TRANSFER_STATS` (the agent process's ``transfers_refused_*`` stats) and logged once
per kind and minute.
Arguments are never logged (a phone number is personal data).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from brisvox.agent.tool_engine.registry import Tool, ToolContext, ToolError, ToolKind, ToolSpec
from brisvox.runtime.log_limit import LogLimiter
from ipc.codec import Frame
from ipc.frames import (
    Bridge,
    BridgeEnded,
    BridgeResult,
    Command,
    CommandReply,
    ConsultResult,
    Hangup,
    SendDtmf,
    Transfer,
    TransferResult,
)

BUILTIN_NAMES = ("end_call", "send_dtmf", "transfer_call", "warm_transfer")
TRANSFER_TOOLS = ("transfer_call", "warm_transfer")  # each needs transfer_targets
DTMF = re.compile(r"^[0-9*#A-Da-dwW]{1,32}$")
TARGET = re.compile(r"^(\+?[0-9]{3,15}|sips?:[^\s]{3,200})$")
SUMMARY_MAX = 400  # a blind transfer's X-Transfer-Summary, characters
UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
log = logging.getLogger("brisvox.agent.tools")
_log_once = LogLimiter(log)
TRANSFER_STATS: Counter[str] = Counter()  # refusals by kind (the agent process's stats)


def refuse(kind: str, message: str) -> ToolError:
    """A typed refusal of a transfer (``kind``: ``target``, ``summary``, ``repeat``), counted
    and logged once per kind and minute (never the arguments)."""
    TRANSFER_STATS[f"transfers_refused_{kind}"] += 1
    _log_once(f"transfer_refused_{kind}", "transfer refused (%s): %s", kind, message)
    return ToolError(message)

END_CALL = ToolSpec(
    "end_call",
    "End the phone call. Say goodbye first; call this only when the caller is done or asks to hang up.",
    {"type": "object", "properties": {"reason": {"type": "string", "maxLength": 200}},
     "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=2.0, filler_after=None,
)
SEND_DTMF = ToolSpec(
    "send_dtmf",
    "Press keys on the phone keypad (DTMF), e.g. to navigate a phone menu. digits: 0-9, *, #, A-D; "
    "'w' waits half a second.",
    {"type": "object", "properties": {"digits": {"type": "string", "pattern": DTMF.pattern}},
     "required": ["digits"], "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=2.0, filler_after=None, repeatable=True,
)
TRANSFER_CALL = ToolSpec(
    "transfer_call",
    "Transfer the caller to another phone number or SIP address (a blind transfer: you leave the call).",
    {"type": "object", "properties": {"target": {"type": "string", "pattern": TARGET.pattern},
                                      "reason": {"type": "string", "maxLength": 200},
                                      "summary": {"type": "string", "maxLength": SUMMARY_MAX,
                                                  "description": "one line for the person who answers"}},
     "required": ["target"], "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=10.0, filler_after=1.0,
)
WARM_SLACK_S = 40.0  # the hold message, the summary, the bridge and the outcome message
WARM_TRANSFER = ToolSpec(
    "warm_transfer",
    "Transfer the caller with an introduction: the caller waits on hold while the person at the target hears a "
    "summary of this call and accepts or declines. If they accept, you leave the call; if not, you are back with "
    "the caller, who has been told why.",
    {"type": "object", "properties": {"target": {"type": "string", "pattern": TARGET.pattern},
                                      "reason": {"type": "string", "maxLength": 200}},
     "required": ["target"], "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=30.0 + WARM_SLACK_S, filler_after=None,
)


def warm_spec(timeout_s: float) -> ToolSpec:
    """``warm_transfer`` whose run is bounded by ``timeout_s``, the longest from its dial to the
    person's verdict (``[warm_transfer]``'s ring and the consult leg's longest screen:
    ``WarmConfig.consult_bound_s``), and :data:`WARM_SLACK_S`."""
    from dataclasses import replace

    return replace(WARM_TRANSFER, timeout=float(timeout_s) + WARM_SLACK_S)


class TelephonyPort(Protocol):
    """What the call actor gives the telephony tools."""

    call_id: str

    def hangup(self, reason: str) -> None: ...

    def send_dtmf(self, digits: str) -> None: ...

    async def transfer(self, target: str, timeout: float, summary: str = "") -> tuple[bool, str]: ...  # noqa: ASYNC109

    async def warm_transfer(self, target: str, reason: str) -> dict[str, Any]: ...


@dataclass
class LinkTelephony:
    """A TelephonyPort over the actor's CallLink (``to_gateway`` is fire-and-forget).

    The Transfer reply (TransferResult) comes back through the host, which
    calls :meth:`on_transfer_result`; ``hangup_hook`` lets the actor finish
    the goodbye before the Hangup leaves (default: send it at once)."""

    call_id: str
    to_gateway: Callable[[Frame], None]
    hangup_hook: Callable[[str], None] | None = None
    request: Callable[[Frame, float], Awaitable[Frame]] | None = None  # a request to the call's gateway
    warm: Callable[[str, str], Awaitable[dict[str, Any]]] | None = None  # the actor's CallWarm.run
    # the actor's CallWarm.bridge_lost; set: a Bridge keeps the actor attached (BridgeEnded comes here)
    bridge_ended: Callable[[BridgeEnded], Any] | None = None
    _pending: asyncio.Future[TransferResult] | None = field(default=None, init=False)
    transfers: int = field(default=0, init=False)
    _consult: dict[str, asyncio.Future[ConsultResult]] = field(default_factory=dict, init=False)
    _bridge: asyncio.Future[BridgeResult] | None = field(default=None, init=False)
    early_results: list[ConsultResult] = field(default_factory=list, init=False)  # before its wait began
    # waits for a queued Twilio leg's answer that timed out: that answer, late, is hung up
    _given_up: deque[str] = field(default_factory=lambda: deque(maxlen=4), init=False)

    def hangup(self, reason: str) -> None:
        if self.hangup_hook is not None:
            self.hangup_hook(reason)
        else:
            self.to_gateway(Hangup(call_id=self.call_id, reason=reason))

    def send_dtmf(self, digits: str) -> None:
        self.to_gateway(SendDtmf(call_id=self.call_id, digits=digits))

    async def transfer(self, target: str, timeout: float, summary: str = "") -> tuple[bool, str]:  # noqa: ASYNC109
        if self._pending is not None and not self._pending.done():
            return False, "a transfer is already in progress"
        self.transfers += 1
        fut: asyncio.Future[TransferResult] = asyncio.get_running_loop().create_future()
        self._pending = fut
        self.to_gateway(Transfer(call_id=self.call_id, target=target, summary=summary))
        try:
            async with asyncio.timeout(timeout):
                res = await fut
        except TimeoutError:
            return False, "no answer from the carrier in time; the outcome is unknown"
        return res.ok, res.detail

    async def warm_transfer(self, target: str, reason: str) -> dict[str, Any]:
        if self.warm is None:
            raise ToolError("this call cannot place a warm transfer")
        return await self.warm(target, reason)

    async def dial(self, target: str, agent: str, via: str, timeout: float,  # noqa: ASYNC109
                   trunk: str = "", extra: Mapping[str, Any] | None = None) -> tuple[bool, dict[str, Any], str]:
        """The gateway's ``dial`` (a new outbound call; ``trunk``: the ``[[sip.trunks]]`` entry;
        ``extra``: more args, a warm transfer's ``consult_for`` and ``summary``):
        ``(ok, data, error)``, at most ``timeout`` s."""
        if self.request is None:
            return False, {}, "no gateway to dial through"
        args = {"target": target, "agent": agent, "via": via, **({"trunk": trunk} if trunk else {}), **(extra or {})}
        try:
            reply = await self.request(Command(name="dial", args=args), timeout)
        except TimeoutError:
            return False, {}, "the gateway did not answer the dial in time; the outcome is unknown"
        except ConnectionError:
            return False, {}, "the gateway is not reachable"
        if not isinstance(reply, CommandReply):
            return False, {}, f"unexpected reply {reply.TYPE}"
        return bool(reply.ok), dict(reply.data or {}), reply.error

    def on_transfer_result(self, res: TransferResult) -> None:
        fut = self._pending
        if fut is not None and not fut.done():
            fut.set_result(res)

    def on_consult_result(self, res: ConsultResult) -> None:
        """A warm transfer's consult leg outcome (the gateway's ConsultResult): resolves the
        wait on that leg (an ``answered`` one, of a Twilio leg queued by its CallSid, the wait on
        ``twilio:<CallSid>``, its ``detail``); one that comes before its wait began (a verdict
        racing the dial's reply) is kept (at most a few) for :meth:`consult_result`; an
        ``answered`` whose wait timed out is hung up (the leg must not live on); the rest is
        dropped."""
        fut = self._consult.get(res.consult_id)
        if fut is None and res.outcome == "answered":  # a queued Twilio leg, waited for by its CallSid
            fut = self._consult.get(res.detail)
            if fut is None and res.detail in self._given_up:  # answered after its wait gave up
                self._given_up.remove(res.detail)
                self.hangup_leg(res.consult_id, "warm_transfer_no_answer")
                return
        if fut is not None and not fut.done():
            fut.set_result(res)
        elif fut is None and len(self.early_results) < 4:
            self.early_results.append(res)

    async def consult_result(self, consult_id: str, timeout: float) -> ConsultResult | None:  # noqa: ASYNC109
        """The ConsultResult of leg ``consult_id`` (``twilio:<CallSid>``: the ``answered`` of that
        queued Twilio leg, which names the leg's call id), None after ``timeout`` s."""
        for r in self.early_results:
            if r.consult_id == consult_id or (r.outcome == "answered" and r.detail == consult_id):
                self.early_results.remove(r)
                return r
        fut: asyncio.Future[ConsultResult] = asyncio.get_running_loop().create_future()
        self._consult[consult_id] = fut
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await fut
        except TimeoutError:
            self._given_up.append(consult_id)
            return None
        finally:
            self._consult.pop(consult_id, None)

    def on_bridge_result(self, res: BridgeResult) -> None:
        fut = self._bridge
        if fut is not None and not fut.done():
            fut.set_result(res)

    def on_bridge_ended(self, f: BridgeEnded) -> None:
        """The gateway's BridgeEnded (a kept bridge's person left): to the warm transfer, or dropped."""
        if self.bridge_ended is not None:
            self.bridge_ended(f)

    async def bridge(self, other: str, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        """Bridge the caller and consult leg ``other``: the BridgeResult, bounded. With a
        :attr:`bridge_ended` hook the Bridge asks to keep this actor attached."""
        fut: asyncio.Future[BridgeResult] = asyncio.get_running_loop().create_future()
        self._bridge = fut
        self.to_gateway(Bridge(call_id=self.call_id, other=other, keep=self.bridge_ended is not None))
        try:
            async with asyncio.timeout(timeout):
                res = await fut
        except TimeoutError:
            return False, "no answer to the bridge in time"
        finally:
            self._bridge = None
        return res.ok, res.detail

    def hangup_leg(self, consult_id: str, reason: str) -> None:
        """End a consult leg of this call's (a warm transfer given up)."""
        self.to_gateway(Hangup(call_id=consult_id, reason=reason))


def telephony_tools(port: TelephonyPort, *, transfer_targets: tuple[str, ...] = (),
                    names: tuple[str, ...] = BUILTIN_NAMES,
                    warm_timeout_s: float = 30.0) -> list[tuple[ToolSpec, Tool]]:
    """The built-in tools bound to one call's port (only ``names``; ``transfer_call`` and
    ``warm_transfer`` only with ``transfer_targets``: an empty list offers no transfer;
    ``warm_timeout_s``: see :func:`warm_spec`)."""
    state: dict[str, Any] = {"ended": False, "transferred": False, "warm": False}

    async def end_call(args: dict[str, Any], ctx: ToolContext) -> Any:
        if state["ended"]:
            return {"status": "already_ending"}
        state["ended"] = True
        port.hangup(str(args.get("reason") or "end_call"))
        return {"status": "ending", "note": "the call ends after your last words are played"}

    async def send_dtmf(args: dict[str, Any], ctx: ToolContext) -> Any:
        digits = str(args["digits"])
        if not DTMF.match(digits):
            raise ToolError("digits may only contain 0-9, *, #, A-D and w")
        port.send_dtmf(digits.upper().replace("W", "w"))
        return {"status": "sent", "digits": digits}

    def allowed(target: str) -> None:
        if target not in transfer_targets:
            raise refuse("target", "that target is not allowed; tell the caller you cannot transfer them there")

    async def transfer_call(args: dict[str, Any], ctx: ToolContext) -> Any:
        target = str(args["target"])
        allowed(target)
        summary = str(args.get("summary") or "")
        if len(summary) > SUMMARY_MAX or UNSAFE.search(summary):
            raise refuse("summary", f"the summary must be one line of at most {SUMMARY_MAX} characters; "
                                    "try again with a shorter one")
        if state["transferred"]:
            return {"status": "already_transferred"}
        wait = TRANSFER_CALL.timeout - 0.5
        ok, detail = await (port.transfer(target, wait, " ".join(summary.split())) if summary.strip()
                            else port.transfer(target, wait))
        if not ok:
            raise ToolError(f"the transfer failed: {detail}" if detail else "the transfer failed")
        state["transferred"] = True
        return {"status": "transferred"}

    async def warm_transfer(args: dict[str, Any], ctx: ToolContext) -> Any:
        target = str(args["target"])
        allowed(target)
        if state["warm"] or state["transferred"]:
            raise refuse("repeat", "a transfer was already attempted in this call; do not try again, "
                                   "help the caller yourself")
        state["warm"] = True
        return await port.warm_transfer(target, str(args.get("reason") or ""))

    table: dict[str, tuple[ToolSpec, Tool]] = {
        "end_call": (END_CALL, end_call), "send_dtmf": (SEND_DTMF, send_dtmf),
        "transfer_call": (TRANSFER_CALL, transfer_call), "warm_transfer": (warm_spec(warm_timeout_s), warm_transfer)}
    if not transfer_targets:
        for name in TRANSFER_TOOLS:
            del table[name]
    return [table[n] for n in names if n in table]
