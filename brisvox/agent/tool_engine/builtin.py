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
Arguments are never logged (a phone number is personal data).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from brisvox.agent.tool_engine.registry import Tool, ToolContext, ToolError, ToolKind, ToolSpec
from ipc.codec import Frame
from ipc.frames import (
    BridgeResult,
    Command,
    CommandReply,
    ConsultResult,
    Hangup,
    SendDtmf,
    Transfer,
    TransferResult,
)

BUILTIN_NAMES = ("end_call", "send_dtmf", "transfer_call")
DTMF = re.compile(r"^[0-9*#A-Da-dwW]{1,32}$")
TARGET = re.compile(r"^(\+?[0-9]{3,15}|sips?:[^\s]{3,200})$")

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
                                      "reason": {"type": "string", "maxLength": 200}},
     "required": ["target"], "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=10.0, filler_after=1.0,
)


class TelephonyPort(Protocol):
    """What the call actor gives the telephony tools."""

    call_id: str

    def hangup(self, reason: str) -> None: ...

    def send_dtmf(self, digits: str) -> None: ...

    async def transfer(self, target: str, timeout: float) -> tuple[bool, str]: ...  # noqa: ASYNC109


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
    _pending: asyncio.Future[TransferResult] | None = field(default=None, init=False)
    transfers: int = field(default=0, init=False)
    consult_results: list[ConsultResult | BridgeResult] = field(default_factory=list, init=False)

    def hangup(self, reason: str) -> None:
        if self.hangup_hook is not None:
            self.hangup_hook(reason)
        else:
            self.to_gateway(Hangup(call_id=self.call_id, reason=reason))

    def send_dtmf(self, digits: str) -> None:
        self.to_gateway(SendDtmf(call_id=self.call_id, digits=digits))

    async def transfer(self, target: str, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        if self._pending is not None and not self._pending.done():
            return False, "a transfer is already in progress"
        self.transfers += 1
        fut: asyncio.Future[TransferResult] = asyncio.get_running_loop().create_future()
        self._pending = fut
        self.to_gateway(Transfer(call_id=self.call_id, target=target))
        try:
            async with asyncio.timeout(timeout):
                res = await fut
        except TimeoutError:
            return False, "no answer from the carrier in time; the outcome is unknown"
        return res.ok, res.detail

    async def dial(self, target: str, agent: str, via: str, timeout: float,  # noqa: ASYNC109
                   trunk: str = "") -> tuple[bool, dict[str, Any], str]:
        """The gateway's ``dial`` (a new outbound call; ``trunk``: the ``[[sip.trunks]]`` entry):
        ``(ok, data, error)``, at most ``timeout`` s."""
        if self.request is None:
            return False, {}, "no gateway to dial through"
        args = {"target": target, "agent": agent, "via": via, **({"trunk": trunk} if trunk else {})}
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
        """A warm transfer's consult leg outcome (the gateway's ConsultResult): queued for the
        transfer that waits on it; one consult at a time, so a bounded queue of a few."""
        if len(self.consult_results) < 8:
            self.consult_results.append(res)

    def on_bridge_result(self, res: BridgeResult) -> None:
        if len(self.consult_results) < 8:
            self.consult_results.append(res)


def telephony_tools(port: TelephonyPort, *, transfer_targets: tuple[str, ...] = (),
                    names: tuple[str, ...] = BUILTIN_NAMES) -> list[tuple[ToolSpec, Tool]]:
    """The built-in tools bound to one call's port (only ``names``; ``transfer_call`` only
    with ``transfer_targets``: an empty list offers no transfer)."""
    state: dict[str, Any] = {"ended": False, "transferred": False}

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

    async def transfer_call(args: dict[str, Any], ctx: ToolContext) -> Any:
        target = str(args["target"])
        if target not in transfer_targets:
            raise ToolError("that target is not allowed; tell the caller you cannot transfer them there")
        if state["transferred"]:
            return {"status": "already_transferred"}
        ok, detail = await port.transfer(target, TRANSFER_CALL.timeout - 0.5)
        if not ok:
            raise ToolError(f"the transfer failed: {detail}" if detail else "the transfer failed")
        state["transferred"] = True
        return {"status": "transferred"}

    table: dict[str, tuple[ToolSpec, Tool]] = {
        "end_call": (END_CALL, end_call), "send_dtmf": (SEND_DTMF, send_dtmf),
        "transfer_call": (TRANSFER_CALL, transfer_call)}
    if not transfer_targets:
        del table["transfer_call"]
    return [table[n] for n in names if n in table]
