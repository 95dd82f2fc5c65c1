"""Delivery of a run's answers and late notes into the conversation.

Owns the :class:`Execution` (the answers of one response) with its Delivery
guard, the record of what a run did (:class:`_RunRecord`), and
:class:`Delivery`, the mailbox of late SideEffect results (:class:`_LateNote`):
how answers and notes reach the context, and what happens when they do not (a
barge-in, a dropped execute). The engine holds one :class:`Delivery`; the
runner and the SideEffect runs report to it, each :class:`Execution` points
back to it for its guard.

Invariants:

* Each SideEffect result reaches the caller exactly once: in its slot, or as a
  late note (mailbox), whatever the caller does (cancel, drop the execute
  task, discard the Execution). A note of a result the model already read (a
  consumed :class:`~brisvox.agent.tool_engine.recent.RecentCall`) is never delivered.
* ``results`` has one tool message per call, in issue order.
* Delivery guard: :meth:`Execution.append_to` (or
  :meth:`~Execution.mark_delivered`) marks it delivered; an execution dropped
  or discarded undelivered reports each SideEffect result it carried as a late
  note, marks its SideEffect calls orphans and puts the late notes it took back
  in the mailbox, ahead of newer ones and in order.
* A script's execution (:meth:`ToolEngine.act
  <brisvox.agent.tool_engine.engine.ToolEngine.act>`, ``scripted``) is read by
  the operator's script, not by the model: delivering it consumes no orphan it
  replayed, so that orphan's result still reaches the model (its note).
* The mailbox holds at most :data:`MAILBOX_CAPACITY` notes; a note beyond it is
  dropped and counted (``late_notes_dropped``), its call marked DROPPED.

Caller obligations: push the assistant message before ``execute``;
``append_to`` each Execution (or ``discard()`` it) before the next message of
the turn; after a dropped execute or a discarded speculation close the open
calls with ``Context.interrupt_pending_tool_calls()``; take the mailbox's notes
(:meth:`Delivery.take_late_notes`) only when no call is open in the context.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from brisvox.agent.conversation.context import (
    Context,
    SystemMessage,
    ToolMessage,
    late_tool_result_note,
)
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.config import MAILBOX_CAPACITY
from brisvox.agent.tool_engine.recent import NoteState, RecentCall, RecentCalls, RunState
from brisvox.agent.tool_engine.registry import IdempotencyKey
from brisvox.agent.tool_engine.state import _Item
from brisvox.clock import Clock


@dataclass(slots=True, eq=False)
class _LateNote:
    call_id: str
    tool: str
    message: SystemMessage
    recent: RecentCall | None


@dataclass(slots=True, eq=False)
class _RunRecord:
    """What a run (execute / commit) did that matters after it: for the Delivery
    guard and for a dropped execute."""

    run: int
    fresh: list[tuple[RecentCall | None, ToolMessage, str, int]] = field(default_factory=list)  # (rc, answer, tool, epoch)
    running: list[RecentCall] = field(default_factory=list)
    replays: list[tuple[RecentCall, ToolMessage, int]] = field(default_factory=list)  # (orphan, answer, epoch)
    taken: list[_LateNote] = field(default_factory=list)
    withheld: list[_LateNote] = field(default_factory=list)
    state: str = "open"  # open | delivered | discarded
    scripted: bool = False  # the operator's call (ToolEngine.act): the script reads its results, not the model


class Execution:
    """The answers of one response: ``results`` (one per call, issue order),
    ``late_notes`` (system notes to append after them) and ``budget_exhausted``.

    Delivery guard: :meth:`append_to` (or :meth:`mark_delivered`) marks it
    delivered; an execution dropped or :meth:`discard`-ed undelivered reports
    each SideEffect result it carried as a late note, marks its SideEffect
    calls orphans and puts the late notes it took back in the mailbox.
    """

    __slots__ = ("results", "budget_exhausted", "_delivery", "_record", "__weakref__")

    def __init__(self, results: list[ToolMessage], budget_exhausted: bool, delivery: Delivery,
                 record: _RunRecord) -> None:
        self.results = results
        self.budget_exhausted = budget_exhausted
        self._delivery = delivery
        self._record = record

    @property
    def late_notes(self) -> list[SystemMessage]:
        return [n.message for n in self._record.taken if not (n.recent and n.recent.consumed)]

    @property
    def delivered(self) -> bool:
        return self._record.state == "delivered"

    def append_to(self, ctx: Context) -> None:
        """Push the results, then the late notes, and mark the execution delivered."""
        if self._record.state != "open":
            raise RuntimeError(f"the execution was already {self._record.state}")
        ctx.extend(self.results)
        ctx.extend(self.late_notes)
        self._delivery.deliver(self._record)

    def mark_delivered(self) -> None:
        """For a caller that wrote ``results`` and ``late_notes`` itself."""
        if self._record.state == "open":
            self._delivery.deliver(self._record)

    def discard(self) -> None:
        """The execution never reaches the model (barge-in): see the class doc."""
        if self._record.state == "open":
            self._delivery.abandon(self._record)

    def __del__(self) -> None:
        try:
            if self._record.state == "open":
                self._delivery.abandon(self._record)
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class Delivery:
    """The mailbox of late notes and the Delivery guard of one engine's executions
    (the invariants are the module's). Marks the recent calls it is given
    (orphans, note states) and adds a delivered replay to them."""

    __slots__ = ("_session", "_clock", "_recent", "_stats", "_mailbox", "_dropped", "_late_outcomes")

    def __init__(self, session: str, clock: Clock, recent: RecentCalls, stats: ev.ToolStats) -> None:
        self._session = session
        self._clock = clock
        self._recent = recent
        self._stats = stats
        self._mailbox: deque[_LateNote] = deque()
        self._dropped = 0
        self._late_outcomes: list[tuple[str, bool]] = []

    def dropped_notes(self) -> int:
        """Late notes dropped on a full mailbox."""
        return self._dropped

    def waiting_notes(self) -> int:
        """Late notes in the mailbox, to be taken at the next settle (before a user message)."""
        return len(self._mailbox)

    @property
    def late_outcomes(self) -> list[tuple[str, bool]]:
        """(tool, is_error) of each note the last :meth:`take_late_notes` returned."""
        return self._late_outcomes

    def take_late_notes(self) -> list[SystemMessage]:
        """Late notes waiting in the mailbox (call only when no call is open in
        the context); they count as reported. ``late_outcomes`` then says, per note,
        its tool and whether its result was an error (a flow moves on a late success)."""
        out = []
        outcomes: list[tuple[str, bool]] = []
        while self._mailbox:
            n = self._mailbox.popleft()
            if n.recent is not None:
                if n.recent.consumed:
                    continue
                n.recent.note = NoteState.REPORTED
            out.append(n.message)
            outcomes.append((n.tool, n.recent.is_error if n.recent is not None else True))
        self._late_outcomes = outcomes
        return out

    def finish(self, items: list[_Item], exhausted: bool, record: _RunRecord, *,
               take_notes: bool = True) -> Execution:
        """The Execution of a run's items (each answered), carrying the mailbox's notes
        (``take_notes`` False: they stay in the mailbox)."""
        results = [it.msg for it in items if it.msg is not None]
        assert len(results) == len(items)
        replayed = {id(rc) for rc, _, _ in record.replays}
        while take_notes and self._mailbox:
            n = self._mailbox.popleft()
            if n.recent is not None and n.recent.consumed:
                continue
            if n.recent is not None and id(n.recent) in replayed:
                record.withheld.append(n)
            else:
                if n.recent is not None:
                    n.recent.note = NoteState.TAKEN
                record.taken.append(n)
        for n in record.withheld:
            if n.recent is not None:
                n.recent.note = NoteState.TAKEN
        return Execution(results, exhausted, self, record)

    def report_late(self, call_id: str, tool: str, msg: ToolMessage, rc: RecentCall | None, epoch: int,
                    retries: int = 0) -> None:
        """A SideEffect result that missed its slot: a late note (counted, traced)."""
        self._push_note(call_id, tool, msg, rc)
        self._stats.side_effect_late_results += 1
        ev.emit("late_result", self._session, epoch, call_id, tool, ev.LATE_RESULT, 0, retries)

    def _push_note(self, call_id: str, tool: str, msg: ToolMessage, rc: RecentCall | None) -> None:
        if rc is not None and rc.consumed:
            return
        note = _LateNote(call_id, tool, late_tool_result_note(call_id, tool, msg.content, msg.is_error), rc)
        self._enqueue(note)

    def _enqueue(self, note: _LateNote, front: bool = False) -> None:
        if len(self._mailbox) >= MAILBOX_CAPACITY:
            self._dropped += 1
            if note.recent is not None:
                note.recent.note = NoteState.DROPPED
            return
        if note.recent is not None:
            note.recent.note = NoteState.PENDING
        if front:
            self._mailbox.appendleft(note)
        else:
            self._mailbox.append(note)

    def orphan(self, rc: RecentCall | None) -> None:
        """``rc``'s result can no longer reach the model as its own tool result."""
        if rc is not None and not rc.orphan:
            rc.orphan = True
            rc.orphan_at = self._clock.now()

    # ------------------------------------------------------------------ delivery guard
    def deliver(self, record: _RunRecord) -> None:
        record.state = "delivered"
        for rc, _msg, _ in record.replays:
            rc.replays.discard(record.run)
            rc.consumed = rc.consumed or not record.scripted
        for n in record.taken:
            if n.recent is not None and not n.recent.consumed:
                n.recent.note = NoteState.REPORTED
        # A delivered replay now stands for the result the model read: a repeat of
        # it in a later response of the same turn is already_done.
        for rc, msg, epoch in () if record.scripted else record.replays:
            if not msg.is_error:
                self._recent.add(RecentCall(IdempotencyKey(self._session, epoch, msg.call_id), rc.tool,
                                            rc.digest, epoch, record.run, self._clock.now(),
                                            RunState.DONE, msg.content, msg.is_error))
        record.withheld.clear()

    def abandon(self, record: _RunRecord) -> None:
        """An execution (or a run) that never reaches the model."""
        if record.state != "open":
            return
        record.state = "discarded"
        for rc, msg, tool, epoch in record.fresh:
            self.orphan(rc)
            self.report_late(msg.call_id, tool, msg, rc, epoch)
        for rc in record.running:
            self.orphan(rc)
        for rc, _, _ in record.replays:
            rc.replays.discard(record.run)
        # Notes this execution took go back, in order, ahead of newer ones.
        back = [n for n in record.taken + record.withheld if not (n.recent and n.recent.consumed)]
        for n in reversed(back):
            self._enqueue(n, front=True)
        record.taken.clear()
        record.withheld.clear()
