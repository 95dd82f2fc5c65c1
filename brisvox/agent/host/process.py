"""The agent process: many call actors on one asyncio loop, linked to the gateway and workers.

Owns the role main registered as ``"agent"`` in ``brisvox/daemon/roles.py``:

* ZeroMQ: the process's ROUTER inbox at ``rt.inbox_endpoint("agent", i)``
  and a DEALER to each ready gateway's inbox (one :class:`ipc.links.Links` object, the same
  non-blocking, handled-inline link the gateway uses), plus a
  :class:`ipc.worker_client.WorkerClient` (identity ``agent-<i>``) for the
  worker lanes.
* At start (``[agents] providers = "definitions"``, the default): every agent
  file the daemon config names (routes, SIP users, "default" =
  ``[agents] default_agent``) is checked offline; an error fails the boot
  with the config exit code (the daemon stops, exit 2, naming the file, line
  and key).
* CallStart -> attach the call's ``in16`` and ``tts`` rings, attach the call
  to a worker (AttachCall through the client, with the gateway named so it
  gets OutUtterance too), build the call (below), start it, answer
  CallAccepted (ErrorReply ``full``, ``bad_ring``, ``no_worker`` or
  ``bad_agent`` otherwise).
* A call's build from its agent file ``<agents dir>/<CallStart.agent>.toml``
  (re-read when it changes): its providers through
  :func:`brisvox.providers.registry.build_call` with the process's ONE
  :class:`~brisvox.providers.worker_jobs.WorkerJobChannel`, its tools
  (:func:`brisvox.agent.tool_engine.loader.build_registry`, the telephony tools
  bound to the call's link, TransferResult frames routed to the port), its
  actor config (``[agents]`` keys, then the file's prompt, filler,
  interruption, turn, STT/TTS settings: :func:`brisvox.agent.definition.actor_config`)
  and its greeting. With ``providers = "scripted"`` every call gets the
  scripted providers the simulation uses too instead (tests:
  ``brisvox/providers/scripted_session.py``, ``seeded_fakes.py``).
* CallEnd -> hang the actor up, write the call record, detach the worker,
  close the rings, answer CallEnded. A CallEnd for a call whose start is still
  running here (the gateway gave up waiting for CallAccepted and revoked it:
  a restarted process working through a backlog) marks that start revoked:
  once built, the call is ended at once like any other (record, worker
  detached, rings closed; counted ``starts_revoked``) and not accepted, so it
  is never left in the table.
* A stage of a call fails (:mod:`brisvox.agent.host.supervision`): counted
  per stage (``stage_failures`` in the stats), and once the actor has
  apologized and hung itself up the call ends as above, with CallEnded
  carrying ``stage_failed:<stage>`` unasked (the gateway hangs the leg up
  with that reason).
* Inbound frames are handed to the actor synchronously in the callback that
  read them (Playback, Cleared, MarkPlayed, Dtmf, CallMedia; ticks and OutUtterance
  through the worker client): no queue between the socket and the book.
  One table (``handlers``: frame class -> handler) dispatches the gateways'
  frames; one without a handler is counted (``unexpected_type``), logged once.
* The barge-in fast path: the actor's clear hook calls
  :meth:`ProcessLink.to_gateway` which sends Clear with a NOBLOCK send on the
  gateway DEALER, inside the driver's decision step.
* Once ready, the startup heap is frozen out of the cyclic GC
  (:func:`brisvox.runtime.memory.freeze_startup_heap`).
* Every 0.5 s: ``rt.heartbeat()``, every live call's ended turns into the histograms
  (``CallActor.observe_turns``), and ``rt.report(calls, stats)``, with the process's
  ``telemetry`` (histograms, end reasons: ``call_metrics.py``; ``[tracing]``: ``tracing.py``)
  and ``loop`` (the loop-stall probe: ``brisvox/runtime/loop_probe.py``).
  On stop: refuse new calls; with drain, wait for live calls up to the grace
  period; then hang every call up (records are written) and close.

Invariants: at most ``[agents] max_calls`` actors; every actor ends (its
tasks too) before the process exits; a dead gateway ends its calls (they
are hung up locally); worker deaths are handled by the worker client
(re-attach with a synthesized stop).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brisvox.agent.host import call_metrics, tracing
from brisvox.agent.host.actor import CallActor
from brisvox.agent.host.call_amd import JobTranscriber
from brisvox.agent.host.call_build import (
    call_info_of,
    from_definition,
    open_call,
    recording_of,
    recordings_default,
)
from brisvox.agent.host.call_consult import CallConsult
from brisvox.agent.host.call_hooks import CallHooks, HookRoutes
from brisvox.agent.host.call_record import write_record
from brisvox.agent.host.call_warm import attach as attach_warm
from brisvox.agent.host.config import AgentsConfig, CallsConfig, check_referenced_agents
from brisvox.agent.host.process_link import ProcessLink
from brisvox.agent.host.s2s_actor import S2sCallActor
from brisvox.agent.host.scripted_call import scripted_providers
from brisvox.agent.host.warm_transfer import WarmConfig
from brisvox.agent.pipeline.speculation.policy import add_totals as add_spec_totals
from brisvox.agent.tool_engine.builtin import TRANSFER_STATS
from brisvox.clock import CLOCK
from brisvox.providers import resilience
from brisvox.providers.http import provider_http_stats
from brisvox.providers.registry import CallProviders
from brisvox.runtime.child_runtime import ChildRuntime
from brisvox.runtime.log_limit import LogLimiter
from brisvox.runtime.loop_probe import LoopProbe
from brisvox.runtime.memory import IdleTrim, freeze_startup_heap
from brisvox.runtime.private_files import prune_older, recording_file_name
from ipc.frames import (
    BridgeEnded,
    BridgeResult,
    CallAccepted,
    CallEnd,
    CallEnded,
    CallMedia,
    CallStart,
    Cleared,
    ConsultResult,
    Dtmf,
    ErrorReply,
    Frame,
    MarkPlayed,
    OutUtterance,
    Playback,
    TransferResult,
)
from ipc.tick_events import TickEvent

if TYPE_CHECKING:
    from brisvox.agent.definition import AgentDef
    from brisvox.outbound.webhooks.writer import OutboxWriter

log = logging.getLogger("brisvox.agent.process")

REPORT_S = 0.5
IN16_RATE = 16000


class _CallSlot:
    __slots__ = ("actor", "link", "rings", "gateway", "ended", "telephony", "hooks", "recording_file")

    def __init__(self, actor: CallActor, link: ProcessLink, rings: list[Any], gateway: str,
                 telephony: Any = None, hooks: CallHooks | None = None, recording_file: str | None = None) -> None:
        self.actor = actor
        self.link = link
        self.rings = rings
        self.gateway = gateway
        self.ended = False
        self.telephony = telephony
        self.hooks = hooks  # the call's webhook events (None: no endpoint wants any)
        self.recording_file = recording_file


class AgentProcess:
    def __init__(self, rt: Any, cfg: AgentsConfig, calls_cfg: CallsConfig, records_dir: Path | None) -> None:
        self.rt = rt
        self.cfg = cfg
        self.calls_cfg = calls_cfg
        self.records_dir = records_dir
        self.identity = f"agent-{rt.index}"
        self.calls: dict[str, _CallSlot] = {}
        self._starting: dict[str, bool] = {}  # call id -> revoked (a CallEnd came while its start ran)
        self.idle_trim = IdleTrim()
        self.links: Any = None
        self.workers: Any = None
        self.accepting = True
        self.counters: dict[str, int] = {
            "calls_started": 0,
            "calls_ended": 0,
            "calls_refused": 0,
            "starts_revoked": 0,  # a start the gateway gave up on, ended once built
            "records_written": 0,
            "record_failures": 0,
            "unknown_call_frames": 0,
            "gateway_lost": 0,
        }
        self.stage_failures: dict[str, int] = {}  # per stage: the first failure of each call
        self.log_limit = LogLimiter(log)
        self.probe: LoopProbe | None = None  # the loop-stall probe, once the loop runs
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gateways: set[str] = set()
        self.jobs: Any = None  # the local-model job channel over the worker client
        self._agents: dict[str, tuple[float, AgentDef]] = {}  # agent definitions: name -> (mtime, definition)
        self.hook_routes: HookRoutes | None = None  # [[webhooks]] of brisvoxd.toml, read at the first call
        self.hook_writer: OutboxWriter | None = None  # the outbox's writer thread, made at the first event
        # what the gateways send: frame class -> handler(frame, sender, cid)
        self.handlers: dict[type[Frame], Callable[[Any, str, int | str | None], None]] = {
            CallStart: self._on_call_start,
            CallEnd: self._on_call_end,
            Playback: self._on_playback,
            Cleared: self._on_cleared,
            MarkPlayed: self._on_mark_played,
            Dtmf: self._on_dtmf,
            CallMedia: self._on_call_media,
            TransferResult: self._on_transfer_result,
            ConsultResult: self._on_consult_result,
            BridgeResult: self._on_bridge_result,
            BridgeEnded: self._on_bridge_ended,
        }

    # -- plumbing ---------------------------------------------------------------
    def spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _topology(self, rows: list[dict[str, Any]]) -> None:
        gw = {f"gateway-{r['index']}": r.get("state") for r in rows if r.get("role") == "gateway"}
        ready_gw = {n for n, st in gw.items() if st == "ready"}
        alive_gw = {n for n, st in gw.items() if st in ("ready", "stopping")}  # a drain: its calls go on
        for name in ready_gw - self._gateways:
            idx = int(name.split("-")[1])
            self.links.connect(name, self.rt.inbox_endpoint("gateway", idx))
        for name in self._gateways - alive_gw:
            self.links.disconnect(name)
            for cid, slot in list(self.calls.items()):
                if slot.gateway == name and not slot.ended:
                    self.counters["gateway_lost"] += 1
                    self.spawn(self._end_call(cid, "gateway_lost", answer=False))
        self._gateways = (self._gateways & alive_gw) | ready_gw
        if self.workers is not None:
            self.workers.on_topology(rows)

    # -- inbound ----------------------------------------------------------------
    def _on_frame(self, frame: Frame, sender: str, cid: int | str | None) -> None:
        handler = self.handlers.get(type(frame))
        if handler is None:
            self.links.guard.unexpected(frame)
        else:
            handler(frame, sender, cid)

    def _slot(self, call_id: str) -> _CallSlot | None:
        slot = self.calls.get(call_id)
        if slot is None:
            self.counters["unknown_call_frames"] += 1
        return slot

    def _on_call_start(self, f: CallStart, sender: str, cid: int | str | None) -> None:
        self.spawn(self._starting_call(f, sender, cid))

    async def _starting_call(self, f: CallStart, sender: str, cid: int | str | None) -> None:
        if f.call_id in self._starting:  # a second CallStart while the first one runs
            self.counters["calls_refused"] += 1
            self.links.reply(sender, ErrorReply(kind="duplicate", detail="", call_id=f.call_id), cid)
            return
        self._starting[f.call_id] = False
        try:
            await self._start_call(f, sender, cid)
        finally:
            revoked = self._starting.pop(f.call_id, False)
        if revoked and f.call_id in self.calls:
            self.counters["starts_revoked"] += 1
            await self._end_call(f.call_id, "start revoked", answer=False)

    def _on_call_end(self, f: CallEnd, sender: str, cid: int | str | None) -> None:
        if f.call_id in self.calls:
            self.spawn(self._end_call(f.call_id, f.reason, answer=True))
        elif f.call_id in self._starting:
            self._starting[f.call_id] = True  # the start ends it once built
        else:
            self.links.reply(sender, CallEnded(call_id=f.call_id, reason="unknown call"), cid)

    def _on_playback(self, f: Playback, sender: str, cid: int | str | None) -> None:
        for call_id, pos in f.positions.items():
            slot = self.calls.get(call_id)
            if slot is not None:
                slot.actor.on_playback(pos)

    def _on_cleared(self, f: Cleared, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None:
            slot.actor.on_cleared(f.epoch, f.position, f.marks)

    def _on_mark_played(self, f: MarkPlayed, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None:
            slot.actor.on_mark_played(f.name)

    def _on_dtmf(self, f: Dtmf, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None:
            slot.actor.on_dtmf(f.digit)

    def _on_call_media(self, f: CallMedia, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None:
            slot.actor.on_media(f.state, f.dial)
            if slot.hooks is not None:
                slot.hooks.on_media(f.state)

    def _on_transfer_result(self, f: TransferResult, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None and slot.telephony is not None:
            slot.telephony.on_transfer_result(f)

    def _on_consult_result(self, f: ConsultResult, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None and slot.telephony is not None:
            slot.telephony.on_consult_result(f)

    def _on_bridge_result(self, f: BridgeResult, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None and slot.telephony is not None:
            slot.telephony.on_bridge_result(f)

    def _on_bridge_ended(self, f: BridgeEnded, sender: str, cid: int | str | None) -> None:
        if (slot := self._slot(f.call_id)) is not None and slot.telephony is not None:
            slot.telephony.on_bridge_ended(f)  # the caller back from a warm transfer's bridge

    def _on_position(self, call_id: str, pos: int) -> None:
        slot = self.calls.get(call_id)
        if slot is not None:
            slot.actor.on_worker(pos)

    def _on_event(self, call_id: str, ev: TickEvent) -> None:
        slot = self.calls.get(call_id)
        if slot is not None:
            link = self.workers.calls.get(call_id) if self.workers is not None else None
            pos = link.in16_pos if link is not None else ev.pos
            slot.actor.on_worker(pos, [ev])

    def _on_out_utterance(self, f: OutUtterance) -> None:
        slot = self.calls.get(f.call_id)
        if slot is not None:
            slot.actor.on_out_utterance(f.utterance, f.epoch, f.out_pos)

    # -- calls --------------------------------------------------------------------
    async def _start_call(self, f: CallStart, sender: str, cid: int | str | None) -> None:
        from ipc.ring import Ring, RingError, ring_name

        def refuse(kind: str, detail: str = "") -> None:
            self.counters["calls_refused"] += 1
            self.links.reply(sender, ErrorReply(kind=kind, detail=detail, call_id=f.call_id), cid)

        if not self.accepting:
            return refuse("draining")
        if len(self.calls) >= self.cfg.max_calls:
            return refuse("full")
        if f.call_id in self.calls:
            return refuse("duplicate")
        rings: list[Any] = []
        try:
            in16 = Ring.attach(ring_name(f.instance, f.call_id, "in16", f.ring_key), IN16_RATE)
            rings.append(in16)
            tts = Ring.attach(ring_name(f.instance, f.call_id, "tts", f.ring_key), f.tts_rate)
            rings.append(tts)
        except RingError as e:
            for r in rings:
                r.close()
            return refuse("bad_ring", str(e))
        if self.workers is None:
            for r in rings:
                r.close()
            return refuse("no_worker")
        denoise = "off"
        if self.cfg.providers == "definitions":
            try:  # [audio] denoise runs in the worker: known before the attach
                denoise = self._agent_def(self.cfg.agent_name(f.agent)).denoise
            except Exception:  # noqa: S110 - a bad definition is refused below (bad_agent), after the attach
                pass
        try:
            # the gateway chooses the worker (it counts every call of every agent process);
            # another one takes the call only if that one refuses, and CallAccepted says which
            wlink = await self.workers.attach(f.call_id, f.instance, f.call_rate, f.tts_rate,
                                              worker=f.worker if f.worker >= 0 else None, gateway=sender,
                                              ring_key=f.ring_key, denoise=denoise)
        except Exception as e:  # AttachError, timeouts
            for r in rings:
                r.close()
            log.warning("call %s refused: no worker took it: %s", f.call_id, f"{type(e).__name__}: {e}"[:300])
            return refuse("no_worker", f"{type(e).__name__}: {e}"[:200])
        link = ProcessLink(self, f.call_id, sender)
        actor_cfg = self.cfg.actor_config(f.tts_rate)
        registry = telephony = flow = agent_link = recording = amd = None
        greeting = ""
        agent_hooks: tuple[Any, ...] = ()
        if self.cfg.providers == "definitions":
            try:
                agent = self._agent_def(self.cfg.agent_name(f.agent))
                hang_later = functools.partial(self._hangup_later, f.call_id)
                built = (from_definition(agent, f.call_id, link.to_gateway, self.job_channel(), hang_later,
                                         link.request) if f.consult_for  # a consult leg: no agent service
                         else await open_call(agent, f, link.to_gateway, self.job_channel(),  # [agent_link]: dialled
                                              hang_later, link.request))
                provs, registry, telephony, flow, agent_link = built.providers, built.registry, built.telephony, built.flow, built.agent_link
            except Exception as e:  # a bad definition, a missing key, a tool that is not provided
                await self._undo_attach(f.call_id, rings)
                log.warning("call %s refused: agent %r: %s", f.call_id, f.agent, f"{type(e).__name__}: {e}"[:300])
                return refuse("bad_agent", f"{type(e).__name__}: {e}"[:200])
            from brisvox.agent.definition import actor_config, with_call_params

            actor_cfg = with_call_params(actor_config(agent, base=actor_cfg), call_info_of(f).params)  # {{name}}
            recording = recording_of(agent, self._recordings_dir, self.calls_cfg.keep_days)  # [recording]
            greeting = agent.greeting
            amd = agent.amd  # [amd]: a dialled call is screened before its first word
            agent_hooks = agent.webhooks
            warm_cfg, agent_dir = agent.warm_transfer, Path(agent.path).parent  # a relative hold_audio's base
        else:
            provs = CallProviders(*scripted_providers(self.cfg, f.call_id, f.tts_rate))
            warm_cfg, agent_dir = WarmConfig(), None
        consult = None
        if f.consult_for and provs.stt is None:
            await self._undo_attach(f.call_id, rings)
            return refuse("bad_agent", "a consult leg needs a cascaded agent (stt, llm, tts), not speech-to-speech")
        if f.consult_for:  # a warm transfer's consult leg: the summary, the person's answer, no conversation
            consult = CallConsult(f.call_id, f.consult_for, warm_cfg, f.consult_summary, CLOCK, link.to_gateway,
                                  functools.partial(self._hangup_later, f.call_id))
            actor_cfg, provs = consult.parts(actor_cfg, provs)
            greeting, amd, registry, flow = consult.opening(), None, None, None
        actor = (CallActor if provs.s2s is None else S2sCallActor)(  # a speech-to-speech agent: docs/S2S.md
            f.call_id,
            actor_cfg,
            stt=provs.stt,
            llm=provs.llm,
            tts=provs.tts,
            s2s=provs.s2s,
            source=in16,
            sink=tts,
            link=link,
            call_rate=f.call_rate,
            tts_rate=f.tts_rate,
            call_info=call_info_of(f),  # transport, ids, caller, called, parameters
            events=link.to_gateway if f.events else None,  # the call's events (a native "events" start)
            agent=f.agent,
            registry=registry,
            greeting=greeting,
            flow=flow,
            on_stage_failure=self._stage_failed,
            on_hangup=functools.partial(self._ended_itself, f.call_id),
            media=f.media,  # a dialled call in early media: no turn, no greeting until the answer
            amd=amd,
            hangup_later=functools.partial(self._hangup_later, f.call_id),
        )
        if consult is not None:
            consult.bind(actor)
        elif telephony is not None and provs.s2s is None:  # warm_transfer runs through the actor
            attach_warm(actor, telephony, warm_cfg, agent_dir)
        if recording is not None:  # the gateway names the WAV so: call.ended can say which file it is
            recording["file"] = recording_file_name(f.call_id, actor.started_wall)
        hooks = self._call_hooks(f.call_id, self.cfg.agent_name(f.agent), agent_hooks, actor.amd is not None)
        if actor.amd is not None:  # the verdict: in call.answered, and in the campaign's row
            actor.on_amd = functools.partial(self._amd_verdict, f.call_id, hooks)
            if (jobs := self.job_channel()) is not None:  # the opening's words: the worker's local STT
                actor.amd.listen_with(JobTranscriber(jobs, f.call_id))
        self.calls[f.call_id] = _CallSlot(actor, link, rings, sender, telephony, hooks,
                                          recording["file"] if recording is not None else None)
        self.idle_trim.note(len(self.calls))
        if agent_link is not None:  # the agent service hears the call (docs/AGENT_PROTOCOL.md)
            agent_link.bind(actor)
        if hooks is not None:
            hooks.install(actor)  # after the agent link: the tap passes everything on to it
        actor.start()
        if hooks is not None:
            hooks.started(actor)
        self.counters["calls_started"] += 1
        if self._starting.get(f.call_id):
            return  # revoked meanwhile: ended by the caller (_starting_call), never accepted
        self.links.reply(sender, CallAccepted(call_id=f.call_id, worker=wlink.worker, recording=recording), cid)

    def _amd_verdict(self, call_id: str, hooks: CallHooks | None, data: dict[str, Any]) -> None:
        """A screened call's AMD verdict: the waiting ``call.answered`` webhook gets it, and a
        campaign's attempt that dialled the call records it (``[campaigns] enabled``)."""
        if hooks is not None:
            hooks.amd(data)
        campaigns = self.rt.config.section("campaigns") if self.rt.config is not None else None
        if campaigns is not None and campaigns.enabled:
            from brisvox.outbound.campaign.config import store_path
            from brisvox.outbound.campaign.store import record_verdict

            self.spawn(asyncio.to_thread(record_verdict, store_path(self.rt.config), call_id,
                                         str(data.get("verdict") or "")))

    def _call_hooks(self, call_id: str, agent: str, agent_hooks: tuple[Any, ...],
                    expect_amd: bool = False) -> CallHooks | None:
        """The call's webhook events, or None when no endpoint wants any of them."""
        if self.hook_routes is None:
            self.hook_routes = HookRoutes(self.rt.config.section("webhooks").hooks)
        targets = self.hook_routes.targets(agent, agent_hooks)
        if not targets:
            return None
        if self.hook_writer is None:
            from brisvox.outbound.webhooks.outbox import outbox_path
            from brisvox.outbound.webhooks.writer import OutboxWriter
            from brisvox.runtime.paths import state_dir

            self.hook_writer = OutboxWriter(outbox_path(state_dir(self.rt.config)))
            self.hook_writer.start()
        return CallHooks(self.hook_writer, targets, call_id, agent, expect_amd=expect_amd)

    def _recordings_dir(self) -> Path:
        from brisvox.runtime.paths import state_dir

        return recordings_default(self.calls_cfg.path, state_dir(self.rt.config))

    def _stage_failed(self, stage: str) -> None:
        self.stage_failures[stage] = self.stage_failures.get(stage, 0) + 1

    def _ended_itself(self, call_id: str, reason: str) -> None:
        self.spawn(self._end_call(call_id, reason, answer=True))

    def _agent_def(self, name: str) -> AgentDef:
        """The parsed agent file ``<agents dir>/<name>.toml``, re-read when it changed."""
        from brisvox.agent.definition import load_agent
        from brisvox.agent.host.config import AGENT_NAME

        if not AGENT_NAME.match(name):
            raise ValueError(f"invalid agent name {name!r}")
        path = self.cfg.agents_path(getattr(self.rt.config, "path", None)) / f"{name}.toml"
        mtime = path.stat().st_mtime
        hit = self._agents.get(name)
        if hit is not None and hit[0] == mtime:
            return hit[1]
        agent = load_agent(path)
        self._agents[name] = (mtime, agent)
        return agent

    def job_channel(self) -> Any:
        """The process's one channel to the workers' local-model job lanes (created once)."""
        if self.jobs is None and self.workers is not None:
            from brisvox.providers.worker_jobs import WorkerJobChannel

            self.jobs = WorkerJobChannel(self.workers)
        return self.jobs

    def _hangup_later(self, call_id: str, reason: str) -> None:
        self.spawn(self._hangup_after_playout(call_id, reason))

    async def _hangup_after_playout(self, call_id: str, reason: str, limit: float = 15.0) -> None:
        """end_call: let the goodbye play out (the bot idle again), then ask the gateway
        to hang up (bounded by ``limit``)."""
        from ipc.frames import Hangup

        deadline = time.monotonic() + limit
        await asyncio.sleep(0.2)  # the tool answers first; the closing words follow
        while time.monotonic() < deadline:
            slot = self.calls.get(call_id)
            if slot is None or slot.ended or slot.actor.idle():
                break
            await asyncio.sleep(0.1)
        slot = self.calls.get(call_id)
        if slot is not None and not slot.ended:
            slot.link.to_gateway(Hangup(call_id=call_id, reason=reason))
            await self._end_call(call_id, reason, answer=False)  # the gateway sends no CallEnd after a Hangup

    async def _undo_attach(self, call_id: str, rings: list[Any]) -> None:
        if self.workers is not None:
            try:
                await self.workers.detach(call_id)
            except Exception:  # noqa: BLE001 - best effort
                pass
        for r in rings:
            r.close()

    async def _end_call(self, call_id: str, reason: str, answer: bool) -> None:
        slot = self.calls.get(call_id)
        if slot is None or slot.ended:
            return
        slot.ended = True
        try:
            record = await slot.actor.hangup(reason)
            add_spec_totals(self.counters, record.get("speculation") or {}, "speculation_")  # -> /metrics
            self._write(record)
            if slot.hooks is not None:
                slot.hooks.ended(record, slot.recording_file)
        finally:
            if self.workers is not None:
                try:
                    await self.workers.detach(call_id)
                except Exception:  # noqa: BLE001 - detach is best effort at hang-up
                    log.warning("detach of %s failed", call_id)
            for r in slot.rings:
                r.close()
            self.calls.pop(call_id, None)
            self.idle_trim.note(len(self.calls))  # the last call's memory back to the kernel
            self.counters["calls_ended"] += 1
            if answer:
                self.links.send(slot.gateway, CallEnded(call_id=call_id, reason=reason))

    def _write(self, record: dict[str, Any]) -> None:
        if self.records_dir is None:
            return
        try:
            write_record(record, self.records_dir)
            self.counters["records_written"] += 1
        except OSError as e:
            self.counters["record_failures"] += 1
            log.error("call record not written: %s", e.strerror)

    def observe_turns(self) -> None:
        """Every live call's turns that ended since the last report, into the histograms."""
        for call_id, slot in list(self.calls.items()):
            try:
                slot.actor.observe_turns()
            except Exception:  # noqa: BLE001 - telemetry never breaks the report
                self.log_limit("observe_turns", "call %s: turn telemetry failed", call_id, level=logging.ERROR)
                self.counters["telemetry_failures"] = self.counters.get("telemetry_failures", 0) + 1

    def stats(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.counters)
        if self.links is not None:
            d.update(self.links.stats())
        if self.workers is not None:
            d.update({f"workers_{k}": v for k, v in self.workers.counters.items()})
        d["live_interrupts"] = sum(slot.actor.interrupts() for slot in self.calls.values())
        d.update(TRANSFER_STATS)  # transfers_refused_<target|summary|repeat> (tool_engine/builtin.py)
        d["telemetry"] = call_metrics.METRICS.snapshot()  # the supervisor sums it: daemon/telemetry.py
        d["stage_failures"] = dict(self.stage_failures)
        if self.hook_writer is not None:
            d["webhooks"] = self.hook_writer.stats()  # the outbox writer: submitted, committed, dropped, ...
        d["resilience"] = dict(resilience.STATS)  # retries, recoveries, refusals: <stage>.<name>
        d["breakers_open"] = {k: int(b.state != "closed") for k, b in resilience.DEFAULT.breakers.items()}
        d["provider_http"] = provider_http_stats()  # shared clients, HTTP/2 PINGs: providers/keepalive.py
        if self.probe is not None:
            d["loop"] = self.probe.snapshot()  # the loop-stall probe: daemon/loop_metrics.py
        return d

    # -- main loop ------------------------------------------------------------------
    async def run(self) -> int:
        import zmq.asyncio

        from ipc.links import Links
        from ipc.worker_client import WorkerClient

        loop = asyncio.get_running_loop()
        rt = self.rt
        ctx = rt.zmq_context()
        self.links = Links(ctx, self.identity, self._on_frame)
        self.links.start(loop, rt.inbox_endpoint("agent", rt.index))
        try:
            actx = zmq.asyncio.Context.shadow(ctx.underlying)
            endpoints = {int(r["index"]): rt.inbox_endpoint("worker", int(r["index"])) for r in rt.peers("worker")}
            self.workers = WorkerClient(
                actx,
                self.identity,
                endpoints,
                on_event=self._on_event,
                on_position=self._on_position,
                on_out_utterance=self._on_out_utterance,
                endpoint_for=lambda i: rt.inbox_endpoint("worker", i),
            )
            await self.workers.start()
            rt.add_topology_callback(self._topology, loop=loop)  # replays the Topology already received
            stop = asyncio.Event()
            drain = False

            def on_stop() -> None:
                nonlocal drain
                drain = bool(rt.drain)
                loop.call_soon_threadsafe(stop.set)

            rt.add_shutdown_callback(on_stop)
            self.probe = LoopProbe(self.identity).start()
            self.spawn(self.probe.run())  # a task of the process: cancelled with the others at the stop
            rt.ready({"inbox": rt.inbox_endpoint("agent", rt.index)})
            log.info("agent %s ready", self.identity)
            freeze_startup_heap()
            while not stop.is_set():
                rt.heartbeat()
                self.observe_turns()
                rt.report(len(self.calls), self.stats())
                try:
                    async with asyncio.timeout(REPORT_S):
                        await stop.wait()
                except TimeoutError:
                    pass
            self.accepting = False
            if drain:
                deadline = time.monotonic() + float(rt.grace_s or 0.0)
                while self.calls and time.monotonic() < deadline:
                    rt.heartbeat()
                    await asyncio.sleep(0.25)
            await asyncio.gather(*(self._end_call(c, "agent_stopping", answer=True) for c in list(self.calls)),
                                 return_exceptions=True)
            for t in list(self._tasks):
                t.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=1.0)
        finally:
            if self.probe is not None:  # its watchdog thread ends with the loop it watches
                self.probe.close()
            # the sockets are closed however run ends (a failure, a cancellation): one left open on
            # the asyncio shadow context would hold the process's ZeroMQ term at exit
            try:
                if self.workers is not None:
                    await self.workers.close()
            finally:
                self.links.close()
                if self.hook_writer is not None:  # the last calls' events: committed before the process exits
                    if not await asyncio.to_thread(self.hook_writer.close, 5.0):
                        log.error("webhook outbox writer did not finish within 5 s: %d events not committed",
                                  self.hook_writer.q.qsize())
        rt.report(0, self.stats())
        return 0


