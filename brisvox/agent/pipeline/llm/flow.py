"""The LLM runner's offer of tools and its side of a flow (docs/FLOWS.md).

Owns :class:`FlowHook` (one per runner, with or without a
:class:`~brisvox.agent.flows.manager.FlowManager`) and :class:`FlowHost`, the little it
needs of the runner while it enters a transition or runs actions:

* The request of every round offers the current node's tools and functions
  (:meth:`FlowHook.tools`); a call of anything else is answered ``unknown_tool`` in its slot
  (:meth:`FlowHook.screen`: an :class:`InvalidCall`, never run), so the model cannot reach a
  later node's tools early.
* After a round's results are in the context, :meth:`FlowHook.after` asks the manager for
  the transition they make and enters it: the old node's post-actions, the new context (a
  copy the manager built from the context as it was when the transition began: append /
  reset / reset with the collected data) handed to :meth:`FlowHost.swap_context` (the
  runner swaps it in and marks the playout book's rounds applied, so nothing cuts the old
  context any more; ``reset``: the summary was of the replaced conversation), then the new
  node's pre-actions; the turn goes on with the new node's prompt and tools. Past
  ``max_transitions`` the flow's fallback line is said and the call ends.
* A round with no calls at a node with no transitions ends the node: its post-actions run
  (:meth:`FlowHook.final`: the goodbye node's ``end_call``).
* The start node's pre-actions (taken from the manager at construction) are said at the
  call's first turn (the greeting's, or the caller's first: :meth:`FlowHook.start_turn`,
  once); a keypad entry matching the node's ``on_keypad`` moves the flow at the start of
  the entry's own turn (:meth:`FlowHook.keypad`), then the model answers from there; so
  does the late result of a ``next_on`` tool a barge-in cut (:meth:`FlowHook.late`).
* Actions: ``say`` is a fixed line (:meth:`FlowHost.speak`: its own round, into the
  context, played from its pre-rendered clip after its first rendering: the TTS stage's
  clip cache); ``end_call``, ``transfer``, ``warm_transfer`` and ``tool`` call the registry's
  tool (``end_call``, ``transfer_call``, ``warm_transfer`` or the named one) through the tool engine
  (:meth:`ToolEngine.act <brisvox.agent.tool_engine.engine.ToolEngine.act>`), as a model's
  call runs: its kind, its timeout, and for a SideEffect tool the idempotency key
  (session, the turn's epoch, the action's id ``flow.<node>.<pre|post|cap>.<index>``), so
  an action runs at most once per turn (the node entered again in the same turn is
  answered from the record) and one cut by a barge-in or its timeout keeps running, its
  result a late note in the context at the next settle. The script reads the result, the
  model does not; an error result or a missing tool is counted (``action_failures``) and
  logged, and the call goes on. Every action stops at a halted turn.
* Without a flow, the runner's observer (the agent link, :mod:`.observer`) shapes the offer:
  :meth:`FlowHook.tools` offers what it says, and a call of a tool it screens (narrowed
  away by ``tools.set``) is answered ``unknown_tool`` in its slot, never run
  (:class:`_Unoffered`). Without either, the offer is the runner's tools, unscreened.
* A runner with a flow skips speculation (``skipped_flow``): a transition would change the
  context behind a speculative request.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.assemble import CallError, InvalidCall
from brisvox.agent.conversation.context import Context, ToolCall, ToolMessage
from brisvox.agent.flows.definition import FlowAction
from brisvox.agent.flows.manager import FlowCapReached, FlowManager
from brisvox.agent.pipeline.llm.observer import CallObserver
from brisvox.agent.pipeline.llm.turn import Turn
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import ToolSpec

log = logging.getLogger("brisvox.agent.flow")


@dataclass(frozen=True, slots=True)
class _Unoffered(InvalidCall):
    """A call of a tool the observer narrowed away: answered ``unknown_tool``, never run."""

    def error_result(self) -> ToolMessage:
        return ToolMessage(self.id, te.error_body(te.UNKNOWN_TOOL, self.name or "", self.error.detail), True)


class FlowHost(Protocol):
    """What the flow hook needs of the runner (the owner of the context and the voice)."""

    @property
    def ctx(self) -> Context: ...

    async def speak(self, turn: Turn, text: str, clip: bool) -> None:
        """A fixed line as its own round, into the context."""

    def swap_context(self, ctx: Context, reset: bool) -> None:
        """The transition's new context replaces the old one."""


