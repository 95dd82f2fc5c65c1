"""The core's links to agent processes and workers: topology, the frame dispatch table, reports.

Owns :class:`PeerRouter`, the collaborator of the gateway core that talks ZeroMQ
(:class:`ipc.links.Links`): which agent processes and workers are ready
(topology pushes and static peers, applied to the
:class:`~brisvox.gateway.core.peer_load.PeerLoad`), the echo agent's worker
client, the dispatch of every frame the gateway receives
(:meth:`PeerRouter.frame_handlers`: one ``frame class -> handler`` table
covering exactly ``ipc.codec.received_by("gateway")``), the periodic Playback
reports and the operators' ``Command`` (answered by the core, the
:class:`Operator`: introspection, and ``dial``, answered when the outbound
call is: answered over SIP, queued by Twilio with ``via = "twilio"``).
What a frame says about the bot's audio goes to the playout commands
(:mod:`brisvox.gateway.core.playout_commands`), what it says about the call's end to
the call lifecycle (:mod:`brisvox.gateway.core.lifecycle`).

Invariants:

* A frame of a type without a handler is counted (``frames_unexpected_<type>``);
  a late reply to a request that already timed out (CallAccepted, Attached,
  Detached, ErrorReply) is counted as ``links_late_replies``; a frame naming
  a call the table does not know is counted (``frames_unknown_call``), except
  OutUtterance (a worker's announcement may trail the call's end).
* A Clear, Pause or Resume is applied in the callback that read it (see
  :mod:`brisvox.gateway.core.playout_commands`).
* A CallEvent is handed to its call's leg as it is (``send_call_event``; only a native
  leg whose client asked sends it) or dropped: counted ``call_events_sent`` or
  ``call_events_dropped``, never queued, never answered; the gateway reads nothing in it.
* An agent process that is no longer ready ends its calls (``calls_agent_lost``);
  a worker that is no longer ready leaves its calls without a worker until
  their next OutUtterance names the one they were re-attached to (both
  through each call's machine: a released call is never touched).
* Clear, Pause, Resume, Mark, SendDtmf and CallEvent are taken only from the agent process
  that hosts the call, and not once it is bridged (CallEnded: only from that process, bridged
  or not; Mark also from a kept agent while bridged: it books the ``out`` ring only) (counted
  ``frames_refused_foreign``, ``frames_refused_bridged``). A Hangup or Transfer is taken only from the agent process that hosts the call (or, for a
  Hangup, from the caller's process of a consult leg); a bridged call takes neither
  (:meth:`~brisvox.gateway.core.consults.Consults.may_control`). ConsultVerdict and Bridge go to
  :class:`~brisvox.gateway.core.consults.Consults`; a Bridge is answered (BridgeResult) before
  the CallEnd("bridged") it brings (two; one, the consult leg's, for a Bridge with ``keep``).
* ``max_calls = "auto"``: the call table's limit follows the slowest Smart Turn
  inference time a worker's row reports (``measured.smart_turn_ms``, from its boot
  self-benchmark; :meth:`GatewayConfig.call_limit`). A figure is kept per worker
  index until a new incarnation reports another, so a worker that restarts does not
  raise the limit while it boots; a live call is never ended by a lower limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import zmq

from brisvox.gateway.config import GatewayConfig
from brisvox.gateway.core.calls import Call, CallTable
from brisvox.gateway.core.consults import Consults
from brisvox.gateway.core.lifecycle import CallLifecycle
from brisvox.gateway.core.peer_load import PeerLoad
from brisvox.gateway.core.playout_commands import PlayoutCommands
from brisvox.gateway.metrics import GatewayMetrics
from ipc import frames as F
from ipc.bus import endpoint as bus_endpoint
from ipc.links import Links

log = logging.getLogger("brisvox.gateway")

Handler = Callable[[Any, str, "int | str | None"], None]
REPLIES = (F.CallAccepted, F.Attached, F.Detached, F.ErrorReply)


class Operator(Protocol):
    """What an operator's ``Command`` asks of the gateway (the core answers)."""

    def command(self, name: str, args: dict[str, Any]) -> dict[str, Any]: ...

    def dial(self, args: dict[str, Any], done: Callable[[dict[str, Any] | None, str], None],
             sender: str = "") -> None: ...


