"""The job lane: CPU-heavy work (Smart Turn, later local STT/TTS/LLM) on its own threads.

Owns a bounded queue, the worker threads that drain it, and the rules of a
job's life, so the realtime lane (the tick loop) never waits for a job:

* ``submit`` never blocks: a full queue refuses the job (counted, the caller
  answers ``busy``).
* Order: the queued job with the smallest ``(order_ns, arrival)`` starts
  next. ``order_ns`` defaults to the arrival time (FIFO); Smart Turn jobs set
  it to the moment their turn ended (:mod:`workers.dispatch`), so the
  analysis whose turn ended first runs first, whatever order the requests
  arrived in. The queue stays bounded by ``capacity``.
* A job whose deadline passed while it waited is not started: it is answered
  ``expired`` (counted).
* A job with a ``supersede`` key replaces the queued (not yet started) job of
  the same key: the older one is answered ``superseded`` (counted) and never
  runs; its result could no longer matter (a newer Smart Turn request for the
  same call makes the older verdict stale). A running job is never touched.
* :meth:`JobLane.withdraw` takes the queued (not yet started) jobs that match
  out of the queue: each is answered ``cancelled`` (counted) and never runs;
  the owner knows their result could not change anything (a Smart Turn
  analysis of a pause the caller already ended). A running job is never
  touched.
* A job running longer than its timeout is answered ``timeout`` by
  :meth:`JobLane.check_timeouts` (called from the tick loop); its late
  result is dropped when it finally finishes (counted). A Python thread
  cannot be pre-empted, so the thread stays busy until the model returns.
* A job that raises is answered ``job_failed`` (counted); the thread lives on.
* Every started job's queue wait and run time are summed and their maxima
  kept (``wait_us_*``, ``run_us_*``: what a busy lane adds to a turn), and its
  CPU time (the job thread's own, ``cpu_us_total``: onnxruntime runs on it with
  one intra-op thread). :meth:`JobLane.recent` gives the p50 / p95 of the queue
  wait and of the CPU time over the last :data:`RECENT` started jobs.
* Results are handed to the owner through ``results`` (a deque) plus the
  ``notify`` callback (the core writes a byte to its wake pipe), so only the
  owner's thread touches its ZeroMQ socket.

Time is ``time.monotonic_ns()`` (deadlines cross processes).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ipc.codec import Frame
from ipc.frames import ErrorReply

log = logging.getLogger("brisvox.workers.jobs")

RECENT = 4096  # started jobs kept for JobLane.recent (a load bench level has ~1000 analyses)


@dataclass(slots=True, eq=False)
class Job:
    """One unit of work. ``route`` tells the owner where the answer goes."""

    kind: str
    call_id: str
    route: Any  # (identity, cid) for the core; opaque here
    deadline_ns: int
    timeout_ns: int
    args: dict[str, Any] = field(default_factory=dict)
    received_ns: int = 0
    started_ns: int = 0
    answered: bool = False  # the owner already answered it (timeout): drop the late result
    cancelled: bool = False  # JobLane.cancel: a streaming runner stops at its next step
    order_ns: int = 0  # queue order (smaller first); 0: the arrival time (FIFO)
    supersede: Any = None  # a newer queued job with the same key replaces this one (None: never)


@dataclass(frozen=True, slots=True)
class JobDone:
    job: Job
    reply: Frame
    final: bool = True  # False: a streamed frame (JobLane.emit), sent without the correlation id


# -- request frames and hooks of job kinds served by other modules -------------------------
# FRAME_HANDLERS: a request frame type -> ``handler(worker, ident, cid, frame) -> Frame | None``
# for the frames another module serves (filled by workers/local_jobs.py at import); a Worker
# binds each to itself into its dispatch's ONE table (RequestDispatch.handlers, workers/
# dispatch.py), called on the worker's main thread. DETACH_HOOKS run with ``(worker, call_id)``
# when a call is detached, CLOSE_HOOKS with ``(worker,)`` at close.
FRAME_HANDLERS: dict[type, Callable[..., Frame | None]] = {}
DETACH_HOOKS: list[Callable[..., None]] = []
CLOSE_HOOKS: list[Callable[..., None]] = []


class JobLane:
    """``threads`` threads running ``runner(job) -> Frame`` over a queue of ``capacity``."""

    def __init__(
        self,
        name: str,
        runner: Callable[[Job], Frame],
        notify: Callable[[], None],
        threads: int = 1,
        capacity: int = 32,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.name = name
        self.runner = runner
        self.notify = notify
        self.capacity = max(1, capacity)
        self.clock_ns = clock_ns
        self.results: collections.deque[JobDone] = collections.deque()
        # a heap of (order_ns, arrival seq, job): seq breaks ties FIFO and never compares jobs
        self._queue: list[tuple[int, int, Job]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._running: dict[int, Job] = {}
        self._stop = False
        self.counters = {"submitted": 0, "refused": 0, "expired": 0, "superseded": 0, "cancelled": 0,
                         "done": 0, "failed": 0,
                         "timeouts": 0, "late_results": 0,
                         # queue wait and run time of started jobs (the turn latency a busy lane adds)
                         "wait_us_total": 0, "wait_us_max": 0, "run_us_total": 0, "run_us_max": 0,
                         "cpu_us_total": 0}
        self._waits: collections.deque[int] = collections.deque(maxlen=RECENT)  # us, started jobs
        self._cpus: collections.deque[int] = collections.deque(maxlen=RECENT)  # us, finished jobs
        self._threads = [
            threading.Thread(target=self._loop, name=f"brisvox-{name}-{i}", daemon=True)
            for i in range(max(1, threads))
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def recent(self) -> dict[str, int]:
        """p50 / p95 of the queue wait and of the CPU time per job over the last :data:`RECENT`
        started jobs, in us (``wait_p50_us``, ``wait_p95_us``, ``cpu_p50_us``, ``cpu_p95_us``;
        empty before the first job)."""
        with self._cv:  # copy under the lock, sort outside it (the job threads append)
            waits, cpus = list(self._waits), list(self._cpus)
        out: dict[str, int] = {}
        for name, xs in (("wait", waits), ("cpu", cpus)):
            xs.sort()
            if xs:
                out[f"{name}_p50_us"] = xs[(len(xs) - 1) // 2]
                out[f"{name}_p95_us"] = xs[min(len(xs) - 1, (95 * len(xs)) // 100)]
        return out

    def submit(self, job: Job) -> bool:
        """Queue ``job`` (False: refused, the queue is full or the lane stopped).

        A queued job with the same ``supersede`` key is taken out first and
        answered ``superseded``: the new job takes its place, so superseding
        never refuses for lack of room."""
        old: Job | None = None
        with self._cv:
            if self._stop:
                self.counters["refused"] += 1
                return False
            if job.supersede is not None:
                for i, (_, _, q) in enumerate(self._queue):
                    if q.supersede == job.supersede:
                        old = q
                        self._queue[i] = self._queue[-1]
                        self._queue.pop()
                        heapq.heapify(self._queue)
                        break
            if len(self._queue) >= self.capacity:
                self.counters["refused"] += 1
                return False
            job.received_ns = job.received_ns or self.clock_ns()
            heapq.heappush(self._queue, (job.order_ns or job.received_ns, next(self._seq), job))
            self.counters["submitted"] += 1
            if old is not None:
                self.counters["superseded"] += 1
                old.answered = True
            self._cv.notify()
        if old is not None:
            self.results.append(JobDone(old, ErrorReply(
                kind="superseded", call_id=old.call_id, detail=f"{old.kind}: a newer request replaced it")))
            self.notify()
        return True

    def emit(self, job: Job, frame: Frame) -> bool:
        """A streaming runner's partial output (job-lane thread): queued for the owner,
        sent without a correlation id. Dropped (False) once the job was answered."""
        with self._cv:
            if job.answered:
                return False
        self.results.append(JobDone(job, frame, final=False))
        self.notify()
        return True

    def cancel(self, match: Callable[[Job], bool]) -> int:
        """Flag every queued or running job that ``match``es as cancelled (owner thread)."""
        n = 0
        with self._cv:
            for job in [*(q for _, _, q in self._queue), *self._running.values()]:
                if not job.cancelled and match(job):
                    job.cancelled = True
                    n += 1
        return n

    def withdraw(self, match: Callable[[Job], bool], detail: str = "withdrawn") -> int:
        """Take every queued job that ``match``es out of the queue and answer it ``cancelled``
        (owner thread); returns how many. Running jobs are not looked at."""
        with self._cv:
            keep = [q for q in self._queue if not match(q[2])]
            gone = [q[2] for q in self._queue if match(q[2])]
            if not gone:
                return 0
            self._queue[:] = keep
            heapq.heapify(self._queue)
            for job in gone:
                job.answered = True
            self.counters["cancelled"] += len(gone)
        for job in gone:
            self.results.append(JobDone(job, ErrorReply(kind="cancelled", call_id=job.call_id,
                                                        detail=f"{job.kind}: {detail}")))
        self.notify()
        return len(gone)

    def check_timeouts(self) -> list[JobDone]:
        """Answer every running job past its timeout (owner thread)."""
        now = self.clock_ns()
        out: list[JobDone] = []
        with self._cv:
            for job in self._running.values():
                if not job.answered and job.timeout_ns > 0 and now - job.started_ns > job.timeout_ns:
                    job.answered = True
                    self.counters["timeouts"] += 1
                    out.append(JobDone(job, ErrorReply(kind="timeout", call_id=job.call_id,
                                                       detail=f"{job.kind} ran over {job.timeout_ns // 1_000_000} ms")))
        return out

    def stop(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._stop = True
            self._queue.clear()
            self._cv.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)

    def _finish(self, job: Job, reply: Frame) -> None:
        with self._cv:
            self._running.pop(threading.get_ident(), None)
            if job.answered:
                self.counters["late_results"] += 1
                return
            job.answered = True
        self.results.append(JobDone(job, reply))
        self.notify()

    def _loop(self) -> None:
        me = threading.get_ident()
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                job = heapq.heappop(self._queue)[2]
                now = self.clock_ns()
                if now > job.deadline_ns:
                    self.counters["expired"] += 1
                    expired = True
                else:
                    expired = False
                    job.started_ns = now
                    self._running[me] = job
                    c = self.counters
                    wait_us = (now - job.received_ns) // 1000
                    c["wait_us_total"] += wait_us
                    if wait_us > c["wait_us_max"]:
                        c["wait_us_max"] = wait_us
                    self._waits.append(wait_us)
            if expired:
                job.answered = True
                self.results.append(JobDone(job, ErrorReply(
                    kind="expired", call_id=job.call_id,
                    detail=f"{job.kind} waited past its deadline by {(now - job.deadline_ns) // 1000} us")))
                self.notify()
                continue
            cpu0 = time.thread_time_ns()
            try:
                reply = self.runner(job)
                ok = not isinstance(reply, ErrorReply)
            except Exception as e:
                log.exception("%s job failed", job.kind)
                reply = ErrorReply(kind="job_failed", call_id=job.call_id, detail=f"{type(e).__name__}: {e}"[:500])
                ok = False
            run_us = (self.clock_ns() - job.started_ns) // 1000
            cpu_us = (time.thread_time_ns() - cpu0) // 1000
            with self._cv:
                c = self.counters
                c["done" if ok else "failed"] += 1
                c["run_us_total"] += run_us
                c["cpu_us_total"] += cpu_us
                self._cpus.append(cpu_us)
                if run_us > c["run_us_max"]:
                    c["run_us_max"] = run_us
            self._finish(job, reply)
