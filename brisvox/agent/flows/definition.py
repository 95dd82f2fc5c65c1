"""Flow definitions: the ``[flow]`` table of an agent file (or a Python-built :class:`FlowDef`), checked.

A flow is a graph of nodes the conversation moves through (a booking: greeting ->
party size and time -> confirm -> book -> goodbye). Each node has:

* ``role`` and ``task``: the node's system prompt (``role`` kept from the flow's
  ``role`` when the node has none) — message 0 of the context while the node is current;
* ``tools``: registry tools offered at the node (ordinary tools: validation, idempotency
  and the confirmation gate apply), and ``functions``: flow functions the model calls to
  report what it learnt (their arguments are validated by their schema and recorded in the
  flow's data) and, with ``next``, to move to another node;
* ``next_on``: a transition when a registry tool of the node succeeded
  (``{ book_table = "goodbye" }``); ``on_keypad``: a transition on a keypad entry
  (``{ "1" = "bookings" }``);
* ``pre_actions`` (when the node is entered) and ``post_actions`` (when it is left, or
  after its first answer for a node without exits): ``{ say = "..." }`` (a fixed line),
  ``{ end_call = true }``, ``{ transfer = "+49..." }``, ``{ tool = "name", args = {...} }``;
* ``context``: how the context is carried INTO the node: ``append`` (the history stays,
  message 0 becomes the node's prompt), ``reset`` (only the node's prompt), ``reset_with_summary``
  (the node's prompt and a system note with the flow's collected data).

The flow: ``start`` (a node), ``max_transitions`` per call (default 32; beyond it the
``fallback_line`` is said and the call ends), ``role``.

:func:`check_flow` returns every problem with its dotted key: an unknown node (``start``,
``next``, ``next_on``, ``on_keypad``), a node no path from ``start`` reaches, a set of nodes
the conversation can enter and never leave without an exit (no node in it ends the call
or transfers), a tool that nothing provides, a function name that clashes with a tool,
an action calling ``confirm_pending`` (the tool engine refuses it: an action is never gated).
Invariant: a :class:`FlowDef` that :func:`check_flow` passes has every reference resolved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from brisvox.agent.tool_engine.registry import CONFIRM_TOOL_NAME

CONTEXT_STRATEGIES = ("append", "reset", "reset_with_summary")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class FlowAction:
    """One pre/post action: exactly one of ``say``, ``end_call``, ``transfer``, ``warm_transfer``
    (with its ``reason``), ``tool``. A warm transfer is no exit: declined or unanswered, the
    conversation goes on at the node."""

    say: str = ""
    end_call: bool = False
    transfer: str = ""
    tool: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)
    warm_transfer: str = ""
    reason: str = ""

    @property
    def exits(self) -> bool:
        return self.end_call or bool(self.transfer)


@dataclass(frozen=True, slots=True)
class FlowFunction:
    name: str
    description: str
    parameters: Mapping[str, Any]
    next: str = ""


@dataclass(frozen=True, slots=True)
class FlowNode:
    name: str
    task: str
    role: str = ""
    tools: tuple[str, ...] = ()
    functions: tuple[FlowFunction, ...] = ()
    next_on: Mapping[str, str] = field(default_factory=dict)
    on_keypad: Mapping[str, str] = field(default_factory=dict)
    pre_actions: tuple[FlowAction, ...] = ()
    post_actions: tuple[FlowAction, ...] = ()
    context: str = "append"

    def targets(self) -> list[tuple[str, str]]:
        """(dotted key under the node, target node) of every transition."""
        out = [(f"functions.{f.name}.next", f.next) for f in self.functions if f.next]
        out += [(f"next_on.{k}", v) for k, v in self.next_on.items()]
        out += [(f"on_keypad.{k}", v) for k, v in self.on_keypad.items()]
        return out

    @property
    def exits(self) -> bool:
        return any(a.exits for a in (*self.pre_actions, *self.post_actions))


@dataclass(frozen=True, slots=True)
class FlowDef:
    start: str
    nodes: Mapping[str, FlowNode]
    role: str = ""
    max_transitions: int = 32
    fallback_line: str = ""  # "" -> DEFAULT_FALLBACK


DEFAULT_FALLBACK = "I'm sorry, I can't continue with this right now. Goodbye."


@dataclass(frozen=True, slots=True)
class FlowProblem:
    key: str  # dotted, under the agent file's root (``flow.nodes.book.tools``)
    message: str


# -- parsing ------------------------------------------------------------------------------


def _action(d: Mapping[str, Any]) -> FlowAction:
    return FlowAction(say=str(d.get("say", "")), end_call=bool(d.get("end_call", False)),
                      transfer=str(d.get("transfer", "")), tool=str(d.get("tool", "")),
                      args=dict(d.get("args", {})), warm_transfer=str(d.get("warm_transfer", "")),
                      reason=str(d.get("reason", "")))


def parse_flow(table: Mapping[str, Any]) -> FlowDef:
    """The ``[flow]`` table (already schema-valid) as a :class:`FlowDef`."""
    nodes: dict[str, FlowNode] = {}
    for name, n in dict(table.get("nodes", {})).items():
        fns = tuple(FlowFunction(str(f["name"]), str(f.get("description", "")), dict(f.get("parameters", {})),
                                 str(f.get("next", ""))) for f in n.get("functions", ()))
        nodes[name] = FlowNode(
            name=name, task=str(n.get("task", "")), role=str(n.get("role", "")), tools=tuple(n.get("tools", ())),
            functions=fns, next_on=dict(n.get("next_on", {})), on_keypad={str(k): str(v) for k, v in
                                                                          dict(n.get("on_keypad", {})).items()},
            pre_actions=tuple(_action(a) for a in n.get("pre_actions", ())),
            post_actions=tuple(_action(a) for a in n.get("post_actions", ())),
            context=str(n.get("context", "append")))
    return FlowDef(start=str(table.get("start", "")), nodes=nodes, role=str(table.get("role", "")),
                   max_transitions=int(table.get("max_transitions", 32)),
                   fallback_line=str(table.get("fallback_line", DEFAULT_FALLBACK)))


# -- checking -----------------------------------------------------------------------------


def check_flow(flow: FlowDef, tools: Iterable[str]) -> list[FlowProblem]:
    """Every problem of ``flow``; ``tools`` are the names the agent's registry provides."""
    known_tools = set(tools)
    out: list[FlowProblem] = []
    nodes = flow.nodes
    if not nodes:
        return [FlowProblem("flow.nodes", "a flow needs at least one node")]
    if flow.start not in nodes:
        out.append(FlowProblem("flow.start", f"unknown node {flow.start!r} (nodes: {', '.join(sorted(nodes))})"))
    if flow.max_transitions < 1:
        out.append(FlowProblem("flow.max_transitions", "must be at least 1"))
    for name, n in nodes.items():
        where = f"flow.nodes.{name}"
        if not _NAME.match(name):
            out.append(FlowProblem(where, "a node name is 1-64 of A-Z a-z 0-9 _ -"))
        if not n.task.strip():
            out.append(FlowProblem(f"{where}.task", "a node needs a task prompt"))
        if n.context not in CONTEXT_STRATEGIES:
            out.append(FlowProblem(f"{where}.context", f"{n.context!r}: one of {', '.join(CONTEXT_STRATEGIES)}"))
        for key, target in n.targets():
            if target not in nodes:
                out.append(FlowProblem(f"{where}.{key}", f"unknown node {target!r}"))
        for i, t in enumerate(n.tools):
            if t not in known_tools:
                out.append(FlowProblem(f"{where}.tools", f"tool {t!r} (item {i + 1}) is not provided by the agent's "
                                                         "tools (list it in `tools` or a tool module)"))
        for k in n.next_on:
            if k not in n.tools:
                out.append(FlowProblem(f"{where}.next_on.{k}", f"{k!r} is not one of the node's tools"))
        fnames = [f.name for f in n.functions]
        for f in n.functions:
            if not _NAME.match(f.name):
                out.append(FlowProblem(f"{where}.functions", f"function name {f.name!r}: 1-64 of A-Z a-z 0-9 _ -"))
            if f.name in known_tools or f.name in n.tools or fnames.count(f.name) > 1:
                out.append(FlowProblem(f"{where}.functions", f"function {f.name!r} clashes with a tool or another "
                                                             "function of the node"))
        for a in (*n.pre_actions, *n.post_actions):
            if sum(bool(x) for x in (a.say, a.end_call, a.transfer, a.warm_transfer, a.tool)) != 1:
                out.append(FlowProblem(f"{where}.actions", "an action is exactly one of say, end_call, transfer, "
                                                           "warm_transfer, tool"))
            if a.reason and not a.warm_transfer:
                out.append(FlowProblem(f"{where}.actions", "reason belongs to a warm_transfer action"))
            if a.tool and a.tool not in known_tools:
                out.append(FlowProblem(f"{where}.actions", f"action tool {a.tool!r} is not provided"))
            elif a.tool == CONFIRM_TOOL_NAME:
                out.append(FlowProblem(f"{where}.actions", f"{CONFIRM_TOOL_NAME!r} confirms the model's requests; "
                                                           "an action is never gated, call the tool itself"))
    if out:
        return out
    seen_fn: dict[str, str] = {}
    for name, n in nodes.items():
        for f in n.functions:
            if f.name in seen_fn and seen_fn[f.name] != name:
                out.append(FlowProblem(f"flow.nodes.{name}.functions", f"function {f.name!r} is also a function of "
                                       f"node {seen_fn[f.name]!r}: a function name is unique in the flow"))
            seen_fn.setdefault(f.name, name)
        for a in (*n.pre_actions, *n.post_actions):
            need = ("end_call" if a.end_call else "transfer_call" if a.transfer else
                    "warm_transfer" if a.warm_transfer else "")
            if need and need not in known_tools:
                out.append(FlowProblem(f"flow.nodes.{name}.actions", f"the action needs the built-in {need!r} in "
                                                                      "the agent's tools"))
    if out:
        return out
    reach = _reachable(flow, flow.start)
    for name in nodes:
        if name not in reach:
            out.append(FlowProblem(f"flow.nodes.{name}", f"unreachable: no transition from {flow.start!r} leads here"))
    trapped = [n for n in _order(flow, flow.start) if not any(nodes[m].exits for m in _reachable(flow, n))]
    if trapped:
        out.append(FlowProblem(f"flow.nodes.{trapped[0]}", "a transition loop without an exit: from "
                               f"{', '.join(trapped)} no node that ends the call or transfers can be reached"))
    return out


def _order(flow: FlowDef, start: str) -> list[str]:
    """The nodes reachable from ``start``, breadth first (problems name the nearest first)."""
    seen = [start]
    i = 0
    while i < len(seen):
        for _, t in flow.nodes[seen[i]].targets():
            if t not in seen:
                seen.append(t)
        i += 1
    return seen


def _reachable(flow: FlowDef, start: str) -> set[str]:
    return set(_order(flow, start))