class FlowHook:
    """The runner's offer and its flow (see the module docstring)."""

    def __init__(self, flow: FlowManager | None, engine: ToolEngine | None, ctx: Context) -> None:
        self.flow = flow
        self.engine = engine
        self._pre: tuple[FlowAction, ...] = flow.start(ctx) if flow is not None else ()  # said at the first turn
        self._pre_node = flow.node.name if flow is not None else ""
        self._keypad: str | None = None  # the node a keypad entry or a late result moves to, at a turn's start
        self.actions = 0
        self.action_failures = 0

    # -- the offer -------------------------------------------------------------------------
    def tools(self, tools: list[ToolSpec], observer: CallObserver | None) -> list[ToolSpec]:
        """What the next request offers (``tools``: the runner's own)."""
        if self.flow is not None:
            return self.flow.tool_specs()
        return tools if observer is None else observer.offered(tools)

    def screen(self, calls: Sequence[Any], observer: CallObserver | None) -> list[Any]:
        """Calls of tools the current node (or the observer) does not offer become unknown_tool answers."""
        flow = self.flow
        if flow is None and observer is None:
            return list(calls)
        out: list[Any] = []
        for c in calls:
            if isinstance(c, ToolCall) and flow is None and observer is not None and observer.screened(c.name):
                out.append(_Unoffered(c.id, c.name, "", CallError("unknown_tool", f"{c.name!r} is not offered now"),
                                      c.provider_id))
            elif isinstance(c, ToolCall) and flow is not None and not flow.offered(c.name):
                out.append(InvalidCall(c.id, c.name, "", CallError("unknown_tool", f"{c.name!r} is not offered "
                                                                                   "at this step"), c.provider_id))
            else:
                out.append(c)
        return out

    # -- transitions -----------------------------------------------------------------------
    async def after(self, turn: Turn, calls: Sequence[Any], results: Sequence[ToolMessage], host: FlowHost) -> bool:
        """Enter the transition the round's results make; True: the call ends (no more rounds)."""
        flow = self.flow
        if flow is None:
            return False
        target = flow.decide(calls, results)
        return False if target is None else await self._enter(turn, target, host)

    async def start_turn(self, turn: Turn, host: FlowHost) -> bool:
        """At a turn's start: the start node's pre-actions (once per call), then a transition a
        keypad entry decided (:meth:`keypad`). True: the call ends."""
        if self.flow is None:
            return False
        pre, self._pre = self._pre, ()
        if pre and await self._run(turn, pre, host, f"{self._pre_node}.pre"):
            return True
        target, self._keypad = self._keypad, None
        return target is not None and await self._enter(turn, target, host)

    def late(self, outcomes: Sequence[tuple[str, bool]]) -> None:
        """Late tool results (a booking a barge-in cut, finished later): a ``next_on`` tool
        of the current node that succeeded moves the flow at the next turn's start."""
        flow = self.flow
        if flow is None or self._keypad is not None:
            return
        for tool, is_error in outcomes:
            target = flow.node.next_on.get(tool)
            if target and not is_error:
                self._keypad = target
                return

    def enter_next(self, node: str) -> None:
        """The flow moves to ``node`` at the next turn's start (an AMD verdict's ``node:`` action,
        decided before the call's first turn)."""
        if self.flow is not None and node in self.flow.flow.nodes:
            self._keypad = node

    def keypad(self, digits: str) -> None:
        """A keypad entry: the transition it makes at the current node is entered when its turn starts."""
        if self.flow is not None:
            self._keypad = self.flow.keypad(digits)

    async def final(self, turn: Turn, host: FlowHost) -> None:
        """A round without calls at a node without transitions: the node's post-actions."""
        flow = self.flow
        if flow is not None and not flow.node.targets():
            await self._run(turn, flow.node.post_actions, host, f"{flow.node.name}.post")

    async def _enter(self, turn: Turn, target: str, host: FlowHost) -> bool:
        flow = self.flow
        assert flow is not None
        left = flow.node.name
        try:
            t = flow.enter(target, host.ctx)
        except FlowCapReached:
            log.warning("flow: max_transitions reached; the fallback line, then the call ends")
            await host.speak(turn, flow.flow.fallback_line or "Goodbye.", clip=False)
            await self._run(turn, (FlowAction(end_call=True),), host, f"{left}.cap")
            return True
        await self._run(turn, t.post_actions, host, f"{left}.post")
        host.swap_context(t.context, reset=flow.node.context != "append")
        return await self._run(turn, t.pre_actions, host, f"{t.node}.pre")

    # -- actions ---------------------------------------------------------------------------
    async def _run(self, turn: Turn, actions: Sequence[FlowAction], host: FlowHost, where: str) -> bool:
        """Run ``actions`` (``where``: ``<node>.<pre|post|cap>``) in order; True when one of
        them ends the call."""
        ends = False
        for i, a in enumerate(actions):
            if turn.token.cancelled:
                return ends
            self.actions += 1
            if a.say:
                await host.speak(turn, a.say, clip=True)  # pre-rendered after its first use
                continue
            if a.end_call:
                name, args = "end_call", {"reason": "flow"}
            elif a.transfer:
                name, args = "transfer_call", {"target": a.transfer}
            elif a.warm_transfer:
                name, args = "warm_transfer", {"target": a.warm_transfer, "reason": a.reason or "flow"}
            else:
                name, args = a.tool, dict(a.args)
            ends = ends or a.exits
            await self._tool(turn, ToolCall(f"flow.{where}.{i}", name, args))
        return ends

    async def _tool(self, turn: Turn, call: ToolCall) -> None:
        """One action's call through the engine; a cut turn discards its execution (a
        SideEffect result that reached its slot becomes a late note, as a model's does)."""
        engine = self.engine
        if engine is None or engine.registry.get(call.name) is None:
            self.action_failures += 1
            log.error("flow action: tool %r is not in the call's registry", call.name)
            return
        execution = await engine.act(call, turn.epoch, turn.token)
        if turn.token.cancelled:
            execution.discard()
            return
        execution.mark_delivered()
        res = execution.results[0]
        if res.is_error:
            self.action_failures += 1
            log.warning("flow action %s (%s) answered %s", call.id, call.name, _error_kind(res))


def _error_kind(res: ToolMessage) -> str:
    """The ``error`` of an error result's body (never its detail: it may quote the arguments)."""
    try:
        body = orjson.loads(res.content)
    except orjson.JSONDecodeError:
        return "error"
    return str(body.get("error", "error")) if isinstance(body, dict) else "error"
