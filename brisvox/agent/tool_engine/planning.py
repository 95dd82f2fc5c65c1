"""Planning and admission of a response's tool calls (steps 1 and 2 of a run).

Owns the validation of a response's calls in one synchronous step, before
anything runs (:meth:`_Planning._plan`: unparsable calls, unknown tools, the
``max_calls`` cap, the argument size before the schema, the schema), the
holding of SideEffect calls for a :class:`Speculation`, and admission
(:meth:`_Planning._admit`): calls of a superseded turn and the per-turn retry
budget.

Invariants:

* Planning runs nothing and never awaits; each refused call is answered with
  its typed error result (docs/TOOLS.md, "Error results").
* Arguments over ``max_argument_bytes`` (serialized) are refused before the
  schema is read; a tool only ever receives arguments that match its schema.
* A response with malformed calls spends one round of its turn's budget; once
  a turn has spent more than ``max_invalid_rounds``, nothing runs for the rest
  of that turn (``budget_exhausted``). The budget is kept for the newest 16
  turns.
* A call of a turn older than the newest one is answered ``stale_turn`` and
  never runs.
* A speculation's held SideEffect calls run only through
  :meth:`ToolEngine.commit <brisvox.agent.tool_engine.engine.ToolEngine.commit>`;
  a speculation dropped or discarded runs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from brisvox.agent.conversation.assemble import InvalidCall
from brisvox.agent.conversation.context import ToolCall, ToolMessage
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.config import D_BUDGET, D_STALE, D_TOO_MANY
from brisvox.agent.tool_engine.state import _EngineState, _Item


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


class _Planning(_EngineState):
    """Steps 1 and 2 of a run: plan, admit (a part of :class:`ToolEngine`)."""

    _max_calls: int
    _newest: int | None
    _invalid: dict[int, int]

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
