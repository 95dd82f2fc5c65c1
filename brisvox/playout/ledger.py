"""EpochLedger: the agent-side playout machine of one call (pure: no I/O, no clock).

Owns what the agent has said about the bot's audio and what the gateway
answered: the newest epoch cleared FOR (every epoch below it is dead), the
epoch a Pause holds, the final release position of each cleared epoch
(Cleared), and the release floor (the newest Playback position).

Inputs and the actions they return:

* :meth:`clear_for` (a barge-in decision, or a new response's first audio:
  ``lazy``) -> ``SendClear`` to the gateway and ``SendTtsCut`` to the worker,
  only for an epoch above every earlier one (Clear is idempotent per epoch).
  On the wire a Clear/TtsCut names the newest DEAD epoch: ``epoch - 1``.
* :meth:`pause` / :meth:`resume` (a barge-in candidate holds the bot's audio
  of a live epoch, and releases it) -> ``SendPause`` / ``SendResume``; a
  Pause of a dead epoch, a second Pause of the held epoch and a Resume of an
  epoch that is not held send nothing (counted). A Clear ends the hold.
* :meth:`cleared` (the gateway's Cleared) -> whether it is the first answer
  for that epoch; its position is that epoch's final release position.
* :meth:`release` (the gateway's Playback) -> the new release floor, or None
  for a report that does not move it (the floor never goes backwards).

Invariants: ``epoch`` only grows; ``held`` is 0 or a live epoch; each
cleared epoch has at most one final position, the first reported; the
release floor is monotone. Memory is bounded (``MAX_FINALS`` finals kept).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_FINALS = 64


@dataclass(frozen=True, slots=True)
class SendClear:
    dead: int  # the newest dead epoch
    sent_ns: int
    lazy: bool


@dataclass(frozen=True, slots=True)
class SendTtsCut:
    dead: int
    tts_pos: int


@dataclass(frozen=True, slots=True)
class SendPause:
    epoch: int
    sent_ns: int


@dataclass(frozen=True, slots=True)
class SendResume:
    epoch: int
    sent_ns: int


LedgerAction = SendClear | SendTtsCut | SendPause | SendResume


@dataclass(slots=True)
class LedgerStats:
    clears: int = 0
    pauses: int = 0
    resumes: int = 0
    pauses_ignored: int = 0
    resumes_ignored: int = 0
    cleared: int = 0
    cleared_repeated: int = 0
    releases_stale: int = 0


class EpochLedger:
    """See the module docstring."""

    __slots__ = ("epoch", "held", "finals", "release_floor", "st")

    def __init__(self) -> None:
        self.epoch = 0  # the newest epoch cleared for: every epoch below it is dead
        self.held = 0  # the epoch a Pause holds (0: none)
        self.finals: dict[int, int] = {}  # dead epoch -> its final release position (Cleared)
        self.release_floor = 0
        self.st = LedgerStats()

    @property
    def sent(self) -> int:
        """Clears sent."""
        return self.st.clears

    def clear_for(self, epoch: int, tts_pos: int, now_ns: int, lazy: bool = False) -> list[LedgerAction]:
        if epoch <= self.epoch:
            return []
        self.epoch = epoch
        self.held = 0  # the Clear ends any hold (at the held position, at the gateway)
        self.st.clears += 1
        return [SendClear(epoch - 1, now_ns, lazy), SendTtsCut(epoch - 1, tts_pos)]

    def pause(self, epoch: int, now_ns: int) -> list[LedgerAction]:
        if epoch < self.epoch or epoch == self.held:
            self.st.pauses_ignored += 1
            return []
        self.held = epoch
        self.st.pauses += 1
        return [SendPause(epoch, now_ns)]

    def resume(self, epoch: int, now_ns: int) -> list[LedgerAction]:
        if self.held == 0 or epoch != self.held:
            self.st.resumes_ignored += 1
            return []
        self.held = 0
        self.st.resumes += 1
        return [SendResume(epoch, now_ns)]

    def cleared(self, dead: int, position: int) -> bool:
        """The gateway's Cleared for ``dead`` (the newest dead epoch) at ``position``."""
        if dead in self.finals:
            self.st.cleared_repeated += 1
            return False
        if len(self.finals) >= MAX_FINALS:
            del self.finals[min(self.finals)]
        self.finals[dead] = position
        self.st.cleared += 1
        return True

    def release(self, position: int) -> int | None:
        """A Playback report: the new release floor, or None when it does not move forward."""
        if position < self.release_floor:
            self.st.releases_stale += 1
            return None
        self.release_floor = position
        return position
