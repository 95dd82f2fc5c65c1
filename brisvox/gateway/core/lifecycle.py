"""The call's lifecycle in the core: admission, the agent side's start, the transport's events.

Owns :class:`CallLifecycle`, the part of the gateway core that implements
the transport seam (:class:`~brisvox.gateway.core.host.CallHost`): admitting a
call, choosing its agent process and worker, starting the agent side
(CallStart or the echo agent), taking the caller's audio and DTMF in, and
ending and releasing the call.

Call lifecycle::

    transport admits (CallTable.admit: rings created)    -> state "starting"
    CallStart to an agent process (or the echo agent)    -> "active" (pacer serves it)
    transport ends (BYE, stop, close) or agent Hangup    -> "ending": CallEnd sent
    agent answers CallEnded (or detach_timeout_s passes) -> rings unlinked, "ended"

Invariants:

* Every call ends exactly once on each side (transport, agent) and its rings
  are unlinked exactly once (:meth:`CallLifecycle.release_if_done`, once both
  sides are done, or forced at shutdown).
* :meth:`CallLifecycle.audio_in` is the one writer of a call's ``in`` ring
  and its receive counters; audio after the transport side ended is dropped.
* A call whose ``CallAccepted`` carries ``recording`` is recorded
  (:mod:`brisvox.gateway.core.recorder`) from then until its transport side ends
  (or its release, whichever is first): ``audio_in`` hands it the caller's
  audio, the pacer each frame it released.
* ``workers`` counts, per worker, the live calls it serves (all agents);
  :meth:`CallLifecycle.set_worker` is the only place that changes a call's
  worker, so the count stays true.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from brisvox.gateway.config import GatewayConfig, GatewaySettings
from brisvox.gateway.core.calls import Call, CallTable, Leg
from brisvox.gateway.core.playout import PlayoutCommands
from brisvox.gateway.core.recorder import Recorder
from brisvox.runtime.memory import IdleTrim
from ipc import frames as F

if TYPE_CHECKING:
    from brisvox.gateway.core.gateway_core import GatewayCore

log = logging.getLogger("brisvox.gateway")

ECHO = "echo"
ECHO_TTS_RATE = 16000


class CallLifecycle(PlayoutCommands):
    """Admission, call start and end; the :class:`~brisvox.gateway.core.host.CallHost` methods."""

    settings: GatewaySettings
    cfg: GatewayConfig
    instance: str
    table: CallTable
    agents: dict[str, int]  # ready agent process -> live calls
    stopping_agents: set[str]  # no new calls; their live calls go on (a drain)
    workers: dict[int, int]  # ready worker index -> live calls it serves (all agents)
    loop: asyncio.AbstractEventLoop | None
    _tasks: set[asyncio.Task[Any]]
    _transports_idle: asyncio.Event
    idle_trim: IdleTrim
    recorder: Recorder

    # -- the loop ------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        assert self.loop is not None
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        loop = self.loop or asyncio.get_event_loop()
        return loop.call_later(delay, callback)

    def count(self, name: str, n: int = 1) -> None:
        self.metrics.inc(name, n)

    # -- admission ------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.table.draining

    def refusal(self) -> str:
        """Why :meth:`admit` would refuse a call now (``"draining"``, ``"full"``), else ``""``."""
        return self.table.refusal()

    def note_refused(self, reason: str) -> None:
        self.table.refused[reason] = self.table.refused.get(reason, 0) + 1

    def resolve_agent(self, agent: str) -> tuple[str, str]:
        """(agent name actually used, agent process identity or "" for the echo agent)."""
        if agent == ECHO:
            return ECHO, ""
        if self.agents:
            proc = min(self.agents, key=lambda n: (self.agents[n], n))
            return agent, proc
        return ECHO, ""  # no agent process: the echo line-test agent serves the call

    def pick_worker(self) -> int:
        """The worker for a new call: the least loaded by the gateway's count of live calls.

        The gateway owns this choice for every call (pipeline and echo): it is the one
        place that sees all calls of all agent processes. The agent attaches to it (or,
        if it refuses, to another one and says which in CallAccepted)."""
        if not self.workers:
            return -1
        return min(self.workers, key=lambda i: (self.workers[i], i))

    def set_worker(self, call: Call, index: int) -> None:
        """``call`` is served by worker ``index`` (-1: none known); keeps ``workers`` true."""
        if index not in self.workers:
            index = -1
        old = call.worker
        if old == index:
            return
        if old in self.workers:
            self.workers[old] = max(0, self.workers[old] - 1)
        call.worker = index
        if index >= 0:
            self.workers[index] += 1

    def admit(self, transport: str, agent: str, call_rate: int) -> Call:
        """Admit a call (rings created). Raises AdmissionError (full/draining/rings)."""
        name, proc = self.resolve_agent(agent)
        tts_rate = ECHO_TTS_RATE if name == ECHO else self.cfg.tts_rate
        call = self.table.admit(transport, name, call_rate, tts_rate)  # AdmissionError: counted there
        self.idle_trim.note(len(self.table))
        call.agent_proc = proc
        if name == ECHO and agent != ECHO:
            self.metrics.inc("calls_echo_fallback")
        self.metrics.inc(f"calls_admitted_{transport}")
        return call

    def start_call(self, call: Call, leg: Leg, on_ready: Callable[[bool, str], None]) -> None:
        """Attach the transport leg and start the agent side; ``on_ready(ok, why)`` follows."""
        call.leg = leg
        self.spawn(self._start_call(call, on_ready))

    async def _start_call(self, call: Call, on_ready: Callable[[bool, str], None]) -> None:
        ok, why = False, ""
        try:
            self.set_worker(call, self.pick_worker())
            if call.agent == ECHO:
                from brisvox.gateway.core.echo import EchoAgent

                echo = EchoAgent(cast("GatewayCore", self), call)
                call.builtin = echo
                await echo.start()
                ok = True
            else:
                proc = call.agent_proc
                self.agents[proc] = self.agents.get(proc, 0) + 1
                frame = F.CallStart(
                    call_id=call.call_id, agent=call.agent, transport=call.transport,
                    call_rate=call.call_rate, tts_rate=call.tts_rate, worker=call.worker,
                    instance=self.instance, started_ns=call.started_ns,
                    transport_ids=dict(call.transport_ids) or None, params=dict(call.params) or None,
                    caller=call.caller, called=call.called, events=call.events,
                )
                try:
                    reply = await self.links.request(proc, frame, self.cfg.agent_timeout_s)
                except (TimeoutError, ConnectionError) as e:
                    why = f"agent {proc}: {type(e).__name__}"
                    self.metrics.inc("calls_agent_timeout")
                    reply = None
                if isinstance(reply, F.CallAccepted):
                    ok = True
                    if reply.worker >= 0:
                        self.set_worker(call, reply.worker)  # another worker took it
                    if reply.recording and not call.transport_done:  # the agent asks for a recording
                        call.recording = self.recorder.open(call.call_id, call.call_rate, reply.recording)
                elif isinstance(reply, F.ErrorReply):
                    why = f"agent refused: {reply.kind}"  # the caller hears the kind; the log, the detail
                    log.warning("call %s: agent %s refused it: %s %s", call.call_id, proc, reply.kind, reply.detail)
                    self.metrics.inc("calls_agent_refused")
        except Exception as e:  # a broken start must end this call only
            log.exception("starting call %s failed", call.call_id)
            why = f"internal error: {type(e).__name__}"
        if call.transport_done:  # the caller hung up while we were starting
            if ok and call.agent_proc:
                self._send_call_end(call)
            else:
                call.agent_done = True
            self.release_if_done(call)
            return
        if ok:
            call.state = "active"
            self.pacer.add(call)
            self.metrics.inc("calls_started")
        else:
            # no agent side; the start is over, so the transport's end (which on_ready brings
            # about) must release the call itself: "starting" would tell it to leave that to
            # this task, which is done (an agent that died during CallStart used to leave the
            # call and its rings in the table for good)
            call.agent_done = True
            call.state = "ending"
            self.metrics.inc("calls_failed_start")
        on_ready(ok, why)
        if not ok:
            self.release_if_done(call)  # the leg may have ended already, inside on_ready

    def abandon(self, call: Call) -> None:
        """The agent side of ``call`` never started (see :class:`~brisvox.gateway.core.host.CallHost`)."""
        call.agent_done = True
        self.release_if_done(call)

    # -- transport events ---------------------------------------------------------

    def transport_ended(self, call: Call, reason: str) -> None:
        """The caller side is gone (BYE, stop, close, timeout). Idempotent."""
        if call.transport_done:
            return
        call.transport_done = True
        self.pacer.remove(call)
        if call.recording is not None:
            call.recording.close()  # no more audio either way
        call.end_reason = call.end_reason or reason
        if all(c.transport_done for c in self.table.calls.values()):
            self._transports_idle.set()
        if call.state == "starting":
            # the start task sees transport_done and finishes the agent side
            call.state = "ending"
            return
        if call.state == "active":
            call.state = "ending"
        if call.builtin is not None:
            self.spawn(self._stop_builtin(call))
        elif call.agent_proc and not call.agent_done:
            self._send_call_end(call)
        else:
            call.agent_done = True
        self.release_if_done(call)

    def _send_call_end(self, call: Call) -> None:
        assert self.loop is not None
        call.end_deadline = self.loop.time() + self.cfg.detach_timeout_s
        self.links.send(call.agent_proc, F.CallEnd(call_id=call.call_id, reason=call.end_reason or "hangup",
                                                   ended_ns=time.monotonic_ns()))

    async def _stop_builtin(self, call: Call) -> None:
        try:
            await call.builtin.stop()
        finally:
            call.agent_done = True
            self.release_if_done(call)

    def hangup(self, call: Call, reason: str) -> None:
        """End the call from our side (agent Hangup, agent death, timeouts)."""
        call.end_reason = call.end_reason or reason
        if call.leg is not None and not call.transport_done:
            call.leg.hangup(reason)
        elif not call.transport_done:
            self.transport_ended(call, reason)

    def release_if_done(self, call: Call, force: bool = False) -> None:
        """Unlink the call's rings once both sides are done (``force``: now, at shutdown)."""
        if not force and not (call.transport_done and call.agent_done):
            return
        if self.table.release(call):
            self.pacer.remove(call)
            if call.recording is not None:
                call.recording.close()
            self.metrics.fold(call.stats)
            if call.agent_proc in self.agents:
                self.agents[call.agent_proc] = max(0, self.agents[call.agent_proc] - 1)
            self.set_worker(call, -1)
            self.metrics.inc("calls_ended")
            self.idle_trim.note(len(self.table))  # the last call's memory back to the kernel

    # -- the caller's side in ---------------------------------------------------------

    def audio_in(self, call: Call, pcm16: np.ndarray, rate: int, wire_bytes: int = -1, gap: int = 0) -> None:
        """Caller audio into the ``in`` ring (see :class:`~brisvox.gateway.core.host.CallHost`)."""
        st = call.stats
        if wire_bytes >= 0:
            st.packets_in += 1
            st.bytes_in += wire_bytes
        if call.transport_done:
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

    def dtmf_in(self, call: Call, digit: str, duration_ms: int) -> None:
        call.stats.dtmf_in += 1
        if call.builtin is not None:
            call.builtin.on_dtmf(digit)
        elif call.agent_proc and call.state == "active":
            self.links.send(call.agent_proc, F.Dtmf(call_id=call.call_id, digit=digit,
                                                    duration_ms=duration_ms, at_ns=time.monotonic_ns()))
