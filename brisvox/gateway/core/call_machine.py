"""CallMachine: the lifecycle of one call in the gateway (pure: no I/O, no clock).

Owns every per-call lifecycle fact: the phase (``state``), whether the
transport side and the agent side are done, which kind of agent side serves
the call (an agent process or the built-in echo agent), why the call ended,
and the deadline by which an agent process sent ``CallEnd`` must have
answered ``CallEnded``. :meth:`CallMachine.handle` takes an event (what
happened) and returns the actions the gateway must take, in order; the
lifecycle executor (:mod:`brisvox.gateway.core.lifecycle`) runs them through
one dispatch table. Time comes in the events (``now``: the loop's time), as
in :class:`~brisvox.playout.gate.PlayoutGate`.

Call lifecycle::

    Admit                                  -> "starting"  (rings exist)
    TransportStarted (the leg attached)    -> StartAgent
    AgentStarted(ok)                       -> "active": StartPacing, NotifyReady
                                              (not ok: "ending", NotifyReady; unanswered:
                                              RevokeStart first)
    TransportEnded | Hangup | Shutdown ... -> "ending": StopMedia, then SendCallEnd
                                              (an agent process) or StopBuiltin (the echo)
    AgentEnded | BuiltinStopped | Abandon
      | DetachTimeout | ForceRelease       -> "ended": Release (rings unlinked)

    Bridged (a warm transfer joined it to another leg, while "active"): SendCallEnd("bridged");
    the call stays "active" with no agent side: its CallEnded, or its agent process's loss,
    ends the agent side only; the transport's end then releases it.
    Bridged(keep) (the caller of a Bridge with ``keep``): no CallEnd, the agent side stays
    attached (unheard: the pacer sends the other leg's voice).
    Unbridged (the other leg of the bridge ended first): kept with its agent side still
    there -> not bridged any more: Count, SendBridgeEnded (the caller is back with its
    agent); kept but the agent side left meanwhile -> Count, HangupLeg("bridge_lost");
    not kept -> HangupLeg("bridge_ended").

Invariants:

* ``Release`` is returned at most once per call, and only once both sides are
  done (``transport_done`` and ``agent_done``); ``ForceRelease`` (the
  gateway's stop) marks both done first. Once released (``state`` "ended")
  every event returns no action: nothing is sent for, started for, or
  released again for an ended call.
* The transport side ends once: ``StopMedia`` at most once; ``end_reason``
  keeps the first reason given (a hang-up's reason, else the transport's).
* ``StartAgent``, ``SendCallEnd``, ``StopBuiltin`` and ``NotifyReady`` are each
  returned at most once. ``NotifyReady`` only when the start ended while the
  transport was up (a caller who hung up during the start gets no answer).
* The agent side starts once, and only while the transport is up. While it
  is starting the transport's end leaves the agent side to ``AgentStarted``;
  a call whose agent side never started is released by ``Abandon`` once its
  transport ended (or by ``TransportStarted`` coming after that end).
* A start the agent process never answered (``AgentStarted.unanswered``: the
  CallStart timed out or its link broke) may still be taken by that process
  afterwards (a restarted agent working through its backlog): the machine
  returns ``RevokeStart`` (a CallEnd nobody waits for) so that such a late
  start is ended there, and releases the call as for any failed start (the
  process remembers the revoked id while its start runs). At most once.
* An action that may re-enter the machine (``HangupLeg``: the leg may report
  its end at once; ``NotifyReady``: ``on_ready`` may end the leg) is the last
  of its list, so the machine is re-entered in its final state.
* Every call ends: with ``max_call_s`` (``Admit``) a call older than that, and with
  ``media_timeout_s`` (the WebSocket transports) one whose inbound packet count did not
  change for that long, is hung up while its transport is up (:meth:`CallMachine.timer`
  names it, ``TimerFired`` ends it: ``Count`` then ``HangupLeg``, ``end_reason``
  :data:`MAX_CALL_REASON` or :data:`MEDIA_TIMEOUT_REASON`, which ``CallEnd`` carries).
* A bridged call (``Bridged``: only while active, with an agent process whose side is not
  done) is told ``CallEnd("bridged")`` once and never hung up because its agent side ended
  (``AgentEnded``, ``AgentLost``, ``AgentHangup``): the person and the caller talk on without it. Its transport's
  end sends no second CallEnd; the detach timeout (counted from the bridge) bounds the wait for
  CallEnded as for any call.
* A kept bridge (``Bridged(keep=True)``, the caller's leg only) sends no CallEnd: the agent
  side stays, and an end of it during the bridge (CallEnded, a Hangup, its process lost) ends
  the agent side only, as above. The transport's end then sends CallEnd as for any call.
  ``Unbridged`` (the other leg ended) returns ``SendBridgeEnded`` at most once per bridge,
  only while the transport is up, no hang-up of ours is under way and the agent side is
  still there; a call that cannot go back to its agent is hung up instead (``bridge_lost``,
  kept; ``bridge_ended``, not kept): no caller is left on a dead bridge.
* Audio is not an event: the caller's audio arrives 50 times a second per
  call, so ``audio_in`` reads ``transport_done`` as its guard (no object per
  packet); the pacer reads ``state`` the same way every frame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STARTING, ACTIVE, ENDING, ENDED = "starting", "active", "ending", "ended"
NOT_STARTED, START_PENDING, STARTED = 0, 1, 2  # the agent side's start


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """The call was admitted (its rings exist); ``process``: an agent process serves it (else
    the echo agent); ``fallback``: another agent was asked for, but no agent process is up.
    ``now``: the call's start; ``max_call_s``, ``media_timeout_s``: its timers (0: none)."""

    transport: str
    process: bool
    fallback: bool = False
    now: float = 0.0
    max_call_s: float = 0.0
    media_timeout_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TransportStarted:
    """The transport attached its leg (``start_call``): the agent side may start."""


