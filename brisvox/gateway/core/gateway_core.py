"""The gateway core: one asyncio loop that owns every caller-facing socket.

Owns the assembly of the gateway: the call table, the pacer, the metrics,
the control links, and one listener per enabled config section of the
transport registry (:mod:`brisvox.gateway.transports`: the SIP user agent
and the WebSocket server), started, stopped and reported in registry order.
Runs standalone (its own loop and ZeroMQ context, for tests and benches) or
inside the daemon (``brisvox/gateway/process.py``).

:class:`GatewayCore` is the :class:`~brisvox.gateway.core.host.CallHost` the
transports receive. Its parts, each in its own module with its invariants:

* :mod:`brisvox.gateway.core.lifecycle`: admission, the agent side's start, the
  caller's audio and DTMF in, the end and release of a call;
* :mod:`brisvox.gateway.core.playout`: Clear, lazy Clear, Pause/Resume, marks,
  utterance starts, fed to each call's :class:`~brisvox.playout.gate.PlayoutGate`
  and its actions executed;
* :mod:`brisvox.gateway.core.peers`: agent processes and workers, the frame
  dispatch table, Playback reports.

Invariants (of the assembly):

* Every listening socket is bound before :meth:`GatewayCore.start` returns
  (a port in use raises ``OSError``).
* :meth:`GatewayCore.stop` hangs every call up, waits up to ``grace_s`` for
  the transports to end them, then releases every call's rings (each once)
  before the listeners close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from brisvox.gateway.config import GatewaySettings
from brisvox.gateway.core.calls import CallTable
from brisvox.gateway.core.host import Dialer, Listener, ListenerFactory
from brisvox.gateway.core.lifecycle import ECHO, ECHO_TTS_RATE
from brisvox.gateway.core.pacer import FRAME_S, Pacer
from brisvox.gateway.core.peers import AgentLinks
from brisvox.gateway.core.recorder import Recorder
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.runtime.memory import IdleTrim
from ipc.links import Links

__all__ = ["ECHO", "ECHO_TTS_RATE", "GatewayCore"]

MAX_REPORTED_CALLS = 16


class GatewayCore(AgentLinks):
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
        self.cfg = settings.gateway
        self.instance = instance
        self.identity = identity
        self.inbox_endpoint = inbox_endpoint
        self.runtime_dir = runtime_dir
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.metrics = GatewayMetrics()
        self.table = CallTable(instance, self.cfg.call_limit(), self.cfg.ring_seconds,
                               max_marks=self.cfg.max_marks, pause_max_s=self.cfg.pause_max_ms / 1000.0)
        self.links = Links(self.ctx, identity, self._on_frame)
        self.pacer = Pacer(
            self.metrics,
            report_every=max(1, round(self.cfg.position_interval_ms / (FRAME_S * 1000))),
            on_actions=self.run_actions,
            on_report=self._report,
        )
        self.static_peers = dict(static_peers or {})
        self.agents: dict[str, int] = {}  # ready agent process -> live calls
        self.stopping_agents: set[str] = set()  # no new calls; their live calls go on (a drain)
        self.workers: dict[int, int] = {}  # ready worker index -> live calls it serves (all agents)
        self.smart_turn_ms: dict[int, float] = {}  # worker index -> its boot-measured Smart Turn ms (auto limit)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listeners: dict[str, Listener] = {}  # config section -> its listener (registry order)
        self.endpoints: dict[str, str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._echo_client: Any = None
        self._transports_idle = asyncio.Event()
        self._echo_actx: Any = None
        self.idle_trim = IdleTrim()  # memory back to the kernel once the last call ended
        self.recorder = Recorder()  # the calls' stereo WAVs, off the loop (its thread starts with the first)
        self.handlers = self.frame_handlers()
        self.gate_actions = self.gate_action_handlers()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> dict[str, str]:
        """Bind everything; returns the bound endpoints (``sip``, ``websocket``, ``inbox``)."""
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
        """Refuse new calls (SIP 503, OPTIONS and /healthz 503, WebSocket 1013); live calls go on."""
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
            self.release_if_done(call, force=True)
        self.pacer.stop()
        await asyncio.to_thread(self.recorder.stop)  # every open recording finished (headers fixed)
        self.idle_trim.cancel()
        for listener in reversed(list(self.listeners.values())):
            await listener.shutdown()
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


    # -- stats --------------------------------------------------------------------

    def dial(self, args: dict[str, Any], done: Callable[[dict[str, Any] | None, str], None]) -> None:
        """The ``dial`` command: placed by the dialer its ``via`` names (default ``sip``: an outbound
        SIP call; ``twilio``: a Twilio calls create), through that dialer's listener."""
        via = args.get("via") or "sip"
        dialer = self.dialers.get(via) if isinstance(via, str) else None
        listener = self.listeners.get(dialer.section) if dialer is not None else None
        target, agent, ring = args.get("target"), args.get("agent") or "", args.get("ring_timeout_s") or 0
        if dialer is None:
            done(None, f"via must be {' or '.join(self.dialers)}")
        elif listener is None:
            done(None, dialer.disabled)
        elif not isinstance(target, str) or not isinstance(agent, str) or \
                not isinstance(ring, (int, float)) or isinstance(ring, bool) or not 0 <= ring <= 600:
            done(None, "expected target (a string), agent (a string), ring_timeout_s (0..600)")
        elif self.table.draining:
            done(None, "refused: draining")
        else:
            dialer.dial(listener, self, target, agent, float(ring), done)

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
