"""The supervisor's timers: health, hung detection, restarts, memory (a part of the arbiter).

Owns what the master loop does each turn when no frame asked for it
(:class:`HealthPolicy`, mixed into :class:`~brisvox.daemon.arbiter.Arbiter`):
pings, hung detection (pong and heartbeat timeouts), handshake timeouts,
stop escalation, restarts after backoff, memory checks (PSS), the ready
transition and sd_notify (status, watchdog).

Invariants:

* Runs on the master loop only, once per turn (``tick``); the loop's poll
  wakes for its deadlines (``Arbiter.next_wait``) and at least every
  ``MAX_LOOP_WAIT_S``.
* After a stall of the master loop itself (SIGSTOP, host suspend, swap
  storm) longer than half the pong timeout, missing pongs do not count
  against the children for that turn.
* A hung child first gets SIGUSR2 (stack dump), then SIGKILL
  ``HUNG_KILL_DELAY_S`` later; a child without a handshake within
  ``init_timeout_s`` is killed once (not every turn).
* A memory restart is a drained stop, at most one per role at a time, and
  only while the daemon is running.
* READY=1 is sent once, when every child is ready or failed; the status pipe
  of ``brisvoxd start`` is answered then.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.procutil import pss_bytes
from brisvox.daemon.sdnotify import Notifier
from brisvox.daemon.slots import Slot, State, hung_reason, memory_verdict

log = logging.getLogger("brisvox.supervisor")

HUNG_KILL_DELAY_S = 0.5  # between the SIGUSR2 stack dump and SIGKILL


class HealthPolicy:
    """The per-turn timers of the master loop."""

    config: DaemonConfig
    pid: int
    state: str
    slots: list[Slot]
    ready_sent: bool
    last_tick_at: float
    next_memory_check: float
    next_status_notify: float
    pss: int | None
    notifier: Notifier
    topology_dirty: bool

    if TYPE_CHECKING:  # from the other parts of the arbiter
        def spawn(self, slot: Slot, now: float) -> None: ...
        def _kill(self, slot: Slot, sig: int) -> None: ...
        def send_to(self, slot: Slot, frame: Any) -> bool: ...
        def push_topology(self) -> None: ...
        def may_restart(self, role: str) -> bool: ...
        def stop_child(self, slot: Slot, reason: str, drain: bool, grace_s: float, now: float) -> None: ...
        def escalate(self, slot: Slot, now: float) -> None: ...
        def advance_stop(self, now: float) -> None: ...
        def status_line(self) -> str: ...
        def report_status_pipe(self, ready: bool = False) -> None: ...

    def tick(self, now: float) -> None:
        from ipc.frames import Ping

        d = self.config.daemon
        h = d.health
        stalled = now - self.last_tick_at
        self.last_tick_at = now
        if stalled > h.pong_timeout_s / 2:
            # the supervisor itself was not running (SIGSTOP, host suspend, swap storm):
            # missing pongs say nothing about the children this turn
            log.warning("master loop stalled for %.1fs; not judging children's pongs this turn", stalled)
            for slot in self.slots:
                slot.last_pong_at = max(slot.last_pong_at, now)
        for slot in list(self.slots):
            if slot.state is State.READY:
                if now - slot.last_ping_at >= h.ping_interval_s:
                    slot.ping_seq += 1
                    slot.last_ping_at = now
                    self.send_to(slot, Ping(seq=slot.ping_seq, sent_ns=time.monotonic_ns()))
                reason = hung_reason(slot, now, h.pong_timeout_s, h.heartbeat_timeout_s)
                if reason:
                    self.kill_hung(slot, reason, now)
            elif slot.state is State.STARTING:
                if now - slot.started_at > h.init_timeout_s:
                    slot.error = f"no handshake within {h.init_timeout_s:g}s (daemon.health.init_timeout_s)"
                    log.error("%s (pid %d): %s; killing it", slot.name, slot.pid, slot.error)
                    self._kill(slot, signal.SIGKILL)
                    slot.started_at = now  # do not repeat the kill every turn
            elif slot.state is State.STOPPING:
                self.escalate(slot, now)
            elif slot.state is State.EXITED and slot.next_start_at is not None and now >= slot.next_start_at:
                if not slot.retired and self.may_restart(slot.role):
                    self.spawn(slot, now)
        if now >= self.next_memory_check:
            self.next_memory_check = now + d.memory.check_interval_s
            self.check_memory(now)
        if self.state in ("draining", "stopping"):
            self.advance_stop(now)
        if self.topology_dirty:
            self.push_topology()
        if not self.ready_sent and self.state == "starting" and all(
            s.state in (State.READY, State.FAILED) for s in self.slots
        ):
            self.ready_sent = True
            self.state = "running"
            status = self.status_line()
            self.notifier.ready(status)
            log.info("ready: %s", status)
            self.report_status_pipe(ready=True)
        if now >= self.next_status_notify and self.state != "starting":
            self.next_status_notify = now + 1.0
            self.notifier.status(self.status_line())
        self.notifier.watchdog(now)

    def kill_hung(self, slot: Slot, reason: str, now: float) -> None:
        slot.hung += 1
        log.error("%s (pid %d) is hung: %s; dumping its stacks and killing it", slot.name, slot.pid, reason)
        self._kill(slot, signal.SIGUSR2)
        slot.state = State.STOPPING
        slot.stop_reason = f"hung: {reason}"
        slot.termed = True
        slot.kill_at = now + HUNG_KILL_DELAY_S
        self.topology_dirty = True

    def check_memory(self, now: float) -> None:
        mem = self.config.daemon.memory
        self.pss = pss_bytes(self.pid)
        restarting = {s.role for s in self.slots if s.state is State.STOPPING and s.stop_reason == "memory limit"}
        for slot in self.slots:
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
            elif verdict == "limit" and slot.state is State.READY and self.state == "running" \
                    and slot.role not in restarting:
                slot.mem_restarts += 1
                restarting.add(slot.role)
                log.error("%s (pid %d) uses %.0f MiB PSS, over its %d MiB limit; restarting it",
                          slot.name, slot.pid, mb, lim.limit_mb)
                self.stop_child(slot, "memory limit", True, self.config.daemon.shutdown.drain_timeout_s, now)