@dataclass(frozen=True, slots=True)
class AgentStarted:
    """The agent side's start is over: ``ok`` (CallAccepted, or the echo runs), else ``why``;
    ``builtin``: the echo agent serves the call (it must be stopped at the end)."""

    ok: bool
    why: str = ""
    builtin: bool = False
    now: float = 0.0
    unanswered: bool = False  # not ok because the agent process never answered (timeout, link)


@dataclass(frozen=True, slots=True)
class TransportEnded:
    """The caller's side is gone (BYE, stop, close, timeout)."""

    reason: str
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class Hangup:
    """The gateway ends the call from its side (RTP timeout, transfer, an operator);
    ``leg``: a leg is attached (it hangs up, then reports the end)."""

    reason: str
    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentHangup:
    """The agent process asks to end the call (Hangup)."""

    reason: str
    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentEnded:
    """The agent process is done with the call (CallEnded: the answer to CallEnd, or its own end)."""

    reason: str
    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentLost:
    """The call's agent process is gone (it exited or failed)."""

    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class BuiltinStopped:
    """The echo agent stopped (its worker detached the call, or it had none)."""


@dataclass(frozen=True, slots=True)
class Abandon:
    """The agent side never started (the transport gave up before ``start_call``); ignored
    once it did start, whose end (``AgentStarted``, ``AgentEnded``) finishes the agent side."""


