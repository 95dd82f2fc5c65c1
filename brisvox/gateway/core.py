"""The gateway core: one asyncio loop that owns every caller-facing socket.

Owns the wiring between the transports (SIP/RTP, Twilio and native
WebSocket), the call table, the pacer, the built-in echo agent and the
control links to agent processes and workers. Runs standalone (its own loop
and ZeroMQ context, for tests and benches) or inside the daemon
(``brisvox/gateway/process.py``).

Call lifecycle::

    transport admits (CallTable.admit: rings created)    -> state "starting"
    CallStart to an agent process (or the echo agent)    -> "active" (pacer serves it)
    transport ends (BYE, stop, close) or agent Hangup    -> "ending": CallEnd sent
    agent answers CallEnded (or detach_timeout_s passes) -> rings unlinked, "ended"

Invariants:

* A Clear is applied in the callback that read it (:meth:`apply_clear`):
  stop releasing (close the epoch gate), tell the transport (Twilio
  ``clear`` / stop RTP audio), answer Cleared with the final release
  position and the marks the cut discarded. Nothing queued runs before it.
* Epoch ledger: after Clear(E) nothing is released from the out ring before
  the start of an utterance of an epoch > E (OutUtterance), and everything in
  between is counted as stale. The ring is cut at the release position (or
  at the newer utterance's start when it is already known), never at the
  write position: the worker may already have written the newer epoch's
  first audio while its OutUtterance is still on the way, and the utterance
  start, not the moment the Clear was read, says where the stale audio ends.
  A Clear read after the newer epoch's audio already started releasing
  (its OutUtterance overtook the Clear) stops nothing: no cut, no transport
  clear, no marks discarded (they are the newer epoch's or already played).
  The same holds for a lazy Clear (a new response's, not a barge-in's) read
  after a talkspurt started from a dry ring after the Clear was sent, before
  that response's OutUtterance arrived.
* Pause / Resume (a barge-in candidate holds the bot's audio,
  :meth:`apply_pause`): applied in the callback that read the frame, so the
  next tick releases nothing; the release position stays (the held audio
  stays in the out ring, nothing is cut). A hold ends with Resume (release
  goes on from the held position), a Clear (Cleared carries the held
  position: exactly what was played), an utterance of a newer epoch, or
  ``pause_max_ms`` (the pacer; counted). A Pause of a dead epoch (at or
  below the last Clear, or older than an announced utterance) and a
  Resume of an epoch that is not held are ignored and counted.
* The first frame of a response goes out in the callback that read its
  OutUtterance (or the Clear that found that utterance already announced),
  not at the pacer's next tick.
* Every call ends exactly once on each side (transport, agent) and its rings
  are unlinked exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from brisvox.gateway.calls import Call, CallTable, Leg, PendingMark
from brisvox.gateway.config import GatewaySettings
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.gateway.pacer import FRAME_S, Pacer
from ipc import frames as F
from ipc.bus import endpoint as bus_endpoint
from ipc.links import Links

log = logging.getLogger("brisvox.gateway")

ECHO = "echo"
ECHO_TTS_RATE = 16000
MAX_REPORTED_CALLS = 16


class GatewayCore:
    """See the module docstring."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        instance: str,
        identity: str = "gateway-0",
        inbox_endpoint: str | None = None,
        runtime_dir: Path | None = None,
        ctx: zmq.Context | None = None,
        static_peers: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.cfg = settings.gateway
        self.instance = instance
        self.identity = identity
        self.inbox_endpoint = inbox_endpoint
        self.runtime_dir = runtime_dir
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.metrics = GatewayMetrics()
        self.table = CallTable(instance, self.cfg.max_calls, self.cfg.ring_seconds)
        self.links = Links(self.ctx, identity, self._on_frame)
        self.pacer = Pacer(
            self.metrics,
            report_every=max(1, round(self.cfg.position_interval_ms / (FRAME_S * 1000))),
            on_mark_played=self._mark_played,
            on_report=self._report,
            pause_max_s=self.cfg.pause_max_ms / 1000.0,
        )
        self.static_peers = dict(static_peers or {})
        self.agents: dict[str, int] = {}  # ready agent process -> live calls
        self.workers: dict[int, int] = {}  # ready worker index -> live calls it serves (all agents)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sip: Any = None
        self.ws: Any = None
        self.endpoints: dict[str, str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._swallow: dict[str, set[str]] = {}
        self._echo_client: Any = None
        self._transports_idle = asyncio.Event()
        self._echo_actx: Any = None

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> dict[str, str]:
        """Bind everything; returns the bound endpoints (``sip``, ``websocket``, ``inbox``)."""
        from brisvox.gateway.sip_ua import SipUserAgent
        from brisvox.gateway.ws_server import WebSocketServer

        self.loop = asyncio.get_running_loop()
        self.links.start(self.loop, self.inbox_endpoint)
        if self.inbox_endpoint:
            self.endpoints["inbox"] = self.inbox_endpoint
        for name, ep in self.static_peers.items():
            self.links.connect(name, ep)
            if name.startswith("agent-"):
                self.agents.setdefault(name, 0)
            elif name.startswith("worker-"):
                self.workers.setdefault(int(name.split("-", 1)[1]), 0)
        if self.settings.sip.enabled:
            self.sip = SipUserAgent(self, self.settings.sip)
            host, port = await self.sip.start()
            self.endpoints["sip"] = f"{host}:{port}"
        if self.settings.websocket.enabled:
            self.ws = WebSocketServer(self, self.settings.websocket)
            host, port = await self.ws.start()
            self.endpoints["websocket"] = f"{host}:{port}"
        self.pacer.start(self.loop)
        return dict(self.endpoints)

    def drain(self) -> None:
        """Refuse new calls (SIP 503, OPTIONS 503, WebSocket 1013); live calls go on."""
        self.table.draining = True

    async def stop(self, grace_s: float = 2.0) -> None:
        """Hang up every call, wait up to ``grace_s`` for the transports, then release all."""
        self.table.draining = True
        for call in list(self.table.calls.values()):
            if call.leg is not None and not call.transport_done:
                call.leg.hangup("shutdown")
            elif not call.transport_done:
                self.transport_ended(call, "shutdown")
        if any(not c.transport_done for c in self.table.calls.values()):
            self._transports_idle.clear()
            try:
                async with asyncio.timeout(grace_s):
                    await self._transports_idle.wait()
            except TimeoutError:
                self.metrics.inc("stop_grace_expired")
        for call in list(self.table.calls.values()):
            if not call.transport_done:
                self.transport_ended(call, "shutdown")
            call.agent_done = True
            self._maybe_release(call, force=True)
        self.pacer.stop()
        if self.ws is not None:
            await self.ws.stop()
        if self.sip is not None:
            self.sip.stop()
        if self._echo_client is not None:
            try:
                async with asyncio.timeout(1.0):
                    await self._echo_client.close()
            except TimeoutError:
                pass
        for t in list(self._tasks):
            t.cancel()
        self.links.close()
        if self._own_ctx:
            self.ctx.term()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self.loop is not None
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # -- topology -------------------------------------------------------------

    def update_topology(self, rows: list[dict[str, Any]]) -> None:
        """Connect to ready agents/workers; end the calls of an agent that died."""
        if self.runtime_dir is None:
            return
        ready = {(r["role"], int(r["index"])) for r in rows if r.get("state") == "ready"}
        for role, idx in ready:
            name = f"{role}-{idx}"
            if role == "agent":
                self.links.connect(name, bus_endpoint(self.runtime_dir, name))
                self.agents.setdefault(name, 0)
            elif role == "worker":
                self.links.connect(name, bus_endpoint(self.runtime_dir, name))
                self.workers.setdefault(idx, 0)
        for name in list(self.agents):
            if ("agent", int(name.split("-")[1])) not in ready and name not in self.static_peers:
                del self.agents[name]
                self.links.disconnect(name)
                for call in list(self.table.calls.values()):
                    if call.agent_proc == name and not call.agent_done:
                        call.agent_done = True
                        self.metrics.inc("calls_agent_lost")
                        self.hangup(call, "agent process died")
        for idx in list(self.workers):
            if ("worker", idx) not in ready and f"worker-{idx}" not in self.static_peers:
                del self.workers[idx]
                self.links.disconnect(f"worker-{idx}")
                for call in self.table.calls.values():
                    if call.worker == idx:
                        call.worker = -1  # re-attached elsewhere; its next OutUtterance says where

        if self._echo_client is not None:
            self._echo_client.on_topology(rows)

    async def echo_client(self) -> Any:
        """The echo agent's worker client (subscriber ``<identity>-echo``), or None
        when the echo runs without workers (not configured, or none known)."""
        if not self.cfg.echo_use_workers:
            return None
        if self._echo_client is None:
            endpoints = {i: self.links.endpoints[f"worker-{i}"] for i in self.workers
                         if f"worker-{i}" in self.links.endpoints}
            if not endpoints:
                return None
            import zmq.asyncio

            from ipc.worker_client import WorkerClient

            self._echo_actx = zmq.asyncio.Context.shadow(self.ctx.underlying)
            client = WorkerClient(self._echo_actx, f"{self.identity}-echo", endpoints,
                                  on_out_utterance=lambda f: None, request_timeout=self.cfg.agent_timeout_s)
            self._echo_client = client
            await client.start()
        return self._echo_client

    # -- admission --------------------------------------------------------------

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
                from brisvox.gateway.echo import EchoAgent

                echo = EchoAgent(self, call)
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
                elif isinstance(reply, F.ErrorReply):
                    why = f"agent refused: {reply.kind}"
                    self.metrics.inc("calls_agent_refused")
        except Exception as e:  # a broken start must end this call only
            log.exception("starting call %s failed", call.call_id)
            why = f"internal error: {type(e).__name__}"
        if call.transport_done:  # the caller hung up while we were starting
            if ok and call.agent_proc:
                self._send_call_end(call)
            else:
                call.agent_done = True
            self._maybe_release(call)
            return
        if ok:
            call.state = "active"
            self.pacer.add(call)
            self.metrics.inc("calls_started")
        else:
            call.agent_done = True
            self.metrics.inc("calls_failed_start")
        on_ready(ok, why)

    # -- transport events ---------------------------------------------------------

    def transport_ended(self, call: Call, reason: str) -> None:
        """The caller side is gone (BYE, stop, close, timeout). Idempotent."""
        if call.transport_done:
            return
        call.transport_done = True
        self.pacer.remove(call)
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
        self._maybe_release(call)

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
            self._maybe_release(call)

    def hangup(self, call: Call, reason: str) -> None:
        """End the call from our side (agent Hangup, agent death, timeouts)."""
        call.end_reason = call.end_reason or reason
        if call.leg is not None and not call.transport_done:
            call.leg.hangup(reason)
        elif not call.transport_done:
            self.transport_ended(call, reason)

    def _maybe_release(self, call: Call, force: bool = False) -> None:
        if not force and not (call.transport_done and call.agent_done):
            return
        if self.table.release(call):
            self.pacer.remove(call)
            self.metrics.fold(call.stats)
            if call.agent_proc in self.agents:
                self.agents[call.agent_proc] = max(0, self.agents[call.agent_proc] - 1)
            self.set_worker(call, -1)
            self._swallow.pop(call.call_id, None)
            self.metrics.inc("calls_ended")

    def audio_in(self, call: Call, n: int) -> None:
        """Bookkeeping after a leg wrote ``n`` samples to the in ring."""
        call.stats.samples_in += n

    def dtmf_in(self, call: Call, digit: str, duration_ms: int) -> None:
        call.stats.dtmf_in += 1
        if call.builtin is not None:
            call.builtin.on_dtmf(digit)
        elif call.agent_proc and call.state == "active":
            self.links.send(call.agent_proc, F.Dtmf(call_id=call.call_id, digit=digit,
                                                    duration_ms=duration_ms, at_ns=time.monotonic_ns()))

    def mark_echo(self, call: Call, name: str) -> None:
        """A peer that echoes marks (Twilio) played ``name``."""
        sent = call.marks_sent
        for i, m in enumerate(sent):
            if m.name == name:
                del sent[i]
                call.stats.marks_played += 1
                self._mark_played(call, m)
                return
        swallow = self._swallow.get(call.call_id)
        if swallow and name in swallow:
            swallow.discard(name)
            self.metrics.inc("marks_echo_after_clear")
        else:
            self.metrics.inc("marks_echo_unknown")

    # -- agent side: marks, clears, utterances -------------------------------------

    def add_mark(self, call: Call, name: str, position: int) -> bool:
        if len(call.marks) + len(call.marks_sent) >= self.cfg.max_marks:
            call.stats.marks_refused += 1
            return False
        call.stats.marks += 1
        m = PendingMark(position, name)
        marks = call.marks
        if not marks or marks[-1].position <= position:
            marks.append(m)
        else:
            i = len(marks)
            while i > 0 and marks[i - 1].position > position:
                i -= 1
            marks.insert(i, m)
        if position <= call.release_pos and call.state == "active":
            self.pacer.kick(call)
        return True

    def apply_clear(self, call: Call, epoch: int, sent_ns: int = 0, arrival_ns: int = 0,
                    lazy: bool = False) -> None:
        """The Clear fast path (see module invariants). ``arrival_ns``: when the frame was read;
        ``lazy``: a new response's Clear, not a barge-in (see ``ipc.frames.Clear``)."""
        t_in = arrival_ns or time.monotonic_ns()
        if epoch <= call.cleared_epoch:
            self.metrics.inc("clears_repeated")
            self._send_cleared(call, epoch, [])
            return
        call.cleared_epoch = epoch
        if self.pacer.unpause(call) is not None:
            self.metrics.inc("pauses_cleared")  # the hold ends in the cut, at the held position
        ring = call.out_ring
        w = ring.write_pos
        newer = [p for e, p in call.utterances if e > epoch]
        if newer and call.release_pos > min(newer):
            # the newer epoch already plays (its OutUtterance raced ahead of this Clear, e.g.
            # the actor's lazy Clear of a new response): nothing of epochs <= ``epoch`` is left
            # to stop, and a transport clear would drop the new response's frames at the peer
            self.metrics.inc("clears_after_newer")
            call.gate_pos = max(call.gate_pos, min(newer))
            call.stats.clears += 1
            self._send_cleared(call, epoch, [], time.monotonic_ns())
            return
        if lazy and not newer and call.spurt_from_dry and sent_ns > 0 and call.spurt_ns > sent_ns:
            # the same race with the OutUtterance still on its way: the last talkspurt (playing,
            # or already run dry after a short first chunk) started from a dry ring after this
            # Clear was sent, after everything of the older epochs had been written, so it is the
            # new response's audio; cutting would send the peer a clear that drops its frames
            self.metrics.inc("clears_after_newer")
            call.stats.clears += 1
            self._send_cleared(call, epoch, [], time.monotonic_ns())
            return
        if newer:
            start = min(newer)
            ring.cut(min(w, start))
            call.gate_open = True
            call.gate_pos = max(call.gate_pos, start)
        else:
            # hold what is not released yet: the next utterance's start decides what is stale
            ring.cut(call.out_reader.position)
            call.gate_open = False
        call.playing = False
        call.partial_wait = False
        call.starved_at = -1.0
        if call.leg is not None and not call.transport_done:
            call.leg.send_clear()
        cut_marks = [m.name for m in call.marks] + [m.name for m in call.marks_sent]
        if call.marks_sent:
            sw = self._swallow.setdefault(call.call_id, set())
            if len(sw) < 256:
                sw.update(m.name for m in call.marks_sent)
        call.marks.clear()
        call.marks_sent.clear()
        call.stats.clears += 1
        call.stats.marks_cleared += len(cut_marks)
        applied = time.monotonic_ns()
        self.metrics.clear_local.add((applied - t_in) / 1e6)
        if sent_ns > 0:
            self.metrics.clear_latency.add((applied - sent_ns) / 1e6)
        self._send_cleared(call, epoch, cut_marks, applied)
        if not call.gate_open:
            self.pacer.forget_announcement(call)
        elif call.state == "active":
            # the newer epoch's utterance was announced before this Clear arrived: it starts now
            self.pacer.utterance(call)

    def apply_pause(self, call: Call, epoch: int) -> None:
        """Hold the bot's audio of live epoch ``epoch`` (see module invariants)."""
        if epoch <= call.cleared_epoch or any(e > epoch for e, _ in call.utterances):
            self.metrics.inc("pauses_stale")
            return
        held = self.pacer.paused.get(call.call_id)
        if held is not None:
            self.metrics.inc("pauses_repeated")
            if epoch > held[0]:
                self.pacer.paused[call.call_id] = (epoch, held[1])
            return
        self.metrics.inc("pauses")
        self.pacer.pause(call, epoch)

    def apply_resume(self, call: Call, epoch: int) -> None:
        """Release the held audio of ``epoch`` from the held position."""
        held = self.pacer.paused.get(call.call_id)
        if held is None or held[0] != epoch:
            self.metrics.inc("resumes_unpaused")
            return
        self.metrics.inc("resumes")
        if call.state == "active":
            self.pacer.resume(call)
        else:
            self.pacer.unpause(call)

    def _send_cleared(self, call: Call, epoch: int, marks: list[str], applied: int = 0) -> None:
        call.reported_pos = call.release_pos
        call.released_since_report = False
        if call.builtin is not None:
            call.builtin.on_cleared(epoch, call.release_pos, marks)
        elif call.agent_proc:
            self.links.send(call.agent_proc, F.Cleared(
                call_id=call.call_id, epoch=epoch, position=call.release_pos,
                applied_ns=applied or time.monotonic_ns(), marks=marks or None))

    def note_utterance(self, call: Call, epoch: int, out_pos: int) -> None:
        """An utterance of ``epoch`` starts at ``out_pos`` in the out ring (OutUtterance)."""
        call.utterances.append((epoch, out_pos))
        if epoch <= call.cleared_epoch:
            self.metrics.inc("utterances_stale")
            return
        if self.pacer.paused:
            held = self.pacer.paused.get(call.call_id)
            if held is not None and epoch > held[0]:
                self.pacer.unpause(call)  # the held epoch is over: a newer response plays
                self.metrics.inc("pauses_superseded")
        if not call.gate_open:
            call.gate_open = True
            call.gate_pos = max(call.gate_pos, out_pos)
        if call.state == "active":
            self.pacer.utterance(call)

    def _mark_played(self, call: Call, m: PendingMark) -> None:
        if call.builtin is not None:
            call.builtin.on_mark_played(m.name, m.position)
        elif call.agent_proc:
            self.links.send(call.agent_proc, F.MarkPlayed(call_id=call.call_id, name=m.name,
                                                          position=m.position, played_ns=time.monotonic_ns()))

    # -- periodic -----------------------------------------------------------------

    def _report(self, calls: list[Call]) -> None:
        """Every position interval: Playback per agent process, plus housekeeping."""
        by_agent: dict[str, dict[str, int]] = {}
        for call in calls:
            if call.released_since_report and call.agent_proc:
                by_agent.setdefault(call.agent_proc, {})[call.call_id] = call.release_pos
                call.reported_pos = call.release_pos
                call.released_since_report = False
        now_ns = time.monotonic_ns()
        for proc, positions in by_agent.items():
            self.links.send(proc, F.Playback(positions=positions, sent_ns=now_ns))
        self.links.drain_all()
        assert self.loop is not None
        now = self.loop.time()
        for call in list(self.table.calls.values()):
            if call.state == "ending" and call.transport_done and not call.agent_done \
                    and call.end_deadline and now > call.end_deadline:
                self.metrics.inc("calls_detach_timeout")
                call.agent_done = True
                self._maybe_release(call)

    # -- frames from agents and workers ---------------------------------------------

    def _on_frame(self, frame: F.Frame, sender: str, cid: int | str | None) -> None:
        call_id = getattr(frame, "call_id", None)
        call = self.table.get(call_id) if call_id else None
        if isinstance(frame, F.Clear):
            if call is not None:
                self.apply_clear(call, frame.epoch, frame.sent_ns, self.links.arrival_ns, frame.lazy)
            else:
                self.metrics.inc("frames_unknown_call")
            return
        if isinstance(frame, F.OutUtterance):
            if call is not None:
                if sender.startswith("worker-") and sender != f"worker-{call.worker}":
                    self.set_worker(call, int(sender[7:]))  # re-attached after a worker was lost
                self.note_utterance(call, frame.epoch, frame.out_pos)
            return
        if isinstance(frame, F.Pause | F.Resume):
            if call is None:
                self.metrics.inc("frames_unknown_call")
            elif isinstance(frame, F.Pause):
                self.apply_pause(call, frame.epoch)
            else:
                self.apply_resume(call, frame.epoch)
            return
        if isinstance(frame, F.WorkerTick):
            for ev in frame.events:
                c = self.table.get(str(ev.get("call_id", "")))
                if c is not None and c.builtin is not None:
                    c.builtin.on_worker_event(ev)
            return
        if isinstance(frame, F.Command):
            self.links.reply(sender, F.CommandReply(ok=True, data=self.command(frame.name, frame.args or {})), cid)
            return
        if call is None:
            if call_id:
                self.metrics.inc("frames_unknown_call")
            elif isinstance(frame, F.CallAccepted | F.Attached | F.Detached | F.ErrorReply):
                self.links.late_replies += 1
            else:
                self.metrics.inc(f"frames_unexpected_{frame.TYPE}")
            return
        if isinstance(frame, F.Mark):
            self.add_mark(call, frame.name, frame.position)
        elif isinstance(frame, F.Hangup):
            call.agent_done = True
            self.hangup(call, frame.reason)
            self._maybe_release(call)
        elif isinstance(frame, F.CallEnded):
            call.agent_done = True
            if not call.transport_done:
                self.hangup(call, frame.reason or "agent ended the call")
            self._maybe_release(call)
        elif isinstance(frame, F.SendDtmf):
            if call.leg is not None:
                refused = call.leg.send_dtmf(frame.digits)
                call.stats.dtmf_out += len(frame.digits) - refused
        elif isinstance(frame, F.Transfer):
            self._transfer(call, frame.target, sender, cid)
        elif isinstance(frame, F.CallAccepted | F.Attached | F.Detached | F.ErrorReply):
            self.links.late_replies += 1
        else:
            self.metrics.inc(f"frames_unexpected_{frame.TYPE}")

    def _transfer(self, call: Call, target: str, sender: str, cid: int | str | None) -> None:
        def done(ok: bool, detail: str) -> None:
            self.metrics.inc("transfers_ok" if ok else "transfers_failed")
            self.links.reply(sender, F.TransferResult(call_id=call.call_id, ok=ok, detail=detail), cid)

        if call.leg is None or call.transport_done:
            done(False, "call not connected")
        else:
            call.leg.transfer(target, done)

    def command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Introspection for operators and tests (``stats``, ``calls``)."""
        if name == "calls":
            return {c.call_id: {"transport": c.transport, "agent": c.agent, "state": c.state,
                                "release_pos": c.release_pos, "in_pos": c.in_ring.write_pos,
                                "ids": dict(c.transport_ids), **c.stats.as_dict()}
                    for c in self.table.calls.values()}
        return self.stats()

    # -- stats --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        live = [c.stats for c in self.table.calls.values()]
        out: dict[str, Any] = {"calls_active": len(self.table), "calls_admitted": self.table.admitted,
                               "calls_released": self.table.released}
        out.update(self.metrics.snapshot(live))
        for reason, n in self.table.refused.items():
            out[f"calls_refused_{reason}"] = n
        out.update(self.links.stats())
        out["links_late_replies"] = self.links.late_replies
        if self.sip is not None:
            out.update(self.sip.stats())
        if self.ws is not None:
            out.update(self.ws.stats())
        out["pacer_ticks"] = self.pacer.ticks
        ff = self.pacer.first_frame
        out["first_frame_n"] = ff.n
        out["first_frame_p50_ms"] = ff.quantile(0.5)
        out["first_frame_p99_ms"] = ff.quantile(0.99)
        per_call = {}
        for c in list(self.table.calls.values())[:MAX_REPORTED_CALLS]:
            s = c.stats
            per_call[c.call_id] = {"packets_in": s.packets_in, "frames_out": s.frames_out,
                                   "late_frames": s.late_frames, "lost": s.lost, "underruns": s.underruns,
                                   "jitter_ms": round(s.jitter_ms, 2), "clears": s.clears,
                                   "marks_played": s.marks_played, "dtmf_in": s.dtmf_in}
        out["call"] = per_call
        if self.links.guard.errors:
            out["decode_errors"] = dict(self.links.guard.errors)
        return out
