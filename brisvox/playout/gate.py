"""PlayoutGate: the gateway-side playout machine of one call (pure: no I/O, no clock).

Owns what may be released from the call's ``out`` ring and what the agent is
told about it: the epoch ledger (the newest cleared epoch, the gate that stays
closed after a Clear until an utterance of a newer epoch starts, the position
below which everything is stale), the utterance starts (OutUtterance), the
Pause hold, the marks (pending, sent to a peer that echoes them, swallowed
after a Clear), the release position and its reports, and the talkspurt facts
the lazy Clear needs.

Two faces:

* the command plane, :meth:`PlayoutGate.handle`: ``ClearIn``, ``PauseIn``,
  ``ResumeIn``, ``UtteranceIn``, ``MarkIn``, ``EchoIn`` -> a list of actions
  (``CutRing``, ``StopSpurt``, ``ClearTransport``, ``SendCleared``,
  ``ForgetAnnouncement``, ``StartUtterance``, ``Hold``, ``Kick``,
  ``SendMark``, ``MarkPlayed``, ``Count``) that the caller executes in order;
* the release path the pacer runs every frame: :meth:`hold` (is the call
  held by a Pause; a hold older than ``pause_max_s`` ends by itself),
  :meth:`releasable_from` (where release may go on from, or closed),
  :meth:`released` (the new release position; the marks it passed, as
  actions), :meth:`spurt_start` / :meth:`spurt_end`, :meth:`report`.

Invariants:

* After Clear(E) nothing is released before the start of an utterance of an
  epoch > E, and everything between the release position and that start is
  stale. The ring is cut at the reader's position (or at the newer
  utterance's start when it is already known, never past the write
  position), never at the write position: the worker may already have
  written the newer epoch's first audio while its OutUtterance is still on
  the way.
* A Clear that finds the newer epoch already released (its OutUtterance
  overtook the Clear) stops nothing: no cut, no transport clear, no marks
  discarded. The same holds for a lazy Clear (a new response's) read after a
  talkspurt that started from a dry ring after the Clear was sent, before
  that response's OutUtterance arrived.
* Cleared always carries the release position at the moment the Clear was
  applied: exactly what was played (a held position after a Pause).
* Pause holds the release position (nothing cut, skipped or read); it ends
  with Resume, a Clear, or ``pause_max_s``. An utterance of a newer epoch does
  not end it: the agent sends the held epoch's Clear before the newer epoch's
  first audio, so that Clear is on its way (the worker's link may overtake
  it), and it must find the held position, not old audio released in
  between; for the same reason a Pause read after a newer epoch's
  utterance still holds. A Pause of a cleared epoch and a Resume of an epoch
  that is not held are ignored and counted.
* At most ``max_marks`` marks are pending per call; marks are released in
  position order; after a Clear, echoes of the marks it discarded are
  swallowed (they were reported in Cleared); the swallow set is bounded.
* ``release_pos`` only moves forward.

Counters that belong to the call (clears, marks, marks_played, ...) go to the
``counts`` object given at construction; process-wide ones come out as
``Count`` actions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

MAX_SWALLOW = 256
UTTERANCES_KEPT = 32


class GateCounts(Protocol):
    """Per-call counters the gate keeps (the gateway's CallStats has them)."""

    clears: int
    marks: int
    marks_played: int
    marks_cleared: int
    marks_refused: int


@dataclass(slots=True)
class Counts:
    """A plain :class:`GateCounts` (the simulator, tests)."""

    clears: int = 0
    marks: int = 0
    marks_played: int = 0
    marks_cleared: int = 0
    marks_refused: int = 0


@dataclass(slots=True)
class PendingMark:
    position: int
    name: str


# --- inputs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClearIn:
    """Clear(epoch): epochs <= ``epoch`` are dead. ``read_pos``/``write_pos``: the out ring's
    reader and write positions when the Clear is applied; ``sent_ns``: when the agent sent it
    (0: unknown); ``lazy``: a new response's Clear, not a barge-in's."""

    epoch: int
    read_pos: int
    write_pos: int
    sent_ns: int = 0
    lazy: bool = False


@dataclass(frozen=True, slots=True)
class PauseIn:
    epoch: int
    now: float


@dataclass(frozen=True, slots=True)
class ResumeIn:
    epoch: int


@dataclass(frozen=True, slots=True)
class UtteranceIn:
    """OutUtterance: an utterance of ``epoch`` starts at ``out_pos`` in the out ring."""

    epoch: int
    out_pos: int


@dataclass(frozen=True, slots=True)
class MarkIn:
    name: str
    position: int


@dataclass(frozen=True, slots=True)
class EchoIn:
    """A peer that echoes marks played ``name``."""

    name: str


GateInput = ClearIn | PauseIn | ResumeIn | UtteranceIn | MarkIn | EchoIn


# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CutRing:
    position: int


@dataclass(frozen=True, slots=True)
class StopSpurt:
    """A Clear cut the talkspurt: pacing state resets (no end-of-spurt to the leg)."""


@dataclass(frozen=True, slots=True)
class ClearTransport:
    """Tell the peer to drop what it buffered (Twilio ``clear``, stop RTP audio)."""


@dataclass(frozen=True, slots=True)
class SendCleared:
    """Answer the agent. ``cut``: the Clear cut something (its latency is worth measuring)."""

    epoch: int
    position: int
    marks: tuple[str, ...] = ()
    cut: bool = False


@dataclass(frozen=True, slots=True)
class ForgetAnnouncement:
    """The announced utterance will not play (the gate closed)."""


@dataclass(frozen=True, slots=True)
class StartUtterance:
    """An utterance of a live epoch may start: release its first frame now."""


@dataclass(frozen=True, slots=True)
class Hold:
    """A Pause holds the release; ``ended_spurt``: a talkspurt was playing and ends here."""

    ended_spurt: bool


@dataclass(frozen=True, slots=True)
class Kick:
    """Release what is due now (a resume, a mark already passed)."""


@dataclass(frozen=True, slots=True)
class SendMark:
    """Send the mark to a peer that echoes it (right after the frame that reached it)."""

    name: str


@dataclass(frozen=True, slots=True)
class MarkPlayed:
    name: str
    position: int


@dataclass(frozen=True, slots=True)
class Count:
    """Bump a process-wide counter."""

    name: str


Action = (CutRing | StopSpurt | ClearTransport | SendCleared | ForgetAnnouncement | StartUtterance
          | Hold | Kick | SendMark | MarkPlayed | Count)

FREE, HELD, EXPIRED = 0, 1, 2
_NONE: tuple[Action, ...] = ()


class PlayoutGate:
    """See the module docstring."""

    __slots__ = ("max_marks", "pause_max_s", "counts", "cleared_epoch", "open", "floor", "utterances",
                 "held", "marks", "marks_sent", "swallow", "release_pos", "reported_pos",
                 "released_since_report", "playing", "spurt_ns", "spurt_from_dry", "held_spurt",
                 "_handlers")

    def __init__(self, counts: GateCounts | None = None, *, max_marks: int = 64,
                 pause_max_s: float = 2.5) -> None:
        self.max_marks = max_marks
        self.pause_max_s = pause_max_s
        self.counts: GateCounts = counts if counts is not None else Counts()
        self.cleared_epoch = -1
        self.open = True  # False after a Clear until an utterance of a newer epoch starts
        self.floor = 0  # audio before this out position is stale
        self.utterances: deque[tuple[int, int]] = deque(maxlen=UTTERANCES_KEPT)  # (epoch, out_pos)
        self.held: tuple[int, float] | None = None  # (held epoch, when the Pause was applied)
        self.marks: deque[PendingMark] = deque()  # not yet released
        self.marks_sent: deque[PendingMark] = deque()  # sent to a peer that echoes, not yet echoed
        self.swallow: set[str] = set()  # echoes a Clear already reported
        self.release_pos = 0
        self.reported_pos = 0
        self.released_since_report = False
        # the current talkspurt: playing, when it started (ns) and whether from a dry ring
        self.playing = False
        self.spurt_ns = 0
        self.spurt_from_dry = True
        self.held_spurt = False  # a Pause ended the last talkspurt
        self._handlers = {ClearIn: self._clear, PauseIn: self._pause, ResumeIn: self._resume,
                          UtteranceIn: self._utterance, MarkIn: self._mark, EchoIn: self._echo}

    # -- the command plane ------------------------------------------------------------------

    def handle(self, inp: GateInput) -> list[Action]:
        return self._handlers[type(inp)](inp)  # type: ignore[operator]

    def _cleared(self, epoch: int, marks: tuple[str, ...] = (), cut: bool = False) -> SendCleared:
        self.reported_pos = self.release_pos
        self.released_since_report = False
        return SendCleared(epoch, self.release_pos, marks, cut)

    def _clear(self, c: ClearIn) -> list[Action]:
        if c.epoch <= self.cleared_epoch:
            return [Count("clears_repeated"), self._cleared(c.epoch)]
        self.cleared_epoch = c.epoch
        out: list[Action] = []
        if self.held is not None:
            self.held = None
            out.append(Count("pauses_cleared"))  # the hold ends in the cut, at the held position
        newer = [p for e, p in self.utterances if e > c.epoch]
        start = min(newer) if newer else -1
        if newer and self.release_pos > start:
            # the newer epoch already plays (its OutUtterance raced ahead of this Clear): nothing
            # of epochs <= epoch is left to stop; a transport clear would drop the new response
            self.floor = max(self.floor, start)
            self.counts.clears += 1
            out += [Count("clears_after_newer"), self._cleared(c.epoch)]
            return out
        if c.lazy and not newer and self.spurt_from_dry and c.sent_ns > 0 and self.spurt_ns > c.sent_ns:
            # the same race with the OutUtterance still on its way: the last talkspurt started
            # from a dry ring after this Clear was sent, so it is the new response's audio
            self.counts.clears += 1
            out += [Count("clears_after_newer"), self._cleared(c.epoch)]
            return out
        if newer:
            out.append(CutRing(min(c.write_pos, start)))
            self.open = True
            self.floor = max(self.floor, start)
        else:
            # hold what is not released yet: the next utterance's start decides what is stale
            out.append(CutRing(c.read_pos))
            self.open = False
        self.playing = False
        out += [StopSpurt(), ClearTransport()]
        cut = tuple(m.name for m in self.marks) + tuple(m.name for m in self.marks_sent)
        if self.marks_sent and len(self.swallow) < MAX_SWALLOW:
            self.swallow.update(m.name for m in self.marks_sent)
        self.marks.clear()
        self.marks_sent.clear()
        self.counts.clears += 1
        self.counts.marks_cleared += len(cut)
        out.append(self._cleared(c.epoch, cut, cut=True))
        out.append(StartUtterance() if self.open else ForgetAnnouncement())
        return out

    def _pause(self, p: PauseIn) -> list[Action]:
        if p.epoch <= self.cleared_epoch:
            return [Count("pauses_stale")]
        # (a Pause of an epoch older than an announced utterance still holds: that epoch's Clear
        # follows the Pause on the same link, and must find the held position)
        if self.held is not None:
            if p.epoch > self.held[0]:
                self.held = (p.epoch, self.held[1])
            return [Count("pauses_repeated")]
        self.held = (p.epoch, p.now)
        ended = self.playing
        if ended:  # the talkspurt ends here: not starved, so not an underrun later
            self.playing = False
            self.held_spurt = True
        return [Count("pauses"), Hold(ended)]

    def _resume(self, r: ResumeIn) -> list[Action]:
        if self.held is None or self.held[0] != r.epoch:
            return [Count("resumes_unpaused")]
        self.held = None
        return [Count("resumes"), Kick()]

    def _utterance(self, u: UtteranceIn) -> list[Action]:
        self.utterances.append((u.epoch, u.out_pos))
        if u.epoch <= self.cleared_epoch:
            return [Count("utterances_stale")]
        out: list[Action] = []
        if self.held is not None and u.epoch > self.held[0]:
            # a newer epoch exists, so the Clear of the held one is on its way (the agent sends
            # it before the newer epoch's first audio; only the two links can reorder them):
            # keep holding, so that the Clear finds exactly the held position
            out.append(Count("pauses_superseded"))
        if not self.open:
            self.open = True
            self.floor = max(self.floor, u.out_pos)
        out.append(StartUtterance())
        return out

    def _mark(self, m: MarkIn) -> list[Action]:
        if len(self.marks) + len(self.marks_sent) >= self.max_marks:
            self.counts.marks_refused += 1
            return [Count("marks_refused")]
        self.counts.marks += 1
        pm = PendingMark(m.position, m.name)
        marks = self.marks
        if not marks or marks[-1].position <= m.position:
            marks.append(pm)
        else:
            i = len(marks)
            while i > 0 and marks[i - 1].position > m.position:
                i -= 1
            marks.insert(i, pm)
        return [Kick()] if m.position <= self.release_pos else []

    def _echo(self, e: EchoIn) -> list[Action]:
        sent = self.marks_sent
        for i, m in enumerate(sent):
            if m.name == e.name:
                del sent[i]
                self.counts.marks_played += 1
                return [MarkPlayed(m.name, m.position)]
        if e.name in self.swallow:
            self.swallow.discard(e.name)
            return [Count("marks_echo_after_clear")]
        return [Count("marks_echo_unknown")]

    # -- the release path (the pacer, every frame) -------------------------------------------

    def hold(self, now: float) -> int:
        """FREE, HELD (release nothing, keep the position) or EXPIRED (the hold just ended)."""
        held = self.held
        if held is None:
            return FREE
        if now - held[1] < self.pause_max_s:
            return HELD
        self.held = None
        return EXPIRED

    def releasable_from(self, pos: int) -> int:
        """Where release may go on from a reader at ``pos``: ``pos`` itself, the gate's floor
        (everything before it is stale), or -1 while the gate is closed after a Clear."""
        if not self.open:
            return -1
        return self.floor if pos < self.floor else pos

    def released(self, pos: int, by_echo: bool) -> tuple[Action, ...] | list[Action]:
        """Audio up to ``pos`` left; returns the marks it passed (SendMark or MarkPlayed)."""
        if pos > self.release_pos:
            self.release_pos = pos
        self.released_since_report = True
        if self.marks and self.marks[0].position <= self.release_pos:
            return self.due_marks(by_echo)
        return _NONE

    def due_marks(self, by_echo: bool) -> tuple[Action, ...] | list[Action]:
        """The pending marks at or below the release position, in position order."""
        pos = self.release_pos
        marks = self.marks
        if not marks or marks[0].position > pos:
            return _NONE
        out: list[Action] = []
        while marks and marks[0].position <= pos:
            m = marks.popleft()
            if by_echo:
                self.marks_sent.append(m)
                out.append(SendMark(m.name))
            else:
                self.counts.marks_played += 1
                out.append(MarkPlayed(m.name, m.position))
        return out

    def spurt_start(self, ns: int) -> None:
        """A talkspurt starts now (``ns``: a monotonic timestamp)."""
        self.playing = True
        self.spurt_ns = ns
        self.spurt_from_dry = not self.held_spurt
        self.held_spurt = False

    def spurt_end(self) -> None:
        """The ring ran dry: the talkspurt ends."""
        self.playing = False

    def report(self) -> int | None:
        """The release position to report, if anything was released since the last report."""
        if not self.released_since_report:
            return None
        self.reported_pos = self.release_pos
        self.released_since_report = False
        return self.release_pos
