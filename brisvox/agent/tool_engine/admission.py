"""Admission of a planned round (step 2 of a run): stale turns, the retry budget.

Owns :class:`TurnBudget`, the engine's memory of turns: the newest turn
(epoch) it has seen and, per turn, the rounds with malformed calls. It answers
the items it refuses and returns whether the round is exhausted; the caller
traces the answers and runs the rest.

Invariants:

* A call of a turn older than the newest one is answered ``stale_turn`` and
  never runs; such a round spends no budget. A newer turn becomes the newest,
  with a fresh budget.
* A round with malformed calls spends one round of its turn's budget (a valid
  round refunds nothing); once a turn has spent more than
  ``max_invalid_rounds``, nothing runs for the rest of that turn
  (``budget_exhausted``, valid calls included). The budget is kept for the
  newest :data:`KEPT_TURNS` turns.
* A script's call (:meth:`TurnBudget.admit_script`) spends no budget and is
  refused only ``stale_turn``.
* A commit spends no budget: its held calls are answered ``stale_turn`` if
  their turn was superseded since, ``budget_exhausted`` if the turn's budget
  was spent since.
"""

from __future__ import annotations

from collections.abc import Sequence

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.tool_engine import events as ev
from brisvox.agent.tool_engine.config import D_BUDGET, D_STALE
from brisvox.agent.tool_engine.state import _Item

KEPT_TURNS = 16


class TurnBudget:
    """The newest turn and each kept turn's spent rounds (see the module doc)."""

    __slots__ = ("_max_invalid_rounds", "_newest", "_invalid")

    def __init__(self, max_invalid_rounds: int) -> None:
        self._max_invalid_rounds = max_invalid_rounds
        self._newest: int | None = None
        self._invalid: dict[int, int] = {}

    def invalid_rounds(self, epoch: int) -> int:
        return self._invalid.get(epoch, 0)

    def admit(self, items: Sequence[_Item], epoch: int, malformed: bool) -> bool:
        """Admit a planned round (execute, speculate); returns whether it is exhausted.
        Sets each item's ``retries``; refused items are answered and no longer held."""
        if self._newest is not None and epoch < self._newest:
            for it in items:
                it.held = False
                it.error(te.STALE_TURN, D_STALE, ev.STALE_TURN)
            return False
        if self._newest is None or epoch > self._newest:
            self._new_turn(epoch)
        before = self._invalid.get(epoch, 0)
        count = before + 1 if malformed else before
        self._invalid[epoch] = count
        exhausted = count > self._max_invalid_rounds
        for it in items:
            it.retries = before
            if exhausted:
                it.held = False
                it.error(te.BUDGET_EXHAUSTED, D_BUDGET, ev.BUDGET_EXHAUSTED)
        return exhausted

    def admit_script(self, items: Sequence[_Item], epoch: int) -> None:
        """Admit the operator's calls (a flow's action): ``stale_turn`` for a superseded
        turn, otherwise admitted whatever the model spent of the turn's budget."""
        if self._newest is not None and epoch < self._newest:
            for it in items:
                it.error(te.STALE_TURN, D_STALE, ev.STALE_TURN)
            return
        if self._newest is None or epoch > self._newest:
            self._new_turn(epoch)
        for it in items:
            it.retries = self._invalid.get(epoch, 0)

    def admit_held(self, held: Sequence[_Item], epoch: int) -> bool:
        """Admit a speculation's held calls at its commit (no budget spent); returns
        whether any was refused ``budget_exhausted``."""
        stale = self._newest is not None and epoch < self._newest
        if not stale and (self._newest is None or epoch > self._newest):
            self._new_turn(epoch)
        exhausted = False
        for it in held:
            it.retries = self._invalid.get(epoch, 0)
            if stale:
                it.error(te.STALE_TURN, D_STALE, ev.STALE_TURN)
            elif self._invalid.get(epoch, 0) > self._max_invalid_rounds:
                exhausted = True
                it.error(te.BUDGET_EXHAUSTED, D_BUDGET, ev.BUDGET_EXHAUSTED)
        return exhausted

    def _new_turn(self, epoch: int) -> None:
        self._newest = epoch
        self._invalid.setdefault(epoch, 0)
        while len(self._invalid) > KEPT_TURNS:
            del self._invalid[next(iter(self._invalid))]
