"""The tool engine of one call: :class:`ToolEngine` (docs/TOOLS.md).

Owns the engine's public surface, its lifecycle and the state the parts share
(the registry, the idempotency store, the recent calls, the confirmation gate,
the counters): the entry points (:meth:`~ToolEngine.execute` a committed
response, :meth:`~ToolEngine.speculate` one, :meth:`~ToolEngine.commit` a
speculation), the queries the runner and the metrics read, the confirmation
gate's notes from the runner, and ``close``; :meth:`~ToolEngine.act` runs one call
of the operator's script (a flow's action) on the same paths. It holds its parts, each built
here with what it needs (each states the invariants it owns):
:class:`~.planning.Planner` (validation, speculation; pure),
:class:`~.admission.TurnBudget` (stale turns, the retry budget),
:class:`~.running.Runner` (parallel runs in issue order, ReadOnly calls),
:class:`~.side_effects.SideEffects` (at most once per idempotency key,
orphans, repeats, confirmation), :class:`~.delivery.Delivery` (exactly once
to the model, the Delivery guard of an :class:`Execution`, late notes) and
:class:`~.trace.CallTrace`.

Invariants:

* No exception escapes ``execute``/``speculate``/``commit`` except the
  caller's own cancellation (``asyncio.CancelledError``).
* ``commit`` spends no budget; a speculation commits at most once.
* ``act`` runs its call exactly as ``execute`` runs a model's (schema, kind,
  idempotency key, timeout, late note), except that it spends no budget, the
  confirmation gate does not hold it and it leaves the mailbox's notes where
  they are.
* After ``close`` no entry point runs; every running SideEffect call is
  aborted and recorded lost (never run again).

The engine never reads the context; the caller obligations are in
:mod:`.delivery`. Run it on one event loop (not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.assemble import InvalidCall
from brisvox.agent.conversation.context import SystemMessage, ToolCall
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.admission import TurnBudget
from brisvox.agent.tool_engine.call_info import NO_CALL, CallInfo
from brisvox.agent.tool_engine.config import EngineConfig
from brisvox.agent.tool_engine.confirm import Confirmations
from brisvox.agent.tool_engine.delivery import Delivery, Execution
from brisvox.agent.tool_engine.idempotency import IdempotencyStore, IdempotencyUsage
from brisvox.agent.tool_engine.planning import Planner, Speculation
from brisvox.agent.tool_engine.recent import RecentCalls
from brisvox.agent.tool_engine.registry import (
    CONFIRM_TOOL_NAME,
    CancelToken,
    ToolRegistry,
    ToolSpec,
)
from brisvox.agent.tool_engine.running import Runner
from brisvox.agent.tool_engine.side_effects import SideEffects, _Mutations
from brisvox.agent.tool_engine.state import _Item
from brisvox.agent.tool_engine.trace import CallTrace
from brisvox.clock import CLOCK, Clock, LoopClock


class ToolEngine:
    """One call's tool engine. Use it on one event loop; ``close()`` it at the end
    of the session (aborts running SideEffect calls, recorded lost)."""

    def __init__(self, registry: ToolRegistry, session_id: str, clock: Clock | None = None,
                 config: EngineConfig | None = None, *, call_info: CallInfo = NO_CALL,
                 _mutations: _Mutations | None = None) -> None:
        cfg = config or EngineConfig()
        self.registry = registry
        self.session = session_id
        self.call_info = call_info  # every ToolContext of the call carries it
        self.clock: Clock = clock or CLOCK
        if not isinstance(self.clock, LoopClock):
            # Timers are scheduled on the running loop (real or virtual): its time
            # must be the clock's time.
            raise TypeError("the tool engine needs a loop clock (brisvox.clock.CLOCK)")
        self.config = cfg
        self.confirmations = Confirmations(cfg.confirm_ttl)
        self._store = IdempotencyStore(max(1, cfg.idempotency_capacity),
                                       max(cfg.idempotency_max_bytes, cfg.max_result_bytes))
        self._stats = ev.ToolStats()
        recent = RecentCalls()
        self._trace = CallTrace(session_id, self.clock)
        self._planner = Planner(registry, cfg.max_calls, cfg.max_argument_bytes)
        self._turns = TurnBudget(cfg.max_invalid_rounds)
        self._delivery = Delivery(session_id, self.clock, recent, self._stats)
        self._side_effects = SideEffects(
            session=session_id, call_info=call_info, clock=self.clock, config=cfg, registry=registry,
            store=self._store, recent=recent, confirmations=self.confirmations, stats=self._stats,
            delivery=self._delivery, mutations=_mutations or _Mutations())
        self._runner = Runner(
            session=session_id, call_info=call_info, clock=self.clock, max_result_bytes=cfg.max_result_bytes,
            side_effects=self._side_effects, delivery=self._delivery, trace=self._trace, stats=self._stats)
        self._closed = False

    # ------------------------------------------------------------------ public queries
    def invalid_rounds(self, epoch: int) -> int:
        return self._turns.invalid_rounds(epoch)

    def idempotency_usage(self) -> IdempotencyUsage:
        return self._store.usage()

    def late_notes_dropped(self) -> int:
        return self._delivery.dropped_notes()

    def late_notes_waiting(self) -> int:
        return self._delivery.waiting_notes()

    def stats(self) -> ev.ToolStatsSnapshot:
        return self._stats.snapshot()

    def running_side_effects(self) -> int:
        return len(self._side_effects.running())

    def call_specs(self, calls: Sequence[ToolCall | InvalidCall]) -> list[ToolSpec | None]:
        """The spec of each call (None for an invalid or unknown one): for the filler policy."""
        out: list[ToolSpec | None] = []
        for c in calls:
            out.append(self.registry.spec(c.name) if isinstance(c, ToolCall) else None)
        return out

    # late notes (docs/TOOLS.md, "Late notes")
    def take_late_notes(self) -> list[SystemMessage]:
        """Late notes waiting in the mailbox; call only when no call is open in the
        context (:meth:`Delivery.take_late_notes
        <brisvox.agent.tool_engine.delivery.Delivery.take_late_notes>`)."""
        return self._delivery.take_late_notes()

    @property
    def late_outcomes(self) -> list[tuple[str, bool]]:
        """(tool, is_error) of each note the last :meth:`take_late_notes` returned."""
        return self._delivery.late_outcomes

    # confirmation gate, reported by the runner
    def note_user_turn(self) -> None:
        self.confirmations.note_user_turn()

    def note_user_speech_started(self) -> None:
        self.confirmations.note_user_speech_started()

    def clear_confirmations(self) -> None:
        self.confirmations.clear()

    # ------------------------------------------------------------------ entry points
    async def execute(self, calls: Sequence[ToolCall | InvalidCall], epoch: int,
                      cancel: CancelToken | None = None) -> Execution:
        """Run a committed response's calls; one result per call, in issue order."""
        self._check_open()
        token = cancel if cancel is not None else CancelToken()
        items, malformed = self._planner.plan(calls, hold_side_effects=False)
        exhausted = self._admit(items, epoch, malformed)
        record = await self._runner.run(items, epoch, token)
        return self._delivery.finish(items, exhausted, record)

    async def speculate(self, calls: Sequence[ToolCall | InvalidCall], epoch: int,
                        cancel: CancelToken | None = None) -> Speculation:
        """Run ReadOnly calls, answer malformed ones, hold SideEffect calls."""
        self._check_open()
        token = cancel if cancel is not None else CancelToken()
        items, malformed = self._planner.plan(calls, hold_side_effects=True)
        exhausted = self._admit(items, epoch, malformed)
        self._trace.held(epoch, items)
        await self._runner.run([it for it in items if not it.held], epoch, token)
        return Speculation(epoch, items, exhausted)

    async def commit(self, speculation: Speculation, cancel: CancelToken | None = None) -> Execution:
        """Run a speculation's held calls; the whole response in issue order. Spends no budget."""
        self._check_open()
        epoch, items, held = speculation.claim()
        token = cancel if cancel is not None else CancelToken()
        exhausted = self._turns.admit_held(held, epoch) or speculation.budget_exhausted
        self._trace.answered(epoch, held)
        record = await self._runner.run(held, epoch, token)
        return self._delivery.finish(items, exhausted, record)

    async def act(self, call: ToolCall, epoch: int, cancel: CancelToken | None = None) -> Execution:
        """Run one call of the operator's script (a flow's ``tool``, ``end_call`` or
        ``transfer`` action) in turn ``epoch``: planned and run as :meth:`execute` runs a
        model's call (the schema, the tool's kind and timeout; a SideEffect call at most
        once per idempotency key (session, epoch, ``call.id``), on its own task, its result
        a late note when the slot was answered ``timeout`` or ``interrupted``; a repeat of
        a recent orphan or of a success of the same turn answered from the record). The
        script's call spends no retry budget, is not held by the confirmation gate (the
        operator chose it, not the model) and takes no late notes from the mailbox (they
        wait for :meth:`take_late_notes`): the Execution holds its one result and no notes.
        ``mark_delivered()`` it once the script has read the result, or ``discard()`` it
        when the turn was cut meanwhile (a SideEffect result becomes a late note)."""
        self._check_open()
        token = cancel if cancel is not None else CancelToken()
        items, _ = self._planner.plan([call], hold_side_effects=False)
        for it in items:
            if it.msg is None and it.tool == CONFIRM_TOOL_NAME:
                it.error(te.UNKNOWN_TOOL, f"{CONFIRM_TOOL_NAME} answers the model's requests, not a script's",
                         ev.UNKNOWN_TOOL)
        self._turns.admit_script(items, epoch)
        self._trace.answered(epoch, items)
        record = await self._runner.run(items, epoch, token, scripted=True)
        return self._delivery.finish(items, False, record, take_notes=False)

    def _admit(self, items: list[_Item], epoch: int, malformed: bool) -> bool:
        exhausted = self._turns.admit(items, epoch, malformed)
        self._trace.answered(epoch, items)
        return exhausted

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """End of the session: abort every running SideEffect call (each is
        recorded lost at its next await point)."""
        self._closed = True
        self._side_effects.abort()

    async def aclose(self, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """:meth:`close`, then wait for the aborted runs to end, at most ``timeout`` seconds
        (a body that swallows its cancellation is left running). Returns how many did not end."""
        self.close()
        tasks = self._side_effects.running()
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=timeout)  # never cancels what it waits for
        return len(pending)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the tool engine is closed")
