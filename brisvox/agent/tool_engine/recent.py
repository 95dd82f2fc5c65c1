"""Recent SideEffect calls of a session: orphans and repeats.

Owns the memory the idempotency key cannot give: a regenerated response has
a new epoch and new call ids, and a repeated call in a later response of the
same turn has a new call id. The engine remembers the last
:data:`ORPHAN_CAPACITY` SideEffect calls with a digest of tool name and
arguments (key order does not matter) and answers from here:

* an ORPHAN (its result could not reach the model as its own tool result) is
  replayed, refused as in flight / lost / already reported, within the window;
* a call identical to one that SUCCEEDED earlier in the same turn, in another
  response, is refused ``already_done``.

Invariants: at most ORPHAN_CAPACITY entries (the oldest is forgotten); a
consumed orphan is never matched again and its note is never delivered.
"""

from __future__ import annotations

import enum
import hashlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from brisvox.agent.tool_engine.registry import IdempotencyKey

ORPHAN_CAPACITY = 32


def call_digest(tool: str, args: dict[str, Any]) -> bytes:
    """Digest of tool name + arguments; JSON key order does not matter."""
    h = hashlib.blake2b(digest_size=16)
    h.update(tool.encode("utf-8", "replace"))
    h.update(b"\x00")
    h.update(orjson.dumps(args, option=orjson.OPT_SORT_KEYS))
    return h.digest()


class RunState(enum.Enum):
    RUNNING = "running"
    DONE = "done"
    LOST = "lost"


class NoteState(enum.Enum):
    NONE = "none"  # no late note (yet)
    PENDING = "pending"  # in the mailbox
    TAKEN = "taken"  # carried by an execution not yet delivered
    REPORTED = "reported"  # reached the context
    DROPPED = "dropped"  # the mailbox was full


@dataclass(slots=True, eq=False)
class RecentCall:
    key: IdempotencyKey
    tool: str
    digest: bytes
    epoch: int
    run: int
    started_at: float
    state: RunState = RunState.RUNNING
    content: str = ""
    is_error: bool = False
    orphan: bool = False
    orphan_at: float = 0.0
    note: NoteState = NoteState.NONE
    consumed: bool = False
    replays: set[int] = field(default_factory=set)  # runs that replayed it, not yet delivered


class RecentCalls:
    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: deque[RecentCall] = deque(maxlen=ORPHAN_CAPACITY)

    def add(self, rc: RecentCall) -> None:
        self._calls.append(rc)

    def find_orphan(self, tool: str, digest: bytes, run: int, now: float, window: float) -> RecentCall | None:
        """The latest live orphan with this tool and arguments from another run,
        within ``window`` seconds of its start (0 turns the check off)."""
        if window <= 0:
            return None
        for rc in reversed(self._calls):
            if (rc.orphan and not rc.consumed and rc.run != run and rc.tool == tool
                    and rc.digest == digest and now - rc.started_at <= window):
                return rc
        return None

    def find_success(self, tool: str, digest: bytes, epoch: int, run: int, *, any_epoch: bool = False,
                     failures_count: bool = False) -> RecentCall | None:
        """An earlier call of another response of the same turn with this tool and
        arguments whose result is done and not an error (the already_done rule).
        The keyword flags exist only for the mutation tests."""
        for rc in reversed(self._calls):
            if (rc.tool == tool and rc.digest == digest and rc.run != run and not rc.orphan
                    and (any_epoch or rc.epoch == epoch) and rc.state is RunState.DONE
                    and (failures_count or not rc.is_error)):
                return rc
        return None

    def __len__(self) -> int:
        return len(self._calls)
