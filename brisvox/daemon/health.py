"""The supervisor's health checks: pings, hung detection, handshake timeouts, memory.

:class:`HealthPolicy` is held by :class:`~brisvox.daemon.arbiter.Arbiter`,
which calls it from its per-turn timers (``Arbiter.tick``): once per turn
:meth:`HealthPolicy.note_turn` (stall detection), per slot :meth:`probe`
(a ready child: ping, hung detection) or :meth:`check_handshake` (a starting
child), and :meth:`check_memory`, which returns the children to restart for
memory rather than stopping them (the owner stops them). It acts on children
only through the :class:`~brisvox.daemon.child_table.ChildTable` it holds
(send a Ping, send a signal, mark the topology dirty); the configuration
comes through a getter (it changes on reload).

Invariants:

* Runs on the master loop only, once per turn; the loop's poll wakes for its
  deadlines (``Arbiter.next_wait``, :attr:`next_memory_check`) and at least
  every ``MAX_LOOP_WAIT_S``.
* After a stall of the master loop itself (SIGSTOP, host suspend, swap
  storm) longer than half the pong timeout, missing pongs do not count
  against the children for that turn.
* A hung child first gets SIGUSR2 (stack dump), then SIGKILL
  ``HUNG_KILL_DELAY_S`` later; a child without a handshake within
  ``init_timeout_s`` is killed once (not every turn).
* A memory restart is a drained stop, at most one per role at a time, and
  only while the daemon is running.
* Its repeated lines (a stall, a hung child, a missed handshake, a memory
  restart) go through the supervisor's one
  :class:`~brisvox.runtime.log_limit.LogLimiter`: per site and child, the first
  with its detail, then one line a minute with the count.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.child_table import ChildTable
from brisvox.daemon.procutil import pss_bytes
from brisvox.daemon.slots import Slot, State, hung_reason, memory_verdict
from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.supervisor")

HUNG_KILL_DELAY_S = 0.5  # between the SIGUSR2 stack dump and SIGKILL


class HealthPolicy:
    """Liveness and memory checks of the children, and the daemon's own PSS."""

    def __init__(self, table: ChildTable, config: Callable[[], DaemonConfig], pid: int,
                 log_limit: LogLimiter | None = None) -> None:
        self.table = table
        self.config = config
        self.pid = pid
        self.log_limit = log_limit or LogLimiter(log)  # a child that keeps hanging: a line, then a count
        self.last_tick_at = time.monotonic()
        self.next_memory_check = 0.0
        self.pss: int | None = None  # the supervisor's own, at the last memory check

    def restart_clock(self, now: float) -> None:
        """The loop starts (or resumes) now: the time before is no stall."""
        self.last_tick_at = now

    def note_turn(self, now: float) -> None:
        """Start of a turn: after a stall of the loop itself, forgive this turn's missing pongs."""
        h = self.config().daemon.health
        stalled = now - self.last_tick_at
        self.last_tick_at = now
        if stalled > h.pong_timeout_s / 2:
            # the supervisor itself was not running (SIGSTOP, host suspend, swap storm):
            # missing pongs say nothing about the children this turn
            self.log_limit("loop_stalled", "master loop stalled for %.1fs; not judging children's pongs this turn",
                           stalled)
            for slot in self.table.slots:
                slot.last_pong_at = max(slot.last_pong_at, now)

    def probe(self, slot: Slot, now: float) -> None:
        """A ready child: ping it when due; kill it when hung."""
        from ipc.frames import Ping

        h = self.config().daemon.health
        if now - slot.last_ping_at >= h.ping_interval_s:
            slot.ping_seq += 1
            slot.last_ping_at = now
            self.table.send_to(slot, Ping(seq=slot.ping_seq, sent_ns=time.monotonic_ns()))
        reason = hung_reason(slot, now, h.pong_timeout_s, h.heartbeat_timeout_s)
        if reason:
            self.kill_hung(slot, reason, now)

    def check_handshake(self, slot: Slot, now: float) -> None:
        """A starting child: kill it once when its handshake is overdue."""
        h = self.config().daemon.health
        if now - slot.started_at > h.init_timeout_s:
            slot.error = f"no handshake within {h.init_timeout_s:g}s (daemon.health.init_timeout_s)"
            self.log_limit(f"no_handshake:{slot.name}", "%s (pid %d): %s; killing it", slot.name, slot.pid,
                           slot.error, level=logging.ERROR)
            self.table.kill(slot, signal.SIGKILL)
            slot.started_at = now  # do not repeat the kill every turn

    def kill_hung(self, slot: Slot, reason: str, now: float) -> None:
        slot.hung += 1
        self.log_limit(f"hung:{slot.name}", "%s (pid %d) is hung: %s; dumping its stacks and killing it",
                       slot.name, slot.pid, reason, level=logging.ERROR)
        self.table.kill(slot, signal.SIGUSR2)
        slot.state = State.STOPPING
        slot.stop_reason = f"hung: {reason}"
        slot.termed = True
        slot.kill_at = now + HUNG_KILL_DELAY_S
        self.table.topology_dirty = True

    def check_memory(self, now: float, running: bool) -> list[Slot]:
        """When due: read every PSS, warn, and return the ready children over their limit
        that the owner restarts (a drained stop, reason ``memory limit``) while ``running``."""
        if now < self.next_memory_check:
            return []
        mem = self.config().daemon.memory
        self.next_memory_check = now + mem.check_interval_s
        self.pss = pss_bytes(self.pid)
        slots = self.table.slots
        restarting = {s.role for s in slots if s.state is State.STOPPING and s.stop_reason == "memory limit"}
        over: list[Slot] = []
        for slot in slots:
            if slot.state not in (State.READY, State.STARTING):
                continue
            slot.pss = pss_bytes(slot.pid)
            lim = mem.for_role(slot.role)
            verdict = memory_verdict(slot.pss, lim.warn_mb, lim.limit_mb)
            mb = (slot.pss or 0) / (1 << 20)
            if verdict == "ok":
                slot.mem_warned = False
            elif verdict == "warn" and not slot.mem_warned:
                slot.mem_warned = True
                log.warning("%s (pid %d) uses %.0f MiB PSS (warn at %d MiB, restart at %d MiB)",
                            slot.name, slot.pid, mb, lim.warn_mb, lim.limit_mb)
            elif verdict == "limit" and slot.state is State.READY and running and slot.role not in restarting:
                slot.mem_restarts += 1
                restarting.add(slot.role)
                self.log_limit(f"memory:{slot.name}", "%s (pid %d) uses %.0f MiB PSS, over its %d MiB limit; "
                               "restarting it", slot.name, slot.pid, mb, lim.limit_mb, level=logging.ERROR)
                over.append(slot)
        return over
