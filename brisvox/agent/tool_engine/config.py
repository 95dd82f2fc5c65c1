"""The tool engine's limits and the texts the model reads.

Owns :class:`EngineConfig` (every cap of one call's engine; the defaults are
the ones docs/TOOLS.md documents), the mailbox capacity, the truncation marker
of a cut SideEffect result with the helpers that measure and cut result text,
and the ``detail`` texts of the error results (docs/TOOLS.md, "Error results").

Invariant: a cut result ends with :data:`TRUNCATION_MARKER` and is at most the
limit it was cut to (the cut respects UTF-8 boundaries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.assemble import DEFAULT_MAX_CALLS

MAILBOX_CAPACITY = 64
TRUNCATION_MARKER = "...[truncated]"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_invalid_rounds: int = 2
    max_result_bytes: int = 64 * 1024
    idempotency_capacity: int = 256
    idempotency_max_bytes: int = 4 * 1024 * 1024
    max_argument_bytes: int = 16 * 1024
    max_side_effect_runtime: float = 120.0
    orphan_window: float = 120.0  # 0 turns the orphan check off
    confirm_ttl: float = 120.0
    max_calls: int = DEFAULT_MAX_CALLS


# --- detail texts ------------------------------------------------------------------------

D_ALREADY_DONE = ("an identical call already ran earlier in this turn and succeeded; its result is "
                  "above. Do not repeat this call, tell the caller what happened")
D_ALREADY_REPORTED = "an identical call already ran; its result is in the note above; do not repeat it"
D_ORPHAN_RUNNING = "an identical call is still running; its result follows as a note; do not repeat it"
D_DUPLICATE = "this call is already running; its result follows as a note; do not repeat it"
D_UNKNOWN = "the call ended without a result; its outcome is unknown and it will not run again"
D_STORE_FULL = "too many actions are still running in this call; this one was not run"
D_STALE = "this call belongs to a turn that was superseded; it was not run"
D_BUDGET = "too many invalid tool calls in this turn; no more tool calls run in this turn"
D_TOO_MANY = "more than {n} tool calls in one response; this call was not run"
D_INTERRUPTED = "the call was interrupted"
D_NOT_STARTED = "the call was interrupted before it started; it did not run"
D_INTERRUPTED_RUNNING = ("the call was interrupted while running; it keeps running and its result "
                         "follows as a note; do not repeat it")
D_TIMEOUT_RO = "the tool did not answer within {t:g} s"
D_TIMEOUT_SE = ("the tool did not answer within {t:g} s; it keeps running and its result follows as "
                "a note; do not repeat this call")
D_BACKSTOP = "the tool did not finish within {t:g} s and was stopped; its outcome is unknown; do not repeat it"
D_PANIC = "the tool panicked"
D_LOST = "the tool ended without a result; its outcome is unknown; do not repeat it"


# --- result text ---------------------------------------------------------------------


def _serialize(out: Any) -> str:
    if isinstance(out, str):
        return out
    return orjson.dumps(out).decode("utf-8")


def _nbytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "replace"))


def _cut_with_marker(text: str, limit: int) -> str:
    head, _ = te.cut_utf8(text, max(0, limit - len(TRUNCATION_MARKER)))
    return head + TRUNCATION_MARKER