class PeerRouter:
    """Topology, frame dispatch and reports (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, *, identity: str, ctx: zmq.Context, runtime_dir: Path | None,
                 static_peers: dict[str, str], links: Links, table: CallTable, load: PeerLoad,
                 lifecycle: CallLifecycle, playout: PlayoutCommands, metrics: GatewayMetrics,
                 operator: Operator, now: Callable[[], float], consults: Consults) -> None:
        self.cfg = cfg
        self.identity = identity
        self.ctx = ctx
        self.runtime_dir = runtime_dir
        self.static_peers = static_peers
        self.links = links
        self.table = table
        self.load = load
        self.lifecycle = lifecycle
        self.playout = playout
        self.metrics = metrics
        self.operator = operator
        self.consults = consults
        self.now = now
        self.smart_turn_ms: dict[int, float] = {}  # worker index -> its boot-measured Smart Turn ms (auto limit)
        self._echo_client: Any = None
        self._echo_actx: Any = None
        self.handlers = self.frame_handlers()

    # -- topology -------------------------------------------------------------

    def connect_static(self) -> None:
        """Connect to the configured peers (no topology pushes: tests, benches)."""
        for name, ep in self.static_peers.items():
            self.links.connect(name, ep)
            if name.startswith("agent-"):
                self.load.add_agent(name)
            elif name.startswith("worker-"):
                self.load.add_worker(int(name.split("-", 1)[1]))

    def update_topology(self, rows: list[dict[str, Any]]) -> None:
        """Connect to ready agents/workers; end the calls of an agent that died.

        A ``stopping`` agent (a drain, a scale-down) gets no new call but keeps its live ones:
        they end when they end, or when the process is gone (exited, failed, absent)."""
        if self.runtime_dir is None:
            return
        load = self.load
        ready = {(r["role"], int(r["index"])) for r in rows if r.get("state") == "ready"}
        alive = ready | {(r["role"], int(r["index"])) for r in rows if r.get("state") == "stopping"}
        for role, idx in ready:
            name = f"{role}-{idx}"
            if role == "agent":
                self.links.connect(name, bus_endpoint(self.runtime_dir, name))
                load.add_agent(name)
            elif role == "worker":
                self.links.connect(name, bus_endpoint(self.runtime_dir, name))
                load.add_worker(idx)
        for name in list(load.agents):
            if ("agent", int(name.split("-")[1])) not in ready and name not in self.static_peers:
                load.agent_stopping(name)  # no new calls
        for name in list(load.stopping_agents):
            if ("agent", int(name.split("-")[1])) not in alive:
                load.agent_gone(name)
                self.links.disconnect(name)
                self.lifecycle.agent_lost(name)
        for idx in list(load.workers):
            if ("worker", idx) not in ready and f"worker-{idx}" not in self.static_peers:
                load.drop_worker(idx)
                self.links.disconnect(f"worker-{idx}")
                self.lifecycle.worker_lost(idx)  # re-attached elsewhere; its next OutUtterance says where

        if self._echo_client is not None:
            self._echo_client.on_topology(rows)
        self._follow_measured_capacity(rows)
    def _follow_measured_capacity(self, rows: list[dict[str, Any]]) -> None:
        """``max_calls = "auto"``: the limit for the slowest worker's boot-measured Smart Turn time."""
        if self.cfg.max_calls != "auto":
            return
        for r in rows:
            m = r.get("measured")
            if r.get("role") == "worker" and r.get("state") == "ready" and isinstance(m, dict):
                ms = m.get("smart_turn_ms")
                if isinstance(ms, int | float) and not isinstance(ms, bool) and ms > 0:
                    self.smart_turn_ms[int(r["index"])] = float(ms)
        listed = {int(r["index"]) for r in rows if r.get("role") == "worker"}
        for idx in [i for i in self.smart_turn_ms if i not in listed]:  # scaled down: gone for good
            del self.smart_turn_ms[idx]
        slowest = max(self.smart_turn_ms.values()) if self.smart_turn_ms else None
        limit = self.cfg.call_limit(slowest)
        if limit != self.table.max_calls:
            log.info("max_calls auto: %d -> %d (Smart Turn %s per inference, measured at the workers' boot)",
                     self.table.max_calls, limit, f"{slowest:.1f} ms" if slowest is not None else "not reported")
            self.table.max_calls = limit

    async def echo_client(self) -> Any:
        """The echo agent's worker client (subscriber ``<identity>-echo``), or None
        when the echo runs without workers (not configured, or none known)."""
        if not self.cfg.echo_use_workers:
            return None
        if self._echo_client is None:
            endpoints = {i: self.links.endpoints[f"worker-{i}"] for i in self.load.workers
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

    async def close(self) -> None:
        """The echo agent's worker client closed (within a second)."""
        if self._echo_client is not None:
            try:
                async with asyncio.timeout(1.0):
                    await self._echo_client.close()
            except TimeoutError:
                pass

    # -- periodic -----------------------------------------------------------------

    def report(self, calls: list[Call]) -> None:
        """Every position interval: Playback per agent process, plus housekeeping."""
        by_agent: dict[str, dict[str, int]] = {}
        for call in calls:
            if call.agent_proc and call.gate.released_since_report:
                pos = call.gate.report()
                if pos is not None:
                    by_agent.setdefault(call.agent_proc, {})[call.call_id] = pos
        now_ns = time.monotonic_ns()
        for proc, positions in by_agent.items():
            self.links.send(proc, F.Playback(positions=positions, sent_ns=now_ns))
        self.links.drain_all()
        self.lifecycle.expire_detaches(self.now())

    # -- frames from agents and workers ---------------------------------------------

    def frame_handlers(self) -> dict[type[F.Frame], Handler]:
        """What the gateway receives: frame class -> handler(frame, sender, cid)."""
        return {
            F.Clear: self._on_clear,
            F.OutUtterance: self._on_out_utterance,
            F.Pause: self._on_pause,
            F.Resume: self._on_resume,
            F.Command: self._on_command,
            F.Mark: self._on_mark,
            F.Hangup: self._on_hangup,
            F.CallEnded: self._on_call_ended,
            F.SendDtmf: self._on_send_dtmf,
            F.Transfer: self._on_transfer,
            F.CallEvent: self._on_call_event,
            F.ConsultVerdict: self._on_consult_verdict,
            F.Bridge: self._on_bridge,
        }

    def on_frame(self, frame: F.Frame, sender: str, cid: int | str | None) -> None:
        handler = self.handlers.get(type(frame))
        if handler is not None:
            handler(frame, sender, cid)
            return
        call_id = getattr(frame, "call_id", None)
        if call_id and self.table.get(call_id) is None:
            self.metrics.inc("frames_unknown_call")
        elif isinstance(frame, REPLIES):
            self.links.late_replies += 1
        else:
            self.metrics.inc(f"frames_unexpected_{frame.TYPE}")

    def _call(self, call_id: str) -> Call | None:
        call = self.table.get(call_id) if call_id else None
        if call is None:
            self.metrics.inc("frames_unknown_call")
        return call

    def _hosted(self, call_id: str, sender: str, kept: bool = False) -> Call | None:
        """The call ``call_id`` if ``sender`` is the agent process that hosts it and it is not
        bridged (its agent side left; ``kept``: or bridged with its agent kept, for a frame that
        only books the ``out`` ring, never reaches the leg); else None, counted
        (``frames_refused_foreign``, ``frames_refused_bridged``): no stranger controls a call."""
        call = self._call(call_id)
        if call is None:
            return None
        if sender != call.agent_proc:
            self.metrics.inc("frames_refused_foreign")
            return None
        if call.bridged_with and not (kept and call.machine.bridge_kept and not call.machine.agent_done):
            self.metrics.inc("frames_refused_bridged")
            return None
        return call

    def _on_clear(self, f: F.Clear, sender: str, cid: int | str | None) -> None:
        call = self._hosted(f.call_id, sender)
        if call is not None:
            self.playout.apply_clear(call, f.epoch, f.sent_ns, self.links.arrival_ns, f.lazy)

    def _on_out_utterance(self, f: F.OutUtterance, sender: str, cid: int | str | None) -> None:
        call = self.table.get(f.call_id)
        if call is not None:
            if sender.startswith("worker-") and sender != f"worker-{call.worker}":
                self.load.set_worker(call, int(sender[7:]))  # re-attached after a worker was lost
            self.playout.note_utterance(call, f.epoch, f.out_pos)

    def _on_pause(self, f: F.Pause, sender: str, cid: int | str | None) -> None:
        call = self._hosted(f.call_id, sender)
        if call is not None:
            self.playout.apply_pause(call, f.epoch)

    def _on_resume(self, f: F.Resume, sender: str, cid: int | str | None) -> None:
        call = self._hosted(f.call_id, sender)
        if call is not None:
            self.playout.apply_resume(call, f.epoch)

    def _on_command(self, f: F.Command, sender: str, cid: int | str | None) -> None:
        if f.name == "dial":  # answered once the call is answered or failed (brisvoxd dial, or queued: Twilio)
            def done(data: dict[str, Any] | None, error: str) -> None:
                self.links.reply(sender, F.CommandReply(ok=not error, data=data or {"reason": error},
                                                        error=error), cid)

            self.operator.dial(f.args or {}, done, sender)
            return
        self.links.reply(sender, F.CommandReply(ok=True, data=self.operator.command(f.name, f.args or {})), cid)

    def _on_mark(self, f: F.Mark, sender: str, cid: int | str | None) -> None:
        # a kept agent's marks during a bridge are booked: reported passed when the caller is
        # back (Pacer.unbridged), so the agent's reply from the bridge's time ends (its book)
        call = self._hosted(f.call_id, sender, kept=True)
        if call is not None:
            self.playout.add_mark(call, f.name, f.position)

    def _on_hangup(self, f: F.Hangup, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None and self.consults.may_control(call, sender):  # no stranger ends a call
            self.lifecycle.agent_hangup(call, f.reason)

    def _on_call_ended(self, f: F.CallEnded, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None and sender != call.agent_proc:
            self.metrics.inc("frames_refused_foreign")  # a stranger cannot end (or release) it
        elif call is not None:
            self.lifecycle.agent_ended(call, f.reason)

    def _on_send_dtmf(self, f: F.SendDtmf, sender: str, cid: int | str | None) -> None:
        call = self._hosted(f.call_id, sender)
        if call is not None and call.leg is not None:
            refused = call.leg.send_dtmf(f.digits)
            call.stats.dtmf_out += len(f.digits) - refused

    def _on_call_event(self, f: F.CallEvent, sender: str, cid: int | str | None) -> None:
        """Forwarded to the leg as it is, or dropped and counted (never queued, never answered)."""
        call = self._hosted(f.call_id, sender)
        if call is None:
            return
        sent = call.leg is not None and not call.transport_done and call.leg.send_call_event(f.name, f.data)
        self.metrics.inc("call_events_sent" if sent else "call_events_dropped")

    def _on_consult_verdict(self, f: F.ConsultVerdict, sender: str, cid: int | str | None) -> None:
        self.consults.verdict(f, sender)  # forwarded to the caller's agent as ConsultResult, or refused

    def _on_bridge(self, f: F.Bridge, sender: str, cid: int | str | None) -> None:
        legs = self.consults.bridge(f, sender)
        if isinstance(legs, str):
            self.links.reply(sender, F.BridgeResult(call_id=f.call_id, ok=False, detail=legs), cid)
            return
        # answered before the CallEnd("bridged") that follows, so the agent reads the bridge first
        self.links.reply(sender, F.BridgeResult(call_id=f.call_id, ok=True, detail=f"bridged with {f.other}"), cid)
        caller, leg = legs
        self.lifecycle.bridged(caller, keep=f.keep)  # keep: its agent stays attached (BridgeEnded later)
        self.lifecycle.bridged(leg)

    def _on_transfer(self, f: F.Transfer, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is None:
            return

        def done(ok: bool, detail: str) -> None:
            self.metrics.inc("transfers_ok" if ok else "transfers_failed")
            self.links.reply(sender, F.TransferResult(call_id=call.call_id, ok=ok, detail=detail), cid)

        if call.leg is None or call.transport_done:
            done(False, "call not connected")
        elif call.bridged_with or sender != call.agent_proc:
            self.metrics.inc("transfers_refused_foreign")
            done(False, "not a call of the sender")
        else:
            if f.summary and call.transport != "sip":
                # only a SIP REFER carries it (X-Transfer-Summary); Twilio's REST transfer has no header
                self.metrics.inc("transfer_summaries_ignored")
            call.leg.transfer(f.target, done, f.summary)
