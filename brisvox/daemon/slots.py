"""Child slots and the restart policy: pure state, no I/O.

A *slot* is one position in the daemon's process table (``worker-1``); the
processes that fill it over time are its incarnations. The arbiter performs
the I/O; these functions decide.

States (also the ``state`` of Topology rows and of ``brisvoxd status``)::

    starting --Hello ok--> ready --Shutdown sent--> stopping --exit--> exited
        |                    |                                          |
        +------exit----------+-------------------exit-------------------+
    exited --backoff elapsed--> starting          (unless retired)
    exited --boot_failures_max boot failures in a row--> failed  (stays visible)

Invariants:

* A boot failure is an exit before the handshake completed (or a Hello with
  ``ok`` False). ``boot_failures`` counts them in a row; any incarnation that
  reached ready resets it. At ``boot_failures_max`` the slot is ``failed``
  and is not restarted until a reload.
* Backoff doubles from ``backoff_initial_s`` up to ``backoff_max_s``; an
  incarnation that stayed ready for ``backoff_reset_s`` restarts from the
  initial delay again.
* Storm damping: when the whole daemon restarted more than ``storm_restarts``
  children within ``storm_window_s``, every further restart waits at least
  ``storm_delay_s``.
* An exit with the config-error code is reported as such; the arbiter stops
  the daemon.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field
from typing import Any

from brisvox.config.daemon import RestartPolicy
from brisvox.runtime import exitcodes


class State(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    EXITED = "exited"
    FAILED = "failed"


LIVE = (State.STARTING, State.READY, State.STOPPING)


@dataclass
class Slot:
    """One child position and what the supervisor knows of its current incarnation."""

    role: str
    index: int
    state: State = State.EXITED
    pid: int = 0
    started_at: float = 0.0
    ready_at: float | None = None
    restarts: int = 0  # incarnations after the first
    incarnations: int = 0
    boot_failures: int = 0
    backoff_s: float = 0.0
    next_start_at: float | None = 0.0  # None: not scheduled
    retired: bool = False  # do not restart after the current incarnation exits
    remove: bool = False  # drop the slot once it exited (scale-down)
    last_exit: str = ""
    error: str = ""
    endpoints: dict[str, str] | None = None
    measured: dict[str, float] = field(default_factory=dict)  # the ready incarnation's Hello.measured
    # health
    ping_seq: int = 0
    last_ping_at: float = 0.0
    last_pong_at: float = 0.0
    beat_ms: int = -1
    calls: int = 0
    stats: dict[str, Any] | None = None
    pss: int | None = None
    mem_warned: bool = False
    nofile: tuple[int, int] | None = None  # (soft, hard) RLIMIT_NOFILE, read at the handshake
    # stop escalation
    stop_reason: str = ""
    stop_sent_at: float | None = None
    acked: bool = False
    ack_deadline: float | None = None
    term_at: float | None = None
    kill_at: float | None = None
    termed: bool = False
    # counters for metrics
    hung: int = 0
    mem_restarts: int = 0
    events: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def on_spawn(self, pid: int, now: float) -> None:
        if self.incarnations:
            self.restarts += 1
        self.incarnations += 1
        self.pid = pid
        self.state = State.STARTING
        self.started_at = now
        self.ready_at = None
        self.next_start_at = None
        self.error = ""
        self.endpoints = None
        self.measured = {}
        self.last_pong_at = now
        self.last_ping_at = now
        self.beat_ms = -1
        self.calls = 0
        self.stats = None
        self.nofile = None
        self.pss = None
        self.mem_warned = False
        self.stop_reason = ""
        self.stop_sent_at = self.ack_deadline = self.term_at = self.kill_at = None
        self.acked = False
        self.termed = False

    def on_ready(self, now: float, endpoints: dict[str, str] | None,
                 measured: dict[str, float] | None = None) -> None:
        self.state = State.READY
        self.ready_at = now
        self.last_pong_at = now
        self.boot_failures = 0
        self.endpoints = endpoints
        self.measured = {k: float(v) for k, v in (measured or {}).items()
                         if isinstance(v, int | float) and not isinstance(v, bool)}

    def row(self) -> dict[str, Any]:
        """The Topology row of this slot (``measured``: what the incarnation measured at boot)."""
        row: dict[str, Any] = {"role": self.role, "index": self.index, "pid": self.pid, "state": str(self.state)}
        if self.measured:
            row["measured"] = dict(self.measured)
        return row


class StormTracker:
    """Restart times across the whole daemon, for storm damping."""

    def __init__(self) -> None:
        self.times: collections.deque[float] = collections.deque()

    def record(self, now: float, window: float) -> int:
        self.times.append(now)
        while self.times and self.times[0] < now - window:
            self.times.popleft()
        return len(self.times)


@dataclass(frozen=True)
class ExitDecision:
    """What the arbiter does after an incarnation exited."""

    action: str  # "restart" | "failed" | "retired" | "config_error"
    delay_s: float = 0.0
    boot_failure: bool = False


def on_exit(slot: Slot, code: int, now: float, policy: RestartPolicy, storm: StormTracker) -> ExitDecision:
    """Apply an exit (``code`` >= 0 exit code, < 0 minus the signal) to ``slot``."""
    booted = slot.ready_at is not None and not slot.error
    slot.last_exit = exitcodes.describe(code)
    uptime_ready = (now - slot.ready_at) if slot.ready_at is not None else 0.0
    slot.ready_at = None
    slot.endpoints = None
    if code == exitcodes.CONFIG:
        slot.state = State.EXITED
        slot.next_start_at = None
        return ExitDecision("config_error")
    if slot.retired:
        slot.state = State.EXITED
        slot.next_start_at = None
        return ExitDecision("retired")
    boot_failure = not booted
    if boot_failure:
        slot.boot_failures += 1
        if slot.boot_failures >= policy.boot_failures_max:
            slot.state = State.FAILED
            slot.next_start_at = None
            return ExitDecision("failed", boot_failure=True)
    if booted and uptime_ready >= policy.backoff_reset_s:
        slot.backoff_s = 0.0
    delay = policy.backoff_initial_s if slot.backoff_s <= 0 else min(policy.backoff_max_s, slot.backoff_s * 2)
    slot.backoff_s = max(delay, 1e-3)
    if storm.record(now, policy.storm_window_s) > policy.storm_restarts:
        delay = max(delay, policy.storm_delay_s)
    slot.state = State.EXITED
    slot.next_start_at = now + delay
    return ExitDecision("restart", delay, boot_failure)


def hung_reason(slot: Slot, now: float, pong_timeout_s: float, heartbeat_timeout_s: float) -> str | None:
    """Why a ready child counts as hung, or None."""
    if slot.state is not State.READY:
        return None
    if now - slot.last_pong_at > pong_timeout_s:
        return f"no pong for {now - slot.last_pong_at:.1f}s"
    if slot.beat_ms > heartbeat_timeout_s * 1000:
        return f"main loop heartbeat is {slot.beat_ms / 1000:.1f}s old"
    return None


def memory_verdict(pss: int | None, warn_mb: int, limit_mb: int) -> str:
    """"ok", "warn" or "limit" for a PSS reading against a role's thresholds."""
    if pss is None:
        return "ok"
    mb = pss / (1 << 20)
    if limit_mb and mb > limit_mb:
        return "limit"
    if warn_mb and mb > warn_mb:
        return "warn"
    return "ok"
