"""The inference worker's request dispatch: the control inbox, its one table, the job lane's requests.

Owns :class:`RequestDispatch` (held by :class:`workers.core.Worker`): the
ROUTER inbox (decode, one reply per request), the dispatch of each control
frame to its handler through ONE table, :attr:`RequestDispatch.handlers`
(frame class -> ``handler(ident, cid, frame)``: attach, detach,
TtsUtterance/TtsCut, SubscriberHello and Smart Turn are its own; the worker
adds, bound to itself, the frames other modules registered in
:data:`workers.jobs.FRAME_HANDLERS`, the local STT/TTS/LLM job frames of
:mod:`workers.local_jobs`), the submission of Smart Turn jobs to the job lane
(:class:`workers.jobs.JobLane`: Smart Turn analyses read the last 8 s straight
from the call's in16 ring on their own thread; the tick never waits for them;
they are queued by their deadline, earliest first; a newer request for the
same call supersedes a queued older one, and a SmartTurnCancel takes a queued
one out: an analysis whose verdict could no longer be used is never run) and the sending of every
lane's results.

It is handed what it works on explicitly: the attached calls
(:class:`workers.call_table.AttachedCalls`: attach, detach, retire), the
realtime lane (:meth:`workers.realtime.RealtimeLane.announce` for a
TtsUtterance), the worker's counters, decode guard and non-blocking ``send``,
the worker's other job lanes (``extra_lanes``, filled by
:mod:`workers.local_jobs`) and, at :meth:`RequestDispatch.load`, the Smart
Turn model and the job lane.

Invariants:

* Bad requests get a typed :class:`ErrorReply` (counted in ``errors``) and
  the worker serves on; a bug handling one frame is answered ``internal``,
  never stops the worker. A frame without a handler is answered
  ``unsupported`` (and counted as ``unexpected_type``, logged once per type).
* The table is complete when the dispatch is built (every handler module is
  imported by :mod:`workers.core` first) and never changes afterwards.
* A request answered now carries the request's correlation id; a job's final
  result carries it too (its partial results do not).
* Only the thread that runs :meth:`workers.core.Worker.run` touches the
  socket; sends never block (a failed send is counted in ``send_failed``).
* :meth:`RequestDispatch.run_job` and the job handlers run on a job-lane
  thread; ``_smart_turn_job`` reads the in16 ring by name, never the calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from ipc.codec import DecodeGuard, Frame, encode
from ipc.frames import (
    AmdHear,
    AmdStart,
    AttachCall,
    DetachCall,
    Detached,
    ErrorReply,
    SmartTurnCancel,
    SmartTurnRequest,
    SmartTurnResult,
    SubscriberHello,
    TtsCut,
    TtsUtterance,
)
from ipc.ring import Ring
from workers.amd import AmdParams
from workers.call_table import AttachedCalls
from workers.config import WorkersConfig
from workers.jobs import Job, JobDone, JobLane
from workers.realtime import RealtimeLane
from workers.smart_turn import WINDOW_SAMPLES, SmartTurnModel
from workers.stats import TickStats

log = logging.getLogger("brisvox.workers")

# a request frame's handler: (sender identity, correlation id, frame) -> the reply (None: none)
Handler = Callable[[bytes, int | str | None, Any], Frame | None]


class RequestDispatch:
    """The control inbox and the Smart Turn job lane of worker ``index`` (see the module's invariants)."""

    def __init__(self, index: int, cfg: WorkersConfig, stats: TickStats, guard: DecodeGuard,
                 attached: AttachedCalls, realtime: RealtimeLane, send: Callable[[bytes, bytes], bool],
                 extra_lanes: dict[str, JobLane], handlers: Mapping[type, Handler]) -> None:
        self.index = index
        self.cfg = cfg
        self.stats = stats
        self.guard = guard
        self.attached = attached
        self.calls = attached.calls
        self.realtime = realtime
        self._send = send
        self.extra_lanes = extra_lanes
        self.smart: SmartTurnModel | None = None
        self.jobs: JobLane | None = None
        # job kind -> handler run on a job-lane thread (returns the reply frame)
        self.job_handlers: dict[str, Callable[[Job], Frame]] = {"smart_turn": self._smart_turn_job}
        self.handlers: dict[type, Handler] = {
            **handlers,
            AttachCall: self._on_attach,
            DetachCall: self._on_detach,
            SubscriberHello: self._on_hello,
            SmartTurnRequest: self.smart_turn,
            SmartTurnCancel: self._on_smart_turn_cancel,
            TtsUtterance: self._on_tts_utterance,
            TtsCut: self._on_tts_cut,
            AmdStart: self._on_amd_start,
            AmdHear: self._on_amd_hear,
        }

    def load(self, smart: SmartTurnModel | None, jobs: JobLane) -> None:
        """The Smart Turn model (None: disabled) and the job lane its analyses run on."""
        self.smart = smart
        self.jobs = jobs

    def drain_inbox(self, sock: Any) -> None:
        """Handle what waits in the inbox ``sock`` (at most 1000 frames), answering each request."""
        for _ in range(1000):
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
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

    def handle(self, ident: bytes, frame: Frame, cid: int | str | None = None) -> Frame | None:
        """One control frame -> its reply (None: nothing to answer)."""
        handler = self.handlers.get(type(frame))
        if handler is None:
            self.guard.unexpected(frame)
            return self.stats.error("unsupported", f"worker does not serve {frame.TYPE}")
        return handler(ident, cid, frame)

    def _on_attach(self, ident: bytes, cid: int | str | None, f: AttachCall) -> Frame | None:
        return self.attached.attach(f)

    def _on_detach(self, ident: bytes, cid: int | str | None, f: DetachCall) -> Frame | None:
        self.attached.detach(f.call_id)
        return Detached(call_id=f.call_id)

    def _on_hello(self, ident: bytes, cid: int | str | None, f: SubscriberHello) -> Frame | None:
        """The sender's identity is now ``f.incarnation``: its other incarnations' calls go."""
        self.attached.retire(ident.decode("utf-8", "replace"), f.incarnation)
        return None

    def _on_tts_utterance(self, ident: bytes, cid: int | str | None, f: TtsUtterance) -> Frame | None:
        c = self.calls.get(f.call_id)
        if c is None:
            return self.stats.error("unknown_call", "tts_utterance for a call not attached here", f.call_id)
        self.realtime.announce(c, f.utterance, f.epoch, f.tts_pos)
        return None

    def _on_tts_cut(self, ident: bytes, cid: int | str | None, f: TtsCut) -> Frame | None:
        c = self.calls.get(f.call_id)
        if c is None:
            return self.stats.error("unknown_call", "tts_cut for a call not attached here", f.call_id)
        c.out.cut(f.epoch, f.tts_pos)
        return None

    def _on_amd_start(self, ident: bytes, cid: int | str | None, f: AmdStart) -> Frame | None:
        """Classify the call's opening from ``in16_pos`` on: the realtime lane feeds the
        detector each VAD window from there (a second AmdStart replaces the first)."""
        c = self.calls.get(f.call_id)
        if c is None:
            return self.stats.error("unknown_call", "amd_start for a call not attached here", f.call_id)
        try:
            params = AmdParams(max_wait_ms=f.max_wait_ms, leave_message=f.leave_message, transcripts=f.transcripts)
        except ValueError as e:
            return self.stats.error("bad_params", str(e)[:200], f.call_id)
        c.amd, c.amd_start = None, (max(0, f.in16_pos), params)
        self.stats.amd_started += 1
        return None

    def _on_amd_hear(self, ident: bytes, cid: int | str | None, f: AmdHear) -> Frame | None:
        """What the screened opening says: the call's detector checks it for cues (its events
        go out with the call's next tick)."""
        c = self.calls.get(f.call_id)
        if c is None:
            return self.stats.error("unknown_call", "amd_hear for a call not attached here", f.call_id)
        self.realtime.amd_hear(c, f.text[:2000])
        return None

    # -- job lane --------------------------------------------------------------

    def smart_turn(self, ident: bytes, cid: int | str | None, f: SmartTurnRequest) -> Frame | None:
        c = self.calls.get(f.call_id)
        if c is None:
            return self.stats.error("unknown_call", "smart_turn for a call not attached here", f.call_id)
        w = c.inp.out_pos
        cap = c.rings["in16"].capacity
        if f.end_pos <= 0 or f.end_pos > w or f.end_pos < w - cap:
            return self.stats.error("bad_range", f"end_pos {f.end_pos} outside the in16 ring's "
                                    f"[{max(0, w - cap)}, {w}]", f.call_id)
        now = time.monotonic_ns()
        if f.deadline_ns <= now:
            return self.stats.error("expired", "deadline already passed", f.call_id)
        if self.smart is None or self.jobs is None:
            return self.stats.error("unsupported", "smart turn is disabled on this worker", f.call_id)
        # queue order: the request's deadline (the verdict is of no use after it: earliest
        # deadline first); a newer request for the same call supersedes a queued older one
        job = Job("smart_turn", f.call_id, (ident, cid), f.deadline_ns,
                  self.cfg.job_timeout_ms * 1_000_000, {"ring": c.in16_name, "end_pos": f.end_pos},
                  received_ns=now, order_ns=f.deadline_ns, supersede=("smart_turn", ident, f.call_id))
        if not self.jobs.submit(job):
            return self.stats.error("busy", f"job queue full ({self.jobs.capacity})", f.call_id)
        return None

    def _on_smart_turn_cancel(self, ident: bytes, cid: int | str | None, f: SmartTurnCancel) -> Frame | None:
        """The sender's queued analysis of ``f.call_id`` ending at ``f.end_pos`` is not run
        (answered ``cancelled``); one already running is left alone. Not answered itself."""
        if self.jobs is not None:
            self.jobs.withdraw(lambda j: j.kind == "smart_turn" and j.call_id == f.call_id
                               and j.route[0] == ident and j.args.get("end_pos") == f.end_pos,
                               "its verdict can no longer be used")
        return None

    def run_job(self, job: Job) -> Frame:
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

    def send_job_results(self) -> None:
        """Send what every job lane finished (and answer the jobs that ran over their timeout)."""
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
