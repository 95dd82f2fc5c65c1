"""The turn driver's side of speculative generation: when a candidate end of turn is offered.

Owns :class:`CandidateOffers`, the bookkeeping the
:class:`~brisvox.agent.pipeline.cascade.turn_driver.TurnDriver` consults at its few hook points
(its ``_spec_*`` methods) and the :class:`~brisvox.agent.pipeline.stage.pipeline_frames.SpeculationCandidate`
frames it sends downstream to the runner. Pure: no I/O, no clock of its own (the
driver passes ``now``); the rule itself (what counts as equal text) is
:func:`brisvox.agent.pipeline.speculation.policy.normalize`.

Candidates:

* At the UtteranceFinal of a stop, when the machine is paused in the open turn and no
  other stop of the turn is owed: the turn's final text.
* With ``on_partial``, at the VAD stop that paused the machine: the final segments heard
  so far, else the latest interim. With ``partial_stable_for`` > 0 (the stable-partial
  gate) that partial is held (:meth:`CandidateOffers.hold`) until the caller stayed
  silent and the text unchanged for that long: an interim that changes the text restarts
  the wait, a resume or the stop's own final cancels it (a final is the STT's own stable
  text and is never held), so a caller who keeps talking costs no request.

Rules: equal (normalised) text is not offered again while it stands; ``max_per_turn``
bounds the requests a stuttering transcript can cost (refusals counted ``capped``); a
resume (VadStart), or a gate release with no text, withdraws the standing candidate (an
empty SpeculationCandidate). With the adaptive policy a complete verdict ends the turn
at the final itself (the machine is no longer paused), so the final adds nothing there
and costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from brisvox.agent.pipeline.speculation.policy import OfferStats, SpeculationConfig, normalize
from brisvox.agent.pipeline.stage.pipeline_frames import SpeculationCandidate


@dataclass(slots=True)
class _Gate:
    epoch: int
    text: str
    deadline: float


class CandidateOffers:
    """Per call: the standing candidate of the open turn, the per-turn count, the gate."""

    __slots__ = ("cfg", "st", "_epoch", "_count", "_standing", "gate")

    def __init__(self, cfg: SpeculationConfig) -> None:
        self.cfg = cfg
        self.st = OfferStats()
        self._epoch = 0
        self._count = 0
        self._standing: str | None = None  # normalised text of the standing candidate
        self.gate: _Gate | None = None

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    @property
    def on_partial(self) -> bool:
        return self.cfg.enabled and self.cfg.on_partial

    @property
    def deadline(self) -> float | None:
        return self.gate.deadline if self.gate is not None else None

    def offer(self, epoch: int, text: str) -> SpeculationCandidate | None:
        """The frame to send for this candidate, or None (off, empty, standing, capped)."""
        text = text.strip()
        if not self.cfg.enabled or not text:
            return None
        if epoch != self._epoch:
            self._epoch, self._count, self._standing = epoch, 0, None
        norm = normalize(text)
        if norm == self._standing:
            return None
        if self._count >= self.cfg.max_per_turn:
            self.st.capped += 1
            return None
        self._count += 1
        self._standing = norm
        self.st.offered += 1
        return SpeculationCandidate(epoch, text)

    def withdraw(self) -> SpeculationCandidate | None:
        """The caller resumed: the withdrawal to send, if a candidate stands."""
        self.gate = None
        if self._standing is None:
            return None
        self._standing = None
        self.st.withdrawn += 1
        return SpeculationCandidate(self._epoch, "")

    def end_turn(self) -> None:
        """The turn ended (its UserTurnEnded carries the text) or was cut: nothing stands."""
        self._standing = None
        self.gate = None

    # -- the stable-partial gate -------------------------------------------------------
    def hold(self, epoch: int, text: str, now: float) -> None:
        self.gate = _Gate(epoch, text, now + self.cfg.partial_stable_for)

    def changed(self, text: str, now: float) -> None:
        """An interim while the gate waits: a different text restarts the wait."""
        g = self.gate
        if g is not None and text != g.text:
            g.text = text
            g.deadline = now + self.cfg.partial_stable_for

    def due(self, now: float) -> _Gate | None:
        g = self.gate
        if g is None or now < g.deadline:
            return None
        self.gate = None
        return g

    def stats(self) -> dict[str, int]:
        return {"speculations_offered": self.st.offered, "speculations_withdrawn": self.st.withdrawn,
                "speculations_capped": self.st.capped}
