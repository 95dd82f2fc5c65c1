"""The supervisor's stop: phases, Shutdown frames, escalation.

:class:`StopPlan` is held by :class:`~brisvox.daemon.arbiter.Arbiter`: it
owns the phased stop of the daemon (reason, drain, current phase, the drain
timeout) and the stop of one child. The arbiter owns the daemon's state and
decides when a stop begins (``Arbiter.begin_stop``); the plan acts on the
children only through the :class:`~brisvox.daemon.child_table.ChildTable` it
holds, and says when the stop is complete (:meth:`StopPlan.advance`).

Stop: phases. Phase 1 stops the gateway and the agent processes (with
``drain`` they stop admitting and finish live calls, up to the drain
timeout); phase 2 stops the workers and the outbound role once phase 1 is gone
(live calls need the workers until then; the last calls' webhook events are in the
outbox by then, and what the courier has not delivered stays there for the next start). Each stop is a Shutdown frame, acknowledged by the child,
escalated to SIGTERM at the grace deadline (or at once if unacknowledged),
then to SIGKILL.

Invariants:

* A child that is not ready (no handshake, so no channel), or whose Shutdown
  frame cannot be sent, gets SIGTERM at once; SIGKILL follows
  ``term_timeout_s`` later.
* A stop while draining ends the calls now (:meth:`end_calls_now`: a Shutdown
  without drain, grace at most ``grace_s``); a stop while stopping SIGTERMs
  every child at once (:meth:`term_all`).
* While stopping, a slot of a phase that has begun is retired and never
  restarted; a later phase's role may still restart (:meth:`may_restart`).
* The stop is complete only when every phase's members are gone.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.child_table import ChildTable
from brisvox.daemon.slots import Slot, State

log = logging.getLogger("brisvox.supervisor")

STOP_PHASES = (("gateway", "agent"), ("worker", "outbound"))


class StopPlan:
    """The phased stop of the daemon and the stop of one child."""

    def __init__(self, table: ChildTable, config: Callable[[], DaemonConfig]) -> None:
        self.table = table
        self.config = config
        self.active = False  # a stop has begun
        self.reason = ""
        self.drain = False
        self.phase = 0
        # set once (the drain command may change it); a reload does not
        self.drain_timeout_s = config().daemon.shutdown.drain_timeout_s

    def begin(self, drain: bool, reason: str) -> None:
        """The daemon begins to stop (then :meth:`advance` it)."""
        self.active = True
        self.reason = reason
        self.drain = drain
        self.phase = 0

    def end_calls_now(self, reason: str, now: float) -> None:
        """A stop while draining: every stopping child ends its calls within ``grace_s``."""
        from ipc.frames import Shutdown

        sd = self.config().daemon.shutdown
        self.drain = False
        for s in self.table.slots:
            if s.state is State.STOPPING and not s.termed:
                s.term_at = min(s.term_at or now, now + sd.grace_s)
                self.table.send_to(s, Shutdown(reason=reason, grace_s=sd.grace_s, drain=False))

    def term_all(self, now: float) -> None:
        """A stop while stopping: SIGTERM every live child not yet sent one."""
        sd = self.config().daemon.shutdown
        for s in self.table.slots:
            if s.live and not s.termed:
                self.table.kill(s, signal.SIGTERM)
                s.state = State.STOPPING
                s.termed = True
                s.kill_at = now + sd.term_timeout_s

    def advance(self, now: float) -> bool:
        """Stop the members of the current phase, move on once they are gone; True when all are."""
        sd = self.config().daemon.shutdown
        while self.phase < len(STOP_PHASES):
            roles = STOP_PHASES[self.phase]
            # in a drain, only the first phase waits for calls; workers go once callers are gone
            drain = self.drain and self.phase == 0
            grace = self.drain_timeout_s if drain else sd.grace_s
            members = [s for s in self.table.slots if s.role in roles]
            for s in members:
                s.retired = True
                if s.state in (State.STARTING, State.READY):
                    self.stop_child(s, self.reason, drain, grace, now)
                elif s.state is State.EXITED:
                    s.next_start_at = None
            if any(s.live for s in members):
                return False
            self.phase += 1
        return True

    def may_restart(self, role: str) -> bool:
        if not self.active:
            return True
        for i, roles in enumerate(STOP_PHASES):
            if role in roles:
                return i > self.phase
        return False

    def stop_child(self, slot: Slot, reason: str, drain: bool, grace_s: float, now: float) -> None:
        from ipc.frames import Shutdown

        sd = self.config().daemon.shutdown
        connected = slot.state is State.READY
        slot.state = State.STOPPING
        slot.stop_reason = reason
        slot.stop_sent_at = now
        self.table.topology_dirty = True
        if connected and self.table.send_to(slot, Shutdown(reason=reason, grace_s=grace_s, drain=drain)):
            slot.ack_deadline = now + sd.ack_timeout_s
            slot.term_at = now + grace_s
        else:
            self.table.kill(slot, signal.SIGTERM)
            slot.termed = True
            slot.kill_at = now + sd.term_timeout_s

    def escalate(self, slot: Slot, now: float) -> None:
        sd = self.config().daemon.shutdown
        if not slot.termed:
            late_ack = not slot.acked and slot.ack_deadline is not None and now >= slot.ack_deadline
            if late_ack or (slot.term_at is not None and now >= slot.term_at):
                log.warning("%s (pid %d): %s; sending SIGTERM", slot.name, slot.pid,
                            "no shutdown acknowledgement" if late_ack else "grace period over")
                self.table.kill(slot, signal.SIGTERM)
                slot.termed = True
                slot.kill_at = now + sd.term_timeout_s
        elif slot.kill_at is not None and now >= slot.kill_at:
            if not slot.stop_reason.startswith("hung"):
                log.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", slot.name, slot.pid)
            self.table.kill(slot, signal.SIGKILL)
            slot.kill_at = None