@dataclass(frozen=True, slots=True)
class DetachTimeout:
    """The agent process did not answer CallEnd within the detach timeout
    (fed when :meth:`CallMachine.detach_overdue` says so)."""


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A call timer ran out (fed when :meth:`CallMachine.timer` names one): ``reason`` is
    :data:`MAX_CALL_REASON` or :data:`MEDIA_TIMEOUT_REASON`; the gateway hangs the call up."""

    reason: str
    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class Bridged:
    """The gateway joined the call to another leg (a warm transfer's Bridge): the agent side
    leaves (CallEnd "bridged"), the transport stays; ``keep``: the agent side stays attached
    (the caller of a Bridge with ``keep``)."""

    now: float = 0.0
    keep: bool = False


@dataclass(frozen=True, slots=True)
class Unbridged:
    """The other leg of the call's bridge ended while this one is up (the person hung up)."""

    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """The worker serving the call left the topology (its calls are re-attached elsewhere)."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The gateway stops: hang the call up (the transports get ``grace_s`` to end it)."""

    leg: bool
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class ForceRelease:
    """The gateway stops and the grace is over: end both sides and release now."""

    now: float = 0.0


Event = (Admit | TransportStarted | AgentStarted | TransportEnded | Hangup | AgentHangup | AgentEnded
         | AgentLost | BuiltinStopped | Abandon | DetachTimeout | TimerFired | WorkerLost | Shutdown
         | ForceRelease | Bridged | Unbridged)


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Count:
    """Bump a process-wide counter."""

    name: str


@dataclass(frozen=True, slots=True)
class StartAgent:
    """Start the agent side: CallStart to the agent process, or the echo agent."""


@dataclass(frozen=True, slots=True)
class StartPacing:
    """The call is active: the pacer serves it."""


@dataclass(frozen=True, slots=True)
class NotifyReady:
    """Answer the transport's ``start_call`` (``on_ready(ok, why)``)."""

    ok: bool
    why: str


@dataclass(frozen=True, slots=True)
class StopMedia:
    """The transport side is gone: no more pacing, the recording closed."""


@dataclass(frozen=True, slots=True)
class SendCallEnd:
    """Tell the agent process the call ended (it answers CallEnded)."""

    reason: str


@dataclass(frozen=True, slots=True)
class SendBridgeEnded:
    """The call's bridge is over and it goes back to its (kept) agent side: the gateway stops
    the relay, drops what the agent wrote meanwhile, and tells the agent (BridgeEnded)."""


@dataclass(frozen=True, slots=True)
class RevokeStart:
    """Tell the agent process that a start it never answered is over (a CallEnd; no answer
    is waited for: the call is released as a failed start)."""

    reason: str


@dataclass(frozen=True, slots=True)
class StopBuiltin:
    """Stop the echo agent (its worker detaches the call); ``BuiltinStopped`` follows."""


@dataclass(frozen=True, slots=True)
class HangupLeg:
    """The leg hangs up (it reports its end with ``transport_ended``)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ForgetWorker:
    """The call's worker is gone: no worker serves it (nor counts it) until a new one says so."""


@dataclass(frozen=True, slots=True)
class Release:
    """Unlink the call's rings and forget it."""


Action = (Count | StartAgent | StartPacing | NotifyReady | StopMedia | SendCallEnd | RevokeStart
          | StopBuiltin | HangupLeg | ForgetWorker | Release | SendBridgeEnded)

START_AGENT, START_PACING, STOP_MEDIA = StartAgent(), StartPacing(), StopMedia()
STOP_BUILTIN, FORGET_WORKER, RELEASE = StopBuiltin(), ForgetWorker(), Release()
SEND_BRIDGE_ENDED = SendBridgeEnded()
_NONE: tuple[Action, ...] = ()

AGENT_LOST_REASON = "agent process died"
AGENT_ENDED_REASON = "agent ended the call"
SHUTDOWN_REASON = "shutdown"
BRIDGED_REASON = "bridged"  # CallEnd.reason of a call a warm transfer bridged
BRIDGE_ENDED_REASON = "bridge_ended"  # a bridged leg hung up because the other one ended
BRIDGE_LOST_REASON = "bridge_lost"  # a kept caller hung up: the person left, and so did its agent side
MAX_CALL_REASON = "max call duration"  # [gateway] max_call_s
MEDIA_TIMEOUT_REASON = "media timeout"  # [websocket] media_timeout_s
TIMER_COUNTERS = {MAX_CALL_REASON: "calls_max_duration", MEDIA_TIMEOUT_REASON: "calls_media_timeout"}


class CallMachine:
    """See the module docstring."""

    __slots__ = ("detach_timeout_s", "state", "transport_done", "agent_done", "process", "builtin",
                 "start", "end_reason", "end_deadline", "call_deadline", "media_timeout_s", "media_seen",
                 "media_at", "bridged", "bridge_kept", "hanging_up")

    def __init__(self, detach_timeout_s: float = 10.0) -> None:
        self.detach_timeout_s = detach_timeout_s
        self.state = STARTING  # starting -> active -> ending -> ended
        self.transport_done = False
        self.agent_done = False
        self.process = False  # an agent process serves the call
        self.builtin = False  # the echo agent serves it (it must be stopped)
        self.start = NOT_STARTED  # the agent side's start: not started, pending (StartAgent), over
        # why the call ended: the first reason given (a transport may annotate it before it
        # reports its end, as SIP's ring timeout does: Call.end_reason)
        self.end_reason = ""
        self.end_deadline = 0.0  # CallEnd sent: CallEnded is due by then (0: not sent)
        self.call_deadline = 0.0  # max_call_s: the call is hung up after it (0: no limit)
        self.media_timeout_s = 0.0  # no inbound media this long hangs the call up (0: never)
        self.media_seen = -1  # the inbound packet count last seen by timer() ...
        self.media_at = 0.0  # ... and when it last changed
        self.bridged = False  # joined to another leg: the agent side left, the transport goes on
        self.bridge_kept = False  # ... and the agent side stayed attached (Bridged(keep)): no CallEnd sent
        self.hanging_up = False  # we asked the leg to hang up (HangupLeg): its end is on the way

    def handle(self, event: Event) -> tuple[Action, ...]:
        if self.state == ENDED:
            return _NONE
        return _HANDLERS[type(event)](self, event)

    # -- queries (what the gateway reads between events) --------------------------------

    @property
    def released(self) -> bool:
        return self.state == ENDED

    def detach_overdue(self, now: float) -> bool:
        """CallEnd was sent, CallEnded has not come, and the detach timeout passed."""
        return (self.state == ENDING and self.transport_done and not self.agent_done
                and bool(self.end_deadline) and now > self.end_deadline)

    def timer(self, now: float, media: int) -> str:
        """The reason of a call timer that ran out at ``now`` ("" none), ``media`` being the
        call's inbound packet count so far (a change restarts the media timeout: no event per
        packet). Only while the transport is up; :class:`TimerFired` with the reason follows."""
        if self.transport_done or self.state == ENDED:
            return ""
        if self.call_deadline and now >= self.call_deadline:
            return MAX_CALL_REASON
        if media != self.media_seen:
            self.media_seen, self.media_at = media, now
        elif self.media_timeout_s and now - self.media_at >= self.media_timeout_s:
            return MEDIA_TIMEOUT_REASON
        return ""

    # -- the steps shared by several events ---------------------------------------------

    def _release_if_done(self) -> tuple[Action, ...]:
        if self.transport_done and self.agent_done and self.state != ENDED:
            self.state = ENDED
            return (RELEASE,)
        return _NONE

    def _send_call_end(self, now: float) -> SendCallEnd:
        self.end_deadline = now + self.detach_timeout_s
        return SendCallEnd(self.end_reason or "hangup")

    def _end_transport(self, reason: str, now: float) -> tuple[Action, ...]:
        """The transport side is gone (once)."""
        if self.transport_done:
            return _NONE
        self.transport_done = True
        self.end_reason = self.end_reason or reason
        if self.state == STARTING:
            # the start's end (AgentStarted) finishes the agent side; with no start, Abandon does
            # (an Abandon that came first, the transport still up, released the call here)
            self.state = ENDING
            return (STOP_MEDIA, *self._release_if_done())
        self.state = ENDING
        out: list[Action] = [STOP_MEDIA]
        if self.builtin:
            out.append(STOP_BUILTIN)
        elif self.process and not self.agent_done:
            if not self.bridged or self.bridge_kept:  # a bridged call's CallEnd went out at the bridge
                out.append(self._send_call_end(now))
        else:
            self.agent_done = True
        return (*out, *self._release_if_done())

    def _hang_up(self, reason: str, leg: bool, now: float) -> tuple[Action, ...]:
        """End the call from our side: the leg hangs up (and reports its end), or, without a
        leg, the transport side ends here."""
        self.end_reason = self.end_reason or reason
        if self.transport_done:
            return _NONE
        if leg:
            self.hanging_up = True
            return (HangupLeg(reason),)
        return self._end_transport(reason, now)

    # -- events --------------------------------------------------------------------------

    def _admit(self, e: Admit) -> tuple[Action, ...]:
        self.process = e.process
        self.call_deadline = e.now + e.max_call_s if e.max_call_s > 0 else 0.0
        self.media_timeout_s = e.media_timeout_s
        self.media_at = e.now
        admitted = Count(f"calls_admitted_{e.transport}")
        return (Count("calls_echo_fallback"), admitted) if e.fallback else (admitted,)

    def _transport_started(self, e: TransportStarted) -> tuple[Action, ...]:
        if self.start != NOT_STARTED:
            return _NONE  # the agent side starts once
        self.start = STARTED if self.transport_done else START_PENDING
        if self.transport_done:  # the caller is gone already: nothing to start
            self.agent_done = True
            return self._release_if_done()
        return (START_AGENT,)

    def _agent_started(self, e: AgentStarted) -> tuple[Action, ...]:
        if self.start != START_PENDING:
            return _NONE
        self.start = STARTED
        self.builtin = e.builtin
        revoke: tuple[Action, ...] = (RevokeStart("start unanswered"),) if (
            not e.ok and e.unanswered and self.process) else ()
        if self.transport_done:  # the caller hung up while the agent side started
            if e.ok and self.process:
                return (self._send_call_end(e.now), *self._release_if_done())
            self.agent_done = True
            return (*revoke, *self._release_if_done())
        if e.ok:
            self.state = ACTIVE
            return (START_PACING, Count("calls_started"), NotifyReady(True, e.why))
        # no agent side: the transport's end (which NotifyReady brings about) releases the
        # call itself (an agent that died during CallStart used to leave the call and its
        # rings in the table for good)
        self.agent_done = True
        self.state = ENDING
        return (*revoke, Count("calls_failed_start"), NotifyReady(False, e.why))

    def _transport_ended(self, e: TransportEnded) -> tuple[Action, ...]:
        return self._end_transport(e.reason, e.now)

    def _hangup(self, e: Hangup) -> tuple[Action, ...]:
        return self._hang_up(e.reason, e.leg, e.now)

    def _agent_hangup(self, e: AgentHangup) -> tuple[Action, ...]:
        self.agent_done = True
        if self.bridged:  # it left at the bridge: the legs' own ends end the call
            return self._release_if_done()
        return self._hang_up(e.reason, e.leg, e.now) or self._release_if_done()

    def _agent_ended(self, e: AgentEnded) -> tuple[Action, ...]:
        self.agent_done = True
        if not self.transport_done and not self.bridged:
            return self._hang_up(e.reason or AGENT_ENDED_REASON, e.leg, e.now)
        return self._release_if_done()

    def _agent_lost(self, e: AgentLost) -> tuple[Action, ...]:
        if self.agent_done:
            return _NONE
        self.agent_done = True
        lost = Count("calls_agent_lost")
        if self.bridged:  # the bridge goes on without it
            return (lost, *self._release_if_done())
        # a call that already waits for CallEnded is released here (it used to stay in the
        # table, both sides done, until the gateway stopped)
        return (lost, *(self._hang_up(AGENT_LOST_REASON, e.leg, e.now) or self._release_if_done()))

    def _agent_side_over(self, e: BuiltinStopped) -> tuple[Action, ...]:
        self.agent_done = True
        return self._release_if_done()

    def _abandon(self, e: Abandon) -> tuple[Action, ...]:
        if self.start != NOT_STARTED:
            return _NONE  # it did start (a dialled call's early media): its own end finishes it
        self.agent_done = True
        return self._release_if_done()

    def _detach_timeout(self, e: DetachTimeout) -> tuple[Action, ...]:
        if self.agent_done:
            return _NONE
        self.agent_done = True
        return (Count("calls_detach_timeout"), *self._release_if_done())

    def _timer_fired(self, e: TimerFired) -> tuple[Action, ...]:
        if self.transport_done:
            return _NONE
        return (Count(TIMER_COUNTERS.get(e.reason, "calls_timer")), *self._hang_up(e.reason, e.leg, e.now))

    def _bridged(self, e: Bridged) -> tuple[Action, ...]:
        if self.state != ACTIVE or self.bridged or self.transport_done or self.agent_done or not self.process:
            return _NONE
        self.bridged = True
        if e.keep:
            self.bridge_kept = True
            return _NONE
        self.end_deadline = e.now + self.detach_timeout_s
        return (SendCallEnd(BRIDGED_REASON),)

    def _unbridged(self, e: Unbridged) -> tuple[Action, ...]:
        if not self.bridged or self.transport_done:
            return _NONE
        if not self.bridge_kept:
            return self._hang_up(BRIDGE_ENDED_REASON, e.leg, e.now)
        if self.hanging_up:
            return _NONE  # our hang-up is under way (the gateway's stop, a timer): it ends the call
        if self.agent_done:  # the agent side left during the bridge: nobody to go back to
            return (Count("bridges_lost_hung_up"), *self._hang_up(BRIDGE_LOST_REASON, e.leg, e.now))
        self.bridged = self.bridge_kept = False
        return (Count("bridges_lost_resumed"), SEND_BRIDGE_ENDED)

    def _worker_lost(self, e: WorkerLost) -> tuple[Action, ...]:
        return (FORGET_WORKER,)

    def _shutdown(self, e: Shutdown) -> tuple[Action, ...]:
        if self.transport_done:
            return _NONE
        if e.leg:
            self.hanging_up = True
            return (HangupLeg(SHUTDOWN_REASON),)
        return self._end_transport(SHUTDOWN_REASON, e.now)

    def _force_release(self, e: ForceRelease) -> tuple[Action, ...]:
        out = self._end_transport(SHUTDOWN_REASON, e.now)
        self.agent_done = True
        return (*out, *self._release_if_done())


_HANDLERS: dict[type, Callable[[CallMachine, Any], tuple[Action, ...]]] = {
    Admit: CallMachine._admit,
    TransportStarted: CallMachine._transport_started,
    AgentStarted: CallMachine._agent_started,
    TransportEnded: CallMachine._transport_ended,
    Hangup: CallMachine._hangup,
    AgentHangup: CallMachine._agent_hangup,
    AgentEnded: CallMachine._agent_ended,
    AgentLost: CallMachine._agent_lost,
    BuiltinStopped: CallMachine._agent_side_over,
    Abandon: CallMachine._abandon,
    DetachTimeout: CallMachine._detach_timeout,
    TimerFired: CallMachine._timer_fired,
    WorkerLost: CallMachine._worker_lost,
    Shutdown: CallMachine._shutdown,
    ForceRelease: CallMachine._force_release,
    Bridged: CallMachine._bridged,
    Unbridged: CallMachine._unbridged,
}