def records_dir(rt: Any, calls: CallsConfig) -> Path | None:
    if not calls.records:
        return None
    if calls.path:
        return Path(calls.path).expanduser()
    from brisvox.runtime.paths import state_dir

    return state_dir(rt.config) / "calls"


def prune_records(target: Path, keep_days: int) -> int:
    """Delete per-call record files older than ``keep_days`` (directories only)."""
    return prune_older(target, keep_days, "*.json")


def main(rt: ChildRuntime) -> int:
    from brisvox.config.errors import ConfigError
    from brisvox.runtime import exitcodes

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        cfg, calls = rt.config.section("agents"), rt.config.section("calls")
        tracing.configure(rt.config.section("tracing"), int(rt.index))
        assert isinstance(cfg, AgentsConfig) and isinstance(calls, CallsConfig)
        target = records_dir(rt, calls)
        if target is not None and target.suffix != ".jsonl":
            target.mkdir(parents=True, exist_ok=True)
            prune_records(target, calls.keep_days)
        if cfg.script and not Path(cfg.script).is_file():
            raise ConfigError("agents.script", f"no such file: {cfg.script}")
        errors, warnings = check_referenced_agents(rt.config)
        for w in warnings:
            log.warning("%s", w)
        if errors:  # fail closed: the daemon stops (exit 2) naming the agent file, its key and line
            raise ConfigError("agents", "; ".join(errors[:3]) + (f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""))
    except ConfigError as e:
        rt.fail(str(e), exitcodes.CONFIG)
    except OSError as e:
        rt.fail(f"call records directory: {e}", exitcodes.BOOT)
    return int(asyncio.run(AgentProcess(rt, cfg, calls, target).run()))
