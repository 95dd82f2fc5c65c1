"""Applying a heard prefix to an assistant message of the context (the
played-text cut of a barge-in).

Owns HOW a played-text cut changes the context; WHAT was heard is decided
elsewhere (the call actor's playout book builds a :class:`Truncation`).
:func:`apply_truncation` keeps the message, cuts its text to the heard prefix,
or removes it:

* ``KEPT``: the heard text is the whole message text (trailing whitespace
  aside), or the message has no text.
* ``TRUNCATED``: the text becomes the heard prefix (trailing whitespace
  trimmed). An assistant message that carries tool calls is always retained,
  with its calls, even when nothing of its text was heard, so tool pairs stay
  valid.
* ``REMOVED``: nothing heard and no tool call: the message is removed (an
  empty assistant message is invalid). Tool results that answered the removed
  message (orphans) are removed with it.

Invariants: the context is unchanged when :class:`TruncationError` is raised
(the heard text is not a prefix of the message, the index is out of range or
not an assistant message); a valid context stays valid after any outcome.
Callers walk rounds last to first, so a removal never shifts an index they
still need.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from brisvox.agent.conversation.context import AssistantMessage, Context, ToolMessage


class TruncationOutcome(enum.Enum):
    KEPT = "kept"
    TRUNCATED = "truncated"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class Truncation:
    """What the caller heard of one assistant message.

    ``heard``: the heard prefix of the message text (the empty string for a
    round never reached). ``in_full``: the source judged the round played to
    its end (informational, for counters: the text is still cut to ``heard``,
    which drops a tail that was never sent). ``estimated``: the position came
    from a speaking-rate estimate rather than word timestamps.
    """

    heard: str
    in_full: bool = False
    estimated: bool = False

    @classmethod
    def nothing(cls) -> Truncation:
        return cls("")


class TruncationError(ValueError):
    """The cut cannot be applied; ``kind``: ``not_a_prefix``, ``no_such_message``
    or ``not_assistant``. The context is unchanged."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def apply_truncation(ctx: Context, msg_index: int, truncation: Truncation) -> TruncationOutcome:
    """Cut the assistant message at ``msg_index`` to what was heard."""
    if not 0 <= msg_index < len(ctx):
        raise TruncationError("no_such_message", f"index {msg_index} of {len(ctx)}")
    msg = ctx[msg_index]
    if not isinstance(msg, AssistantMessage):
        raise TruncationError("not_assistant", f"message {msg_index} is {msg.role}")
    heard = truncation.heard
    if not msg.text.startswith(heard):
        raise TruncationError("not_a_prefix", f"heard text is not a prefix of message {msg_index}")
    kept = heard.rstrip()
    if kept == msg.text.rstrip():
        return TruncationOutcome.KEPT
    if kept or msg.tool_calls:
        ctx.replace(msg_index, AssistantMessage(kept, msg.tool_calls, msg.provider_data))
        return TruncationOutcome.TRUNCATED
    _remove_with_orphans(ctx, msg_index, msg)
    return TruncationOutcome.REMOVED


def _remove_with_orphans(ctx: Context, msg_index: int, msg: AssistantMessage) -> None:
    ids = {c.id for c in msg.tool_calls}
    # Results answering the removed message directly follow it.
    end = msg_index + 1
    while end < len(ctx):
        nxt = ctx[end]
        if not (isinstance(nxt, ToolMessage) and nxt.call_id in ids):
            break
        end += 1
    for i in range(end - 1, msg_index - 1, -1):
        ctx.remove(i)
