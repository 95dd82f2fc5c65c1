"""The gateway's ``dial`` and ``calls`` commands as requests to its inbox (``gateway-0.sock``).

Owns the one client of those commands: ``brisvoxd dial`` / ``brisvox dial``
(:func:`brisvox.cli.brisvoxd.cmd_dial`) and the outbound campaign runner
(:mod:`brisvox.outbound.campaign.dialer`) both call :func:`dial`. It imports
only :mod:`ipc` (a function-level import), so a service can use it without
pulling in the CLI's command set.

Invariants: every request has a timeout (a SIP dial: its ring plus 40 s for
Timer B and the agent side; a Twilio one, or ``calls``: 20 s / the timeout
given; an awaited Twilio one: its ring plus 50 s); a gateway that does not answer in time
is an error whose text starts with :data:`GATEWAY_SILENT` (the dial may or may not have been
placed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GATEWAY_SILENT = "the gateway does not answer on"
TWILIO_PREFIX = "twilio:"  # a Twilio call named by its CallSid (dial's answer, live_calls)
NO_STATUS = "no call status from Twilio"  # an awaited Twilio dial that heard nothing decisive (twilio_dial)


def dial(inbox: str, target: str, agent: str = "", ring_timeout_s: float = 0.0,
         via: str = "sip", trunk: str = "", params: Mapping[str, str] | None = None,
         await_answer: bool = False) -> tuple[bool, dict[str, Any], str]:
    """Ask the gateway at ``inbox`` to place an outbound call: (ok, data, error). ``params``: the
    call's parameters (the agent's ``CallStart.params``: a campaign row's variables; the gateway
    refuses more than ``MAX_DIAL_PARAMS`` or a malformed one, :func:`brisvox.wire.jsontext.dial_params`). Over SIP once
    the callee answered (data["call_id"]) or the dial failed (error: "busy", "no answer", ...);
    through Twilio once Twilio accepted the calls create (data["call_sid"], "status"), or with
    ``await_answer`` as over SIP: once Twilio's status callback (or its fetch of the webhook) said
    the callee answered (data["call_sid"], "status" ``in-progress``) or the dial failed (error:
    "busy", "no answer", "failed", "canceled", or :data:`NO_STATUS`: nothing decisive came)."""
    from ipc.bus import RequestTimeout, request_sync
    from ipc.frames import Command, CommandReply

    if via == "sip":
        wait = (ring_timeout_s or 600.0) + 40.0  # the ring, Timer B, the agent
    elif await_answer:  # the ring (Twilio's default 60 s), the gateway's grace for the status, the create
        wait = (ring_timeout_s or 60.0) + 30.0 + 20.0
    else:
        wait = 20.0
    try:
        reply = request_sync(inbox, Command(name="dial", args={"target": target, "agent": agent, "via": via,
                                                                "ring_timeout_s": ring_timeout_s,
                                                                **({"trunk": trunk} if trunk else {}),
                                                                **({"await_answer": True} if await_answer else {}),
                                                                **({"params": dict(params)} if params else {})}), wait)
    except RequestTimeout:
        return False, {}, f"{GATEWAY_SILENT} {inbox}"
    if not isinstance(reply, CommandReply):
        return False, {}, f"unexpected reply {reply.TYPE}"
    return bool(reply.ok), dict(reply.data or {}), reply.error


def live_calls(inbox: str, timeout: float = 5.0) -> set[str] | None:
    """The call ids the gateway at ``inbox`` holds now (its ``calls`` command), and for a Twilio
    call ``twilio:<CallSid>`` too (an awaited Twilio dial's answer names it so); None when it
    does not answer within ``timeout``."""
    from ipc.bus import RequestTimeout, request_sync
    from ipc.frames import Command, CommandReply

    try:
        reply = request_sync(inbox, Command(name="calls"), timeout)
    except RequestTimeout:
        return None
    if not isinstance(reply, CommandReply) or not reply.ok or not isinstance(reply.data, dict):
        return None
    return {str(k) for k in reply.data} | {f"{TWILIO_PREFIX}{c['ids']['callSid']}" for c in reply.data.values()
                                            if isinstance(c, dict) and isinstance(c.get("ids"), dict)
                                            and isinstance(c["ids"].get("callSid"), str)}


DIAL_TIMES = (("ringing_at_ms", "ringing"), ("progress_at_ms", "early media"), ("answered_at_ms", "answered"))


def dial_times(data: dict[str, Any]) -> str:
    """A SIP dial's signalling times, in ms after its INVITE ("-": the callee never sent it)."""
    def ms(key: str) -> str:
        v = data.get(key)
        return f"{v} ms" if isinstance(v, int) and not isinstance(v, bool) else "-"

    return ", ".join(f"{label} {ms(key)}" for key, label in DIAL_TIMES) + " after the INVITE"
