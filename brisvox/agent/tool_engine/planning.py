"""Planning of a response's tool calls (step 1 of a run), and the speculation.

Owns :class:`Planner`, the validation of a response's calls in one synchronous
step, before anything runs (unparsable calls, unknown tools, the ``max_calls``
cap, the argument size before the schema, the schema), with the holding of
SideEffect calls for a speculation; and :class:`Speculation`, a speculative
response until its commit. Admission (stale turns, the retry budget) is
:mod:`.admission`.

Invariants:

* Planning is pure: calls in, plan items out (each refused call answered with
  its typed error result, docs/TOOLS.md "Error results"); it runs nothing,
  never awaits and changes no state of the engine.
* Arguments over ``max_argument_bytes`` (serialized) are refused before the
  schema is read; a tool only ever receives arguments that match its schema.
* A speculation's held SideEffect calls run only through
  :meth:`ToolEngine.commit <brisvox.agent.tool_engine.engine.ToolEngine.commit>`,
  which claims it once; a speculation dropped or discarded runs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.assemble import InvalidCall
from brisvox.agent.conversation.context import ToolCall, ToolMessage
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.config import D_TOO_MANY
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.agent.tool_engine.state import _Item


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

    def claim(self) -> tuple[int, list[_Item], list[_Item]]:
        """For :meth:`ToolEngine.commit`: the epoch, every item and the held ones,
        released (no longer held). Raises ``RuntimeError`` unless the speculation
        is open; it is committed from now on."""
        if self._state != "open":
            raise RuntimeError(f"the speculation was already {self._state}")
        self._state = "committed"
        held = [it for it in self._items if it.held]
        for it in held:
            it.held = False
        return self._epoch, self._items, held


class Planner:
    """Step 1 of a run: a response's calls into plan items (pure; see the module doc).

    Reads the registry it was given (its tools as registered when ``plan`` runs)."""

    __slots__ = ("_registry", "_max_calls", "_max_args")

    def __init__(self, registry: ToolRegistry, max_calls: int, max_argument_bytes: int) -> None:
        self._registry = registry
        self._max_calls = max(1, max_calls)
        self._max_args = max_argument_bytes

    # ------------------------------------------------------------------ step 1: plan
    def plan(self, calls: Sequence[ToolCall | InvalidCall], hold_side_effects: bool) -> tuple[list[_Item], bool]:
        """The items of ``calls`` in issue order, and whether any is malformed.
        With ``hold_side_effects`` the valid SideEffect calls are held."""
        items: list[_Item] = []
        malformed = False
        max_args = self._max_args
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
            entry = self._registry.get(name)
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
