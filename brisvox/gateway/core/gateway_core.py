"""The gateway core: one asyncio loop that owns every caller-facing socket.

Owns the assembly of the gateway: the call table, the pacer, the recorder,
the metrics, the control links, and one listener per enabled config section
of the transport registry (:mod:`brisvox.gateway.transports`: the SIP user
agent and the WebSocket server), started, stopped and reported in registry
order. Runs standalone (its own loop and ZeroMQ context, for tests and
benches) or inside the daemon (``brisvox/gateway/process.py``).

:class:`GatewayCore` is the :class:`~brisvox.gateway.core.host.CallHost` the
transports receive (and the :class:`~brisvox.gateway.core.echo.EchoHost` of
the echo agent, the :class:`~brisvox.gateway.core.peers.Operator` of the
operators' commands); it owns its state and holds its collaborators, each in
its own module with its invariants, and delegates to them:

* :class:`~brisvox.gateway.core.lifecycle.CallLifecycle`: admission, the
  agent side's start, the caller's audio and DTMF in, the end and release of
  a call, each decided by the call's
  :class:`~brisvox.gateway.core.call_machine.CallMachine` (pure) and executed
  through one action table;
* :class:`~brisvox.gateway.core.playout_commands.PlayoutCommands`: Clear, lazy Clear,
  Pause/Resume, marks, utterance starts, fed to each call's
  :class:`~brisvox.playout.gate.PlayoutGate` and its actions executed;
* :class:`~brisvox.gateway.core.peers.PeerRouter`: agent processes and
  workers (topology), the frame dispatch table, Playback reports;
* :class:`~brisvox.gateway.core.peer_load.PeerLoad`: which agent process and
  worker a new call goes to, and how many live calls each serves;
* :class:`~brisvox.gateway.core.pacer.Pacer` (the one timer) and
  :class:`~brisvox.gateway.core.recorder.Recorder` (the calls' WAVs).

No collaborator holds the core: each gets what it uses (the table, the
links, the pacer, ... and ``spawn`` / ``now`` for the loop); the router
reaches it only as the :class:`~brisvox.gateway.core.peers.Operator` of a
``Command``, the echo agent only as its ``EchoHost``.

Invariants (of the assembly):

* Every listening socket is bound before :meth:`GatewayCore.start` returns
  (a port in use raises ``OSError``).
* :meth:`GatewayCore.stop` hangs every call up, waits up to ``grace_s`` for
  the transports to end them, then releases every call's rings (each once)
  before the listeners close.
* An agent's frame (a barge-in's Clear) never waits behind more than
  :data:`INBOX_POLL_NS` of the callers' audio: the pacer polls the inbox between
  slices of its tick, and the caller's audio path (every transport's frames in,
  :meth:`GatewayCore.audio_in`) polls it when the last poll is that old, so a
  burst of carrier reads in one loop iteration (100 calls' frames) does not hold
  a Clear until the loop selects again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import GatewaySettings
from brisvox.gateway.core.calls import Call, CallTable, Leg
from brisvox.gateway.core.consults import Consults
from brisvox.gateway.core.host import Dialer, Listener, ListenerFactory
from brisvox.gateway.core.lifecycle import Builtin, CallLifecycle
from brisvox.gateway.core.pacer import FRAME_S, Pacer
from brisvox.gateway.core.peer_load import ECHO, ECHO_TTS_RATE, PeerLoad
from brisvox.gateway.core.peers import PeerRouter
from brisvox.gateway.core.playout_commands import PlayoutCommands
from brisvox.gateway.core.recorder import Recorder
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.playout.gate import Action as GateAction
from brisvox.runtime.memory import IdleTrim
from ipc import frames as F
from ipc.links import Links

INBOX_POLL_NS = 1_000_000  # the caller's audio path polls the inbox once this long since the last poll

__all__ = ["ECHO", "ECHO_TTS_RATE", "GatewayCore"]

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
        listeners: Mapping[str, ListenerFactory],
        dialers: Mapping[str, Dialer],
    ) -> None:
        self.settings = settings
        self.listener_factories = listeners  # config section -> its listener's factory (the registry's)
        self.dialers = dialers  # a dial's via -> how it is placed (the registry's)
        self.cfg = cfg = settings.gateway
        self.instance = instance
        self.identity = identity
        self.inbox_endpoint = inbox_endpoint
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.metrics = GatewayMetrics()
        self.table = CallTable(instance, cfg.call_limit(), cfg.ring_seconds, max_marks=cfg.max_marks,
                               pause_max_s=cfg.pause_max_ms / 1000.0, detach_timeout_s=cfg.detach_timeout_s)
        self.links = Links(self.ctx, identity, self._on_frame)
        self.pacer = Pacer(
            self.metrics,
            report_every=max(1, round(cfg.position_interval_ms / (FRAME_S * 1000))),
            on_actions=self._on_gate_actions,
            on_report=self._on_report,
            between=self.links.poll_inbox,
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listeners: dict[str, Listener] = {}  # config section -> its listener (registry order)
        self.endpoints: dict[str, str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inbox_polled_ns = 0  # when the caller's audio path last polled the inbox
        self.idle_trim = IdleTrim()  # memory back to the kernel once the last call ended
        self.recorder = Recorder()  # the calls' stereo WAVs, off the loop (its thread starts with the first)
        self.peer_load = PeerLoad()
        self.playout = PlayoutCommands(self.metrics, self.pacer, self.links)
        self.consults = Consults(self.table, self.links, self.metrics)
        self.lifecycle = CallLifecycle(
            cfg, instance, table=self.table, pacer=self.pacer, recorder=self.recorder, links=self.links,
            load=self.peer_load, metrics=self.metrics, idle_trim=self.idle_trim, spawn=self.spawn,
            now=self.now, make_builtin=self._make_echo, consults=self.consults)
        self.router = PeerRouter(
            cfg, identity=identity, ctx=self.ctx, runtime_dir=runtime_dir, static_peers=dict(static_peers or {}),
            links=self.links, table=self.table, load=self.peer_load, lifecycle=self.lifecycle,
            playout=self.playout, metrics=self.metrics, operator=self, now=self.now, consults=self.consults)

    # -- wiring: the links' and the pacer's callbacks -------------------------------------

    def _on_frame(self, frame: F.Frame, sender: str, cid: int | str | None) -> None:
        self.router.on_frame(frame, sender, cid)

    def _on_gate_actions(self, call: Call, actions: Sequence[GateAction]) -> None:
        self.playout.run_actions(call, actions)

    def _on_report(self, calls: list[Call]) -> None:
        self.router.report(calls)

    def _make_echo(self, call: Call) -> Builtin:
        # imported here: the echo's worker client only when a call needs it
        from brisvox.gateway.core.echo import EchoAgent

        return EchoAgent(self, call)

    # -- start and stop ------------------------------------------------------------

    async def start(self) -> dict[str, str]:
        """Bind everything; returns the bound endpoints (``sip``, ``websocket``, ``inbox``)."""
        self.loop = asyncio.get_running_loop()
        self.links.start(self.loop, self.inbox_endpoint)
        if self.inbox_endpoint:
            self.endpoints["inbox"] = self.inbox_endpoint
        self.router.connect_static()
        for section, make in self.listener_factories.items():
            cfg = getattr(self.settings, section)
            if not cfg.enabled:
                continue
            listener = make(self, cfg)
            self.listeners[section] = listener
            host, port = await listener.start()
            self.endpoints[section] = f"{host}:{port}"
        self.pacer.start(self.loop)
        return dict(self.endpoints)

    def drain(self) -> None:
        """Refuse new calls (SIP 503, OPTIONS and /healthz 503, WebSocket 1013; trunk registrations
        removed); live calls go on."""
        self.table.draining = True
        for listener in self.listeners.values():
            listener.drain()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Hang up every call, wait up to ``grace_s`` for the transports, then release all."""
        self.table.draining = True
        self.lifecycle.hang_up_all()
        if not await self.lifecycle.transports_gone(grace_s):
            self.metrics.inc("stop_grace_expired")
        self.lifecycle.release_all()
        self.pacer.stop()
        await asyncio.to_thread(self.recorder.stop)  # every open recording finished (headers fixed)
        self.idle_trim.cancel()
        for listener in reversed(list(self.listeners.values())):
            await listener.shutdown()
        await self.router.close()
        for t in list(self._tasks):
            t.cancel()
        self.links.close()
        if self._own_ctx:
            self.ctx.term()

    def reload(self, settings: GatewaySettings) -> dict[str, Any]:
        """A reloaded configuration: each started listener is given its new section and applies
        what it applies live (the SIP user agent: its trunks); the rest of the gateway's sections
        apply at its next start. Returns section -> what its listener did; a ConfigError from one
        listener leaves it as it ran and is raised after the others were given theirs."""
        done: dict[str, Any] = {}
        error: ConfigError | None = None
        for section, listener in self.listeners.items():
            try:
                done[section] = listener.reload(getattr(settings, section))
            except ConfigError as e:
                error = e
        if error is not None:
            raise error
        return done

    def update_topology(self, rows: list[dict[str, Any]]) -> None:
        """The supervisor's topology: connect to ready peers, end the calls of a dead agent."""
        self.router.update_topology(rows)

    # -- the loop (CallHost) -----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        assert self.loop is not None
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        loop = self.loop or asyncio.get_event_loop()
        return loop.call_later(delay, callback)

    def now(self) -> float:
        """The loop's time (its clock, ``time.monotonic``, before the loop is known)."""
        loop = self.loop
        return loop.time() if loop is not None else time.monotonic()

    def count(self, name: str, n: int = 1) -> None:
        self.metrics.inc(name, n)

    # -- admission and the call's ends (CallHost) -------------------------------------------

    @property
    def draining(self) -> bool:
        return self.table.draining

    def refusal(self) -> str:
        """Why :meth:`admit` would refuse a call now (``"draining"``, ``"full"``), else ``""``."""
        return self.table.refusal()

    def note_refused(self, reason: str) -> None:
        self.table.refused[reason] = self.table.refused.get(reason, 0) + 1

    def admit(self, transport: str, agent: str, call_rate: int, *, source: str = "",
              media_timeout_s: float = 0.0) -> Call:
        return self.lifecycle.admit(transport, agent, call_rate, source=source, media_timeout_s=media_timeout_s)

    def start_call(self, call: Call, leg: Leg, on_ready: Callable[[bool, str], None]) -> None:
        self.lifecycle.start_call(call, leg, on_ready)

    def abandon(self, call: Call) -> None:
        self.lifecycle.abandon(call)

    def transport_ended(self, call: Call, reason: str) -> None:
        self.lifecycle.transport_ended(call, reason)

    def hangup(self, call: Call, reason: str) -> None:
        self.lifecycle.hangup(call, reason)

    # -- the caller's side in (CallHost) ---------------------------------------------------------

    def audio_in(self, call: Call, pcm16: np.ndarray, rate: int, wire_bytes: int = -1, gap: int = 0) -> None:
        self.lifecycle.audio_in(call, pcm16, rate, wire_bytes, gap)
        now = time.monotonic_ns()
        if now - self._inbox_polled_ns >= INBOX_POLL_NS:  # a clock read per frame; a poll at most per ms
            self._inbox_polled_ns = now
            self.links.poll_inbox()

    def packet_in(self, call: Call, wire_bytes: int) -> None:
        self.lifecycle.packet_in(call, wire_bytes)

    def dtmf_in(self, call: Call, digit: str, duration_ms: int) -> None:
        self.lifecycle.dtmf_in(call, digit, duration_ms)

    def media_state(self, call: Call, state: str, dial: dict[str, int] | None = None) -> None:
        self.lifecycle.media_state(call, state, dial)

    def protocol_error(self, call: Call | None, counter: str) -> None:
        self.lifecycle.protocol_error(call, counter)

    def mark_echo(self, call: Call, name: str) -> None:
        self.playout.mark_echo(call, name)

    # -- playout inputs and the worker (EchoHost; the frames' own path is the router's) -------------

    def apply_clear(self, call: Call, epoch: int, sent_ns: int = 0, arrival_ns: int = 0,
                    lazy: bool = False) -> None:
        self.playout.apply_clear(call, epoch, sent_ns, arrival_ns, lazy)

    def apply_pause(self, call: Call, epoch: int) -> None:
        self.playout.apply_pause(call, epoch)

    def note_utterance(self, call: Call, epoch: int, out_pos: int) -> None:
        self.playout.note_utterance(call, epoch, out_pos)

    def add_mark(self, call: Call, name: str, position: int) -> None:
        self.playout.add_mark(call, name, position)

    def set_worker(self, call: Call, index: int) -> None:
        self.peer_load.set_worker(call, index)

    async def echo_client(self) -> Any:
        return await self.router.echo_client()

    # -- operators (Operator) --------------------------------------------------------------------

    def command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Introspection for operators and tests (``stats``, ``calls``, ``transfers``: the last
        finished warm transfers, each leg's times)."""
        if name == "transfers":
            return {"transfers": list(self.consults.history)}
        if name == "calls":
            return {c.call_id: {"transport": c.transport, "agent": c.agent, "state": c.state,
                                "agent_proc": c.agent_proc, "worker": c.worker,
                                "transport_done": c.transport_done, "agent_done": c.agent_done,
                                "end_reason": c.end_reason,
                                "age_s": round((time.monotonic_ns() - c.started_ns) / 1e9, 1),
                                "release_pos": c.release_pos, "in_pos": c.in_ring.write_pos,
                                "ids": dict(c.transport_ids), **self.consults.describe(c), **c.stats.as_dict()}
                    for c in self.table.calls.values()}
        return self.stats()

    def dial(self, args: dict[str, Any], done: Callable[[dict[str, Any] | None, str], None],
             sender: str = "") -> None:
        """The ``dial`` command: placed by the dialer its ``via`` names (default ``sip``: an outbound
        SIP call; ``twilio``: a Twilio calls create), through that dialer's listener. With
        ``consult_for`` (a live call of ``sender``'s) and ``summary`` it is a warm transfer's consult
        leg (:mod:`brisvox.gateway.core.consults`). A plain dial with ``await_answer = true`` is
        answered once the callee answered or the dial failed whatever its ``via`` (a SIP dial
        always is; a Twilio one otherwise at Twilio's ``queued``)."""
        via = args.get("via") or "sip"
        dialer = self.dialers.get(via) if isinstance(via, str) else None
        listener = self.listeners.get(dialer.section) if dialer is not None else None
        target, agent, ring = args.get("target"), args.get("agent") or "", args.get("ring_timeout_s") or 0
        trunk = args.get("trunk") or ""
        if dialer is None:
            done(None, f"via must be {' or '.join(self.dialers)}")
        elif listener is None:
            done(None, dialer.disabled)
        elif not isinstance(target, str) or not isinstance(agent, str) or not isinstance(trunk, str) or \
                not isinstance(ring, (int, float)) or isinstance(ring, bool) or not 0 <= ring <= 600:
            done(None, "expected target (a string), agent (a string), trunk (a string), ring_timeout_s (0..600)")
        elif self.table.draining:
            done(None, "refused: draining")
        else:
            caller, summary, why = self.consults.check_dial(args, sender)
            if why:
                done(None, f"refused: {why}")
            elif caller is None:  # await_answer (via twilio): the reply at the callee's answer, as a SIP dial's
                answer = {"await_answer": True} if args.get("await_answer") is True else {}
                dialer.dial(listener, self, target, agent, float(ring), done, trunk[:64], args.get("params"), None,
                            **answer)
            else:
                self._dial_consult(dialer, listener, caller, summary, target, agent, float(ring), done, trunk[:64],
                                  args.get("params"))

    def _dial_consult(self, dialer: Dialer, listener: Listener, caller: Call, summary: str, target: str,
                      agent: str, ring: float, done: Callable[[dict[str, Any] | None, str], None],
                      trunk: str, params: Any) -> None:
        """A consult leg for ``caller``: marked as it is admitted (SIP) or queued (Twilio: its
        stream claims it by CallSid); a failed dial frees the caller for another."""
        caller_id = caller.call_id
        placed: list[str] = []

        def admitted(leg: Call) -> None:
            live = self.table.get(caller_id)
            if live is not None:
                self.consults.placed(live, leg, summary)
                placed.append(leg.call_id)

        def finished(data: dict[str, Any] | None, error: str) -> None:
            live = self.table.get(caller_id)
            sid = (data or {}).get("call_sid")
            if error:
                self.consults.dial_failed(caller_id, placed[0] if placed else "")
            elif placed:
                self.consults.dial_answered(placed[0])
            elif not placed and isinstance(sid, str) and live is not None:
                self.consults.queued(live, sid, summary)
            done({**data, "consult_for": caller_id} if data else data, error)

        dialer.dial(listener, self, target, agent, ring, finished, trunk, params, admitted)

    def stats(self) -> dict[str, Any]:
        live = [c.stats for c in self.table.calls.values()]
        out: dict[str, Any] = {"calls_active": len(self.table), "calls_admitted": self.table.admitted,
                               "calls_released": self.table.released, "max_calls": self.table.max_calls}
        out.update(self.metrics.snapshot(live))
        for reason, n in self.table.refused.items():
            out[f"calls_refused_{reason}"] = n
        out.update(self.links.stats())
        out["links_late_replies"] = self.links.late_replies
        for listener in self.listeners.values():
            out.update(listener.stats())
        out.update(self.recorder.stats())
        out.update(self.consults.stats())
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
