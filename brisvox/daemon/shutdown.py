"""The supervisor's stop: phases, Shutdown frames, escalation (a part of the arbiter).

Owns how the daemon stops (:class:`StopPlan`, mixed into
:class:`~brisvox.daemon.arbiter.Arbiter`), and how one child is stopped.

Stop: phases. Phase 1 stops the gateway and the agent processes (with
``drain`` they stop admitting and finish live calls, up to the drain
timeout); phase 2 stops the workers once phase 1 is gone (live calls need
them until then). Each stop is a Shutdown frame, acknowledged by the child,
escalated to SIGTERM at the grace deadline (or at once if unacknowledged),
then to SIGKILL.

Invariants:

* A child that is not ready (no handshake, so no channel), or whose Shutdown
  frame cannot be sent, gets SIGTERM at once; SIGKILL follows
  ``term_timeout_s`` later.
* A stop while draining ends the calls now (a Shutdown without drain, grace
  at most ``grace_s``); a stop while stopping SIGTERMs every child at once.
* While stopping, a slot of a phase that has begun is retired and never
  restarted; a later phase's role may still restart (``may_restart``).
* The daemon is done only when every phase's members are gone.
* The first fatal error sets the exit code; later ones do not overwrite it.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.sdnotify import Notifier
from brisvox.daemon.slots import Slot, State
from brisvox.runtime import exitcodes

log = logging.getLogger("brisvox.supervisor")

STOP_PHASES = (("gateway", "agent"), ("worker",))


class StopPlan:
    """The phased stop of the daemon and the stop of one child."""

    config: DaemonConfig
    state: str
    done: bool
    slots: list[Slot]
    exit_code: int
    error_message: str
    stop_reason: str
    stop_drain: bool
    stop_phase: int
    drain_timeout_s: float
    notifier: Notifier
    topology_dirty: bool

    if TYPE_CHECKING:  # from the other parts of the arbiter
        def _kill(self, slot: Slot, sig: int) -> None: ...
        def send_to(self, slot: Slot, frame: Any) -> bool: ...
        def status_line(self) -> str: ...

    def begin_stop(self, drain: bool, reason: str) -> None:
        now = time.monotonic()
        sd = self.config.daemon.shutdown
        if self.state in ("draining", "stopping"):
            if self.state == "draining" and not drain:
                log.info("stop requested while draining: ending calls now")
                self.state = "stopping"
                self.stop_drain = False
                for s in self.slots:
                    if s.state is State.STOPPING and not s.termed:
                        s.term_at = min(s.term_at or now, now + sd.grace_s)
                        from ipc.frames import Shutdown

                        self.send_to(s, Shutdown(reason=reason, grace_s=sd.grace_s, drain=False))
            elif not drain:
                log.warning("second stop request: sending SIGTERM to every child now")
                for s in self.slots:
                    if s.live and not s.termed:
                        self._kill(s, signal.SIGTERM)
                        s.state = State.STOPPING
                        s.termed = True
                        s.kill_at = now + sd.term_timeout_s
            return
        self.state = "draining" if drain else "stopping"
        self.stop_reason = reason
        self.stop_drain = drain
        self.stop_phase = 0
        self.notifier.stopping(f"{self.state} ({reason}); {self.status_line()}")
        self.advance_stop(now)

    def advance_stop(self, now: float) -> None:
        sd = self.config.daemon.shutdown
        while self.stop_phase < len(STOP_PHASES):
            roles = STOP_PHASES[self.stop_phase]
            # in a drain, only the first phase waits for calls; workers go once callers are gone
            drain = self.stop_drain and self.stop_phase == 0
            grace = self.drain_timeout_s if drain else sd.grace_s
            members = [s for s in self.slots if s.role in roles]
            for s in members:
                s.retired = True
                if s.state in (State.STARTING, State.READY):
                    self.stop_child(s, self.stop_reason, drain, grace, now)
                elif s.state is State.EXITED:
                    s.next_start_at = None
            if any(s.live for s in members):
                return
            self.stop_phase += 1
        self.done = True

    def fatal(self, code: int, message: str) -> None:
        if self.exit_code == exitcodes.OK:
            self.exit_code = code
            self.error_message = message
            if code == exitcodes.CONFIG:
                print(f"brisvoxd: configuration error: {message}", file=sys.stderr, flush=True)
        self.begin_stop(drain=False, reason="configuration error" if code == exitcodes.CONFIG else "fatal error")

    def may_restart(self, role: str) -> bool:
        if self.state not in ("draining", "stopping"):
            return True
        for i, roles in enumerate(STOP_PHASES):
            if role in roles:
                return i > self.stop_phase
        return False

    def stop_child(self, slot: Slot, reason: str, drain: bool, grace_s: float, now: float) -> None:
        from ipc.frames import Shutdown

        sd = self.config.daemon.shutdown
        connected = slot.state is State.READY
        slot.state = State.STOPPING
        slot.stop_reason = reason
        slot.stop_sent_at = now
        self.topology_dirty = True
        if connected and self.send_to(slot, Shutdown(reason=reason, grace_s=grace_s, drain=drain)):
            slot.ack_deadline = now + sd.ack_timeout_s
            slot.term_at = now + grace_s
        else:
            self._kill(slot, signal.SIGTERM)
            slot.termed = True
            slot.kill_at = now + sd.term_timeout_s

    def escalate(self, slot: Slot, now: float) -> None:
        sd = self.config.daemon.shutdown
        if not slot.termed:
            late_ack = not slot.acked and slot.ack_deadline is not None and now >= slot.ack_deadline
            if late_ack or (slot.term_at is not None and now >= slot.term_at):
                log.warning("%s (pid %d): %s; sending SIGTERM", slot.name, slot.pid,
                            "no shutdown acknowledgement" if late_ack else "grace period over")
                self._kill(slot, signal.SIGTERM)
                slot.termed = True
                slot.kill_at = now + sd.term_timeout_s
        elif slot.kill_at is not None and now >= slot.kill_at:
            if not slot.stop_reason.startswith("hung"):
                log.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", slot.name, slot.pid)
            self._kill(slot, signal.SIGKILL)
            slot.kill_at = None
