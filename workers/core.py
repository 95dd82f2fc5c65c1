"""The inference worker: call table, realtime lane (tick loop) and the control inbox.

Owns everything a worker process does for the calls attached to it
(DESIGN.md section 1, "Inference workers"):

* the **call table**: AttachCall maps a call's four rings (in, in16, tts,
  out) and gives it a Silero state slot; DetachCall unmaps them. The rings
  belong to the gateway; a worker only ever writes ``in16`` and ``out``, and
  only while the call is attached to it (one writer at a time).
* the **realtime lane**, one tick every ``tick_ms`` on the main thread:
  convert ``in`` -> ``in16`` (:class:`workers.resample.InputChain`) for every
  call whose next 32 ms VAD window is complete (or whose in16 is older than
  ``fresh_ms``), run ONE batched Silero over every call that has a full
  window (more runs only when a call catches up after a stall or a
  re-attach; one run per VAD rate: 8 kHz calls use Silero's native 8 kHz
  mode on the ``in`` samples themselves when ``[vad] native_8k`` is on, the
  others the 16 kHz model on ``in16``; positions are in16 positions either
  way), feed each call's :class:`workers.vad.VadStream`, convert
  ``tts`` -> ``out``, then send one :class:`WorkerTick` to each subscriber
  with news (the in16 positions that advanced, the VAD events of the tick).
* the **first audio of an utterance** does not wait for a tick: a
  TtsUtterance makes the call "hot"; as soon as the utterance's first 20 ms
  of tts audio is in the ring (usually already when the frame arrives: the
  actor writes right after announcing) the worker converts that one call's
  ``tts`` -> ``out`` on its loop, outside the tick, and sends OutUtterance at
  once, so the gateway can release the first frame without waiting for its
  own tick. While a call is hot the loop polls every millisecond (at most
  one tick long); the conversion costs the realtime lane what it would have
  cost in the next tick.
  VAD windows sit on a fixed grid (``GRID_PHASE``) so a window never waits
  for the next 20 ms frame because of the resampler's 4-sample hold-back.
* the **job lane** (:class:`workers.jobs.JobLane`): Smart Turn analyses read
  the last 8 s straight from the call's in16 ring on their own thread; the
  tick never waits for them.
* **failure behaviour**: per-call VAD fail-open with recovery probes
  (:class:`workers.vad.VadHealth`), gaps close speech with a stop dated to
  the last speech, a re-attach after a worker death starts with a synthesized
  stop, bad requests get a typed :class:`ErrorReply` and the worker serves on.

Runs standalone (its own ZeroMQ context and ROUTER inbox: tests and the
benchmark drive it directly) or inside brisvoxd via :mod:`workers.process`.
Only the thread that runs :meth:`Worker.run` touches the socket.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from ipc.bus import bind, endpoint_path, make_socket
from ipc.codec import DecodeGuard, Frame, encode
from ipc.frames import (
    AttachCall,
    Attached,
    DetachCall,
    Detached,
    ErrorReply,
    OutUtterance,
    SmartTurnRequest,
    SmartTurnResult,
    TtsCut,
    TtsUtterance,
    WorkerTick,
)
from ipc.ring import Ring, RingError, ring_name
from workers import local_jobs as _local_jobs  # noqa: F401 - registers the local STT/TTS/LLM job frames
from workers.config import SmartTurnConfig, VadConfig, WorkersConfig
from workers.jobs import CLOSE_HOOKS, DETACH_HOOKS, FRAME_HANDLERS, Job, JobDone, JobLane
from workers.resample import RATE16, InputChain, OutputChain, resume_in_pos
from workers.smart_turn import WINDOW_SAMPLES, SmartTurnModel
from workers.vad import (
    RATE8,
    WINDOW,
    WINDOW8,
    SileroBatch,
    VadEvent,
    VadHealth,
    VadParams,
    VadStream,
    refine_start,
    refine_stop,
)

log = logging.getLogger("brisvox.workers")

PEND_S = 2  # seconds of audio waiting for the VAD, per call, at most
HOLDBACK16 = 4  # in16 samples soxr QQ may hold back (measured: 4 from 8 kHz, <= 2 from higher rates)
# VAD windows end at in16 positions == GRID_PHASE (mod GRID): 8 samples before a multiple of 32.
# Frames of any multiple of 2 ms end on multiples of 32 in16 samples, so a window's last sample
# plus the resampler's hold-back never needs the NEXT frame (with windows ending on frame
# boundaries, every 5th window of 20 ms frames at 8 kHz waited one frame more: +20 ms).
GRID = 32
GRID_PHASE = 24
MAX_RATE = 192_000
SCALE = np.float32(1.0 / 32768.0)


@dataclass(frozen=True, slots=True)
class WorkerModels:
    silero: Path
    smart_turn: Path | None


class Call:
    """One attached call: rings, converters, VAD state. Owned by the tick thread."""

    __slots__ = ("call_id", "subscriber", "gateway", "slot", "rings", "inp", "out", "params", "stream",
                 "health", "pend", "pend_n", "pend_off", "vad_pos", "events", "in16_name", "probe",
                 "attached_ns", "fall_ref", "need_in", "hold16", "conv_ns", "pub_pos", "native8", "win")

    def __init__(self, call_id: str, subscriber: str, gateway: str, slot: int, rings: dict[str, Ring],
                 inp: InputChain, out: OutputChain, params: VadParams, health: VadHealth,
                 native8: bool = False) -> None:
        self.call_id = call_id
        self.subscriber = subscriber
        self.gateway = gateway
        self.slot = slot
        self.rings = rings
        self.inp = inp
        self.out = out
        self.params = params
        self.stream = VadStream(params)
        self.health = health
        # the VAD reads the `in` samples of an 8 kHz call at their own rate (Silero's 8 kHz mode):
        # `pend` holds VAD-rate samples, `win` of them per 32 ms window; `vad_pos` is in16 either way
        self.native8 = native8 and inp.rate == RATE8
        self.win = WINDOW8 if self.native8 else WINDOW
        self.pend = np.zeros(PEND_S * (RATE8 if self.native8 else RATE16), dtype=np.int16)
        self.pend_n = 0
        self.pend_off = 0
        self.vad_pos = 0
        self.align()
        self.events: list[dict[str, Any]] = []
        self.in16_name = rings["in16"].name
        self.probe = False
        self.attached_ns = time.monotonic_ns()
        self.fall_ref = (-1, -1)  # (raw stop pos, refined pos) announced by the last falling event
        # convert when in16 (not only `in`) covers the window: a stop's `at` is then always in
        # in16 when it is published (Smart Turn reads up to it; the actor defers until it is)
        self.hold16 = 0 if inp.rate == RATE16 else HOLDBACK16
        self.need_in = 0  # the in position that completes the next VAD window: convert then
        self.conv_ns = 0  # when the input was last converted
        self.pub_pos = -1  # the in16 position last published

    def align(self) -> None:
        """Restart the VAD where the input continues, on the window grid (in16 positions):
        the stream starts up to 31 in16 samples earlier, with those samples taken from the
        ring the VAD reads (in16, or ``in`` for native 8 kHz; zeros where there are none)."""
        if self.native8:
            pos = 2 * self.inp.in_pos  # in16 sample 2k is in sample k (QQ has no delay)
        else:
            pos = self.inp.out_pos
        start = pos - ((pos - GRID_PHASE) % GRID)
        self.vad_pos = start
        self.pend_off = 0
        if self.native8:
            lo, hi, ring = start // 2, pos // 2, self.rings["in"]
        else:
            lo, hi, ring = start, pos, self.rings["in16"]
        self.pend_n = hi - lo
        self.pend[: self.pend_n] = 0
        if hi > 0 and self.pend_n:
            got = ring.read_range(max(0, lo), hi)
            self.pend[self.pend_n - len(got.samples) : self.pend_n] = got.samples

    def schedule(self) -> None:
        """Set ``need_in`` from the VAD position: the input is converted when the
        next window is complete (or after ``fresh_ms`` at the latest)."""
        inp = self.inp
        have = self.pend_n - self.pend_off
        if have >= self.win:
            self.need_in = 0  # a full window is already waiting (VAD rounds ran out)
        else:
            needed = self.vad_pos + WINDOW  # in16
            self.need_in = resume_in_pos(needed + self.hold16, inp.rate)

    def close(self) -> None:
        for r in self.rings.values():
            r.close()


@dataclass
class TickStats:
    """Counters of the realtime lane (exported with each pong and read by the bench)."""

    ticks: int = 0
    overruns: int = 0  # ticks that started more than one interval late
    vad_runs: int = 0
    vad_rows: int = 0
    vad_failures: int = 0
    failed_open: int = 0
    recoveries: int = 0
    gaps: int = 0
    pend_overflows: int = 0
    events: int = 0
    send_failed: int = 0
    orphan_detaches: int = 0
    tick_ns: int = 0  # wall time inside ticks
    tick_cpu_ns: int = 0  # CPU time of the tick thread inside ticks, and per phase:
    input_ns: int = 0
    vad_ns: int = 0
    output_ns: int = 0
    send_ns: int = 0
    tick_max_ns: int = 0
    out_nudges: int = 0  # utterance starts converted and announced outside a tick
    nudge_ns: int = 0  # CPU time of those conversions
    errors: dict[str, int] = field(default_factory=dict)


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
        self.vad_cfg = vad or VadConfig()
        self.st_cfg = smart_turn or SmartTurnConfig()
        self.params = self.vad_cfg.params()
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self._silero_factory = silero_factory or (lambda p, cap, th: SileroBatch(p, cap, th))
        self.silero: SileroBatch | None = None
        self.smart: SmartTurnModel | None = None
        self.calls: dict[str, Call] = {}
        self.by_sub: dict[str, list[Call]] = {}
        self.free_slots: list[int] = []
        self.stats = TickStats()
        self.guard = DecodeGuard(f"worker-{index} inbox")
        self.seq = 0
        self.sock: Any = None
        self.jobs: JobLane | None = None
        self.extra_lanes: dict[str, JobLane] = {}  # lanes of other job kinds (workers/local_jobs.py)
        # job kind -> handler run on a job-lane thread (returns the reply frame)
        self.job_handlers: dict[str, Callable[[Job], Frame]] = {"smart_turn": self._smart_turn_job}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._unroutable: dict[str, int] = {}
        self.tick_s = self.cfg.tick_ms / 1000.0
        self.fresh_ns = self.cfg.fresh_ms * 1_000_000
        self.keepalive_ns = 100 * 1_000_000
        self._last_pub: dict[str, int] = {}
        # call_id -> deadline (monotonic ns): an announced utterance waits for its first audio
        self._hot: dict[str, int] = {}
        self.warm_report: dict[str, float] = {}
        # batch scratch per VAD window width (16 kHz, native 8 kHz), sized for max_calls at load()
        self._scratch: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # -- lifecycle -----------------------------------------------------------

    def load(self) -> None:
        """Load every model and run it once (warm-up) before the worker reports ready."""
        t0 = time.perf_counter()
        cap = self.cfg.max_calls
        self.silero = self._silero_factory(self.models.silero, cap, self.cfg.vad_threads)
        self.silero.warm()
        self.free_slots = list(range(cap - 1, -1, -1))
        self._scratch = {w: (np.zeros(cap, dtype=np.intp), np.zeros((cap, w), dtype=np.int16),
                             np.zeros((cap, w), dtype=np.float32)) for w in (WINDOW, WINDOW8)}
        t1 = time.perf_counter()
        self.warm_report["silero_s"] = t1 - t0
        if self.st_cfg.enabled and self.models.smart_turn is not None:
            self.smart = SmartTurnModel(self.models.smart_turn, self.st_cfg.threads)
            self.smart.warm()
            self.warm_report["smart_turn_s"] = time.perf_counter() - t1
        self.jobs = JobLane("jobs", self._run_job, self._notify, threads=self.cfg.job_threads,
                            capacity=self.cfg.job_queue * self.cfg.job_threads)
        self.jobs.start()

    def bind(self) -> None:
        self.sock = make_socket(self.ctx, zmq.ROUTER)
        bind(self.sock, self.endpoint)

    def close(self) -> None:
        if self.jobs is not None:
            self.jobs.stop()
        for lane in self.extra_lanes.values():
            lane.stop()
        for hook in CLOSE_HOOKS:
            hook(self)
        for c in list(self.calls.values()):
            c.close()
        self.calls.clear()
        self.by_sub.clear()
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

    def _notify(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass

    def run(self, stop: threading.Event, heartbeat: Callable[[], None] | None = None,
            report: Callable[[int, dict[str, Any]], None] | None = None) -> None:
        """Serve until ``stop`` is set: control frames as they come, a tick every ``tick_ms``."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        interval = self.tick_s
        next_tick = time.monotonic() + interval
        last_report = 0.0
        while not stop.is_set():
            now = time.monotonic()
            wait_ms = max(0, int((next_tick - now) * 1000 + 0.999))
            if self._hot and wait_ms > 1:
                wait_ms = 1  # an utterance's first audio is due any moment
            events = dict(poller.poll(wait_ms)) if wait_ms > 0 else {}
            if self.sock in events:
                self._drain_inbox()
            if self._wake_r in events:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            self._send_job_results()
            if self._hot:
                self._serve_hot()
            now = time.monotonic()
            if now >= next_tick:
                late = now - next_tick
                if late > interval:
                    self.stats.overruns += 1
                    next_tick = now + interval
                else:
                    next_tick += interval
                self._drain_inbox()
                self.tick()
                if heartbeat is not None:
                    heartbeat()
                if report is not None and now - last_report >= 0.5:
                    last_report = now
                    report(len(self.calls), self.report_stats())

    # -- control inbox -----------------------------------------------------------

    def _drain_inbox(self) -> None:
        for _ in range(1000):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.guard.errors["malformed"] = self.guard.errors.get("malformed", 0) + 1
                continue
            got = self.guard.decode_env(parts[1])
            if got is None:
                continue
            frame, cid = got
            try:
                reply = self.handle(parts[0], frame, cid)
            except Exception as e:  # a bug handling one frame must not stop the worker
                log.exception("worker-%d: %s failed", self.index, frame.TYPE)
                reply = ErrorReply(kind="internal", detail=f"{type(e).__name__}: {e}"[:300])
            if reply is not None:
                self._send(parts[0], encode(reply, cid=cid))

    def _send(self, ident: bytes, payload: bytes) -> bool:
        try:
            self.sock.send_multipart([ident, payload], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            self.stats.send_failed += 1
            return False

    def _error(self, kind: str, detail: str, call_id: str = "") -> ErrorReply:
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
        return ErrorReply(kind=kind, detail=detail, call_id=call_id)

    def handle(self, ident: bytes, frame: Frame, cid: int | str | None = None) -> Frame | None:
        """One control frame -> its reply (None: nothing to answer)."""
        if isinstance(frame, AttachCall):
            return self.attach(frame)
        if isinstance(frame, DetachCall):
            self.detach(frame.call_id)
            return Detached(call_id=frame.call_id)
        if isinstance(frame, SmartTurnRequest):
            return self.smart_turn(ident, cid, frame)
        if isinstance(frame, TtsUtterance):
            c = self.calls.get(frame.call_id)
            if c is None:
                return self._error("unknown_call", "tts_utterance for a call not attached here", frame.call_id)
            placed = c.out.announce(frame.utterance, frame.epoch, frame.tts_pos)
            if placed is not None:  # its audio was already converted
                self._send_out_utterance(c, placed.utterance, placed.epoch, placed.out_pos)
            elif c.out.next_start() >= 0:
                self._hot[c.call_id] = time.monotonic_ns() + int(self.tick_s * 1e9)
                self._serve_hot()
            return None
        if isinstance(frame, TtsCut):
            c = self.calls.get(frame.call_id)
            if c is None:
                return self._error("unknown_call", "tts_cut for a call not attached here", frame.call_id)
            c.out.cut(frame.epoch, frame.tts_pos)
            return None
        handler = FRAME_HANDLERS.get(type(frame))
        if handler is not None:
            return handler(self, ident, cid, frame)
        return self._error("unsupported", f"worker does not serve {frame.TYPE}")

    def attach(self, f: AttachCall) -> Frame:
        existing = self.calls.get(f.call_id)
        if existing is not None:  # idempotent: a retried attach, or a new owner taking over
            if existing.subscriber != f.subscriber:
                self._unindex(existing)
                existing.subscriber = f.subscriber
                self.by_sub.setdefault(f.subscriber, []).append(existing)
            return Attached(call_id=f.call_id, worker=self.index, in16_pos=existing.inp.out_pos)
        for name, rate in (("call_rate", f.call_rate), ("tts_rate", f.tts_rate)):
            if not 1000 <= rate <= MAX_RATE:
                return self._error("bad_rate", f"{name} {rate} out of range", f.call_id)
        try:
            params = self.params.merged(f.vad)
        except ValueError as e:
            return self._error("bad_params", str(e), f.call_id)
        if not self.free_slots:
            return self._error("full", f"worker-{self.index} serves {len(self.calls)} calls (max_calls)", f.call_id)
        rings: dict[str, Ring] = {}
        try:
            for kind, rate in (("in", f.call_rate), ("in16", RATE16), ("tts", f.tts_rate), ("out", f.call_rate)):
                r = Ring.attach(ring_name(f.instance, f.call_id, kind))
                rings[kind] = r
                if r.rate != rate:
                    raise _RateMismatch(f"ring {r.name}: rate {r.rate}, expected {rate}")
        except (RingError, _RateMismatch) as e:
            for r in rings.values():
                r.close()
            return self._error("bad_rate" if isinstance(e, _RateMismatch) else "bad_ring", str(e), f.call_id)
        slot = self.free_slots.pop()
        assert self.silero is not None
        self.silero.reset(slot)
        inp = InputChain(rings["in"], rings["in16"], f.call_rate, self.cfg.max_read_ms / 1000.0)
        out = OutputChain(rings["tts"], rings["out"], f.tts_rate, f.call_rate, self.cfg.max_read_ms / 1000.0)
        health = VadHealth(self.vad_cfg.max_consecutive_failures, self.vad_cfg.failure_window,
                           self.vad_cfg.recovery_interval)
        c = Call(f.call_id, f.subscriber, f.gateway, slot, rings, inp, out, params, health,
                 native8=self.vad_cfg.native_8k)
        if f.speaking_since >= 0:
            # the previous worker died during speech: close it where its in16 ended
            at = inp.out_pos
            c.events.append({"call_id": c.call_id, "kind": "stop", "pos": max(f.speaking_since, at),
                             "at": at, "ns": time.monotonic_ns(), "reason": "worker_lost"})
        self.calls[f.call_id] = c
        self.by_sub.setdefault(f.subscriber, []).append(c)
        return Attached(call_id=f.call_id, worker=self.index, in16_pos=inp.out_pos)

    def _unindex(self, c: Call) -> None:
        lst = self.by_sub.get(c.subscriber)
        if lst is not None:
            try:
                lst.remove(c)
            except ValueError:
                pass
            if not lst:
                del self.by_sub[c.subscriber]

    def detach(self, call_id: str) -> bool:
        c = self.calls.pop(call_id, None)
        if c is None:
            return False
        self._unindex(c)
        self.free_slots.append(c.slot)
        c.close()
        for hook in DETACH_HOOKS:
            hook(self, call_id)
        return True

    # -- job lane --------------------------------------------------------------

    def smart_turn(self, ident: bytes, cid: int | str | None, f: SmartTurnRequest) -> Frame | None:
        c = self.calls.get(f.call_id)
        if c is None:
            return self._error("unknown_call", "smart_turn for a call not attached here", f.call_id)
        w = c.inp.out_pos
        cap = c.rings["in16"].capacity
        if f.end_pos <= 0 or f.end_pos > w or f.end_pos < w - cap:
            return self._error("bad_range", f"end_pos {f.end_pos} outside the in16 ring's "
                               f"[{max(0, w - cap)}, {w}]", f.call_id)
        now = time.monotonic_ns()
        if f.deadline_ns <= now:
            return self._error("expired", "deadline already passed", f.call_id)
        if self.smart is None or self.jobs is None:
            return self._error("unsupported", "smart turn is disabled on this worker", f.call_id)
        job = Job("smart_turn", f.call_id, (ident, cid), f.deadline_ns,
                  self.cfg.job_timeout_ms * 1_000_000, {"ring": c.in16_name, "end_pos": f.end_pos},
                  received_ns=now)
        if not self.jobs.submit(job):
            return self._error("busy", f"job queue full ({self.jobs.capacity})", f.call_id)
        return None

    def _run_job(self, job: Job) -> Frame:
        """Job-lane thread: dispatch on the job's kind (local STT/TTS/LLM jobs register here)."""
        handler = self.job_handlers.get(job.kind)
        if handler is None:
            return ErrorReply(kind="unsupported", call_id=job.call_id, detail=f"no handler for {job.kind} jobs")
        return handler(job)

    def _smart_turn_job(self, job: Job) -> Frame:
        """Job-lane thread: read 8 s of in16 straight from the ring and score it."""
        assert self.smart is not None
        end = int(job.args["end_pos"])
        ring = Ring.attach(job.args["ring"])
        try:
            got = ring.read_range(max(0, end - WINDOW_SAMPLES), end)
        finally:
            ring.close()
        v = self.smart.analyze(got.samples)
        return SmartTurnResult(call_id=job.call_id, end_pos=end, probability=v.probability,
                               queued_us=(job.started_ns - job.received_ns) // 1000,
                               took_us=v.features_us + v.inference_us)

    def _send_job_results(self) -> None:
        done: list[JobDone] = []
        for jobs in (self.jobs, *self.extra_lanes.values()):
            if jobs is None:
                continue
            while jobs.results:
                done.append(jobs.results.popleft())
            done.extend(jobs.check_timeouts())
        for d in done:
            ident, cid = d.job.route
            if isinstance(d.reply, ErrorReply):
                self.stats.errors[d.reply.kind] = self.stats.errors.get(d.reply.kind, 0) + 1
            self._send(ident, encode(d.reply, cid=cid) if d.final else encode(d.reply))

    # -- realtime lane ---------------------------------------------------------

    def tick(self) -> None:
        st = self.stats
        t0 = time.perf_counter_ns()
        cpu = time.thread_time_ns
        c0 = cpu()
        calls = list(self.calls.values())
        now = time.monotonic_ns()
        fresh = self.fresh_ns
        active: list[Call] = []
        for c in calls:  # convert a call's input when its next VAD window is complete
            w = c.inp.src.write_pos
            if w > c.inp.in_pos and (w >= c.need_in or now - c.conv_ns >= fresh):
                c.conv_ns = now
                self._input(c)
                active.append(c)
            elif c.pend_n - c.pend_off >= c.win:  # windows left over from a catch-up
                active.append(c)
        c1 = cpu()
        self._vad(active)
        for c in active:
            c.schedule()
        c2 = cpu()
        for c in calls:
            out = c.out
            if out.src.write_pos > out.tts_pos:  # new tts audio (most calls are silent most ticks)
                for u in out.step():
                    self._send_out_utterance(c, u.utterance, u.epoch, u.out_pos)
        if self._hot:
            self._hot = {k: v for k, v in self._hot.items() if k in self.calls and self.calls[k].out.next_start() >= 0}
        c3 = cpu()
        self._publish()
        c4 = cpu()
        t4 = time.perf_counter_ns()
        st.ticks += 1
        st.input_ns += c1 - c0
        st.vad_ns += c2 - c1
        st.output_ns += c3 - c2
        st.send_ns += c4 - c3
        st.tick_cpu_ns += c4 - c0
        st.tick_ns += t4 - t0
        if t4 - t0 > st.tick_max_ns:
            st.tick_max_ns = t4 - t0

    def _input(self, c: Call) -> None:
        inp = c.inp
        try:
            n = inp.step()
        except Exception as e:  # a broken ring must not stop the tick for everyone
            self.stats.errors["input"] = self.stats.errors.get("input", 0) + 1
            log.warning("call %s: input conversion failed: %s", c.call_id, e)
            inp.reset_stream()
            return
        if inp.gap >= 0:
            self.stats.gaps += 1
            self._close_stream(c, inp.gap, "gap")
            c.events.append({"call_id": c.call_id, "kind": "gap", "pos": inp.gap, "lost": inp.gap_lost,
                             "ns": time.monotonic_ns()})
            c.align()
            return
        fresh = inp.raw if c.native8 else inp.fresh
        n = len(fresh)
        if n == 0:
            return
        m = c.pend_n
        pend = c.pend
        cap = len(pend)
        if m + n > cap:
            off = c.pend_off
            if m - off + n > cap:  # the VAD fell 2 s behind: shed the backlog like a gap
                self.stats.pend_overflows += 1
                self._close_stream(c, c.vad_pos, "overflow")
                c.align()
                return
            # compact: the unconsumed tail moves to the front (once per ~2 s of audio)
            pend[: m - off] = pend[off:m]
            m -= off
            c.pend_off = 0
        pend[m : m + n] = fresh
        c.pend_n = m + n

    def _close_stream(self, c: Call, at: int, reason: str) -> None:
        """End the call's VAD stream (gap, failure): stop dated to the last speech, fresh state."""
        ev = c.stream.finish(at)
        if ev is not None:
            self._emit(c, ev, reason)
        c.pend_n = c.pend_off = 0
        assert self.silero is not None
        self.silero.reset(c.slot)

    def _emit(self, c: Call, ev: VadEvent, reason: str = "") -> None:
        pos = ev.pos
        if ev.kind == "start":
            c.fall_ref = (-1, -1)
        if self.vad_cfg.refine_boundaries and not reason:
            if ev.kind == "stop" and c.fall_ref[0] == ev.pos:
                pos = c.fall_ref[1]  # the stop carries exactly what its falling event announced
            else:
                pos = self._refine(c, ev)
                if ev.kind == "falling":
                    c.fall_ref = (ev.pos, pos)
        d: dict[str, Any] = {"call_id": c.call_id, "kind": ev.kind, "pos": max(0, pos), "at": ev.at,
                             "ns": time.monotonic_ns()}
        if reason:
            d["reason"] = reason
        c.events.append(d)
        self.stats.events += 1

    def _refine(self, c: Call, ev: VadEvent) -> int:
        ring = c.rings["in16"]
        try:
            if ev.kind == "start":
                base = max(0, ev.pos - 3 * WINDOW - 3200)
                got = ring.read_range(base, ev.pos + WINDOW)
                return refine_start(got.samples, got.start, ev.pos) if got.start <= base + 3200 else ev.pos
            base = max(0, ev.pos - 3 * WINDOW)
            got = ring.read_range(base, ev.at)
            if got.start > base:
                return ev.pos
            return refine_stop(got.samples, got.start, ev.pos, ev.at)
        except Exception:  # refinement is an improvement, never a reason to lose an event
            return ev.pos

    def _vad(self, calls: list[Call]) -> None:
        """One batched Silero run per VAD rate over every call with a full window; more
        runs only for calls that are more than one window behind (a stall, a re-attach)."""
        silero = self.silero
        assert silero is not None
        todo = calls
        for _ in range(self.cfg.max_vad_rounds):
            batches: dict[int, list[Call]] = {}
            behind: list[Call] = []
            for c in todo:
                off = c.pend_off
                have = c.pend_n - off
                w = c.win
                if have < w or (c.native8 and c.vad_pos + WINDOW > c.inp.out_pos):
                    continue  # no full window (native 8 kHz: or in16 does not cover it yet)
                if have >= 2 * w:
                    behind.append(c)
                h = c.health
                if h.failed_open:
                    end = c.vad_pos + WINDOW
                    if h.probe_due(end):
                        c.probe = True
                        silero.reset(c.slot)
                        c.stream = VadStream(c.params)
                    else:  # failed open: audio flows, no VAD
                        c.pend_off = off + w
                        c.vad_pos = end
                        continue
                batch = batches.get(w)
                if batch is None:
                    batch = batches[w] = []
                slots, win16, _ = self._scratch[w]
                i = len(batch)
                slots[i] = c.slot
                win16[i] = c.pend[off : off + w]
                batch.append(c)
            for w, batch in batches.items():
                self._vad_run(w, batch)
            if not behind:
                break
            todo = behind

    def _vad_run(self, w: int, batch: list[Call]) -> None:
        """Score the windows gathered in the ``w``-wide scratch rows and feed each call's stream."""
        silero = self.silero
        assert silero is not None
        st = self.stats
        n = len(batch)
        slots, win16, winf = self._scratch[w]
        win = winf[:n]
        np.multiply(win16[:n], SCALE, out=win)
        try:
            probs = silero.run(slots[:n], win).tolist()
        except Exception as e:
            probs = self._isolate(batch, win, e)
        st.vad_runs += 1
        st.vad_rows += n
        for i in range(n):
            c = batch[i]
            end = c.vad_pos + WINDOW
            c.vad_pos = end
            c.pend_off += w
            p = probs[i]
            if p != p or p < 0.0 or p > 1.0:  # NaN or nonsense: a failed window
                self._vad_failure(c, end)
                continue
            h = c.health
            if h.streak or h.failed_open:
                if h.on_success(end) == "recovered":
                    st.recoveries += 1
                    log.warning("call %s: VAD recovered", c.call_id)
                    c.events.append({"call_id": c.call_id, "kind": "vad_recovered", "pos": end,
                                     "ns": time.monotonic_ns()})
                c.probe = False
            ev = c.stream.push(p, end)
            if ev is not None:
                self._emit(c, ev)

    def _isolate(self, batch: list[Call], win: np.ndarray, err: Exception) -> list[float]:
        """The batched run failed: run each row alone so one bad call cannot fail the rest."""
        silero = self.silero
        assert silero is not None
        self.stats.errors["vad_batch"] = self.stats.errors.get("vad_batch", 0) + 1
        probs = [float("nan")] * len(batch)
        for i, c in enumerate(batch):
            try:
                probs[i] = float(silero.run(np.array([c.slot], dtype=np.intp), win[i : i + 1])[0])
            except Exception:
                pass
        return probs

    def _vad_failure(self, c: Call, end: int) -> None:
        st = self.stats
        st.vad_failures += 1
        was_probe = c.probe
        c.probe = False
        ev = c.stream.finish(end)  # the stream is lost: close speech, rebuild it
        if ev is not None:
            self._emit(c, ev, "vad_error")
        c.stream = VadStream(c.params)
        assert self.silero is not None
        self.silero.reset(c.slot)
        if c.health.on_failure(end) == "failed_open":
            st.failed_open += 1
            log.error("call %s: VAD failed open after %d failures", c.call_id, c.health.streak)
            c.events.append({"call_id": c.call_id, "kind": "vad_failed", "pos": end,
                             "ns": time.monotonic_ns(), "failures": c.health.streak})
        elif was_probe:
            log.info("call %s: VAD recovery probe failed", c.call_id)

    def _serve_hot(self) -> None:
        """Convert the output of calls whose announced utterance got its first audio, now
        (outside the tick), and announce it. A call leaves the hot set once its start is
        placed, when it is gone, or after one tick (the tick converts it anyway)."""
        now = time.monotonic_ns()
        cpu0 = time.thread_time_ns()
        done: list[str] = []
        for call_id, deadline in self._hot.items():
            c = self.calls.get(call_id)
            b = c.out.next_start() if c is not None else -1
            if c is None or b < 0:
                done.append(call_id)
                continue
            have = c.out.src.write_pos - b
            if have >= c.out.src_rate // 50 or (have > 0 and now >= deadline):
                for u in c.out.step():
                    self._send_out_utterance(c, u.utterance, u.epoch, u.out_pos)
                self.stats.out_nudges += 1
                if c.out.next_start() < 0:
                    done.append(call_id)
            elif now >= deadline:
                done.append(call_id)
        for call_id in done:
            self._hot.pop(call_id, None)
        self.stats.nudge_ns += time.thread_time_ns() - cpu0

    def _send_out_utterance(self, c: Call, utterance: int, epoch: int, out_pos: int) -> None:
        payload = encode(OutUtterance(call_id=c.call_id, utterance=utterance, epoch=epoch, out_pos=out_pos))
        self._send(c.subscriber.encode(), payload)
        if c.gateway:
            self._send(c.gateway.encode(), payload)

    def _publish(self) -> None:
        """One WorkerTick per subscriber that has news: the in16 positions that advanced
        and the tick's events (an empty tick every 100 ms at least, as a keepalive)."""
        self.seq += 1
        now = time.monotonic_ns()
        orphaned: list[str] = []
        for sub, calls in self.by_sub.items():
            positions: dict[str, int] = {}
            events: list[dict[str, Any]] = []
            for c in calls:
                pos = c.inp.out_pos
                if pos != c.pub_pos:
                    positions[c.call_id] = pos
                    c.pub_pos = pos
                if c.events:
                    events.extend(c.events)
                    c.events.clear()
            if not positions and not events and now - self._last_pub.get(sub, 0) < self.keepalive_ns:
                continue
            self._last_pub[sub] = now
            payload = encode(WorkerTick(worker=self.index, seq=self.seq, positions=positions, events=events,
                                        sent_ns=now))
            if self._send(sub.encode(), payload):
                self._unroutable.pop(sub, None)
            else:
                first = self._unroutable.setdefault(sub, now)
                if now - first > self.cfg.orphan_timeout_s * 1e9:
                    orphaned.append(sub)
        for sub in orphaned:
            for c in list(self.by_sub.get(sub, [])):
                log.warning("detaching call %s: subscriber %s unreachable", c.call_id, sub)
                self.stats.orphan_detaches += 1
                self.detach(c.call_id)
            self._unroutable.pop(sub, None)

    # -- reporting -----------------------------------------------------------------

    def report_stats(self) -> dict[str, Any]:
        st = self.stats
        jobs = self.jobs.counters if self.jobs else {}
        return {
            "ticks": st.ticks, "overruns": st.overruns, "vad_runs": st.vad_runs, "vad_rows": st.vad_rows,
            "vad_failures": st.vad_failures, "failed_open": st.failed_open, "recoveries": st.recoveries,
            "gaps": st.gaps, "events": st.events, "send_failed": st.send_failed,
            "tick_cpu_ms": st.tick_cpu_ns / 1e6, "tick_max_ms": st.tick_max_ns / 1e6,
            "out_nudges": st.out_nudges,
            "jobs_queued": self.jobs.queued if self.jobs else 0,
            **{f"jobs_{k}": v for k, v in jobs.items()},
            **{f"{n}_{k}": v for n, lane in self.extra_lanes.items() for k, v in lane.counters.items()},
            "errors": dict(st.errors),
            "decode_errors": dict(self.guard.errors),
        }


class _RateMismatch(Exception):
    pass
