"""The call's lifecycle in the core: each call's CallMachine fed, and its actions executed.

Owns :class:`CallLifecycle`, the collaborator of the gateway core behind the
call methods of the transport seam (:class:`~brisvox.gateway.core.host.CallHost`):
admitting a call (its agent process chosen), starting the agent side
(CallStart to the agent process, or the echo agent, on the worker chosen),
taking the caller's audio and DTMF in, and ending and releasing the call.
*When* each of these happens is the call's
:class:`~brisvox.gateway.core.call_machine.CallMachine`'s (read its
docstring): this class turns what a transport, an agent process or the
gateway's stop says into the machine's events, and executes the actions the
machine returns through one dispatch table (:meth:`CallLifecycle.action_handlers`:
action type -> handler).

Invariants (of the execution; the semantics are the machine's):

* Actions run in the order the machine returns them, in the callback that
  fed its event; the start of the agent side and the echo agent's stop are
  the only tasks, and each ends by feeding the machine its result.
* A call's rings are unlinked once (``Release``: :meth:`CallTable.release`),
  and with them the call leaves the pacer, its recording closes, its
  agent process's and worker's counts go down (:class:`~brisvox.gateway.core.peer_load.PeerLoad`)
  and its stats are folded into the gateway's.
* :meth:`CallLifecycle.audio_in` is the one writer of a call's ``in`` ring
  and its receive counters; audio after the transport side ended is dropped
  (the machine's ``transport_done`` is the guard: no event per packet).
* A call whose ``CallAccepted`` carries ``recording`` is recorded
  (:mod:`brisvox.gateway.core.recorder`) from then until its transport side ends
  (or its release, whichever is first): ``audio_in`` hands it the caller's
  audio, the pacer each frame it released.
* Once every call's transport side is done, :meth:`CallLifecycle.transports_gone`
  returns (the gateway's stop waits for it).
* The call's media state (:meth:`CallLifecycle.media_state`) reaches its agent process
  once per change and in order: ``CallStart.media`` when the start is sent, then a
  ``CallMedia`` for each change once the call is active (a change during the start is
  sent right after its CallAccepted), never after the transport side ended.

* Warm transfer (:mod:`brisvox.gateway.core.consults` decides): a queued Twilio consult
  leg is claimed at ``start_call``; CallStart carries ``consult_for``/``consult_summary``;
  ``bridged`` feeds the machine ``Bridged`` (the agent's talkspurt ends there; ``keep`` for
  the caller of a Bridge with ``keep``); when a call's transport side ends (``StopMedia``)
  what the consults return runs right after: hang-ups (the person's leg of a caller who
  left, an unbridged consult leg of a caller) and, for the caller of a person who left,
  ``Unbridged``, whose ``SendBridgeEnded`` ends the relay's talkspurt, drops the agent's
  audio written during the bridge (:meth:`~brisvox.gateway.core.pacer.Pacer.unbridged`) and
  sends BridgeEnded; a released call's leg goes into its transfer's record.

It holds what it executes with (the call table, the pacer, the recorder, the
links, the peer load, the metrics) and reaches the loop only through the two
callables it is given (``spawn``, ``now``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import numpy as np

from brisvox.gateway.config import GatewayConfig
from brisvox.gateway.core import call_machine as M
from brisvox.gateway.core.calls import Call, CallTable, Leg
from brisvox.gateway.core.consults import BRIDGE_LOST, CALLER_GONE, Consults
from brisvox.gateway.core.pacer import Pacer
from brisvox.gateway.core.peer_load import ECHO, ECHO_TTS_RATE, PeerLoad
from brisvox.gateway.core.recorder import Recorder
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.runtime.log_limit import LogLimiter
from brisvox.runtime.memory import IdleTrim
from ipc import frames as F
from ipc.links import Links

log = logging.getLogger("brisvox.gateway")
TIMER_LOG = LogLimiter(log)  # a call ended by its timer: one line per reason per minute, the rest counted

ActionHandler = Callable[[Call, Any], None]
Ready = Callable[[bool, str], None]
DETACH_TIMEOUT, BUILTIN_STOPPED, ABANDON = M.DetachTimeout(), M.BuiltinStopped(), M.Abandon()
TRANSPORT_STARTED, WORKER_LOST = M.TransportStarted(), M.WorkerLost()


class Builtin(Protocol):
    """The built-in agent serving a call (the echo agent), as the lifecycle starts and stops it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class CallLifecycle:
    """Machine events in, machine actions out (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, instance: str, *, table: CallTable, pacer: Pacer,
                 recorder: Recorder, links: Links, load: PeerLoad, metrics: GatewayMetrics,
                 idle_trim: IdleTrim, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
                 now: Callable[[], float], make_builtin: Callable[[Call], Builtin],
                 consults: Consults) -> None:
        self.cfg = cfg
        self.instance = instance
        self.table = table
        self.pacer = pacer
        self.recorder = recorder
        self.links = links
        self.load = load
        self.metrics = metrics
        self.idle_trim = idle_trim
        self.spawn = spawn
        self.now = now
        self.make_builtin = make_builtin
        self.consults = consults  # warm transfer: consult legs and bridges (their rules, not their events)
        self._ready: dict[str, Ready] = {}  # call id -> its start_call's on_ready, until answered
        self._transports_idle = asyncio.Event()
        self.actions = self.action_handlers()

    # -- events in ---------------------------------------------------------------------------

    def feed(self, call: Call, event: M.Event) -> None:
        """``event`` happened to ``call``: its machine decides, the actions run here."""
        handlers = self.actions
        for a in call.machine.handle(event):
            handlers[type(a)](call, a)

    def admit(self, transport: str, agent: str, call_rate: int, *, source: str = "",
              media_timeout_s: float = 0.0) -> Call:
        """Admit a call (rings created) from ``source`` (its share: ``max_calls_per_source``),
        with a media timeout (0: none). Raises AdmissionError (full/draining/source/rings)."""
        name, proc = self.load.resolve_agent(agent)
        tts_rate = ECHO_TTS_RATE if name == ECHO else self.cfg.tts_rate
        per_source = self.cfg.source_call_limit(self.table.max_calls)
        # AdmissionError: counted there
        call = self.table.admit(transport, name, call_rate, tts_rate, source=source, per_source=per_source)
        self.idle_trim.note(len(self.table))
        call.agent_proc = proc
        self.feed(call, M.Admit(transport, process=bool(proc), fallback=name == ECHO and agent != ECHO,
                                now=self.now(), max_call_s=self.cfg.max_call_s, media_timeout_s=media_timeout_s))
        return call

    def start_call(self, call: Call, leg: Leg, on_ready: Ready) -> None:
        """Attach the transport leg and start the agent side; ``on_ready(ok, why)`` follows."""
        call.leg = leg
        if self.consults.claim(call):  # a Twilio consult leg (known by its CallSid) whose caller left
            self.hangup(call, CALLER_GONE)
            self.abandon(call)  # no agent side: its leg's end releases it
            return
        if call.machine.start == M.NOT_STARTED and not call.machine.released:
            self._ready[call.call_id] = on_ready  # answered by NotifyReady, or dropped at the release
        self.feed(call, TRANSPORT_STARTED)

    def abandon(self, call: Call) -> None:
        """The agent side of ``call`` never started (see :class:`~brisvox.gateway.core.host.CallHost`)."""
        self.feed(call, ABANDON)

    def transport_ended(self, call: Call, reason: str) -> None:
        """The caller side is gone (BYE, stop, close, timeout). Idempotent."""
        if not call.machine.transport_done:
            self.feed(call, M.TransportEnded(reason, self.now()))

    def hangup(self, call: Call, reason: str) -> None:
        """End the call from our side (RTP timeout, transfer, tests); the leg reports the end."""
        self.feed(call, M.Hangup(reason, call.leg is not None, self.now()))

    def agent_hangup(self, call: Call, reason: str) -> None:
        """The agent process asks to end the call (Hangup)."""
        self.feed(call, M.AgentHangup(reason, call.leg is not None, self.now()))

    def bridged(self, call: Call, keep: bool = False) -> None:
        """A warm transfer joined the call to another leg: its agent side leaves (CallEnd
        "bridged"; with ``keep`` it stays attached, unheard), its transport stays (its pacer
        now sends the other leg's audio)."""
        if call.gate.playing:  # the agent's audio (hold music) stops here: a new talkspurt follows
            call.gate.spurt_end()
            if call.leg is not None:
                call.leg.end_spurt()
        self.feed(call, M.Bridged(self.now(), keep=keep))

    def agent_ended(self, call: Call, reason: str) -> None:
        """The agent process is done with the call (CallEnded)."""
        self.feed(call, M.AgentEnded(reason, call.leg is not None, self.now()))

    def agent_lost(self, proc: str) -> None:
        """Agent process ``proc`` is gone: its calls end."""
        for call in list(self.table.calls.values()):
            if call.agent_proc == proc:
                self.feed(call, M.AgentLost(call.leg is not None, self.now()))

    def worker_lost(self, index: int) -> None:
        """Worker ``index`` left: its calls have no worker until they are re-attached."""
        for call in list(self.table.calls.values()):
            if call.worker == index:
                self.feed(call, WORKER_LOST)

    def expire_detaches(self, now: float) -> None:
        """Every report period, each call's timers: release the calls whose agent did not answer
        CallEnd within ``detach_timeout_s``, hang up those past ``max_call_s`` or their media
        timeout (:meth:`~brisvox.gateway.core.call_machine.CallMachine.timer`)."""
        for call in list(self.table.calls.values()):
            machine = call.machine
            if machine.detach_overdue(now):
                self.feed(call, DETACH_TIMEOUT)
                continue
            reason = machine.timer(now, call.stats.packets_in)
            if reason:
                TIMER_LOG(reason, "call %s (%s): %s, hanging up", call.call_id, call.transport,
                            reason, level=logging.INFO)
                self.feed(call, M.TimerFired(reason, call.leg is not None, now))

    # -- the gateway's stop ----------------------------------------------------------------------

    def hang_up_all(self) -> None:
        """Every call is hung up (its transport gets the grace to end it)."""
        for call in list(self.table.calls.values()):
            self.feed(call, M.Shutdown(call.leg is not None, self.now()))

    async def transports_gone(self, grace_s: float) -> bool:
        """Wait up to ``grace_s`` until every call's transport side is done (False: it expired)."""
        if all(c.machine.transport_done for c in self.table.calls.values()):
            return True
        self._transports_idle.clear()
        try:
            async with asyncio.timeout(grace_s):
                await self._transports_idle.wait()
        except TimeoutError:
            return False
        return True

    def release_all(self) -> None:
        """Both sides of every call end now, and every call is released (once)."""
        for call in list(self.table.calls.values()):
            self.feed(call, M.ForceRelease(self.now()))

    # -- the caller's side in ---------------------------------------------------------------------

    def audio_in(self, call: Call, pcm16: np.ndarray, rate: int, wire_bytes: int = -1, gap: int = 0) -> None:
        """Caller audio into the ``in`` ring (see :class:`~brisvox.gateway.core.host.CallHost`)."""
        st = call.stats
        if wire_bytes >= 0:
            st.packets_in += 1
            st.bytes_in += wire_bytes
        if call.machine.transport_done:
            return
        if rate != call.call_rate:
            self.metrics.inc("audio_in_wrong_rate")
            return
        ring = call.in_ring
        if gap:
            ring.write_silence(gap)
        n = len(pcm16)
        if n:
            ring.write(pcm16)
        if call.recording is not None:
            call.recording.caller(pcm16, gap)
        st.samples_in += n + gap

    def packet_in(self, call: Call, wire_bytes: int) -> None:
        st = call.stats
        st.packets_in += 1
        st.bytes_in += wire_bytes

    def protocol_error(self, call: Call | None, counter: str) -> None:
        if counter:
            self.metrics.inc(counter)
        if call is not None:
            call.stats.malformed += 1

    def media_state(self, call: Call, state: str, dial: dict[str, int] | None = None) -> None:
        """The call's media state changed (see :class:`~brisvox.gateway.core.host.CallHost`)."""
        if state not in F.MEDIA_STATES:
            raise ValueError(f"unknown media state {state!r}")
        if dial and dial != call.dial_ms:
            call.dial_ms = dict(dial)
            call.dial_told = False
        if state == F.MEDIA_ANSWERED:
            self.consults.answered(call)
        if state != call.media:
            call.media = state
            self.metrics.inc(f"calls_media_{state}")
        self._tell_media(call)

    def _tell_media(self, call: Call) -> None:
        """Send the agent process the call's media state (and a dialled call's times) if it
        was not told them yet."""
        if (call.media == call.media_told and (call.dial_told or not call.dial_ms)) or not call.agent_proc \
                or call.machine.state != M.ACTIVE:
            return
        call.media_told = call.media
        call.dial_told = True
        self.links.send(call.agent_proc, F.CallMedia(call_id=call.call_id, state=call.media,
                                                     at_ns=time.monotonic_ns(), dial=dict(call.dial_ms) or None))

    def dtmf_in(self, call: Call, digit: str, duration_ms: int) -> None:
        call.stats.dtmf_in += 1
        if call.builtin is not None:
            call.builtin.on_dtmf(digit)
        elif call.agent_proc and call.machine.state == M.ACTIVE:
            self.links.send(call.agent_proc, F.Dtmf(call_id=call.call_id, digit=digit,
                                                    duration_ms=duration_ms, at_ns=time.monotonic_ns()))

    # -- the agent side's start (a task) -------------------------------------------------------------

    async def _start_agent(self, call: Call) -> None:
        ok, why, builtin, unanswered = False, "", False, False
        try:
            self.load.set_worker(call, self.load.pick_worker())
            if call.agent == ECHO:
                echo = self.make_builtin(call)
                call.builtin = echo
                builtin = True
                await echo.start()
                ok = True
            else:
                ok, why, unanswered = await self._call_start(call)
        except Exception as e:  # a broken start must end this call only
            log.exception("starting call %s failed", call.call_id)
            why = f"internal error: {type(e).__name__}"
        self.feed(call, M.AgentStarted(ok, why, builtin, self.now(), unanswered=unanswered))
        self._tell_media(call)  # a change while the start was on its way

    async def _call_start(self, call: Call) -> tuple[bool, str, bool]:
        """CallStart to the call's agent process: (accepted, why not, never answered)."""
        proc = call.agent_proc
        self.load.agent_call_started(proc)
        frame = F.CallStart(
            call_id=call.call_id, agent=call.agent, transport=call.transport,
            call_rate=call.call_rate, tts_rate=call.tts_rate, worker=call.worker,
            instance=self.instance, started_ns=call.started_ns,
            transport_ids=dict(call.transport_ids) or None, params=dict(call.params) or None,
            caller=call.caller, called=call.called, events=call.events, ring_key=call.ring_key,
            media=call.media, consult_for=call.consult_for, consult_summary=call.consult_summary,
        )
        call.media_told = call.media
        try:
            reply = await self.links.request(proc, frame, self.cfg.agent_timeout_s)
        except (TimeoutError, ConnectionError) as e:
            self.metrics.inc("calls_agent_timeout")
            return False, f"agent {proc}: {type(e).__name__}", True
        if isinstance(reply, F.CallAccepted):
            if reply.worker >= 0:
                self.load.set_worker(call, reply.worker)  # another worker took it
            if reply.recording and not call.machine.transport_done:  # the agent asks for a recording
                call.recording = self.recorder.open(call.call_id, call.call_rate, reply.recording)
            return True, "", False
        if isinstance(reply, F.ErrorReply):
            log.warning("call %s: agent %s refused it: %s %s", call.call_id, proc, reply.kind, reply.detail)
            self.metrics.inc("calls_agent_refused")
            return False, f"agent refused: {reply.kind}", False  # the caller hears the kind; the log, the detail
        return False, "", False

    async def _stop_builtin(self, call: Call) -> None:
        try:
            await call.builtin.stop()
        finally:
            self.feed(call, BUILTIN_STOPPED)

    # -- actions out ----------------------------------------------------------------------------------

    def action_handlers(self) -> dict[type, ActionHandler]:
        """What the gateway does for each action a call's machine returns."""
        return {
            M.Count: self._count,
            M.StartAgent: self._start_agent_task,
            M.StartPacing: self._start_pacing,
            M.NotifyReady: self._notify_ready,
            M.StopMedia: self._stop_media,
            M.SendCallEnd: self._send_call_end,
            M.RevokeStart: self._revoke_start,
            M.StopBuiltin: self._stop_builtin_task,
            M.HangupLeg: self._hangup_leg,
            M.ForgetWorker: lambda call, a: self.load.forget_worker(call),
            M.Release: self._release,
            M.SendBridgeEnded: self._send_bridge_ended,
        }

    def _start_pacing(self, call: Call, a: M.StartPacing) -> None:
        self.pacer.add(call)
        if call.media == F.MEDIA_ANSWERED:
            self.consults.answered(call)

    def _count(self, call: Call, a: M.Count) -> None:
        self.metrics.inc(a.name)

    def _start_agent_task(self, call: Call, a: M.StartAgent) -> None:
        self.spawn(self._start_agent(call))

    def _stop_builtin_task(self, call: Call, a: M.StopBuiltin) -> None:
        self.spawn(self._stop_builtin(call))

    def _notify_ready(self, call: Call, a: M.NotifyReady) -> None:
        on_ready = self._ready.pop(call.call_id, None)
        if on_ready is not None:
            on_ready(a.ok, a.why)

    def _stop_media(self, call: Call, a: M.StopMedia) -> None:
        self.pacer.remove(call)
        if call.recording is not None:
            call.recording.close()  # no more audio either way
        if all(c.machine.transport_done for c in self.table.calls.values()):
            self._transports_idle.set()
        for other, reason in self.consults.transport_done(call):  # the bridge's other leg, a consult leg
            if reason == BRIDGE_LOST:  # the person left: the caller goes back to its agent, or is hung up
                self.feed(other, M.Unbridged(other.leg is not None, self.now()))
            else:
                self.hangup(other, reason)

    def _send_call_end(self, call: Call, a: M.SendCallEnd) -> None:
        self.links.send(call.agent_proc, F.CallEnd(call_id=call.call_id, reason=a.reason,
                                                   ended_ns=time.monotonic_ns()))

    def _send_bridge_ended(self, call: Call, a: M.SendBridgeEnded) -> None:
        """The caller is back with its agent: the relay's talkspurt ends, the agent's audio from
        the bridge's time is dropped, the agent is told."""
        if call.relay_playing and call.leg is not None:
            call.leg.end_spurt()  # the person's voice stops here: the agent's starts a new talkspurt
        other = self.consults.unbridged(call)
        self.pacer.unbridged(call)
        ended = self.table.get(other)
        self.links.send(call.agent_proc, F.BridgeEnded(call_id=call.call_id, other=other,
                                                       reason=(ended.end_reason if ended else "")[:200],
                                                       ended_ns=time.monotonic_ns()))

    def _revoke_start(self, call: Call, a: M.RevokeStart) -> None:
        self.metrics.inc("calls_start_revoked")
        self.links.send(call.agent_proc, F.CallEnd(call_id=call.call_id, reason=a.reason,
                                                   ended_ns=time.monotonic_ns()))

    def _hangup_leg(self, call: Call, a: M.HangupLeg) -> None:
        if call.leg is not None:
            call.leg.hangup(a.reason)

    def _release(self, call: Call, a: M.Release) -> None:
        self._ready.pop(call.call_id, None)
        if not self.table.release(call):
            log.error("call %s: released twice", call.call_id)  # the machine says once
            return
        self.pacer.remove(call)
        if call.recording is not None:
            call.recording.close()
        self.metrics.fold(call.stats)
        self.consults.released(call)
        self.load.agent_call_ended(call.agent_proc)
        self.load.set_worker(call, -1)
        self.metrics.inc("calls_ended")
        self.idle_trim.note(len(self.table))  # the last call's memory back to the kernel
