"""SideEffect runs: at most once, on their own task, recorded (never twice).

Owns :class:`SideEffects`, which the engine holds and its runner calls: the
start of a SideEffect call (in issue order, synchronously) with its
idempotency check, the confirmation gate, the orphan and regeneration checks
and the repeat rule (``already_done``); the task that owns the tool's future;
the slot's wait for it (timeout, barge-in, a dropped execute); the recording
of the outcome in the idempotency store; and the running tasks themselves
(counted, aborted at the end of the session).

Invariants:

* A SideEffect call runs at most once per idempotency key (session, epoch,
  call id), on its own task that the caller cannot cancel; only the hard
  backstop (``max(max_side_effect_runtime, timeout)``) and
  :meth:`ToolEngine.close <brisvox.agent.tool_engine.engine.ToolEngine.close>`
  end it, and then its key is recorded lost and never run again.
* A replay of a known key answers from the store (the recorded result, a
  running call's ``duplicate_call``, a lost call's ``unknown_outcome``); a
  failed call is recorded like a success.
* The result goes to the waiting slot while it is open, else to the mailbox
  as a late note (:mod:`brisvox.agent.tool_engine.delivery`), never to both.
* A response regenerated after a barge-in that repeats a call still running or
  already finished (within ``orphan_window``) is answered from the record
  instead of running it twice; a call identical to one that already succeeded
  earlier in the same turn is refused ``already_done`` unless the tool is
  ``repeatable``.
* A ``confirm`` tool's call does not run: it is parked in the confirmation gate
  and only a ``confirm_pending`` after the user's next reply runs it; a call of
  the operator's script (``scripted``: a flow's action) is not gated.
* Each execution logs one INFO line with the key digest; arguments are never
  logged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import ToolMessage
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.config import (
    D_ALREADY_DONE,
    D_ALREADY_REPORTED,
    D_BACKSTOP,
    D_DUPLICATE,
    D_INTERRUPTED_RUNNING,
    D_LOST,
    D_NOT_STARTED,
    D_ORPHAN_RUNNING,
    D_STORE_FULL,
    D_TIMEOUT_SE,
    D_UNKNOWN,
    EngineConfig,
    _cut_with_marker,
    _nbytes,
    _serialize,
)
from brisvox.agent.tool_engine.confirm import (
    CONFIRM_MESSAGE,
    Confirmations,
    PendingRequest,
    Refusal,
)
from brisvox.agent.tool_engine.delivery import Delivery, _RunRecord
from brisvox.agent.tool_engine.idempotency import Begin, IdempotencyStore
from brisvox.agent.tool_engine.recent import (
    NoteState,
    RecentCall,
    RecentCalls,
    RunState,
    call_digest,
)
from brisvox.agent.tool_engine.registry import (
    CONFIRM_TOOL_NAME,
    CancelToken,
    IdempotencyKey,
    RegisteredTool,
    ToolContext,
    ToolError,
    ToolRegistry,
)
from brisvox.agent.tool_engine.scope import _Expired, _Interrupted, _Scope
from brisvox.agent.tool_engine.state import _Flight, _Item
from brisvox.clock import Clock


@dataclass(frozen=True, slots=True)
class _Mutations:
    """Deliberately broken variants, used ONLY by the mutation tests to prove the
    tests of the already_done rule can fail. Never set in production."""

    no_already_done_check: bool = False
    already_done_ignores_epoch: bool = False
    failures_count_as_success: bool = False


class SideEffects:
    """SideEffect start, task, wait and record (the invariants are the module's).

    Holds what the engine shares with it: the idempotency store, the recent
    calls, the confirmation gate, the counters, and the :class:`Delivery` that
    takes a result that missed its slot. Owns the running tasks."""

    __slots__ = ("_session", "_call_info", "_clock", "_config", "_registry", "_store", "_recent",
                 "_confirmations", "_stats", "_delivery", "_mut", "_tasks")

    def __init__(self, *, session: str, call_info: CallInfo, clock: Clock, config: EngineConfig,
                 registry: ToolRegistry, store: IdempotencyStore, recent: RecentCalls,
                 confirmations: Confirmations, stats: ev.ToolStats, delivery: Delivery,
                 mutations: _Mutations) -> None:
        self._session = session
        self._call_info = call_info
        self._clock = clock
        self._config = config
        self._registry = registry
        self._store = store
        self._recent = recent
        self._confirmations = confirmations
        self._stats = stats
        self._delivery = delivery
        self._mut = mutations
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the running tasks
    def running(self) -> list[asyncio.Task[None]]:
        """The SideEffect tasks not yet ended."""
        return [t for t in self._tasks if not t.done()]

    def abort(self) -> None:
        """Cancel every SideEffect task (each records its key lost at its next await point)."""
        for t in list(self._tasks):
            t.cancel()

    # -- SideEffect: synchronous start (issue order)
    def start(self, it: _Item, epoch: int, token: CancelToken, record: _RunRecord, seen: set[str], *,
              scripted: bool = False) -> None:
        """Start ``it`` (issue order, no await): on its own task, or answered at once
        (replay, refusal, the confirmation gate unless ``scripted``) with ``it.msg`` set."""
        assert it.entry is not None and it.call is not None
        spec = it.entry.spec
        key = IdempotencyKey(self._session, epoch, it.call_id)
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
            taken = self._confirmations.take(str(args.get("call_id", "")), epoch, self._clock.now())
            if isinstance(taken, Refusal):
                self._stats.confirmations_refused += 1
                kind = te.STALE_TURN if taken is Refusal.STALE else te.CONFIRMATION_REFUSED
                it.error(kind, taken.value, ev.CONFIRMATION_REFUSED)
                return
            confirms = taken
            target = self._registry.get(taken.tool)
            if target is None:
                it.error(te.UNKNOWN_TOOL, f"there is no tool named {taken.tool!r}", ev.UNKNOWN_TOOL)
                return
            run_entry, run_args = target, taken.arguments
        else:
            digest = call_digest(tool_name, args)
            if spec.confirm and not scripted:
                self._confirmations.request(it.call_id, tool_name, args, digest, epoch, self._clock.now())
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
            recent = RecentCall(key, tool_name, digest, epoch, record.run, self._clock.now())
            self._recent.add(recent)
            record.running.append(recent)
        it.recent = recent
        flight = _Flight(key, run_entry.spec.name, it.call_id, epoch, recent, run_entry.spec.timeout)
        it.flight = flight
        if confirms is not None:
            tool_ctx = ToolContext(self._session, confirms.epoch, confirms.call_id, token, confirms.tool,
                                   self._call_info)
            self._stats.confirmations_run += 1
        else:
            tool_ctx = ToolContext(self._session, epoch, it.call_id, token, tool_name, self._call_info)
        ev.log_side_effect(self._session, run_entry.spec.name, epoch, key,
                           confirms.call_id if confirms else None)
        backstop = max(self._config.max_side_effect_runtime, run_entry.spec.timeout)
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
        rc = self._recent.find_orphan(tool, digest, record.run, self._clock.now(), self._config.orphan_window)
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
                    limit = self._config.max_result_bytes
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
        self._delivery.report_late(flight.call_id, flight.tool, msg, rc, flight.epoch)

    # -- SideEffect: the slot's wait
    async def wait(self, it: _Item, epoch: int, token: CancelToken, record: _RunRecord) -> None:
        """The slot of a started call: answered with its result, at its timeout or at
        the barge-in (the call keeps running; its result becomes a late note)."""
        assert it.flight is not None and it.entry is not None
        flight = it.flight
        timeout = flight.timeout
        try:
            async with _Scope(token, timeout):
                msg, outcome = await flight.waiter
        except _Expired:
            if self._take_arrived(it, flight):
                return
            flight.closed = True
            self._delivery.orphan(flight.recent)
            it.error(te.TIMEOUT, D_TIMEOUT_SE.format(t=timeout), ev.TIMED_OUT_RUNNING)
            return
        except _Interrupted:
            if self._take_arrived(it, flight):
                return
            flight.closed = True
            self._delivery.orphan(flight.recent)
            self._stats.side_effect_interrupted += 1
            it.error(te.INTERRUPTED, D_INTERRUPTED_RUNNING, ev.INTERRUPTED_RUNNING)
            return
        except asyncio.CancelledError:
            # The execute future was dropped. A result that arrived but was not
            # read becomes a note; a later one is noted by the task.
            flight.closed = True
            self._delivery.orphan(flight.recent)
            if flight.waiter.done() and not flight.waiter.cancelled():
                m, _ = flight.waiter.result()
                self._delivery.report_late(flight.call_id, flight.tool, m, flight.recent, epoch, it.retries)
            raise
        it.answer(msg, outcome)
        record.fresh.append((flight.recent, msg, flight.tool, flight.epoch))

    def _take_arrived(self, it: _Item, flight: _Flight) -> bool:
        w = flight.waiter
        flight.closed = True
        if w.done() and not w.cancelled():
            msg, outcome = w.result()
            it.answer(msg, outcome)
            return True
        return False
