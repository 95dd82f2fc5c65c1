"""Error results of tool calls: kinds, bounded fields, JSON bodies (docs/TOOLS.md).

Owns the spelling of every error kind the LLM can read and the byte bounds of
the fields of an error body. It lives with the conversation because the
conversation writes error results itself (the assembler's ``invalid tool
call``, the context's ``interrupted`` for calls left open); the tool engine,
above the conversation, writes the rest. Every refusal or failure of a tool call is a tool
message with ``is_error=True`` whose content is the JSON object
``{"error": kind, "tool": name, "detail": text}`` (invalid arguments add
``"issues"`` and ``"truncated"``).

Invariants:

* ``tool`` is at most 64 bytes, ``detail`` at most 512 bytes, an issue's
  ``path`` at most 128 bytes and ``reason`` at most 200 bytes, the ellipsis
  included; cuts fall on a UTF-8 character boundary.
* A body always serializes: text that is not valid UTF-8 (lone surrogates from
  a hostile name) is replaced, never raised on.
"""

from __future__ import annotations

from typing import Any

import orjson

# --- kinds (spelled exactly as docs/TOOLS.md spells them) ----------------------------

INVALID_TOOL_CALL = "invalid tool call"
UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"
ARGUMENTS_TOO_LARGE = "arguments_too_large"
TOO_MANY_CALLS = "too_many_calls"
BUDGET_EXHAUSTED = "budget_exhausted"
STALE_TURN = "stale_turn"
TIMEOUT = "timeout"
INTERRUPTED = "interrupted"
TOOL_FAILED = "tool_failed"
RESULT_TOO_LARGE = "result_too_large"
DUPLICATE_CALL = "duplicate_call"
STORE_FULL = "store_full"
UNKNOWN_OUTCOME = "unknown_outcome"
ALREADY_DONE = "already_done"
ALREADY_REPORTED = "already_reported"
# The confirmation gate's refusal (the seed names no kind for it).
CONFIRMATION_REFUSED = "confirmation_refused"

MALFORMED_KINDS = frozenset({UNKNOWN_TOOL, INVALID_ARGUMENTS, ARGUMENTS_TOO_LARGE, TOO_MANY_CALLS})

MAX_TOOL_BYTES = 64
MAX_DETAIL_BYTES = 512
MAX_PATH_BYTES = 128
MAX_REASON_BYTES = 200
MAX_ISSUES = 5
ELLIPSIS = "\u2026"  # 3 bytes in UTF-8
_ELLIPSIS_BYTES = 3


def clean_text(text: str) -> str:
    """``text`` with anything that is not encodable as UTF-8 (lone surrogates) replaced."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def cut_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """The longest prefix of ``text`` that fits ``max_bytes`` of UTF-8, cut on a
    character boundary, and whether anything was cut."""
    text = clean_text(text)
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text, False
    # Drop a partial multi-byte character at the end of the cut.
    return raw[: max(0, max_bytes)].decode("utf-8", "ignore"), True


def bound(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8, the ellipsis included when cut."""
    text = clean_text(text)
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8")) <= max_bytes:
        return text
    head, _ = cut_utf8(text, max_bytes - _ELLIPSIS_BYTES)
    return head + ELLIPSIS


def error_body(kind: str, tool: str, detail: str, *, extra: dict[str, Any] | None = None) -> str:
    """The JSON text of an error result, every field within its bound."""
    body: dict[str, Any] = {
        "error": kind,
        "tool": bound(tool, MAX_TOOL_BYTES),
        "detail": bound(detail, MAX_DETAIL_BYTES),
    }
    if extra:
        body.update(extra)
    return orjson.dumps(body).decode("utf-8")


def issue(path: str, reason: str) -> dict[str, str]:
    """One validation issue with bounded fields; ``path`` is a JSON pointer or ``(root)``."""
    return {"path": bound(path or "(root)", MAX_PATH_BYTES), "reason": bound(reason, MAX_REASON_BYTES)}
