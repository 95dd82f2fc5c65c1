"""FlowManager: one call's position in its flow, and what a transition does to the context.

A state machine the LLM runner consults (it does no I/O; the runner speaks, ends the call
and runs tools as the returned actions say):

* :meth:`start` makes the context's message 0 the start node's prompt and returns the
  start node's pre-actions.
* :meth:`tool_specs`: what the model is offered at the current node: the node's registry
  tools (their own specs: validation, idempotency, the confirmation gate apply) and its flow
  functions (ReadOnly specs the FLOW answers: :meth:`answer_function`).
* :meth:`function_tools`: the flow functions as ReadOnly registry tools (the engine checks
  their arguments by schema; a bad call is answered ``invalid_arguments`` and changes
  nothing), recording into :attr:`data` and answering ``{"ok": true, ...}``;
  :meth:`offered` screens a call of a tool the current node does not offer.
* :meth:`decide`: after a round's results, the transition they make: the first, in call
  order, of a function with ``next`` that was answered ok, or a ``next_on`` tool whose result
  is not an error. :meth:`keypad` the same for a keypad entry.
* :meth:`enter`: the transition itself, on a COPY of the context (the runner swaps it in):
  ``append`` replaces message 0, ``reset`` keeps only the new prompt (and the caller's
  current turn: every provider needs a user message), ``reset_with_summary`` also a note of
  :attr:`data`; call ids stay unique across a reset (the copy keeps
  the context's call-id high-water marks, so the engine's idempotency key never repeats).
  Returns the old node's post-actions and the new node's pre-actions. Past
  ``max_transitions`` it refuses (:class:`FlowCapReached`): the runner says the fallback
  line and ends the call.

Invariants: the current node always exists; :attr:`transitions` counts entered transitions;
a transition is decided at most once per round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.agent.conversation.context import (
    Context,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.flows.definition import FlowAction, FlowDef, FlowNode
from brisvox.agent.tool_engine.registry import CONFIRM_TOOL_NAME, ToolContext, ToolKind, ToolSpec


class FlowCapReached(RuntimeError):
    """The flow's ``max_transitions`` is spent."""


@dataclass(frozen=True, slots=True)
class Transition:
    node: str
    context: Context
    post_actions: tuple[FlowAction, ...]  # of the node left
    pre_actions: tuple[FlowAction, ...]  # of the node entered


