"""The tool engine of one call: plan, admit, run, record (seed 000 "Tool engine" and "Tool UX").

Owns the execution of a response's tool calls: validation in a synchronous
planning step, the per-turn retry budget, parallel execution with results in
issue order, speculation (SideEffect calls held until commit), cancellation,
timeouts, the idempotency store, late SideEffect results (mailbox and notes),
orphans and regeneration, repeats within a turn (``already_done``), the
Delivery guard of an :class:`Execution`, and the confirmation gate.

Invariants (the product: "never twice"):

* A SideEffect call runs at most once per idempotency key (session, epoch,
  call id), on its own task that the caller cannot cancel; only the hard
  backstop (``max(max_side_effect_runtime, timeout)``) and :meth:`close`
  end it, and then its key is recorded lost and never run again.
* Each SideEffect result reaches the caller exactly once: in its slot, or as a
  late note (mailbox), whatever the caller does (cancel, drop the execute
  task, discard the Execution).
* ``results`` has one tool message per call, in issue order.
* No exception escapes ``execute``/``speculate``/``commit`` except the
  caller's own cancellation (``asyncio.CancelledError``).
* Arguments are never logged.

The engine never reads the context; the caller obligations of seed 000
apply: push the assistant message before ``execute``; ``append_to`` each
Execution (or ``discard()`` it) before the next message of the turn; after a
dropped execute or a discarded speculation close the open calls with
``Context.interrupt_pending_tool_calls()``; cancel a superseded turn's token.
Run it on one event loop (not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from brisvox.agent import tool_errors as te
from brisvox.agent import tool_events as ev
from brisvox.agent.assemble import DEFAULT_MAX_CALLS, InvalidCall
from brisvox.agent.context import (
    Context,
    SystemMessage,
    ToolCall,
    ToolMessage,
    late_tool_result_note,
)
from brisvox.agent.tool_confirm import CONFIRM_MESSAGE, Confirmations, PendingRequest, Refusal
from brisvox.agent.tool_idempotency import Begin, IdempotencyStore, IdempotencyUsage
from brisvox.agent.tool_recent import NoteState, RecentCall, RecentCalls, RunState, call_digest
from brisvox.agent.tools import (
    CONFIRM_TOOL_NAME,
    CancelToken,
    IdempotencyKey,
    RegisteredTool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSpec,
)
from brisvox.clock import CLOCK, Clock, LoopClock

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


@dataclass(frozen=True, slots=True)
class _Mutations:
    """Deliberately broken variants, used ONLY by the mutation tests to prove the
    tests of the already_done rule can fail. Never set in production."""

    no_already_done_check: bool = False
    already_done_ignores_epoch: bool = False
    failures_count_as_success: bool = False


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


# --- results -----------------------------------------------------------------------------


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


class Execution:
    """The answers of one response: ``results`` (one per call, issue order),
    ``late_notes`` (system notes to append after them) and ``budget_exhausted``.

    Delivery guard: :meth:`append_to` (or :meth:`mark_delivered`) marks it
    delivered; an execution dropped or :meth:`discard`-ed undelivered reports
    each SideEffect result it carried as a late note, marks its SideEffect
    calls orphans and puts the late notes it took back in the mailbox.
    """

    __slots__ = ("results", "budget_exhausted", "_engine", "_record", "__weakref__")

    def __init__(self, results: list[ToolMessage], budget_exhausted: bool, engine: ToolEngine,
                 record: _RunRecord) -> None:
        self.results = results
        self.budget_exhausted = budget_exhausted
        self._engine = engine
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
        self._engine._deliver(self._record)

    def mark_delivered(self) -> None:
        """For a caller that wrote ``results`` and ``late_notes`` itself."""
        if self._record.state == "open":
            self._engine._deliver(self._record)

    def discard(self) -> None:
        """The execution never reaches the model (barge-in): see the class doc."""
        if self._record.state == "open":
            self._engine._abandon(self._record)

    def __del__(self) -> None:
        try:
            if self._record.state == "open":
                self._engine._abandon(self._record)
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class Speculation:
    """A speculative response: ReadOnly calls ran, SideEffect calls are held.
    Commit it with :meth:`ToolEngine.commit`; drop (or :meth:`discard`) it to
    run nothing."""

    __slots__ = ("_epoch", "_items", "budget_exhausted", "_state")

    def __init__(self, epoch: int, items: list[_Item], budget_exhausted: bool) -> None:
        self._epoch = epoch
        self._items = items
        self.budget_exhausted = budget_exhausted
        self._state = "open"

    def epoch(self) -> int:
        return self._epoch

    def held_calls(self) -> list[ToolCall]:
        return [it.call for it in self._items if it.held and it.call is not None]

    def answered(self) -> list[ToolMessage]:
        return [it.msg for it in self._items if it.msg is not None]

    def discard(self) -> None:
        self._state = "discarded"


# --- internal plan items -------------------------------------------------------------------


class _Item:
    __slots__ = ("call_id", "tool", "call", "entry", "msg", "outcome", "held", "retries", "t0",
                 "flight", "recent")

    def __init__(self, call_id: str, tool: str, call: ToolCall | None, entry: RegisteredTool | None) -> None:
        self.call_id = call_id
        self.tool = tool
        self.call = call
        self.entry = entry
        self.msg: ToolMessage | None = None
        self.outcome = ""
        self.held = False
        self.retries = 0
        self.t0: float | None = None
        self.flight: _Flight | None = None
        self.recent: RecentCall | None = None

    def answer(self, msg: ToolMessage, outcome: str) -> None:
        self.msg = msg
        self.outcome = outcome

    def error(self, kind: str, detail: str, outcome: str, extra: dict[str, Any] | None = None) -> None:
        self.answer(ToolMessage(self.call_id, te.error_body(kind, self.tool, detail, extra=extra), True), outcome)


class _Flight:
    """One running SideEffect call: the task and the slot waiting for it."""

    __slots__ = ("key", "tool", "call_id", "epoch", "recent", "waiter", "closed", "task", "timeout")

    def __init__(self, key: IdempotencyKey, tool: str, call_id: str, epoch: int,
                 recent: RecentCall | None, timeout: float) -> None:
        self.key = key
        self.tool = tool
        self.timeout = timeout
        self.call_id = call_id
        self.epoch = epoch
        self.recent = recent
        self.waiter: asyncio.Future[tuple[ToolMessage, str]] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.task: asyncio.Task[None] | None = None


class _Interrupted(Exception):
    pass


class _Expired(Exception):
    pass


class _Scope:
    """Bounds the current task by a deadline on the loop's clock and by a turn's
    token: raises :class:`_Expired` or :class:`_Interrupted` instead of the
    CancelledError it caused (the pattern of asyncio.timeout, in one timer and
    one callback: about 2 us instead of 5 us for asyncio.timeout alone).
    A cancellation from outside (the caller dropped the task) propagates."""

    __slots__ = ("_token", "_timeout", "_task", "_cancelling", "_fired", "_handle", "_timer")

    def __init__(self, token: CancelToken | None, timeout: float) -> None:
        self._token = token
        self._timeout = timeout
        self._fired: type[Exception] | None = None
        self._handle = -1

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        loop = task.get_loop()
        self._timer = loop.call_at(loop.time() + self._timeout, self._fire, _Expired)
        if self._token is not None:
            self._handle = self._token.add_callback(self._on_token)

    def _on_token(self) -> None:
        self._fire(_Interrupted)

    def _fire(self, kind: type[Exception]) -> None:
        if self._fired is None:
            self._fired = kind
            self._task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._timer.cancel()
        if self._token is not None:
            self._token.remove_callback(self._handle)
        if self._fired is not None:
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise self._fired


def _serialize(out: Any) -> str:
    if isinstance(out, str):
        return out
    return orjson.dumps(out).decode("utf-8")


def _nbytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "replace"))


def _cut_with_marker(text: str, limit: int) -> str:
    head, _ = te.cut_utf8(text, max(0, limit - len(TRUNCATION_MARKER)))
    return head + TRUNCATION_MARKER


# --- the engine ----------------------------------------------------------------------------


class ToolEngine:
    """One call's tool engine. Use it on one event loop; ``close()`` it at the end
    of the session (aborts running SideEffect calls, recorded lost)."""

    def __init__(self, registry: ToolRegistry, session_id: str, clock: Clock | None = None,
                 config: EngineConfig | None = None, *, _mutations: _Mutations | None = None) -> None:
        cfg = config or EngineConfig()
        self.registry = registry
        self.session = session_id
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

    def take_late_notes(self) -> list[SystemMessage]:
        """Late notes waiting in the mailbox (call only when no call is open in
        the context); they count as reported."""
        out = []
        while self._mailbox:
            n = self._mailbox.popleft()
            if n.recent is not None:
                if n.recent.consumed:
                    continue
                n.recent.note = NoteState.REPORTED
            out.append(n.message)
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

    async def aclose(self) -> None:
        self.close()
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the tool engine is closed")

    # ------------------------------------------------------------------ step 1: plan
    def _plan(self, calls: Sequence[ToolCall | InvalidCall], hold_side_effects: bool) -> tuple[list[_Item], bool]:
        items: list[_Item] = []
        malformed = False
        max_args = self.config.max_argument_bytes
        for pos, c in enumerate(calls):
            if isinstance(c, InvalidCall):
                it = _Item(c.id, c.name or "", None, None)
                if pos >= self._max_calls:
                    it.error(te.TOO_MANY_CALLS, D_TOO_MANY.format(n=self._max_calls), ev.TOO_MANY_CALLS)
                else:
                    it.answer(c.error_result(), ev.MALFORMED)
                malformed = True
                items.append(it)
                continue
            name = c.name if isinstance(c.name, str) else ""
            entry = self.registry.get(name)
            it = _Item(c.id, name, c, entry)
            items.append(it)
            if pos >= self._max_calls:
                it.error(te.TOO_MANY_CALLS, D_TOO_MANY.format(n=self._max_calls), ev.TOO_MANY_CALLS)
                malformed = True
                continue
            if entry is None:
                it.error(te.UNKNOWN_TOOL, f"there is no tool named {te.clean_text(name)!r}; use one of the offered tools",
                         ev.UNKNOWN_TOOL)
                malformed = True
                continue
            args = c.arguments
            if not isinstance(args, dict):
                it.error(te.INVALID_ARGUMENTS, "the arguments must be a JSON object", ev.INVALID_ARGUMENTS,
                         {"issues": [te.issue("(root)", "not an object")], "truncated": False})
                malformed = True
                continue
            try:
                size = len(orjson.dumps(args))
            except (TypeError, orjson.JSONEncodeError) as e:
                reason = "the arguments nest too deeply" if "ecursion" in str(e) else "the arguments are not JSON"
                it.error(te.INVALID_ARGUMENTS, "the arguments could not be read", ev.INVALID_ARGUMENTS,
                         {"issues": [te.issue("(root)", reason)], "truncated": False})
                malformed = True
                continue
            if size > max_args:
                it.error(te.ARGUMENTS_TOO_LARGE,
                         f"the arguments are {size} bytes, over the limit of {max_args} bytes; they were not checked",
                         ev.ARGUMENTS_TOO_LARGE)
                malformed = True
                continue
            issues, truncated = entry.schema.check(args)  # one pass; empty when valid
            if issues:
                it.error(te.INVALID_ARGUMENTS, "the arguments do not match the tool's schema; fix them and call again",
                         ev.INVALID_ARGUMENTS, {"issues": issues, "truncated": truncated})
                malformed = True
                continue
            if hold_side_effects and entry.spec.side_effect:
                it.held = True
        return items, malformed

    # ------------------------------------------------------------------ step 2: admit
    def _new_turn(self, epoch: int) -> None:
        self._newest = epoch
        self._invalid.setdefault(epoch, 0)
        while len(self._invalid) > 16:
            del self._invalid[next(iter(self._invalid))]

    def _admit(self, items: list[_Item], epoch: int, malformed: bool, spend: bool) -> bool:
        """Stale / budget admission; returns whether the round is exhausted."""
        if self._newest is not None and epoch < self._newest:
            for it in items:
                it.held = False
                it.error(te.STALE_TURN, D_STALE, ev.STALE_TURN)
                self._settled(epoch, it)
            return False
        if self._newest is None or epoch > self._newest:
            self._new_turn(epoch)
        before = self._invalid.get(epoch, 0)
        count = before + 1 if (malformed and spend) else before
        self._invalid[epoch] = count
        exhausted = count > self.config.max_invalid_rounds
        for it in items:
            it.retries = before
            if exhausted:
                it.held = False
                it.error(te.BUDGET_EXHAUSTED, D_BUDGET, ev.BUDGET_EXHAUSTED)
            if it.msg is not None:
                self._settled(epoch, it)
        return exhausted

    # ------------------------------------------------------------------ step 3: run
    async def _run(self, items: list[_Item], epoch: int, token: CancelToken) -> _RunRecord:
        self._runs += 1
        record = _RunRecord(self._runs)
        now = self.clock.now()
        waits = []
        seen_se: set[str] = set()
        for it in items:
            if it.msg is not None or it.held:
                continue
            it.t0 = now
            assert it.entry is not None and it.call is not None
            if it.entry.spec.side_effect:
                self._start_side_effect(it, epoch, token, record, seen_se)
                if it.msg is not None:
                    self._settled(epoch, it)
                    continue
                waits.append(self._await_side_effect(it, epoch, token, record))
            else:
                waits.append(self._run_read_only(it, epoch, token))
        try:
            if len(waits) == 1:
                await waits[0]
            elif waits:
                await asyncio.gather(*waits)
        except asyncio.CancelledError:
            # The execute future was dropped: nothing of this run reaches the context.
            self._abandon(record)
            raise
        return record

    def _finish(self, items: list[_Item], exhausted: bool, record: _RunRecord) -> Execution:
        results = [it.msg for it in items if it.msg is not None]
        assert len(results) == len(items)
        replayed = {id(rc) for rc, _, _ in record.replays}
        while self._mailbox:
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

    # -- ReadOnly
    async def _run_read_only(self, it: _Item, epoch: int, token: CancelToken) -> None:
        assert it.entry is not None and it.call is not None
        spec = it.entry.spec
        if token.cancelled:
            self._stats.not_started_cancelled += 1
            it.error(te.INTERRUPTED, D_NOT_STARTED, ev.NOT_STARTED)
            self._settled(epoch, it)
            return
        ctx = ToolContext(self.session, epoch, it.call_id, token, it.tool)
        try:
            try:
                async with _Scope(token, spec.timeout):
                    out = await it.entry.tool(it.call.arguments, ctx)
            except _Expired:
                it.error(te.TIMEOUT, D_TIMEOUT_RO.format(t=spec.timeout), ev.TIMED_OUT)
                return
            except _Interrupted:
                self._stats.read_only_cancelled += 1
                it.error(te.INTERRUPTED, D_INTERRUPTED, ev.INTERRUPTED)
                return
            except ToolError as e:
                it.error(te.TOOL_FAILED, e.message, ev.FAILED)
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling() == 0:  # raised by the tool, not a cancellation
                    it.error(te.TOOL_FAILED, D_PANIC, ev.FAILED)
                    return
                self._stats.read_only_cancelled += 1
                raise
            except Exception:  # a panicking tool never unwinds into the caller
                it.error(te.TOOL_FAILED, D_PANIC, ev.FAILED)
                return
            try:
                text = _serialize(out)
            except (TypeError, orjson.JSONEncodeError):
                it.error(te.TOOL_FAILED, "the tool returned a value that is not JSON", ev.FAILED)
                return
            limit = self.config.max_result_bytes
            n = _nbytes(text) if len(text) * 4 > limit else len(text)
            if n > limit:
                it.error(te.RESULT_TOO_LARGE, f"the result is {n} bytes, over the limit of {limit} bytes",
                         ev.RESULT_TOO_LARGE)
                return
            it.answer(ToolMessage(it.call_id, text, False), ev.OK)
        finally:
            if it.msg is not None:
                self._settled(epoch, it)

    # -- SideEffect: synchronous start (issue order)
    def _start_side_effect(self, it: _Item, epoch: int, token: CancelToken, record: _RunRecord,
                           seen: set[str]) -> None:
        assert it.entry is not None and it.call is not None
        spec = it.entry.spec
        key = IdempotencyKey(self.session, epoch, it.call_id)
        if it.call_id in seen:
            it.error(te.DUPLICATE_CALL, D_DUPLICATE, ev.DUPLICATE)
            return
        seen.add(it.call_id)
        # A replay of a known key answers from the store.
        known = self._store.get(key)
        if known is not None:
            if self._answer_known(it, known.state.value, known.content, known.is_error):
                return
        if token.cancelled:
            self._stats.not_started_cancelled += 1
            it.error(te.INTERRUPTED, D_NOT_STARTED, ev.NOT_STARTED)
            return
        args = it.call.arguments
        tool_name = it.tool
        confirms: PendingRequest | None = None
        if tool_name == CONFIRM_TOOL_NAME:
            taken = self.confirmations.take(str(args.get("call_id", "")), epoch, self.clock.now())
            if isinstance(taken, Refusal):
                self._stats.confirmations_refused += 1
                kind = te.STALE_TURN if taken is Refusal.STALE else te.CONFIRMATION_REFUSED
                it.error(kind, taken.value, ev.CONFIRMATION_REFUSED)
                return
            confirms = taken
            target = self.registry.get(taken.tool)
            if target is None:
                it.error(te.UNKNOWN_TOOL, f"there is no tool named {taken.tool!r}", ev.UNKNOWN_TOOL)
                return
            run_entry, run_args = target, taken.arguments
        else:
            digest = call_digest(tool_name, args)
            if spec.confirm:
                self.confirmations.request(it.call_id, tool_name, args, digest, epoch, self.clock.now())
                self._stats.confirmations_requested += 1
                body = orjson.dumps({"status": "confirmation_required", "tool": te.bound(tool_name, te.MAX_TOOL_BYTES),
                                     "call_id": it.call_id, "message": CONFIRM_MESSAGE}).decode()
                it.answer(ToolMessage(it.call_id, body, False), ev.CONFIRMATION_REQUIRED)
                return
            if self._answer_orphan(it, tool_name, digest, epoch, record):
                return
            if not self._mut.no_already_done_check and not spec.repeatable:
                prior = self._recent.find_success(
                    tool_name, digest, epoch, record.run,
                    any_epoch=self._mut.already_done_ignores_epoch,
                    failures_count=self._mut.failures_count_as_success)
                if prior is not None:
                    self._stats.side_effect_repeats += 1
                    it.error(te.ALREADY_DONE, D_ALREADY_DONE, ev.REPEAT_REFUSED)
                    return
            run_entry, run_args = it.entry, args
        began, _ = self._store.begin(key)
        if began is Begin.FULL:
            it.error(te.STORE_FULL, D_STORE_FULL, ev.STORE_FULL)
            return
        if began is not Begin.STARTED:  # cannot happen: checked above
            it.error(te.DUPLICATE_CALL, D_DUPLICATE, ev.DUPLICATE)
            return
        recent = None
        if confirms is None:
            recent = RecentCall(key, tool_name, digest, epoch, record.run, self.clock.now())
            self._recent.add(recent)
            record.running.append(recent)
        it.recent = recent
        flight = _Flight(key, run_entry.spec.name, it.call_id, epoch, recent, run_entry.spec.timeout)
        it.flight = flight
        if confirms is not None:
            tool_ctx = ToolContext(self.session, confirms.epoch, confirms.call_id, token, confirms.tool)
            self._stats.confirmations_run += 1
        else:
            tool_ctx = ToolContext(self.session, epoch, it.call_id, token, tool_name)
        ev.log_side_effect(self.session, run_entry.spec.name, epoch, key,
                           confirms.call_id if confirms else None)
        backstop = max(self.config.max_side_effect_runtime, run_entry.spec.timeout)
        task = asyncio.get_running_loop().create_task(
            self._side_effect_task(flight, run_entry, run_args, tool_ctx, backstop))
        flight.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answer_known(self, it: _Item, state: str, content: str, is_error: bool) -> bool:
        if state == "done":
            self._stats.side_effect_replays += 1
            it.answer(ToolMessage(it.call_id, content, is_error), ev.RECORDED)
        elif state == "in_flight":
            it.error(te.DUPLICATE_CALL, D_DUPLICATE, ev.DUPLICATE)
        else:
            it.error(te.UNKNOWN_OUTCOME, D_UNKNOWN, ev.LOST)
        return True

    def _answer_orphan(self, it: _Item, tool: str, digest: bytes, epoch: int, record: _RunRecord) -> bool:
        rc = self._recent.find_orphan(tool, digest, record.run, self.clock.now(), self.config.orphan_window)
        if rc is None:
            return False
        if rc.state is RunState.RUNNING:
            self._stats.orphan_in_flight += 1
            it.error(te.DUPLICATE_CALL, D_ORPHAN_RUNNING, ev.ORPHAN_IN_FLIGHT)
        elif rc.note is NoteState.REPORTED:
            self._stats.orphan_reported += 1
            it.error(te.ALREADY_REPORTED, D_ALREADY_REPORTED, ev.ORPHAN_REPORTED)
        elif rc.state is RunState.LOST:
            self._stats.orphan_lost += 1
            it.error(te.UNKNOWN_OUTCOME, D_UNKNOWN, ev.ORPHAN_LOST)
            rc.replays.add(record.run)
            record.replays.append((rc, it.msg, epoch))  # type: ignore[arg-type]
        else:
            self._stats.orphan_replays += 1
            it.answer(ToolMessage(it.call_id, rc.content, rc.is_error), ev.ORPHAN_REPLAYED)
            rc.replays.add(record.run)
            record.replays.append((rc, it.msg, epoch))  # type: ignore[arg-type]
        return True

    # -- SideEffect: the task that owns the tool future
    async def _side_effect_task(self, flight: _Flight, entry: RegisteredTool, args: dict[str, Any],
                                ctx: ToolContext, backstop: float) -> None:
        content, is_error, outcome, lost = "", False, ev.OK, False
        try:
            try:
                async with _Scope(None, backstop):
                    out = await entry.tool(args, ctx)
            except _Expired:
                content, lost, outcome = te.error_body(
                    te.UNKNOWN_OUTCOME, flight.tool, D_BACKSTOP.format(t=backstop)), True, ev.LOST
            except ToolError as e:
                content, is_error, outcome = te.error_body(te.TOOL_FAILED, flight.tool, e.message), True, ev.FAILED
            except asyncio.CancelledError:
                content, lost, outcome = te.error_body(te.UNKNOWN_OUTCOME, flight.tool, D_LOST), True, ev.LOST
                task = asyncio.current_task()
                if task is None or task.cancelling() > 0:  # aborted by close(): re-raise
                    raise
            except Exception:
                content, lost, outcome = te.error_body(te.UNKNOWN_OUTCOME, flight.tool, D_LOST), True, ev.LOST
            else:
                try:
                    content = _serialize(out)
                except (TypeError, orjson.JSONEncodeError):
                    content, is_error, outcome = te.error_body(
                        te.TOOL_FAILED, flight.tool, "the tool returned a value that is not JSON"), True, ev.FAILED
                else:
                    limit = self.config.max_result_bytes
                    if len(content) * 4 > limit and _nbytes(content) > limit:
                        content, outcome = _cut_with_marker(content, limit), ev.OK_TRUNCATED
        finally:
            self._settle_flight(flight, content, is_error or lost, outcome, lost)

    def _settle_flight(self, flight: _Flight, content: str, is_error: bool, outcome: str, lost: bool) -> None:
        if lost:
            self._store.lose(flight.key, content)
        else:
            self._store.record(flight.key, content, is_error)
        rc = flight.recent
        if rc is not None:
            rc.state = RunState.LOST if lost else RunState.DONE
            rc.content, rc.is_error = content, is_error
        msg = ToolMessage(flight.call_id, content, is_error)
        if not flight.closed and not flight.waiter.done():
            flight.waiter.set_result((msg, outcome))
            return
        self._push_note(flight.call_id, flight.tool, msg, rc)
        self._stats.side_effect_late_results += 1
        ev.emit("late_result", self.session, flight.epoch, flight.call_id, flight.tool, ev.LATE_RESULT, 0, 0)

    def _push_note(self, call_id: str, tool: str, msg: ToolMessage, rc: RecentCall | None, front: bool = False) -> None:
        if rc is not None and rc.consumed:
            return
        note = _LateNote(call_id, tool, late_tool_result_note(call_id, tool, msg.content, msg.is_error), rc)
        self._enqueue(note, front)

    def _enqueue(self, note: _LateNote, front: bool = False) -> None:
        if len(self._mailbox) >= MAILBOX_CAPACITY:
            self._dropped_notes += 1
            if note.recent is not None:
                note.recent.note = NoteState.DROPPED
            return
        if note.recent is not None:
            note.recent.note = NoteState.PENDING
        if front:
            self._mailbox.appendleft(note)
        else:
            self._mailbox.append(note)

    # -- SideEffect: the slot's wait
    async def _await_side_effect(self, it: _Item, epoch: int, token: CancelToken, record: _RunRecord) -> None:
        assert it.flight is not None and it.entry is not None
        flight = it.flight
        timeout = flight.timeout
        try:
            try:
                async with _Scope(token, timeout):
                    msg, outcome = await flight.waiter
            except _Expired:
                if self._take_arrived(it, flight):
                    return
                flight.closed = True
                self._orphan(flight.recent)
                it.error(te.TIMEOUT, D_TIMEOUT_SE.format(t=timeout), ev.TIMED_OUT_RUNNING)
                return
            except _Interrupted:
                if self._take_arrived(it, flight):
                    return
                flight.closed = True
                self._orphan(flight.recent)
                self._stats.side_effect_interrupted += 1
                it.error(te.INTERRUPTED, D_INTERRUPTED_RUNNING, ev.INTERRUPTED_RUNNING)
                return
            except asyncio.CancelledError:
                # The execute future was dropped. A result that arrived but was not
                # read becomes a note; a later one is noted by the task.
                flight.closed = True
                self._orphan(flight.recent)
                if flight.waiter.done() and not flight.waiter.cancelled():
                    m, _ = flight.waiter.result()
                    self._push_note(flight.call_id, flight.tool, m, flight.recent)
                    self._stats.side_effect_late_results += 1
                    ev.emit("late_result", self.session, epoch, flight.call_id, flight.tool, ev.LATE_RESULT, 0,
                            it.retries)
                raise
            it.answer(msg, outcome)
            record.fresh.append((flight.recent, msg, flight.tool, flight.epoch))
        finally:
            if it.msg is not None:
                self._settled(epoch, it)

    def _take_arrived(self, it: _Item, flight: _Flight) -> bool:
        w = flight.waiter
        flight.closed = True
        if w.done() and not w.cancelled():
            msg, outcome = w.result()
            it.answer(msg, outcome)
            return True
        return False

    def _orphan(self, rc: RecentCall | None) -> None:
        if rc is not None and not rc.orphan:
            rc.orphan = True
            rc.orphan_at = self.clock.now()

    # ------------------------------------------------------------------ delivery guard
    def _deliver(self, record: _RunRecord) -> None:
        record.state = "delivered"
        for rc, _msg, _ in record.replays:
            rc.replays.discard(record.run)
            rc.consumed = True
        for n in record.taken:
            if n.recent is not None and not n.recent.consumed:
                n.recent.note = NoteState.REPORTED
        # A delivered replay now stands for the result the model read: a repeat of
        # it in a later response of the same turn is already_done.
        for rc, msg, epoch in record.replays:
            if not msg.is_error:
                self._recent.add(RecentCall(IdempotencyKey(self.session, epoch, msg.call_id), rc.tool,
                                            rc.digest, epoch, record.run, self.clock.now(),
                                            RunState.DONE, msg.content, msg.is_error))
        record.withheld.clear()

    def _abandon(self, record: _RunRecord) -> None:
        """An execution (or a run) that never reaches the model."""
        if record.state != "open":
            return
        record.state = "discarded"
        for rc, msg, tool, epoch in record.fresh:
            self._orphan(rc)
            self._push_note(msg.call_id, tool, msg, rc)
            self._stats.side_effect_late_results += 1
            ev.emit("late_result", self.session, epoch, msg.call_id, tool, ev.LATE_RESULT, 0, 0)
        for rc in record.running:
            self._orphan(rc)
        for rc, _, _ in record.replays:
            rc.replays.discard(record.run)
        # Notes this execution took go back, in order, ahead of newer ones.
        back = [n for n in record.taken + record.withheld if not (n.recent and n.recent.consumed)]
        for n in reversed(back):
            self._enqueue(n, front=True)
        record.taken.clear()
        record.withheld.clear()

    # ------------------------------------------------------------------ trace
    def _settled(self, epoch: int, it: _Item) -> None:
        dur = 0
        if it.t0 is not None:
            dur = int(round((self.clock.now() - it.t0) * 1e6))
        ev.emit("tool call settled", self.session, epoch, it.call_id, it.tool, it.outcome, dur, it.retries)

