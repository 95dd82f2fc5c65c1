"""Observability of the tool engine: outcome names, settle events, counters.

Owns the trace of tool calls: one structured ``tool call settled`` event per
settled call on the logger ``brisvox.tools`` (DEBUG), ``tool call held`` for a
call held by a speculation, ``late_result`` for a late SideEffect result,
``side effect`` (INFO) for every SideEffect execution, and the engine's
counters (:class:`ToolStatsSnapshot`).

Invariants: an event carries session, epoch, call, tool (at most 64 bytes),
outcome, duration_us and retries, never an argument value. The event object
rides on the log record as ``record.tool_event``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.tool_engine.registry import IdempotencyKey

LOG = logging.getLogger("brisvox.tools")

# Outcomes (docs/TOOLS.md).
OK = "ok"
OK_TRUNCATED = "ok_truncated"
FAILED = "failed"
TIMED_OUT = "timed_out"
TIMED_OUT_RUNNING = "timed_out_running"
INTERRUPTED = "interrupted"
INTERRUPTED_RUNNING = "interrupted_running"
NOT_STARTED = "not_started"
RECORDED = "recorded"
DUPLICATE = "duplicate"
REPEAT_REFUSED = "repeat_refused"
LOST = "lost"
STORE_FULL = "store_full"
MALFORMED = "malformed"
UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"
ARGUMENTS_TOO_LARGE = "arguments_too_large"
TOO_MANY_CALLS = "too_many_calls"
BUDGET_EXHAUSTED = "budget_exhausted"
STALE_TURN = "stale_turn"
RESULT_TOO_LARGE = "result_too_large"
HELD = "held"
LATE_RESULT = "late_result"
ORPHAN_REPLAYED = "orphan_replayed"
ORPHAN_IN_FLIGHT = "orphan_in_flight"
ORPHAN_LOST = "orphan_lost"
ORPHAN_REPORTED = "orphan_reported"
# The confirmation gate (not named by the seed's list).
CONFIRMATION_REQUIRED = "confirmation_required"
CONFIRMATION_REFUSED = "confirmation_refused"


@dataclass(frozen=True, slots=True)
class ToolEvent:
    message: str  # "tool call settled" | "tool call held" | "late_result"
    session: str
    epoch: int
    call: str
    tool: str
    outcome: str
    duration_us: int
    retries: int


def emit(message: str, session: str, epoch: int, call: str, tool: str, outcome: str,
         duration_us: int, retries: int) -> None:
    if not LOG.isEnabledFor(logging.DEBUG):
        return
    ev = ToolEvent(message, session, epoch, call, te.bound(tool, te.MAX_TOOL_BYTES), outcome,
                   duration_us, retries)
    LOG.debug(
        "%s session=%s epoch=%d call=%s tool=%s outcome=%s duration_us=%d retries=%d",
        message, session, epoch, call, ev.tool, outcome, duration_us, retries,
        extra={"tool_event": ev},
    )


def log_side_effect(session: str, tool: str, epoch: int, key: IdempotencyKey, confirms: str | None = None) -> None:
    """Every SideEffect execution (INFO): tool, epoch, key digest; never arguments."""
    if not LOG.isEnabledFor(logging.INFO):
        return
    key_hex = key.hex()
    if confirms is None:
        LOG.info("side effect session=%s tool=%s epoch=%d key=%s", session,
                 te.bound(tool, te.MAX_TOOL_BYTES), epoch, key_hex)
    else:
        LOG.info("side effect session=%s tool=%s epoch=%d key=%s confirms=%s", session,
                 te.bound(tool, te.MAX_TOOL_BYTES), epoch, key_hex, confirms)


@dataclass(frozen=True, slots=True)
class ToolStatsSnapshot:
    read_only_cancelled: int = 0
    not_started_cancelled: int = 0
    side_effect_interrupted: int = 0
    side_effect_late_results: int = 0
    side_effect_replays: int = 0
    side_effect_repeats: int = 0
    orphan_replays: int = 0
    orphan_in_flight: int = 0
    orphan_lost: int = 0
    orphan_reported: int = 0
    confirmations_requested: int = 0
    confirmations_run: int = 0
    confirmations_refused: int = 0


@dataclass(slots=True)
class ToolStats:
    """Mutable counters of one engine (the fields of :class:`ToolStatsSnapshot`)."""

    read_only_cancelled: int = 0
    not_started_cancelled: int = 0
    side_effect_interrupted: int = 0
    side_effect_late_results: int = 0
    side_effect_replays: int = 0
    side_effect_repeats: int = 0
    orphan_replays: int = 0
    orphan_in_flight: int = 0
    orphan_lost: int = 0
    orphan_reported: int = 0
    confirmations_requested: int = 0
    confirmations_run: int = 0
    confirmations_refused: int = 0

    def snapshot(self) -> ToolStatsSnapshot:
        return ToolStatsSnapshot(**{f.name: getattr(self, f.name) for f in fields(ToolStatsSnapshot)})
