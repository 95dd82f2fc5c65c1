"""The LLM runner driving a flow (a mixin of :class:`LlmRunner`; docs/FLOWS.md).

Owns the runner's side of :class:`~brisvox.agent.flows.manager.FlowManager`:

* The request of every round offers the current node's tools and functions
  (:meth:`_round_tools`); a call of anything else is answered ``unknown_tool`` in its slot
  (:meth:`_flow_screen`: an :class:`InvalidCall`, never run), so the model cannot reach a
  later node's tools early.
* After a round's results are in the context, :meth:`_flow_after` asks the manager for the
  transition they make and enters it: the old node's post-actions, the new context (a copy
  the manager built: append / reset / reset with the collected data) swapped in and the
  playout book's rounds marked applied (nothing cuts the old context any more), then the
  new node's pre-actions; the turn goes on with the new node's prompt and tools. Past
  ``max_transitions`` the flow's fallback line is said and the call ends.
* A round with no calls at a node with no transitions ends the node: its post-actions run
  (:meth:`_flow_final`: the goodbye node's ``end_call``).
* The start node's pre-actions are said at the call's first turn (the greeting's, or the
  caller's first); a keypad entry matching the node's ``on_keypad`` moves the flow at the
  start of the entry's own turn (:meth:`keypad_turn`), then the model answers from there;
  so does the late result of a ``next_on`` tool a barge-in cut (:meth:`flow_late`).
* Actions: ``say`` is a fixed line (its own round, into the context, played from its
  pre-rendered clip after its first rendering: the TTS stage's clip cache); ``end_call``,
  ``transfer`` and ``tool`` run the registry's tool once (``end_call``, ``transfer_call``
  or the named one) with its own timeout; a missing tool is counted and logged.
* Without a flow, the runner's observer (the agent link, :mod:`.observer`) shapes the offer:
  :meth:`_round_tools` offers what it says, and a call of a tool it screens (narrowed away by
  ``tools.set``) is answered ``unknown_tool`` in its slot, never run (:class:`_Unoffered`).
* A runner with a flow skips speculation (``skipped_flow``): a transition would change the
  context behind a speculative request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from brisvox.agent.conversation.assemble import CallError, InvalidCall
from brisvox.agent.conversation.context import ToolCall, ToolMessage
from brisvox.agent.flows.definition import FlowAction
from brisvox.agent.flows.manager import FlowCapReached, FlowManager
from brisvox.agent.pipeline.llm_round import _RunnerParts, _Turn
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine.call_info import NO_CALL
from brisvox.agent.tool_engine.registry import ToolContext, ToolSpec

log = logging.getLogger("brisvox.agent.flow")


@dataclass(frozen=True, slots=True)
class _Unoffered(InvalidCall):
    """A call of a tool the observer narrowed away: answered ``unknown_tool``, never run."""

    def error_result(self) -> ToolMessage:
        return ToolMessage(self.id, te.error_body(te.UNKNOWN_TOOL, self.name or "", self.error.detail), True)


class _FlowHook(_RunnerParts):
    flow: FlowManager | None
    _flow_pre: tuple[FlowAction, ...] = ()  # the start node's pre-actions, said at the first turn
    _flow_keypad: str | None = None  # the node a keypad entry or a late result moves to, at a turn's start
    flow_actions = 0
    flow_action_failures = 0

    def _round_tools(self) -> list[ToolSpec]:
        if self.flow is not None:
            return self.flow.tool_specs()
        return self.tools if self.observer is None else self.observer.offered(self.tools)

    def _flow_screen(self, calls: Sequence[Any]) -> list[Any]:
        """Calls of tools the current node does not offer become unknown_tool answers."""
        flow, obs = self.flow, self.observer
        if flow is None and obs is None:
            return list(calls)
        out: list[Any] = []
        for c in calls:
            if isinstance(c, ToolCall) and flow is None and obs is not None and obs.screened(c.name):
                out.append(_Unoffered(c.id, c.name, "", CallError("unknown_tool", f"{c.name!r} is not offered now"),
                                      c.provider_id))
            elif isinstance(c, ToolCall) and flow is not None and not flow.offered(c.name):
                out.append(InvalidCall(c.id, c.name, "", CallError("unknown_tool", f"{c.name!r} is not offered "
                                                                                   "at this step"), c.provider_id))
            else:
                out.append(c)
        return out

    async def _flow_after(self, turn: _Turn, calls: Sequence[Any], results: Sequence[ToolMessage]) -> bool:
        """Enter the transition the round's results make; True: the call ends (no more rounds)."""
        flow = self.flow
        if flow is None:
            return False
        target = flow.decide(calls, results)
        return False if target is None else await self._flow_enter(turn, target)

    async def _flow_start_turn(self, turn: _Turn) -> bool:
        """At a turn's start: the start node's pre-actions (once per call), then a transition a
        keypad entry decided (:meth:`keypad_turn`). True: the call ends."""
        pre, self._flow_pre = self._flow_pre, ()
        if pre and await self._flow_run(turn, pre):
            return True
        target, self._flow_keypad = self._flow_keypad, None
        return target is not None and await self._flow_enter(turn, target)

    def flow_late(self, outcomes: Sequence[tuple[str, bool]]) -> None:
        """Late tool results (a booking a barge-in cut, finished later): a ``next_on`` tool
        of the current node that succeeded moves the flow at the next turn's start."""
        flow = self.flow
        if flow is None or self._flow_keypad is not None:
            return
        for tool, is_error in outcomes:
            target = flow.node.next_on.get(tool)
            if target and not is_error:
                self._flow_keypad = target
                return

    def keypad_turn(self, digits: str) -> None:
        """A keypad entry: the transition it makes at the current node is entered when its turn starts."""
        if self.flow is not None:
            self._flow_keypad = self.flow.keypad(digits)

    async def _flow_enter(self, turn: _Turn, target: str) -> bool:
        flow = self.flow
        assert flow is not None
        try:
            t = flow.enter(target, self.ctx)
        except FlowCapReached:
            log.warning("flow: max_transitions reached; the fallback line, then the call ends")
            await self._speak_line(turn, flow.flow.fallback_line or "Goodbye.", into_context=True)
            await self._flow_run(turn, (FlowAction(end_call=True),))
            return True
        await self._flow_run(turn, t.post_actions)
        self.ctx = t.context
        self.book.forget_unapplied()
        if flow.node.context != "append":
            self.summarizer.reset()  # its summary was of the conversation the reset replaced
        self._check()
        return await self._flow_run(turn, t.pre_actions)

    async def _flow_final(self, turn: _Turn) -> None:
        """A round without calls at a node without transitions: the node's post-actions."""
        flow = self.flow
        if flow is not None and not flow.node.targets():
            await self._flow_run(turn, flow.node.post_actions)

    async def _flow_run(self, turn: _Turn, actions: Sequence[FlowAction]) -> bool:
        """Run ``actions`` in order; True when one of them ends the call."""
        ends = False
        for a in actions:
            if turn.token.cancelled:
                return ends
            self.flow_actions += 1
            if a.say:
                await self._speak_line(turn, a.say, into_context=True, clip=True)  # pre-rendered after its first use
                continue
            if a.end_call:
                name, args = "end_call", {"reason": "flow"}
            elif a.transfer:
                name, args = "transfer_call", {"target": a.transfer}
            else:
                name, args = a.tool, dict(a.args)
            ends = ends or a.exits
            await self._flow_tool(turn, name, args)
        return ends

    async def _flow_tool(self, turn: _Turn, name: str, args: dict[str, Any]) -> None:
        rt = self.engine.registry.get(name) if self.engine is not None else None
        if rt is None:
            self.flow_action_failures += 1
            log.error("flow action: tool %r is not in the call's registry", name)
            return
        ctx = ToolContext(self.engine.session if self.engine is not None else "", turn.epoch,
                          f"flow.{self.flow_actions}", tool=name,
                          call_info=self.engine.call_info if self.engine is not None else NO_CALL)
        try:
            await asyncio.wait_for(rt.tool(args, ctx), rt.spec.timeout)
        except Exception as e:  # noqa: BLE001 - an action's failure is counted, the call goes on
            self.flow_action_failures += 1
            log.warning("flow action %s failed: %s", name, type(e).__name__)
