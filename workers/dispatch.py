"""The inference worker's request dispatch: the control inbox and the job lane's requests.

Owns :class:`RequestDispatch` (mixed into :class:`workers.core.Worker`): the
ROUTER inbox (decode, one reply per request), the dispatch of each control
frame to its handler through ONE table, :data:`workers.jobs.FRAME_HANDLERS`
(frame class -> ``handler(worker, ident, cid, frame)``: attach, detach,
TtsUtterance/TtsCut, SubscriberHello and Smart Turn registered here, the local STT/TTS/LLM job
frames by :mod:`workers.local_jobs`), the submission of jobs to the job lane
(:class:`workers.jobs.JobLane`: Smart Turn analyses read the last 8 s straight
from the call's in16 ring on their own thread; the tick never waits for them;
they are queued by when their turn ended, earliest first, and a newer request
for the same call supersedes a queued older one) and the sending of their
results.

Invariants:

* Bad requests get a typed :class:`ErrorReply` (counted in ``errors``) and
  the worker serves on; a bug handling one frame is answered ``internal``,
  never stops the worker. A frame without a handler is answered
  ``unsupported`` (and counted as ``unexpected_type``, logged once per type).
* A request answered now carries the request's correlation id; a job's final
  result carries it too (its partial results do not).
* Only the thread that runs :meth:`workers.core.Worker.run` touches the
  socket; sends never block (a failed send is counted in ``send_failed``).
* ``_run_job`` and the job handlers run on a job-lane thread;
  ``_smart_turn_job`` reads the in16 ring by name, never the call table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from ipc.codec import DecodeGuard, Frame, encode
from ipc.frames import (
    AttachCall,
    DetachCall,
    Detached,
    ErrorReply,
    SmartTurnRequest,
    SmartTurnResult,
    SubscriberHello,
    TtsCut,
    TtsUtterance,
)
from ipc.ring import Ring
from workers.call_table import Call
from workers.config import RATE, WorkersConfig
from workers.jobs import FRAME_HANDLERS, Job, JobDone, JobLane
from workers.realtime import TickStats
from workers.smart_turn import WINDOW_SAMPLES, SmartTurnModel

log = logging.getLogger("brisvox.workers")


class RequestDispatch:
    """The control inbox and the job lane (state set by ``Worker.__init__``)."""

    index: int
    cfg: WorkersConfig
    sock: Any
    guard: DecodeGuard
    stats: TickStats
    calls: dict[str, Call]
    smart: SmartTurnModel | None
    jobs: JobLane | None
    extra_lanes: dict[str, JobLane]
    job_handlers: dict[str, Callable[[Job], Frame]]
    tick_s: float
    _hot: dict[str, int]

    if TYPE_CHECKING:  # from the other parts of the worker
        def attach(self, f: AttachCall) -> Frame: ...
        def detach(self, call_id: str) -> bool: ...
        def retire(self, subscriber: str, incarnation: str) -> int: ...
        def _serve_hot(self) -> None: ...
        def _send_out_utterance(self, c: Call, utterance: int, epoch: int, out_pos: int) -> None: ...

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
        handler = FRAME_HANDLERS.get(type(frame))
        if handler is None:
            self.guard.unexpected(frame)
            return self._error("unsupported", f"worker does not serve {frame.TYPE}")
        return handler(self, ident, cid, frame)

    def _on_attach(self, ident: bytes, cid: int | str | None, f: AttachCall) -> Frame | None:
        return self.attach(f)

    def _on_detach(self, ident: bytes, cid: int | str | None, f: DetachCall) -> Frame | None:
        self.detach(f.call_id)
        return Detached(call_id=f.call_id)

    def _on_hello(self, ident: bytes, cid: int | str | None, f: SubscriberHello) -> Frame | None:
        """The sender's identity is now ``f.incarnation``: its other incarnations' calls go."""
        self.retire(ident.decode("utf-8", "replace"), f.incarnation)
        return None

    def _on_tts_utterance(self, ident: bytes, cid: int | str | None, f: TtsUtterance) -> Frame | None:
        c = self.calls.get(f.call_id)
        if c is None:
            return self._error("unknown_call", "tts_utterance for a call not attached here", f.call_id)
        placed = c.out.announce(f.utterance, f.epoch, f.tts_pos)
        if placed is not None:  # its audio was already converted
            self._send_out_utterance(c, placed.utterance, placed.epoch, placed.out_pos)
        elif c.out.next_start() >= 0:
            self._hot[c.call_id] = time.monotonic_ns() + int(self.tick_s * 1e9)
            self._serve_hot()
        return None

    def _on_tts_cut(self, ident: bytes, cid: int | str | None, f: TtsCut) -> Frame | None:
        c = self.calls.get(f.call_id)
        if c is None:
            return self._error("unknown_call", "tts_cut for a call not attached here", f.call_id)
        c.out.cut(f.epoch, f.tts_pos)
        return None

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
        # queue order: when the turn ended (the in16 sample end_pos, dated back from the ring's
        # write position); a newer request for the same call supersedes a queued older one
        turn_end_ns = now - (w - f.end_pos) * 1_000_000_000 // RATE
        job = Job("smart_turn", f.call_id, (ident, cid), f.deadline_ns,
                  self.cfg.job_timeout_ms * 1_000_000, {"ring": c.in16_name, "end_pos": f.end_pos},
                  received_ns=now, order_ns=max(1, turn_end_ns), supersede=("smart_turn", ident, f.call_id))
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


FRAME_HANDLERS.update({
    AttachCall: RequestDispatch._on_attach,
    DetachCall: RequestDispatch._on_detach,
    SubscriberHello: RequestDispatch._on_hello,
    SmartTurnRequest: RequestDispatch.smart_turn,
    TtsUtterance: RequestDispatch._on_tts_utterance,
    TtsCut: RequestDispatch._on_tts_cut,
})
