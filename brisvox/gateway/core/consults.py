"""Warm transfer in the gateway: consult legs, their verdicts, and the bridge of two legs.

Owns :class:`Consults`, the collaborator of the gateway core that holds the rules of a warm
transfer (the agent side, the ``warm_transfer`` tool and the consult actor, is the agent
process's): which call a consult leg consults for, who may speak for it, when two legs
may be joined, and what becomes of one leg when the other ends. The facts live on the two
:class:`~brisvox.gateway.core.calls.Call` objects (``consult_for``, ``consult_leg``,
``verdict``, ``bridged_with``, ``relay``, ``times``); this class decides and records them,
sends the frames it owes the agents (ConsultResult, BridgeResult is the router's), and
returns the hang-ups the lifecycle executes (it never feeds a call's machine itself).

Invariants:

* A ``dial`` with ``consult_for`` names a live call (not ending) hosted by the agent process
  that sent the command, without a live consult leg; its ``summary`` is at most
  :data:`MAX_SUMMARY` characters of printable text (a CR, LF or any other control
  character is refused, not stripped: the agent learns its summary was wrong). Each refusal
  is counted ``consult_dials_refused_<why>`` and logged once a minute.
* A caller has at most one consult leg at a time (``consult_leg``, set when the leg is
  admitted: SIP at the dial, Twilio when its stream arrives; ``twilio:<CallSid>`` between).
  A Twilio consult leg whose stream arrives after its caller left is hung up
  (``caller_gone``) without an agent side; one whose caller is still there is reported
  ConsultResult(answered, detail ``twilio:<CallSid>``) to the caller's agent as it is claimed
  (the dial's reply, Twilio's 201, named only the CallSid: this is where that agent learns
  the leg's call id, and the callee's answer), before any verdict of that leg.
* ConsultVerdict is taken once per consult leg, and only from the agent process that hosts
  it; it reaches the caller's agent process as ConsultResult(accepted/declined). A consult
  leg whose transport ends before a verdict (and before a bridge) is reported
  ConsultResult(hung_up) to the caller's agent, once, if its dial was answered (a dial that
  failed, busy or unanswered, is reported by the dial command's reply alone).
* Bridge joins ``call_id`` and ``other`` only if the sender hosts ``call_id``, ``other`` is
  ``call_id``'s consult leg, both are active, answered, not ending and not bridged, and
  their call rates are equal (the gateway has no resampler of its own: the workers own
  the only one, and the gateway may not import them; two legs at different rates are
  refused ``rates differ``). A bridged call's pacer sends the other leg's ``in`` ring (a
  reader from the bridge's position on: nothing said before the bridge is replayed).
* When a bridged leg's transport ends, both relays are dropped at once (the ended leg's
  rings are unlinked only at its release, after that) and the other leg is dealt with: the
  caller's end hangs the person's leg up (``bridge_ended``); the person's end (their BYE, a
  drop, a timer) is :data:`BRIDGE_LOST` for the caller, which the lifecycle feeds its machine
  as ``Unbridged``: a caller bridged with ``keep`` whose agent side is still attached goes
  back to it (:meth:`Consults.unbridged`: not bridged any more, its ``times["bridge_lost"]``,
  counted ``bridges_lost``; the agent hears BridgeEnded and apologizes), any other caller is
  hung up (``bridge_lost`` when kept and its agent left, ``bridge_ended`` when not kept), so
  no caller is left on a dead bridge. Why keep the caller's agent attached rather than end it
  at the bridge and play a prompt: the gateway has no voice of its own (no TTS, no prompt
  files), and only the agent, which holds the conversation, can apologize in the call's
  voice and go on (take a message, another way to help); the cost is that a bridged caller
  keeps its agent slot and worker until its call ends. A caller whose transport ends while
  its consult leg is unbridged hangs that leg up (``caller_gone``).
* Once un-bridged the caller is an ordinary call of its agent again (Hangup, playout frames,
  another consult dial are taken); the consult leg keeps ``consult_for``, and both legs stay
  in the transfer's record (the ``transfers`` history).
* Hangup from an agent process is taken for a call it hosts (not bridged; bridged with
  ``keep`` while its agent side is attached: the agent side leaves, the bridge goes on) or
  for the consult leg of a call it hosts; any other is refused and counted
  (``hangups_refused_foreign``, ``hangups_refused_bridged``).
* The last :data:`HISTORY` finished warm transfers (both legs' times and outcome) stay
  readable (the ``transfers`` command) after their calls left the table.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from brisvox.gateway.core import call_machine as M
from brisvox.gateway.core.call_machine import ACTIVE
from brisvox.gateway.core.calls import Call, CallTable
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.runtime.log_limit import LogLimiter
from ipc import frames as F
from ipc.links import Links

log = logging.getLogger("brisvox.gateway")
REFUSAL_LOG = LogLimiter(log)  # one line per refusal kind per minute, the rest counted

MAX_SUMMARY = 500  # a consult leg's summary (CallStart.consult_summary), characters
HISTORY = 64  # finished warm transfers kept for the ``transfers`` command
BRIDGE_ENDED = M.BRIDGE_ENDED_REASON  # the caller's end hangs the person's leg up with it
BRIDGE_LOST = M.BRIDGE_LOST_REASON  # the person's end, for the caller: Unbridged (see the module docstring)
CALLER_GONE = "caller_gone"
TWILIO_PENDING = "twilio:"
ANSWERED = "answered"  # the ConsultResult of a queued Twilio consult leg whose stream arrived


def now_ms() -> int:
    return int(time.time() * 1000)


def summary_refusal(summary: object, limit: int = MAX_SUMMARY) -> str:
    """Why ``summary`` cannot be a consult leg's summary ("" it can): not a string, longer
    than ``limit``, or holding a control character (CR, LF, tab, ...) or an unassigned one."""
    if not isinstance(summary, str):
        return "summary must be a string"
    if len(summary) > limit:
        return f"summary longer than {limit} characters"
    if not summary.isprintable():
        return "summary contains control characters (CR/LF or others)"
    return ""


class Consults:
    """Consult legs and bridges (see the module docstring)."""

    def __init__(self, table: CallTable, links: Links, metrics: GatewayMetrics) -> None:
        self.table = table
        self.links = links
        self.metrics = metrics
        self.twilio_pending: dict[str, tuple[str, str]] = {}  # CallSid -> (caller id, summary)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.bridges_active = 0
        self._finishing: dict[str, dict[str, Any]] = {}  # caller id -> its record while a leg is live

    def _refuse(self, kind: str, why: str) -> str:
        self.metrics.inc(kind)
        REFUSAL_LOG(kind, "warm transfer: %s (%s)", why, kind, level=logging.INFO)
        return why

    # -- the dial of a consult leg ------------------------------------------------------------

    def check_dial(self, args: dict[str, Any], sender: str) -> tuple[Call | None, str, str]:
        """``(caller, summary, "")`` for a dial that consults for a call, ``(None, "", "")`` for
        a plain dial, ``(None, "", why)`` for a refused one (counted)."""
        consult_for = args.get("consult_for")
        summary = args.get("summary", "")
        if consult_for in (None, ""):
            if summary:
                return None, "", self._refuse("consult_dials_refused_summary", "a summary needs consult_for")
            return None, "", ""
        if not isinstance(consult_for, str):
            return None, "", self._refuse("consult_dials_refused_invalid", "consult_for must be a call id")
        caller = self.table.get(consult_for)
        if caller is None or caller.state != ACTIVE or caller.transport_done:
            return None, "", self._refuse("consult_dials_refused_unknown",
                                          f"consult_for {consult_for[:40]!r} is not a live call")
        if not sender or caller.agent_proc != sender:
            return None, "", self._refuse("consult_dials_refused_foreign",
                                          f"consult_for {consult_for[:40]!r} is not a call of the sender")
        if caller.bridged_with or caller.consult_for:
            return None, "", self._refuse("consult_dials_refused_bridged",
                                          "a bridged call or a consult leg cannot consult")
        if self._live_consult(caller):
            return None, "", self._refuse("consult_dials_refused_busy",
                                          f"call {consult_for[:40]!r} already has a live consult leg")
        why = summary_refusal(summary)
        if why:
            return None, "", self._refuse("consult_dials_refused_summary", why)
        return caller, summary, ""

    def _live_consult(self, caller: Call) -> bool:
        leg_id = caller.consult_leg
        if not leg_id:
            return False
        if leg_id.startswith(TWILIO_PENDING):
            return leg_id[len(TWILIO_PENDING):] in self.twilio_pending
        leg = self.table.get(leg_id)
        return leg is not None and not leg.transport_done

    def placed(self, caller: Call, leg: Call, summary: str) -> None:
        """The consult leg ``leg`` was admitted for ``caller`` (before its agent side starts)."""
        leg.consult_for = caller.call_id
        leg.consult_summary = summary
        leg.times["dialled"] = leg.times["admitted"]
        caller.consult_leg = leg.call_id
        self.metrics.inc("consult_legs_placed")

    def queued(self, caller: Call, sid: str, summary: str) -> None:
        """A Twilio consult dial was queued as CallSid ``sid``: its stream claims it (:meth:`claim`)."""
        if len(self.twilio_pending) >= 4 * max(1, self.table.max_calls):
            self.twilio_pending.pop(next(iter(self.twilio_pending)))  # bounded: the oldest never came
            self.metrics.inc("consult_twilio_pending_dropped")
        self.twilio_pending[sid] = (caller.call_id, summary)
        caller.consult_leg = TWILIO_PENDING + sid
        self.metrics.inc("consult_legs_placed")

    def dial_answered(self, leg_id: str) -> None:
        """The consult leg's dial was reported answered: from now on its end is a ConsultResult."""
        leg = self.table.get(leg_id)
        if leg is not None and leg.consult_for:
            leg.consult_reported = True

    def dial_failed(self, caller_id: str, leg_id: str = "") -> None:
        """The consult dial failed (busy, no answer, ...): the caller may consult again."""
        caller = self.table.get(caller_id)
        if caller is not None and (not leg_id or caller.consult_leg == leg_id):
            caller.consult_leg = ""
        self.metrics.inc("consult_dials_failed")

    def claim(self, call: Call) -> bool:
        """A call that starts: a queued Twilio consult leg becomes one (by its CallSid). True: it
        is the consult leg of a caller who is gone (or consults another leg now): hang it up
        without starting its agent side (counted ``consult_legs_orphaned``)."""
        sid = call.transport_ids.get("callSid", "")
        pending = self.twilio_pending.pop(sid, None) if sid else None
        if pending is None:
            return False
        caller = self.table.get(pending[0])
        if caller is None or caller.transport_done or caller.consult_leg != TWILIO_PENDING + sid:
            self.metrics.inc("consult_legs_orphaned")
            return True
        call.consult_for = caller.call_id
        call.consult_summary = pending[1]
        call.times["dialled"] = call.times["admitted"]
        call.consult_reported = True  # its stream arrived: Twilio's callee answered
        caller.consult_leg = call.call_id
        # the dial's reply (Twilio's 201) named only the CallSid: the caller's agent learns the leg here
        self._tell_caller(call, ANSWERED, TWILIO_PENDING + sid)
        return False

    def answered(self, call: Call) -> None:
        """The call's media is answered (or it became active): its answer time, once."""
        if "answered" not in call.times:
            call.times["answered"] = now_ms()
            if call.consult_for:
                self.metrics.inc("consult_legs_answered")

    # -- verdicts, hang-ups and the bridge ---------------------------------------------------

    def verdict(self, f: F.ConsultVerdict, sender: str) -> None:
        """The consult leg's agent said accepted/declined: forwarded once to the caller's agent."""
        leg = self.table.get(f.call_id)
        if leg is None or not leg.consult_for:
            self._refuse("consult_verdicts_refused", f"verdict for {f.call_id[:40]!r}: not a consult leg")
            return
        if sender != leg.agent_proc:
            self._refuse("consult_verdicts_refused", f"verdict for {f.call_id[:40]!r} from a stranger")
            return
        if leg.verdict or leg.bridged_with:
            self._refuse("consult_verdicts_refused", f"verdict for {f.call_id[:40]!r}: given already")
            return
        leg.verdict = "accepted" if f.accepted else "declined"
        leg.times["verdict"] = now_ms()
        self.metrics.inc(f"consult_verdicts_{leg.verdict}")
        self._tell_caller(leg, leg.verdict, f.detail[:200])

    def _tell_caller(self, leg: Call, outcome: str, detail: str) -> None:
        caller = self.table.get(leg.consult_for)
        if caller is None or not caller.agent_proc or caller.agent_done or caller.bridged_with:
            self.metrics.inc("consult_results_undelivered")
            return
        self.links.send(caller.agent_proc, F.ConsultResult(call_id=caller.call_id, consult_id=leg.call_id,
                                                           outcome=outcome, detail=detail))

    def may_control(self, call: Call, sender: str) -> bool:
        """A Hangup of ``call`` from ``sender`` may be taken (see the module docstring; counted
        when not)."""
        if call.bridged_with:
            if sender == call.agent_proc and call.machine.bridge_kept and not call.machine.agent_done:
                return True  # its kept agent side leaves; the bridge goes on (the machine's rule)
            self._refuse("hangups_refused_bridged", f"hangup of bridged call {call.call_id}")
            return False
        if sender == call.agent_proc:
            return True
        caller = self.table.get(call.consult_for) if call.consult_for else None
        if caller is not None and caller.agent_proc == sender:
            return True  # a warm transfer given up: the caller's agent ends its consult leg
        self._refuse("hangups_refused_foreign", f"hangup of {call.call_id} from {sender[:40]}")
        return False

    def bridge(self, f: F.Bridge, sender: str) -> tuple[Call, Call] | str:
        """The two legs to join (the caller first), or why not (counted ``bridges_refused``)."""
        a, b = self.table.get(f.call_id), self.table.get(f.other)
        why = ""
        if a is None or b is None:
            why = "unknown call"
        elif sender != a.agent_proc:
            why = "not a call of the sender"
        elif b.consult_for != a.call_id or a.consult_leg != b.call_id:
            why = f"{f.other[:40]} is not the consult leg of {f.call_id[:40]}"
        elif a.bridged_with or b.bridged_with:
            why = "already bridged"
        elif any(c.state != ACTIVE or c.transport_done or c.agent_done or c.media != "answered" for c in (a, b)):
            why = "both legs must be answered and alive"
        elif a.call_rate != b.call_rate:
            why = f"rates differ ({a.call_rate} vs {b.call_rate} Hz): the gateway does not resample"
        elif a.leg is None or b.leg is None:
            why = "a leg is not connected"
        if why or a is None or b is None:
            self._refuse("bridges_refused", f"bridge {f.call_id[:40]} + {f.other[:40]}: {why}")
            return why
        at = now_ms()
        for me, other in ((a, b), (b, a)):
            me.bridged_with = other.call_id
            me.relay = other.in_ring.reader(other.in_ring.write_pos)  # from now on: nothing replayed
            me.relay_playing = False
            me.times["bridged"] = at
        self.bridges_active += 1
        self.metrics.inc("bridges_ok")
        log.info("bridged %s (caller) and %s (consult leg)", a.call_id, b.call_id)
        return a, b

    # -- the end of a leg ----------------------------------------------------------------

    def transport_done(self, call: Call) -> list[tuple[Call, str]]:
        """``call``'s transport ended: what to hang up (the other leg of its bridge, an unbridged
        consult leg of a caller), and the caller told of a consult leg that ended unheard."""
        call.times.setdefault("ended", now_ms())
        out: list[tuple[Call, str]] = []
        if call.bridged_with:
            other = self.table.get(call.bridged_with)
            if call.relay is not None:  # the first of the two ends: the bridge is over
                self.bridges_active -= 1
                call.relay = None
            if other is not None:
                other.relay = None  # never read a ring that is about to be unlinked
                if not other.transport_done:
                    lost = call.consult_for == other.call_id  # the person left: the caller may go back
                    out.append((other, BRIDGE_LOST if lost else BRIDGE_ENDED))
            return out
        if call.consult_for and not call.verdict and call.consult_reported:
            self.metrics.inc("consult_legs_hung_up")
            self._tell_caller(call, "hung_up", call.end_reason[:200])
        if call.consult_leg and not call.consult_leg.startswith(TWILIO_PENDING):
            leg = self.table.get(call.consult_leg)
            if leg is not None and not leg.transport_done and not leg.bridged_with:
                out.append((leg, CALLER_GONE))
        return out

    def unbridged(self, caller: Call, at_ms: int = 0) -> str:
        """``caller``'s bridge ended with the person's leg and it goes back to its agent (its
        machine said so: SendBridgeEnded): not bridged any more, the time and the count. The
        consult leg's id (for BridgeEnded)."""
        other = caller.bridged_with
        caller.bridged_with = ""
        caller.relay = None
        caller.relay_playing = False
        caller.times["bridge_lost"] = at_ms or now_ms()
        self.metrics.inc("bridges_lost")
        log.info("call %s: its bridged consult leg %s ended: back with its agent", caller.call_id, other)
        return other

    def released(self, call: Call) -> None:
        """``call`` left the table: its leg goes into its warm transfer's record, which joins the
        history once every leg of it left (the caller and each consult leg it placed)."""
        if call.consult_leg.startswith(TWILIO_PENDING):
            self.twilio_pending.pop(call.consult_leg[len(TWILIO_PENDING):], None)
        key = call.consult_for or (call.call_id if call.consult_leg else "")
        if not key:
            return
        rec = self._finishing.setdefault(key, {"caller": key, "legs": {}})
        rec["legs"][call.call_id] = self.describe(call)
        other = call.consult_for or call.consult_leg
        if other.startswith(TWILIO_PENDING) or self.table.get(other) is None:
            self.history.append(self._finishing.pop(key))

    def describe(self, call: Call) -> dict[str, Any]:
        """The gateway's view of one leg: its role, its peer leg and its times (Unix ms)."""
        return {"consult_for": call.consult_for, "consult_leg": call.consult_leg, "verdict": call.verdict,
                "bridged_with": call.bridged_with, "end_reason": call.end_reason, "times": dict(call.times)}

    def stats(self) -> dict[str, Any]:
        return {"bridged_calls_active": 2 * self.bridges_active, "consult_twilio_pending": len(self.twilio_pending)}

