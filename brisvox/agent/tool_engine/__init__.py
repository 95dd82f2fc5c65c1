"""The tool engine of one phone call (docs/TOOLS.md).

One :class:`ToolEngine` per call plans, admits, runs and records the tool calls
of the model's responses. It holds its parts, in the order a response meets them:

* :mod:`.planning`: the :class:`Planner`, validation of a response's calls in
  one synchronous, pure step (nothing runs), with speculation's held
  SideEffect calls (the :class:`Speculation`).
* :mod:`.admission`: the :class:`TurnBudget`, admission (stale turns, the
  per-turn retry budget).
* :mod:`.running`: the :class:`Runner`, one run of the admitted calls:
  parallel, results in issue order, the ReadOnly path (cancellation,
  timeouts, panics).
* :mod:`.side_effects`: :class:`SideEffects`, SideEffect runs: at most once
  per idempotency key, on their own task, orphans and regeneration, repeats
  in a turn (``already_done``), the confirmation gate.
* :mod:`.delivery`: the answers reaching the context: the :class:`Execution`
  and its Delivery guard, late notes and the mailbox (:class:`Delivery`: each
  SideEffect result reaches the model exactly once).
* :mod:`.engine`: the :class:`ToolEngine` (entry points, queries, lifecycle,
  the state the parts share) that builds and holds the parts.
* :mod:`.state` (plan items, flights), :mod:`.trace` (the settle events),
  :mod:`.scope` (a call's deadline and cancellation) and :mod:`.config`
  (limits, the texts the model reads).

What the engine works with, outside the per-call engine itself:

* :mod:`.registry` (tool specs, the per-call registry, what a tool receives),
  :mod:`.schema` and :mod:`.fastschema` (argument schemas, compiled once),
  :mod:`.builtin` (the telephony tools) and :mod:`.loader` (an agent's tools
  resolved into a call's registry);
* :mod:`.events` (outcomes, settle events, counters), :mod:`.confirm` (the
  confirmation gate), :mod:`.idempotency` and :mod:`.recent` (SideEffect
  memory), :mod:`.filler` (the "one moment" policy).

The invariants ("never twice") are stated in the module that owns each. The
package imports nothing itself: import each name from its module. It sits
above the conversation (:mod:`brisvox.agent.conversation`): it reads the
assembled calls, answers with the context's tool messages and writes the
error bodies of :mod:`brisvox.agent.conversation.tool_errors`; the
conversation imports nothing of it.
"""
