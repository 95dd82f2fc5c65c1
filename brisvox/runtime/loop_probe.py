"""The event-loop stall probe of every role: how late its loop wakes up, and who held it.

Owns :class:`LoopProbe`. A loop owes a wake-up at some instant (:meth:`LoopProbe.owe`)
and the probe is told when it came (:meth:`LoopProbe.paid`); the difference is the
loop's lateness, the time everything that became ready meanwhile waited. Three
drivers, one per kind of loop:

* an asyncio loop (gateway, agent): :meth:`LoopProbe.run`, a task that sleeps
  :data:`INTERVAL_S` and measures how late its own sleep ended;
* a timer loop (the worker's tick loop): ``owe(next_tick)`` as soon as the next tick
  is scheduled (before this tick's work, so a tick that holds the loop is seen while it
  holds it), ``paid()`` when that tick runs;
* a poll loop without a timer of its own (the supervisor's): ``owe(now)`` when the
  poll returns (what it woke for is due now), ``paid()`` when it goes back to poll:
  the turn's length, which is how long an event arriving during it waits.

A lateness over :data:`STALL_S` counts as a stall, of one of two causes: ``host`` when the
loop's thread spent all of it but :data:`STALL_S` waiting for a CPU (runnable, not running:
the kernel's ``run_delay`` of the thread, ``/proc/self/task/<tid>/schedstat``, read at each
``paid``: an oversubscribed host, not this process), else ``loop`` (the loop's own code
held it: a blocking call, a long callback, a GC pause). Over :data:`STACK_S` it is logged
(rate-limited, :class:`~brisvox.runtime.log_limit.LogLimiter`) with the stack of what
the loop's thread was running: a watchdog thread (:meth:`LoopProbe.start`) wakes when
an owed wake-up is :data:`STACK_S` overdue and, if it is still unpaid, reads the loop
thread's frame from ``sys._current_frames()``: the blocking code's own stack, taken
while it blocks.

:meth:`LoopProbe.snapshot` is what the role reports with its pongs (``stats["loop"]``);
the supervisor renders every role's on ``/metrics`` (``brisvox/daemon/loop_metrics.py``).

Invariants: ``owe``/``paid`` are called from the loop's thread only and cost a clock
read, a few stores and (``paid``) one ``pread`` of the schedstat (no lock); the watchdog
only reads what they store (the owed wake-up is one ``(seq, when)`` attribute, stored
and read whole under the GIL) and keeps a stack only if that same wake-up is still owed
after the stack was read, tagged with its ``seq``, so a stack is never attributed to
another stall; it sleeps until the owed instant plus :data:`STACK_S` (or
:data:`IDLE_WAKE_S`, shorter, while nothing is owed: it sees an owed wake-up before it
is :data:`STACK_S` late, so the stack is taken at that instant), so it wakes a few
times a second; a lateness is never negative; counters only grow; the snapshot is
small and fixed in size.

Sampling: the asyncio driver sees a stall only through a wake-up due during it; a
stall of ``S`` starting ``u`` before the next due instant (``u`` in ``[0, INTERVAL_S)``)
is measured ``S - u``. :data:`INTERVAL_S` trades that for CPU (each probe wake is one
loop iteration: docs/BENCHMARKS.md "Loop-stall probe").
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from brisvox.runtime.histogram import Histogram
from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.loop")

INTERVAL_S = 0.05  # the asyncio probe's sleep (docs/BENCHMARKS.md "Loop probe": its cost)
STALL_S = 0.05  # a lateness over this is a stall (counted)
STACK_S = 0.25  # ... over this it is logged with the stack of what ran
IDLE_WAKE_S = 0.2  # the watchdog's look while nothing is owed (< STACK_S: it still takes a stack at due + STACK_S)
LOG_INTERVAL_S = 30.0  # at most one stall line per this (the rest counted)
STACK_FRAMES = 24  # innermost frames kept of a captured stack
LAG_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopProbe:
    """One loop's lateness (see the module docstring). ``name`` labels its log lines;
    ``cpu_wait()``: seconds the loop's thread waited for a CPU since its last call (default:
    the thread's schedstat; a test passes its own with its own clock)."""

    def __init__(self, name: str, *, interval_s: float = INTERVAL_S, stall_s: float = STALL_S,
                 stack_s: float = STACK_S, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log, log_interval_s: float = LOG_INTERVAL_S,
                 cpu_wait: Callable[[], float] | None = None) -> None:
        if interval_s <= 0 or stall_s <= 0 or stack_s < stall_s:
            raise ValueError("loop probe: interval and stall must be > 0, the stack threshold >= the stall's")
        self.name = name
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.stack_s = stack_s
        self.clock = clock
        self.limit = LogLimiter(logger, interval_s=log_interval_s, clock=clock)
        self.lag = Histogram(LAG_BUCKETS)
        self.stalls = 0
        self.host_stalls = 0  # of the stalls: the thread waited for a CPU (see the module docstring)
        self.long_stalls = 0
        self.max_lag_s = 0.0
        self.stacks = 0  # stacks captured by the watchdog
        self._owed: tuple[int, float] | None = None  # (seq, when) of the owed wake-up; None: nothing owed
        self._seq = 0  # the number of the last owed wake-up
        self._thread = threading.get_ident()  # the loop's thread (set again at every owe)
        self._captured: tuple[int, str] | None = None  # (seq, stack) the watchdog took
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._sched_fd = -1  # the loop thread's schedstat (-1: none, or not this kernel)
        self._sched_tid = 0
        self._run_delay = 0  # its run_delay (ns) at the last paid
        self.cpu_wait = cpu_wait or self._schedstat_wait

    # -- the loop's side --------------------------------------------------------------
    def owe(self, at: float) -> None:
        """The loop owes a wake-up at ``at`` (its clock)."""
        self._thread = threading.get_ident()
        self._seq += 1
        self._owed = (self._seq, at)  # one store: the watchdog reads both or neither

    def paid(self, now: float | None = None) -> float:
        """The owed wake-up came (at ``now``): its lateness in seconds (0 if nothing was owed)."""
        owed = self._owed
        if owed is None:
            return 0.0
        now = self.clock() if now is None else now
        self._owed = None
        late = max(0.0, now - owed[1])
        waited = self.cpu_wait()
        self.lag.observe(late)
        if late > self.max_lag_s:
            self.max_lag_s = late
        if late > self.stall_s:
            self.stalls += 1
            if late - waited <= self.stall_s:
                self.host_stalls += 1
            if late > self.stack_s:
                self.long_stalls += 1
                self._log(late, waited)
        return late

    def _schedstat_wait(self) -> float:
        """Seconds the loop's thread waited for a CPU since the last ``paid`` (0: unknown)."""
        tid = threading.get_native_id()
        if tid != self._sched_tid:
            self._open_sched(tid)
        if self._sched_fd < 0:
            return 0.0
        try:
            rd = int(os.pread(self._sched_fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0.0
        waited, self._run_delay = rd - self._run_delay, rd
        return max(0, waited) / 1e9

    def _open_sched(self, tid: int) -> None:
        if self._sched_fd >= 0:
            os.close(self._sched_fd)
        self._sched_tid = tid
        try:
            self._sched_fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            self._run_delay = int(os.pread(self._sched_fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            self._sched_fd = -1

    def _log(self, late: float, waited: float) -> None:
        cap = self._captured
        stack = cap[1] if cap is not None and cap[0] == self._seq else "(not captured: the stall ended first)"
        self.limit("loop_stall", "%s: event loop stalled %.0f ms (%.0f ms of it waiting for a CPU); it was "
                   "running:\n%s", self.name, late * 1000.0, min(late, waited) * 1000.0, stack)

    async def run(self) -> None:
        """The asyncio driver: sleep :attr:`interval_s`, measure how late the sleep ended, repeat
        (until cancelled)."""
        clock, interval = self.clock, self.interval_s
        try:
            while True:
                self.owe(clock() + interval)
                await asyncio.sleep(interval)
                self.paid()
        finally:
            self._owed = None

    # -- the watchdog ------------------------------------------------------------------
    def start(self) -> LoopProbe:
        """Start the watchdog thread (once); returns self."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"brisvox-loop-probe-{self.name}",
                                              daemon=True)
            self._watchdog.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._sched_fd >= 0:
            os.close(self._sched_fd)
            self._sched_fd, self._sched_tid = -1, 0
        w = self._watchdog
        if w is not None and w is not threading.current_thread():
            w.join(1.0)

    def _watch(self) -> None:
        closed, clock = self._closed, self.clock
        seen = -1
        while not closed.is_set():
            owed = self._owed
            if owed is None or owed[0] == seen:
                closed.wait(min(IDLE_WAKE_S, self.stack_s))
                continue
            seq, due = owed
            wait = due + self.stack_s - clock()
            if wait > 0:
                closed.wait(wait)
                continue
            stack = self._stack_of(self._thread)
            if self._owed is owed:  # still owed, STACK_S late, after the read: the loop was held in it
                seen = seq
                self._captured = (seq, stack)
                self.stacks += 1

    @staticmethod
    def _stack_of(ident: int) -> str:
        frame = sys._current_frames().get(ident)
        if frame is None:
            return "(the loop's thread is gone)"
        return "".join(traceback.format_stack(frame)[-STACK_FRAMES:]).rstrip()

    # -- reporting ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """``stats["loop"]``: the lag histogram (wire form), stalls (and of them the host's), long
        stalls, the max lag."""
        return {"lag": self.lag.wire(), "stalls": self.stalls, "host_stalls": self.host_stalls,
                "long_stalls": self.long_stalls,
                "max_lag_s": round(self.max_lag_s, 6), "stacks": self.stacks,
                "log_suppressed": sum(self.limit.suppressed.values())}
