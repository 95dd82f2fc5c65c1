"""The inference worker: its state and lifecycle, holding the attached calls, the realtime lane and the dispatch.

Owns everything a worker process does for the calls attached to it
(the inference workers of the process map, docs/ARCHITECTURE.md: resampling,
batched VAD, Smart Turn, local model jobs). :class:`Worker` owns the state
they share (the models, the counters, the socket and its wake pipe, the job
lanes) and the lifecycle (load and warm the models, bind, the serve loop
``run``, close, the stats it reports), and HOLDS three collaborators, each
handed explicitly what it needs and each stating its invariants:

* ``attached``, :class:`workers.call_table.AttachedCalls`: the calls attached
  here (per-call state, :class:`~workers.call_table.AttachedCall`), attach, detach,
  retirement;
* ``realtime``, :class:`workers.realtime.RealtimeLane`: one tick every
  ``tick_ms`` with ONE batched Silero over every call with a full window, the
  first audio of an utterance converted outside the tick, VAD fail-open and
  gaps;
* ``dispatch``, :class:`workers.dispatch.RequestDispatch`: the control inbox
  and its one dispatch table, typed errors, and the requests of the **job
  lane** (:class:`workers.jobs.JobLane`: Smart Turn, and the local
  STT/TTS/LLM jobs of :mod:`workers.local_jobs`) that the tick never waits
  for.

Invariants:

* The collaborators are built once, in ``__init__``, and given the models at
  :meth:`Worker.load`; ``calls`` is the attached calls' own dict.
* Runs standalone (its own ZeroMQ context and ROUTER inbox: tests and the
  benchmark drive it directly) or inside brisvoxd via :mod:`workers.process`.
* The serve loop's tick is probed (:class:`brisvox.runtime.loop_probe.LoopProbe`: how
  late each tick runs; a stall's stack logged), reported as ``loop`` in the stats.
* Only the thread that runs :meth:`Worker.run` touches the socket
  (:meth:`Worker.send` never blocks; a failed send is counted).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import zmq

from brisvox.runtime.loop_probe import LoopProbe
from brisvox.runtime.memory import ThreadIdleTrim
from ipc.bus import bind, endpoint_path, make_socket
from ipc.codec import DecodeGuard
from workers import local_jobs as _local_jobs  # noqa: F401 - registers the local STT/TTS/LLM job frames
from workers.call_table import AttachedCall, AttachedCalls
from workers.config import SmartTurnConfig, VadConfig, WorkersConfig
from workers.dispatch import RequestDispatch
from workers.jobs import CLOSE_HOOKS, DETACH_HOOKS, FRAME_HANDLERS, JobLane
from workers.realtime import RealtimeLane
from workers.smart_turn import SmartTurnModel
from workers.stats import TickStats
from workers.vad import SileroBatch


@dataclass(frozen=True, slots=True)
class WorkerModels:
    silero: Path
    smart_turn: Path | None


class Worker:
    """A standalone inference worker serving a ROUTER inbox at ``endpoint``."""

    def __init__(
        self,
        index: int,
        endpoint: str,
        models: WorkerModels,
        settings: WorkersConfig | None = None,
        vad: VadConfig | None = None,
        smart_turn: SmartTurnConfig | None = None,
        ctx: zmq.Context | None = None,
        silero_factory: Callable[[Path, int, int], SileroBatch] | None = None,
    ) -> None:
        self.index = index
        self.endpoint = endpoint
        self.models = models
        self.cfg = settings or WorkersConfig()
        self._vad_cfg = vad or VadConfig()
        self.st_cfg = smart_turn or SmartTurnConfig()
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self._silero_factory = silero_factory or (lambda p, cap, th: SileroBatch(p, cap, th))
        self.silero: SileroBatch | None = None
        self.smart: SmartTurnModel | None = None
        self._idle_trim = ThreadIdleTrim()
        self.stats = TickStats()
        self.probe = LoopProbe(f"worker-{index}")  # the serve loop's lateness at each tick (``loop`` stats)
        self.guard = DecodeGuard(f"worker-{index} inbox")
        self.sock: Any = None
        self.jobs: JobLane | None = None
        self.extra_lanes: dict[str, JobLane] = {}  # lanes of other job kinds (workers/local_jobs.py)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.warm_report: dict[str, float] = {}
        self.attached = AttachedCalls(index, self.cfg, self._vad_cfg, self.stats, self._on_detach)
        self.calls: dict[str, AttachedCall] = self.attached.calls
        self.realtime = RealtimeLane(index, self.cfg, self._vad_cfg, self.attached, self.stats, self.send)
        # the frames other modules serve (workers/local_jobs.py) take the worker: bound to it here
        self.dispatch = RequestDispatch(index, self.cfg, self.stats, self.guard, self.attached, self.realtime,
                                        self.send, self.extra_lanes,
                                        {t: partial(h, self) for t, h in FRAME_HANDLERS.items()})

    # -- lifecycle -----------------------------------------------------------

    @property
    def vad_cfg(self) -> VadConfig:
        """The ``[vad]`` settings, fixed at construction: the call table and the realtime lane
        hold them, so a later assignment would change nothing (read-only on purpose)."""
        return self._vad_cfg

    def load(self) -> None:
        """Load every model and run it once (warm-up) before the worker reports ready."""
        t0 = time.perf_counter()
        cap = self.cfg.max_calls
        self.silero = self._silero_factory(self.models.silero, cap, self.cfg.vad_threads)
        self.silero.warm()
        self.attached.load(self.silero, cap)
        self.realtime.load(self.silero, cap)
        t1 = time.perf_counter()
        self.warm_report["silero_s"] = t1 - t0
        if self.st_cfg.enabled and self.models.smart_turn is not None:
            self.smart = SmartTurnModel(self.models.smart_turn, self.st_cfg.threads, select=self.st_cfg.select)
            self.smart.warm()
            self.warm_report["smart_turn_s"] = time.perf_counter() - t1
        self.jobs = JobLane("jobs", self.dispatch.run_job, self.notify, threads=self.cfg.job_threads,
                            capacity=self.cfg.job_queue * self.cfg.job_threads, nice=self.cfg.job_nice)
        self.dispatch.load(self.smart, self.jobs)
        self.jobs.start()

    def bind(self) -> None:
        """Bind the inbox. ``ROUTER_HANDOVER``: a subscriber that connects under an identity
        still held by a dead connection (a restarted agent process) takes it over at once
        (without it the new connection is ignored until the old one is reaped, and its
        SubscriberHello waits unread); the hello then retires the old incarnation's calls."""
        self.sock = make_socket(self.ctx, zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        bind(self.sock, self.endpoint)

    def close(self) -> None:
        self.probe.close()
        if self.jobs is not None:
            self.jobs.stop()
        for lane in self.extra_lanes.values():
            lane.stop()
        for hook in CLOSE_HOOKS:
            hook(self)
        self.attached.close()
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
            p = endpoint_path(self.endpoint)
            if p is not None:
                p.unlink(missing_ok=True)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._own_ctx:
            self.ctx.term()

    def send(self, ident: bytes, payload: bytes) -> bool:
        """Send to ``ident`` without blocking (False: not sent, counted in ``send_failed``)."""
        try:
            self.sock.send_multipart([ident, payload], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            self.stats.send_failed += 1
            return False

    def notify(self) -> None:
        """Wake the serve loop (any thread: a job lane has a result)."""
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass

    def _on_detach(self, call_id: str) -> None:
        for hook in DETACH_HOOKS:
            hook(self, call_id)

    def run(self, stop: threading.Event, heartbeat: Callable[[], None] | None = None,
            report: Callable[[int, dict[str, Any]], None] | None = None) -> None:
        """Serve until ``stop`` is set: control frames as they come, a tick every ``tick_ms``."""
        lane, dispatch, sock = self.realtime, self.dispatch, self.sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        interval = lane.tick_s
        next_tick = time.monotonic() + interval
        last_report = 0.0
        probe = self.probe.start()
        probe.owe(next_tick)  # the tick is this loop's own wake-up: how late each one runs
        while not stop.is_set():
            now = time.monotonic()
            wait_ms = max(0, int((next_tick - now) * 1000 + 0.999))
            if lane.hot and wait_ms > 1:
                wait_ms = 1  # an utterance's first audio is due any moment
            if lane.due:
                due = lane.due_in_ms()  # a stop window may end before the next tick
                if 0 <= due < wait_ms:
                    wait_ms = due
            events = dict(poller.poll(wait_ms)) if wait_ms > 0 else {}
            if sock in events:
                dispatch.drain_inbox(sock)
            if self._wake_r in events:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            dispatch.send_job_results()
            if lane.hot:
                lane.serve_hot()
            if lane.due:
                lane.serve_due()
            now = time.monotonic()
            if now >= next_tick:
                probe.paid(now)
                late = now - next_tick
                if late > interval:
                    self.stats.overruns += 1
                    next_tick = now + interval
                else:
                    next_tick += interval
                probe.owe(next_tick)  # owed from now: a tick that holds the loop makes the next one late
                dispatch.drain_inbox(sock)
                lane.tick()
                if heartbeat is not None:
                    heartbeat()
                if now - last_report >= 0.5:
                    last_report = now
                    self._idle_trim.poll(len(self.calls), now)  # memory back after the last call
                    if report is not None:
                        report(len(self.calls), self.report_stats())

    # -- reporting -----------------------------------------------------------------

    def _smart_turn_stats(self) -> dict[str, Any]:
        """The Smart Turn file in use (``smart_turn_model.<label>`` = 1: /metrics keeps numbers
        only) and its boot-measured median inference time (``smart_turn_ms``; 0 = not timed)."""
        sm = self.smart
        if sm is None:
            return {}
        ch = sm.choice
        return {"smart_turn_model": {sm.label: 1}, "smart_turn_ms": float(ch.ms) if ch is not None else 0.0}

    def report_stats(self) -> dict[str, Any]:
        st = self.stats
        jobs = self.jobs.counters if self.jobs else {}
        return {
            "ticks": st.ticks, "overruns": st.overruns, "vad_runs": st.vad_runs, "vad_rows": st.vad_rows,
            "vad_failures": st.vad_failures, "failed_open": st.failed_open, "recoveries": st.recoveries,
            "gaps": st.gaps, "events": st.events, "send_failed": st.send_failed,
            "tick_cpu_ms": st.tick_cpu_ns / 1e6, "tick_max_ms": st.tick_max_ns / 1e6,
            "out_nudges": st.out_nudges, "end_hints": st.end_hints, "end_hints_moved": st.end_hints_moved,
            "vad_prompt": st.vad_prompt, "prompt_cpu_ms": st.prompt_ns / 1e6, "orphan_detaches": st.orphan_detaches,
            "retired_calls": st.retired_calls, "retirements": st.retirements,
            "denoised_calls": st.denoised_calls, "denoise_failures": st.denoise_failures,
            "denoise_late": st.denoise_late, "amd_tones_lost": st.amd_tones_lost,
            "calls_by_subscriber": {sub: len(calls) for sub, calls in self.attached.by_sub.items()},
            "jobs_queued": self.jobs.queued if self.jobs else 0,
            **{f"jobs_{k}": v for k, v in jobs.items()},
            **{f"jobs_{k}": v for k, v in (self.jobs.recent() if self.jobs else {}).items()},
            **{f"{n}_{k}": v for n, lane in self.extra_lanes.items() for k, v in lane.counters.items()},
            **self._smart_turn_stats(),
            "errors": dict(st.errors),
            "decode_errors": dict(self.guard.errors),
            "loop": self.probe.snapshot(),
        }
