"""The confirmation gate's pending requests (SideEffect tools that
need the caller's yes).

Owns the per-session set of calls that wait for the user's "yes" and the
order-of-events rules the engine enforces; the meaning of "yes" is the
model's judgment.

Invariants:

* A request can only be confirmed after a user turn that ENDED after the
  request and whose speech BEGAN after it (:meth:`note_user_speech_started`
  marks where a speech began; without it the turn counts from its end).
* A confirmation from an older epoch than its request is refused as stale.
* A request lives ``ttl`` seconds on the injected clock.
* :meth:`clear` (a barge-in) drops every request.
* Taking a request removes it (once); at most :data:`MAX_PENDING` wait (the
  oldest is dropped); an identical request (tool + arguments digest)
  replaces the earlier one.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_PENDING = 8

CONFIRM_MESSAGE = (
    "Not done yet: this action needs the user's confirmation. Tell the user exactly what you "
    "are about to do and ask them to confirm. Only if the user clearly agrees in their NEXT "
    "reply, call confirm_pending with this call_id. If they decline, change the request or say "
    "anything else, do not call it. Never confirm on your own."
)


@dataclass(frozen=True, slots=True)
class PendingRequest:
    call_id: str
    tool: str
    arguments: dict[str, Any]
    digest: bytes
    epoch: int
    created_at: float
    mark: int  # the event counter when the request was made


class Refusal(enum.Enum):
    NOT_PENDING = "there is no pending request with this call_id (it was confirmed, cleared by an interruption, replaced or never made)"
    NO_REPLY = "the user has not replied since you asked; ask them and wait for their answer"
    EXPIRED = "the request expired; ask the user again"
    STALE = "the confirmation belongs to an older turn than the request"


class Confirmations:
    __slots__ = ("ttl", "_pending", "_events", "_speech_mark", "_last_turn_start", "dropped")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._pending: OrderedDict[str, PendingRequest] = OrderedDict()
        self._events = 0
        self._speech_mark: int | None = None
        self._last_turn_start = -1
        self.dropped = 0

    # -- what the runner reports
    def note_user_speech_started(self) -> None:
        """The caller started speaking (S2S speech start, VAD start)."""
        if self._speech_mark is None:
            self._events += 1
            self._speech_mark = self._events

    def note_user_turn(self) -> None:
        """A user turn ended (its message entered the context)."""
        self._events += 1
        start = self._speech_mark if self._speech_mark is not None else self._events
        self._speech_mark = None
        self._last_turn_start = max(self._last_turn_start, start)

    def clear(self) -> None:
        """A barge-in: every pending request is dropped."""
        self._pending.clear()

    # -- what the engine does
    def request(self, call_id: str, tool: str, arguments: dict[str, Any], digest: bytes, epoch: int,
                now: float) -> None:
        for cid, req in list(self._pending.items()):
            if req.tool == tool and req.digest == digest:
                del self._pending[cid]
        while len(self._pending) >= MAX_PENDING:
            self._pending.popitem(last=False)
            self.dropped += 1
        self._events += 1
        self._pending[call_id] = PendingRequest(call_id, tool, arguments, digest, epoch, now, self._events)

    def take(self, call_id: str, epoch: int, now: float) -> PendingRequest | Refusal:
        """The request to run for a confirm_pending(call_id) of turn ``epoch``, or why not."""
        req = self._pending.get(call_id)
        if req is None:
            return Refusal.NOT_PENDING
        if now - req.created_at > self.ttl:
            del self._pending[call_id]
            return Refusal.EXPIRED
        if epoch < req.epoch:
            return Refusal.STALE
        if self._last_turn_start <= req.mark:
            return Refusal.NO_REPLY
        del self._pending[call_id]
        return req

    def __len__(self) -> int:
        return len(self._pending)

    def pending_ids(self) -> list[str]:
        return list(self._pending)
