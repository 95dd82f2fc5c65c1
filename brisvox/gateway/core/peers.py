"""The core's links to agent processes and workers: topology, the frame dispatch table, reports.

Owns :class:`AgentLinks`, the part of the gateway core that talks ZeroMQ
(:class:`ipc.links.Links`): which agent processes and workers are ready
(topology pushes and static peers), the echo agent's worker client, the
dispatch of every frame the gateway receives (:meth:`AgentLinks.frame_handlers`:
one ``frame class -> handler`` table covering exactly
``ipc.codec.received_by("gateway")``), the periodic Playback reports and
the operators' ``Command`` introspection (and ``dial``, answered when the outbound call is:
answered over SIP, queued by Twilio with ``via = "twilio"``).

Invariants:

* A frame of a type without a handler is counted (``frames_unexpected_<type>``);
  a late reply to a request that already timed out (CallAccepted, Attached,
  Detached, ErrorReply) is counted as ``links_late_replies``; a frame naming
  a call the table does not know is counted (``frames_unknown_call``), except
  OutUtterance (a worker's announcement may trail the call's end).
* A Clear, Pause or Resume is applied in the callback that read it (see
  :mod:`brisvox.gateway.core.playout`).
* A CallEvent is handed to its call's leg as it is (``send_call_event``; only a native
  leg whose client asked sends it) or dropped: counted ``call_events_sent`` or
  ``call_events_dropped``, never queued, never answered; the gateway reads nothing in it.
* An agent process that is no longer ready ends its calls (``calls_agent_lost``);
  a worker that is no longer ready leaves its calls without a worker until
  their next OutUtterance names the one they were re-attached to.
* ``max_calls = "auto"``: the call table's limit follows the slowest Smart Turn
  inference time a worker's row reports (``measured.smart_turn_ms``, from its boot
  self-benchmark; :meth:`GatewayConfig.call_limit`). A figure is kept per worker
  index until a new incarnation reports another, so a worker that restarts does not
  raise the limit while it boots; a live call is never ended by a lower limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from brisvox.gateway.core.calls import Call
from brisvox.gateway.core.lifecycle import CallLifecycle
from ipc import frames as F
from ipc.bus import endpoint as bus_endpoint

log = logging.getLogger("brisvox.gateway")

Handler = Callable[[Any, str, "int | str | None"], None]
REPLIES = (F.CallAccepted, F.Attached, F.Detached, F.ErrorReply)


class AgentLinks(CallLifecycle):
    """Topology, frame dispatch and reports (see the module docstring)."""

    identity: str
    ctx: zmq.Context
    runtime_dir: Path | None
    static_peers: dict[str, str]
    smart_turn_ms: dict[int, float]
    _echo_client: Any
    _echo_actx: Any
    handlers: dict[type[F.Frame], Handler]

    # -- topology -------------------------------------------------------------

    def update_topology(self, rows: list[dict[str, Any]]) -> None:
        """Connect to ready agents/workers; end the calls of an agent that died.

        A ``stopping`` agent (a drain, a scale-down) gets no new call but keeps its live ones:
        they end when they end, or when the process is gone (exited, failed, absent)."""
        if self.runtime_dir is None:
            return
        ready = {(r["role"], int(r["index"])) for r in rows if r.get("state") == "ready"}
        alive = ready | {(r["role"], int(r["index"])) for r in rows if r.get("state") == "stopping"}
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
                del self.agents[name]  # no new calls
                self.stopping_agents.add(name)
        for name in list(self.stopping_agents):
            key = ("agent", int(name.split("-")[1]))
            if key in ready:
                self.stopping_agents.discard(name)
            elif key not in alive:
                self.stopping_agents.discard(name)
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

    # -- periodic -----------------------------------------------------------------

    def _report(self, calls: list[Call]) -> None:
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
        assert self.loop is not None
        now = self.loop.time()
        for call in list(self.table.calls.values()):
            if call.state == "ending" and call.transport_done and not call.agent_done \
                    and call.end_deadline and now > call.end_deadline:
                self.metrics.inc("calls_detach_timeout")
                call.agent_done = True
                self.release_if_done(call)

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
        }

    def _on_frame(self, frame: F.Frame, sender: str, cid: int | str | None) -> None:
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

    def _on_clear(self, f: F.Clear, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None:
            self.apply_clear(call, f.epoch, f.sent_ns, self.links.arrival_ns, f.lazy)

    def _on_out_utterance(self, f: F.OutUtterance, sender: str, cid: int | str | None) -> None:
        call = self.table.get(f.call_id)
        if call is not None:
            if sender.startswith("worker-") and sender != f"worker-{call.worker}":
                self.set_worker(call, int(sender[7:]))  # re-attached after a worker was lost
            self.note_utterance(call, f.epoch, f.out_pos)

    def _on_pause(self, f: F.Pause, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None:
            self.apply_pause(call, f.epoch)

    def _on_resume(self, f: F.Resume, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None:
            self.apply_resume(call, f.epoch)

    def _on_command(self, f: F.Command, sender: str, cid: int | str | None) -> None:
        if f.name == "dial":  # answered once the call is answered or failed (brisvoxd dial, or queued: Twilio)
            def done(data: dict[str, Any] | None, error: str) -> None:
                self.links.reply(sender, F.CommandReply(ok=not error, data=data or {"reason": error},
                                                        error=error), cid)

            self.dial(f.args or {}, done)
            return
        self.links.reply(sender, F.CommandReply(ok=True, data=self.command(f.name, f.args or {})), cid)

    def _on_mark(self, f: F.Mark, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None:
            self.add_mark(call, f.name, f.position)

    def _on_hangup(self, f: F.Hangup, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None:
            call.agent_done = True
            self.hangup(call, f.reason)
            self.release_if_done(call)

    def _on_call_ended(self, f: F.CallEnded, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None:
            call.agent_done = True
            if not call.transport_done:
                self.hangup(call, f.reason or "agent ended the call")
            self.release_if_done(call)

    def _on_send_dtmf(self, f: F.SendDtmf, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is not None and call.leg is not None:
            refused = call.leg.send_dtmf(f.digits)
            call.stats.dtmf_out += len(f.digits) - refused

    def _on_call_event(self, f: F.CallEvent, sender: str, cid: int | str | None) -> None:
        """Forwarded to the leg as it is, or dropped and counted (never queued, never answered)."""
        call = self._call(f.call_id)
        if call is None:
            return
        sent = call.leg is not None and not call.transport_done and call.leg.send_call_event(f.name, f.data)
        self.metrics.inc("call_events_sent" if sent else "call_events_dropped")

    def _on_transfer(self, f: F.Transfer, sender: str, cid: int | str | None) -> None:
        call = self._call(f.call_id)
        if call is None:
            return

        def done(ok: bool, detail: str) -> None:
            self.metrics.inc("transfers_ok" if ok else "transfers_failed")
            self.links.reply(sender, F.TransferResult(call_id=call.call_id, ok=ok, detail=detail), cid)

        if call.leg is None or call.transport_done:
            done(False, "call not connected")
        else:
            call.leg.transfer(f.target, done)

    # -- introspection -----------------------------------------------------------------

    def command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Introspection for operators and tests (``stats``, ``calls``)."""
        if name == "calls":
            return {c.call_id: {"transport": c.transport, "agent": c.agent, "state": c.state,
                                "agent_proc": c.agent_proc, "worker": c.worker,
                                "transport_done": c.transport_done, "agent_done": c.agent_done,
                                "end_reason": c.end_reason,
                                "age_s": round((time.monotonic_ns() - c.started_ns) / 1e9, 1),
                                "release_pos": c.release_pos, "in_pos": c.in_ring.write_pos,
                                "ids": dict(c.transport_ids), **c.stats.as_dict()}
                    for c in self.table.calls.values()}
        return self.stats()

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError  # the core's (it sees the listeners)

    def dial(self, args: dict[str, Any], done: Callable[[dict[str, Any] | None, str], None]) -> None:
        raise NotImplementedError  # the core's (the SIP listener places the call)