class FlowManager:
    def __init__(self, flow: FlowDef, registry_specs: Sequence[ToolSpec] = ()) -> None:
        self.flow = flow
        self.node: FlowNode = flow.nodes[flow.start]
        self.transitions = 0
        self.data: dict[str, Any] = {}
        self._specs = {s.name: s for s in registry_specs}
        self.st = {"transitions": 0, "function_calls": 0, "keypad_transitions": 0, "cap_reached": 0}

    # -- the node's prompt and tools -------------------------------------------------------
    def prompt(self, node: FlowNode | None = None) -> SystemMessage:
        n = node or self.node
        role = n.role or self.flow.role
        return SystemMessage(f"{role}\n\n{n.task}".strip() if role else n.task)

    def start(self, ctx: Context) -> tuple[FlowAction, ...]:
        """Message 0 becomes the start node's prompt; the start node's pre-actions."""
        if len(ctx) and isinstance(ctx[0], SystemMessage):
            ctx.replace(0, self.prompt())
        else:
            ctx.insert(0, self.prompt())
        return self.node.pre_actions

    def tool_specs(self) -> list[ToolSpec]:
        """The registry's specs of the node's tools and functions (name order)."""
        return sorted((self._specs[n] for n in self.offered_names() if n in self._specs), key=lambda s: s.name)

    def offered_names(self) -> list[str]:
        """The node's tools and functions, plus ``confirm_pending`` when one of its tools
        needs the confirmation gate (a transfer, ``confirm_tools``): without it a gated call
        made at this node could never be confirmed."""
        names = [*self.node.tools, *(f.name for f in self.node.functions)]
        if any((spec := self._specs.get(n)) is not None and spec.confirm for n in self.node.tools):
            names.append(CONFIRM_TOOL_NAME)
        return names

    def bind(self, registry_specs: Sequence[ToolSpec]) -> None:
        """The call's registry specs (after :meth:`function_tools` were registered)."""
        self._specs = {s.name: s for s in registry_specs}

    # -- the model's calls ---------------------------------------------------------------------
    def function_tools(self) -> list[tuple[ToolSpec, Any]]:
        """Every flow function as a ReadOnly registry tool bound to this manager: the tool
        engine checks its arguments against its schema (a bad call is answered
        ``invalid_arguments`` and records nothing), the body records them in :attr:`data`
        and answers ``{"ok": true, "recorded": ..., "next": ...}``. Function names are unique
        across the flow (``check_flow``)."""
        out: list[tuple[ToolSpec, Any]] = []
        for node in self.flow.nodes.values():
            for fn in node.functions:
                spec = ToolSpec(fn.name, fn.description or fn.name, dict(fn.parameters) or {"type": "object"},
                                ToolKind.READ_ONLY, filler_after=None)
                out.append((spec, self._recorder(fn.next)))
        return out

    def _recorder(self, target: str) -> Any:
        async def record(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            self.st["function_calls"] += 1
            self.data.update(args)
            answer: dict[str, Any] = {"ok": True, "recorded": args}
            if target:
                answer["next"] = target
            return answer

        return record

    def offered(self, name: str) -> bool:
        """The model may call ``name`` at the current node."""
        return name in self.offered_names()

    def decide(self, calls: Sequence[Any], results: Sequence[ToolMessage]) -> str | None:
        """The node a round's answered calls lead to (None: stay): a function's ``next``, a
        ``next_on`` tool that succeeded, or a handler: a node tool whose result object names
        ``"next_node"`` (a dynamic flow's Python tool deciding where to go)."""
        for c, r in zip(calls, results, strict=False):
            if r.is_error or not isinstance(c, ToolCall):
                continue
            chosen = _next_node(r.content) if c.name in self.node.tools else None
            if chosen is not None and chosen in self.flow.nodes:
                return chosen
            fn = next((f for f in self.node.functions if f.name == c.name), None)
            if fn is not None and fn.next:
                return fn.next
            target = self.node.next_on.get(c.name)
            if target:
                return target
        return None

    def keypad(self, digits: str) -> str | None:
        target = self.node.on_keypad.get(digits) or self.node.on_keypad.get(digits.rstrip("#"))
        if target:
            self.st["keypad_transitions"] += 1
        return target

    # -- transitions -----------------------------------------------------------------------------
    def enter(self, target: str, ctx: Context) -> Transition:
        """Move to ``target`` on a copy of ``ctx``; raises FlowCapReached past the cap."""
        if self.transitions >= self.flow.max_transitions:
            self.st["cap_reached"] += 1
            raise FlowCapReached(f"{self.transitions} transitions: the flow's max_transitions")
        old, new = self.node, self.flow.nodes[target]
        out = ctx.copy()
        if new.context == "append":
            if len(out) and isinstance(out[0], SystemMessage):
                out.replace(0, self.prompt(new))
            else:
                out.insert(0, self.prompt(new))
        else:
            last_user = next((m for m in reversed(ctx.messages) if isinstance(m, UserMessage)), None)
            out.truncate_to(0)  # the copy keeps the call-id high-water marks: ids stay unique
            out.push(self.prompt(new))
            if new.context == "reset_with_summary" and self.data:
                facts = "; ".join(f"{k}: {v}" for k, v in self.data.items())
                out.push(SystemMessage(f"What the caller told us so far: {facts}."))
            if last_user is not None:
                out.push(last_user)  # the caller's current turn: every provider needs a user message
        self.node = new
        self.transitions += 1
        self.st["transitions"] += 1
        return Transition(target, out, old.post_actions, new.pre_actions)


def _next_node(content: str) -> str | None:
    if '"next_node"' not in content:
        return None  # the common case: no parse of a result that cannot name one
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    value = body.get("next_node") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
