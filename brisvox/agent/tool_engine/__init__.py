"""The tool engine of one phone call (docs/TOOLS.md).

One :class:`ToolEngine` per call plans, admits, runs and records the tool calls
of the model's responses. Its parts, in the order a response meets them:

* :mod:`.planning`: validation of a response's calls in one synchronous step
  (nothing runs), speculation's held SideEffect calls, and admission (stale
  turns, the per-turn retry budget).
* :mod:`.running`: one run of the admitted calls: parallel, results in issue
  order, the ReadOnly path (cancellation, timeouts, panics).
* :mod:`.side_effects`: SideEffect runs: at most once per idempotency key, on
  their own task, the idempotency store, orphans and regeneration, repeats in a
  turn (``already_done``), the confirmation gate.
* :mod:`.delivery`: the answers reaching the context: the :class:`Execution`
  and its Delivery guard, late notes and the mailbox (each SideEffect result
  reaches the model exactly once).
* :mod:`.engine`: the :class:`ToolEngine` facade (entry points, queries,
  lifecycle) that composes the parts.
* :mod:`.state` (plan items, flights, shared state, the trace), :mod:`.scope`
  (a call's deadline and cancellation) and :mod:`.config` (limits, the texts
  the model reads).

What the engine works with, outside the per-call engine itself:

* :mod:`.registry` (tool specs, the per-call registry, what a tool receives),
  :mod:`.schema` and :mod:`.fastschema` (argument schemas, compiled once),
  :mod:`.builtin` (the telephony tools) and :mod:`.loader` (an agent's tools
  resolved into a call's registry);
* :mod:`.errors` (the error results the model reads), :mod:`.events` (outcomes,
  settle events, counters), :mod:`.confirm` (the confirmation gate),
  :mod:`.idempotency` and :mod:`.recent` (SideEffect memory), :mod:`.filler`
  (the "one moment" policy).

The invariants ("never twice") are stated in the module that owns each. The
package imports nothing itself (the context imports :mod:`.errors`, and the
engine imports the context): import each name from its module.
"""
