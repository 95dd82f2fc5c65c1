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

The invariants ("never twice") are stated in the module that owns each.
"""

from brisvox.agent.tool_engine.config import MAILBOX_CAPACITY, TRUNCATION_MARKER, EngineConfig
from brisvox.agent.tool_engine.delivery import Execution
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.planning import Speculation

__all__ = ["MAILBOX_CAPACITY", "TRUNCATION_MARKER", "EngineConfig", "Execution", "Speculation", "ToolEngine"]
