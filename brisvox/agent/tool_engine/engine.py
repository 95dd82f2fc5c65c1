"""The tool engine of one call: the :class:`ToolEngine` facade (docs/TOOLS.md).

Owns the engine's public surface and its lifecycle: the entry points
(:meth:`~ToolEngine.execute` a committed response, :meth:`~ToolEngine.speculate`
one, :meth:`~ToolEngine.commit` a speculation), the queries the runner and the
metrics read, the confirmation gate's notes from the runner, and ``close``.
It composes the parts (each states the invariants it owns):
:mod:`.planning` (validation, speculation, admission, retry budget),
:mod:`.running` (parallel runs in issue order, ReadOnly calls),
:mod:`.side_effects` (at most once per idempotency key, orphans, repeats,
confirmation) and :mod:`.delivery` (exactly once to the model, the Delivery
guard of an :class:`Execution`, late notes).

Invariants:

* No exception escapes ``execute``/``speculate``/``commit`` except the
  caller's own cancellation (``asyncio.CancelledError``).
* ``commit`` spends no budget; a speculation commits at most once.
* After ``close`` no entry point runs; every running SideEffect call is
  aborted and recorded lost (never run again).

The engine never reads the context; the caller obligations are in
:mod:`.delivery`. Run it on one event loop (not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from brisvox.agent.conversation.assemble import InvalidCall
from brisvox.agent.conversation.context import ToolCall
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.call_info import NO_CALL, CallInfo
from brisvox.agent.tool_engine.config import D_BUDGET, D_STALE, EngineConfig
from brisvox.agent.tool_engine.confirm import Confirmations
from brisvox.agent.tool_engine.delivery import Execution, _LateNote
from brisvox.agent.tool_engine.idempotency import IdempotencyStore, IdempotencyUsage
from brisvox.agent.tool_engine.planning import Speculation, _Planning
from brisvox.agent.tool_engine.recent import RecentCalls
from brisvox.agent.tool_engine.registry import CancelToken, ToolRegistry, ToolSpec
from brisvox.agent.tool_engine.running import _Running
from brisvox.agent.tool_engine.side_effects import _Mutations
from brisvox.clock import CLOCK, Clock, LoopClock


class ToolEngine(_Planning, _Running):
    """One call's tool engine. Use it on one event loop; ``close()`` it at the end
    of the session (aborts running SideEffect calls, recorded lost).

    Besides the methods below it offers ``take_late_notes`` (from
    :class:`~brisvox.agent.tool_engine.delivery._Delivery`)."""

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
        self._max_calls = max(1, cfg.max_calls)
        self._store = IdempotencyStore(max(1, cfg.idempotency_capacity),
                                       max(cfg.idempotency_max_bytes, cfg.max_result_bytes))
        self._recent = RecentCalls()
        self._mailbox: deque[_LateNote] = deque()
        self._dropped_notes = 0
        self._newest: int | None = None
        self._invalid: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs = 0
        self._stats = ev.ToolStats()
        self._mut = _mutations or _Mutations()
        self.confirmations = Confirmations(cfg.confirm_ttl)
        self._closed = False

    # ------------------------------------------------------------------ public queries
    def invalid_rounds(self, epoch: int) -> int:
        return self._invalid.get(epoch, 0)

    def idempotency_usage(self) -> IdempotencyUsage:
        return self._store.usage()

    def late_notes_dropped(self) -> int:
        return self._dropped_notes

    def stats(self) -> ev.ToolStatsSnapshot:
        return self._stats.snapshot()

    def running_side_effects(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    def call_specs(self, calls: Sequence[ToolCall | InvalidCall]) -> list[ToolSpec | None]:
        """The spec of each call (None for an invalid or unknown one): for the filler policy."""
        out: list[ToolSpec | None] = []
        for c in calls:
            out.append(self.registry.spec(c.name) if isinstance(c, ToolCall) else None)
        return out

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
        items, malformed = self._plan(calls, hold_side_effects=False)
        exhausted = self._admit(items, epoch, malformed, spend=True)
        record = await self._run(items, epoch, token)
        return self._finish(items, exhausted, record)

    async def speculate(self, calls: Sequence[ToolCall | InvalidCall], epoch: int,
                        cancel: CancelToken | None = None) -> Speculation:
        """Run ReadOnly calls, answer malformed ones, hold SideEffect calls."""
        self._check_open()
        token = cancel if cancel is not None else CancelToken()
        items, malformed = self._plan(calls, hold_side_effects=True)
        exhausted = self._admit(items, epoch, malformed, spend=True)
        for it in items:
            if it.held:
                ev.emit("tool call held", self.session, epoch, it.call_id, it.tool, ev.HELD, 0, it.retries)
        await self._run([it for it in items if not it.held], epoch, token)
        return Speculation(epoch, items, exhausted)

    async def commit(self, speculation: Speculation, cancel: CancelToken | None = None) -> Execution:
        """Run a speculation's held calls; the whole response in issue order. Spends no budget."""
        self._check_open()
        if speculation._state != "open":
            raise RuntimeError(f"the speculation was already {speculation._state}")
        speculation._state = "committed"
        token = cancel if cancel is not None else CancelToken()
        epoch = speculation._epoch
        items = speculation._items
        held = [it for it in items if it.held]
        for it in held:
            it.held = False
        stale = self._newest is not None and epoch < self._newest
        if not stale and (self._newest is None or epoch > self._newest):
            self._new_turn(epoch)
        exhausted = speculation.budget_exhausted
        for it in held:
            it.retries = self._invalid.get(epoch, 0)
            if stale:
                it.error(te.STALE_TURN, D_STALE, ev.STALE_TURN)
            elif self._invalid.get(epoch, 0) > self.config.max_invalid_rounds:
                exhausted = True
                it.error(te.BUDGET_EXHAUSTED, D_BUDGET, ev.BUDGET_EXHAUSTED)
        for it in held:
            if it.msg is not None:
                self._settled(epoch, it)
        record = await self._run(held, epoch, token)
        return self._finish(items, exhausted, record)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """End of the session: abort every running SideEffect call (each is
        recorded lost at its next await point)."""
        self._closed = True
        for t in list(self._tasks):
            t.cancel()

    async def aclose(self, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """:meth:`close`, then wait for the aborted runs to end, at most ``timeout`` seconds
        (a body that swallows its cancellation is left running). Returns how many did not end."""
        self.close()
        tasks = [t for t in self._tasks if not t.done()]
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=timeout)  # never cancels what it waits for
        return len(pending)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the tool engine is closed")
