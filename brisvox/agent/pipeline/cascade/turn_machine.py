"""The turn machine: who is talking, when a user turn ends, when a barge-in is real.

A pure state machine of turns and barge-in: ``handle(input)`` returns a
list of actions and performs no I/O; the TurnDriver executes the actions.
It owns the turn epoch: every new user turn bumps it, and
``Interrupt(old, new)`` is returned only on a real barge-in (the bot was
answering or speaking), always BEFORE the ``StartUserTurn`` of the same
decision.

Phases: IDLE -> USER_SPEAKING <-> USER_PAUSED -> AWAITING_RESPONSE ->
BOT_SPEAKING -> IDLE, and CLOSED after Hangup. ``BotTurn`` (the agent's
greeting) goes IDLE -> AWAITING_RESPONSE with a new epoch and
``StartBotTurn``; the caller talking over it is a barge-in like any other.

End of turn: with a fixed policy, ``silence`` after the VAD stop; with Smart
Turn, a ``RequestAnalysis`` at the stop ends the turn on a complete verdict,
and ``fallback_silence`` ends it when the verdict is incomplete, late, stale
or missing. A verdict for an older pause (the user resumed) is ignored.

Early analysis (``early_analysis``, with Smart Turn): a ``VadFalling`` (the
VAD saw silence begin, before its stop window ran out) while USER_SPEAKING
starts the analysis at once (``RequestAnalysis(early=True)``, on the audio up
to the falling point) and keeps its verdict. The stop of the SAME fall reuses
it instead of asking again: same fall means nothing but that falling came
between (no VadStart, no newer falling, no phase change) and the stop's
``pos`` equals the falling's ``pos`` exactly (the worker announces in the
falling the ``pos`` its stop will carry; speech resumed in between moves the
stop's). A verdict already in decides at the stop; one still on its way
decides when it comes, as the stop's own would. Anything else discards the
early analysis (its verdict is then stale): one request per fall at most,
and never a verdict of another fall.

Barge-in guards (:class:`InterruptionConfig`): with OFF every VAD start while
the bot is active interrupts at once. With RECOMMENDED a start is a
*candidate*: ignored inside the echo window after the bot's first audio;
confirmed once it has lasted ``min_speech`` and its transcript holds a word
that is not a backchannel, or once it has lasted ``max_backchannel``;
vetoed when it stops with an empty or backchannel-only final; a short
candidate with a real word (a quick "stop") interrupts at its final.

Pause on candidate (``pause_on_candidate``, on in RECOMMENDED): what a person
does when talked over. The moment a candidate opens while the bot is active
(past the echo window), ``PauseOutput(epoch)`` holds the bot's audio at the
gateway (nothing is cut); the candidate then ends in exactly one of:
confirmed -> ``Interrupt`` (the driver's Clear cuts at the held position),
vetoed (backchannel-only or empty final) -> ``ResumeOutput(epoch)`` (the
answer plays on from the held word), the bot's turn ending by itself ->
``ResumeOutput`` then the plain new turn, or Hangup. So a backchannel
("uh-huh") costs the answer a short hold, never the answer, and a real
barge-in silences the bot at once even when the guard needs
``max_backchannel`` to confirm it (an STT without interims).

Keypad (an entry the driver aggregated): its own user turn, ended at once: a new epoch,
``StartUserTurn`` then ``EndUserTurn``, after an ``Interrupt`` (no guards: a key press is
deliberate) while the bot is active; an open spoken turn is left behind unanswered.

The call's media state (``Media``: the gateway's ``CallMedia``, "answered", "early" or
"held"): only an answered call converses. Leaving "answered" (a hold; a dialled call
starts in "early") cuts the bot at once: ``Interrupt`` to a new epoch while the bot is
active (the Clear cuts where the caller stopped hearing; no user turn follows), or
``DropUserTurn`` for an open user turn (its words go unanswered: the caller left); the
phase is IDLE. Until the call is answered again nothing opens a turn: a VAD start or a
keypad entry is ignored (``Note("media_muted")``), a VAD stop belongs to no one, the
greeting (``BotTurn``) waits. Back to "answered" only a greeting that waited starts
(``StartBotTurn``); after a hold the bot says nothing until the caller speaks.

Invariants: while the media is not "answered" no ``StartUserTurn``, ``StartBotTurn``,
``EndUserTurn`` or ``PauseOutput`` is returned; one timer slot (``ArmTimer`` replaces, ``CancelTimer`` clears);
``BotAudioStarted/Ended`` of another epoch are ignored; nothing but Hangup
is accepted after CLOSED; every ``VadStop`` returns exactly one ``OwnStop``
naming who the stop (and so its STT final) belongs to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

# --- configuration -------------------------------------------------------------------

DEFAULT_BACKCHANNELS = frozenset({
    "uh-huh", "uhhuh", "uh", "huh", "mhm", "mm", "mmm", "mm-hmm", "hmm", "um", "yeah", "yep",
    "yes", "ok", "okay", "right", "sure", "aha", "ah", "oh", "i", "see", "got", "it", "alright",
    "cool", "nice", "great", "evet", "tamam", "hı-hı", "hıhı",
})
_WORD = re.compile(r"[\w'-]+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class InterruptionConfig:
    """Barge-in guards. ``enabled`` False = OFF: every start interrupts at once."""

    enabled: bool = True
    min_speech: float = 0.3
    max_backchannel: float = 0.8
    echo_window: float = 0.25
    backchannels: frozenset[str] = DEFAULT_BACKCHANNELS
    pause_on_candidate: bool = True  # hold the bot's audio while a candidate is undecided

    @classmethod
    def off(cls) -> InterruptionConfig:
        return cls(enabled=False, min_speech=0.0, max_backchannel=0.0, echo_window=0.0, pause_on_candidate=False)

    @classmethod
    def recommended(cls) -> InterruptionConfig:
        return cls()

    def is_backchannel(self, text: str) -> bool:
        """True if ``text`` has words and every one is a backchannel."""
        words = _WORD.findall(text.lower())
        return bool(words) and all(w in self.backchannels for w in words)

    def has_real_word(self, text: str) -> bool:
        return any(w not in self.backchannels for w in _WORD.findall(text.lower()))


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """End-of-turn policy. ``smart_turn`` False: fixed ``silence``."""

    silence: float = 0.45
    smart_turn: bool = False
    fallback_silence: float = 1.5
    complete_threshold: float = 0.5
    early_analysis: bool = False  # with smart_turn: analyse at VadFalling, reuse the verdict at its stop
    interruption: InterruptionConfig = field(default_factory=InterruptionConfig)


# --- inputs --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VadStart:
    at: float


@dataclass(frozen=True, slots=True)
class VadStop:
    at: float
    pos: int = -1  # in16 position one past the last speech sample (-1: unknown, never the same fall)


@dataclass(frozen=True, slots=True)
class VadFalling:
    """Silence began at ``pos`` (time ``at``); the stop of this fall will carry ``pos``."""

    at: float
    pos: int


@dataclass(frozen=True, slots=True)
class SttInterim:
    text: str
    now: float


@dataclass(frozen=True, slots=True)
class SttFinal:
    """The joined final text of one stop; ``owner`` as returned by that stop's OwnStop."""

    text: str
    owner: str
    now: float


@dataclass(frozen=True, slots=True)
class Verdict:
    id: int
    probability: float | None  # None: the analysis failed
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class BotAudioStarted:
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class BotAudioEnded:
    epoch: int


@dataclass(frozen=True, slots=True)
class Hangup:
    pass


@dataclass(frozen=True, slots=True)
class BotTurn:
    """The bot speaks first (a greeting): only taken while IDLE."""

    at: float


@dataclass(frozen=True, slots=True)
class Keypad:
    at: float  # the caller's keypad entry ended (see the module docstring)


ANSWERED = "answered"  # ipc.frames.MEDIA_ANSWERED: the one media state in which the call converses


@dataclass(frozen=True, slots=True)
class Media:
    """The call's media state is now ``state`` (ipc.frames.CallMedia: "answered", "early", "held")."""

    state: str
    at: float


TurnInput = (VadStart | VadStop | VadFalling | SttInterim | SttFinal | Verdict | Tick | BotAudioStarted | BotAudioEnded | Hangup
             | BotTurn | Keypad | Media)


# --- actions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartUserTurn:
    epoch: int
    at: float
    from_candidate: bool = False  # the candidate's stops belong to this turn now


@dataclass(frozen=True, slots=True)
class Interrupt:
    old_epoch: int
    new_epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class RequestAnalysis:
    id: int
    at: float  # the stop (or, early, the falling) the analysis ends at
    early: bool = False  # at a VadFalling: the driver analyses up to the falling point


@dataclass(frozen=True, slots=True)
class ArmTimer:
    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    pass


@dataclass(frozen=True, slots=True)
class EndUserTurn:
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class OwnStop:
    """Who a VAD stop belongs to: "turn" (the open user turn), "candidate" (an
    undecided barge-in) or "none" (echo, vetoed backchannel, closed)."""

    owner: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something to count: stale_verdict, echo, vetoed, candidate, incomplete, ..."""

    kind: str


@dataclass(frozen=True, slots=True)
class StartBotTurn:
    """A bot-initiated response of ``epoch`` (the greeting) starts now."""

    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class PauseOutput:
    """Hold the bot's audio of ``epoch`` where it is (a candidate opened at ``at``)."""

    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class ResumeOutput:
    """Release the held audio of ``epoch`` again (the candidate was vetoed)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class DropUserTurn:
    """The open user turn of ``epoch`` ends unanswered (the call left "answered")."""

    epoch: int


Action = (StartUserTurn | Interrupt | RequestAnalysis | ArmTimer | CancelTimer | EndUserTurn | OwnStop | Note
          | StartBotTurn | PauseOutput | ResumeOutput | DropUserTurn)


class Phase(Enum):
    IDLE = "idle"
    USER_SPEAKING = "user_speaking"
    USER_PAUSED = "user_paused"
    AWAITING_RESPONSE = "awaiting_response"
    BOT_SPEAKING = "bot_speaking"
    CLOSED = "closed"


@dataclass(slots=True)
class _Early:
    """An early analysis of the fall that silenced at ``pos``: its verdict once ``done``."""

    id: int
    pos: int
    done: bool = False
    probability: float | None = None


@dataclass(slots=True)
class _Candidate:
    start: float
    speaking: bool = True
    stopped_at: float | None = None
    text: str = ""
    vetoed: bool = False


class TurnMachine:
    """See the module docstring. ``epoch`` is the current turn epoch (0 before any turn)."""

    __slots__ = ("cfg", "phase", "epoch", "deadline", "analysis_id", "pause_at", "bot_started_at", "_cand",
                 "paused", "_early", "media", "_greet_at")

    def __init__(self, cfg: TurnConfig | None = None) -> None:
        self.cfg = cfg or TurnConfig()
        self.phase = Phase.IDLE
        self.epoch = 0
        self.deadline: float | None = None
        self.analysis_id = 0
        self.pause_at = 0.0
        self.bot_started_at: float | None = None
        self._cand: _Candidate | None = None
        self.paused = 0  # the epoch whose output a PauseOutput holds (0: none)
        self._early: _Early | None = None  # the early analysis of the current fall (early_analysis)
        self.media = ANSWERED  # the call's media state (Media): it converses only when answered
        self._greet_at: float | None = None  # a greeting that waits for the answer

    @property
    def bot_active(self) -> bool:
        return self.phase in (Phase.AWAITING_RESPONSE, Phase.BOT_SPEAKING)

    @property
    def candidate_pending(self) -> bool:
        return self._cand is not None and not self._cand.vetoed

    def handle(self, inp: TurnInput) -> list[Action]:
        if self.phase is Phase.CLOSED:
            return []
        if isinstance(inp, Hangup):
            self.phase, self._cand, self.paused, self._early = Phase.CLOSED, None, 0, None
            return self._cancel_timer()
        if isinstance(inp, Media):
            return self._media(inp.state, inp.at)
        if self.media != ANSWERED and isinstance(inp, Keypad | VadStart | VadStop | VadFalling | BotTurn):
            return self._muted(inp)
        if isinstance(inp, Keypad):
            return self._keypad(inp.at)
        if isinstance(inp, VadStart):
            return self._vad_start(inp.at)
        if isinstance(inp, VadStop):
            return self._vad_stop(inp.at, inp.pos)
        if isinstance(inp, VadFalling):
            return self._falling(inp)
        if isinstance(inp, Tick):
            return self._tick(inp.now)
        if isinstance(inp, Verdict):
            return self._verdict(inp)
        if isinstance(inp, SttInterim):
            return self._interim(inp)
        if isinstance(inp, SttFinal):
            return self._final(inp)
        if isinstance(inp, BotAudioStarted):
            if inp.epoch == self.epoch and self.phase is Phase.AWAITING_RESPONSE:
                self.phase = Phase.BOT_SPEAKING
                self.bot_started_at = inp.at
            return []
        if isinstance(inp, BotAudioEnded):
            return self._bot_ended(inp.epoch)
        if isinstance(inp, BotTurn):
            if self.phase is not Phase.IDLE:
                return []  # the caller is already talking: no greeting
            self.epoch, self.phase, self.bot_started_at = self.epoch + 1, Phase.AWAITING_RESPONSE, None
            return [StartBotTurn(self.epoch, inp.at)]
        raise TypeError(f"unknown input {inp!r}")

    # -- the call's media state
    def _media(self, state: str, at: float) -> list[Action]:
        if state == self.media:
            return []
        self.media = state
        if state == ANSWERED:
            greet, self._greet_at = self._greet_at, None
            if greet is None or self.phase is not Phase.IDLE:
                return [Note("media_answered")]
            self.epoch, self.phase, self.bot_started_at = self.epoch + 1, Phase.AWAITING_RESPONSE, None
            return [Note("media_answered"), StartBotTurn(self.epoch, at)]
        acts: list[Action] = [Note("media_muted_call")]
        ph = self.phase
        self._cand, self.paused, self._early, self.bot_started_at = None, 0, None, None
        if self.bot_active:  # the Interrupt's Clear also ends a PauseOutput's hold
            old = self.epoch
            self.epoch += 1
            acts.append(Interrupt(old, self.epoch, at))
        elif ph in (Phase.USER_SPEAKING, Phase.USER_PAUSED):
            self.analysis_id += 1  # a verdict on its way is stale
            acts.append(DropUserTurn(self.epoch))
        self.phase = Phase.IDLE
        return acts + self._cancel_timer()

    def _muted(self, inp: TurnInput) -> list[Action]:
        """An input that would open or shape a turn while the call does not converse."""
        if isinstance(inp, BotTurn):
            self._greet_at = inp.at
            return []
        if isinstance(inp, VadStop):
            return [OwnStop("none")]
        if isinstance(inp, VadFalling):
            return []
        return [Note("media_muted")]

    # -- helpers
    def _arm(self, at: float) -> list[Action]:
        self.deadline = at
        return [ArmTimer(at)]

    def _cancel_timer(self) -> list[Action]:
        if self.deadline is None:
            return []
        self.deadline = None
        return [CancelTimer()]

    def _resume_output(self) -> list[Action]:
        if not self.paused:
            return []
        epoch, self.paused = self.paused, 0
        return [ResumeOutput(epoch)]

    def _pause(self, at: float, pos: int = -1) -> list[Action]:
        self.phase = Phase.USER_PAUSED
        self.pause_at = at
        if self.cfg.smart_turn:
            early = self._take_early(pos)
            if isinstance(early, _Early):
                return self._reuse_early(early, at)
            self.analysis_id += 1  # early: the Notes of an early analysis of another fall, discarded
            return [*early, RequestAnalysis(self.analysis_id, at), *self._arm(at + self.cfg.fallback_silence)]
        return self._arm(at + self.cfg.silence)

    def _new_turn(self, at: float) -> list[Action]:
        self.epoch, self.phase, self._cand, self.bot_started_at = self.epoch + 1, Phase.USER_SPEAKING, None, None
        return [StartUserTurn(self.epoch, at)]

    def _keypad(self, at: float) -> list[Action]:
        old, active, self._early, self.paused = self.epoch, self.bot_active, None, 0  # the Interrupt's Clear ends a hold
        acts: list[Action] = [Interrupt(old, old + 1, at)] if active else []
        acts += [*self._cancel_timer(), *self._new_turn(at)]
        self.phase = Phase.AWAITING_RESPONSE
        return [*acts, EndUserTurn(self.epoch, at)]

    def _barge_in(self, now: float) -> list[Action]:
        cand = self._cand
        old = self.epoch
        self.epoch += 1
        self._cand = None
        self.bot_started_at = None
        self.paused = 0  # the Interrupt's Clear ends the hold (cut at the held position)
        acts: list[Action] = [Interrupt(old, self.epoch, now)]
        acts += self._cancel_timer()
        if cand is None:
            self.phase = Phase.USER_SPEAKING
            acts.append(StartUserTurn(self.epoch, now))
            return acts
        acts.append(StartUserTurn(self.epoch, cand.start, from_candidate=True))
        if cand.speaking:
            self.phase = Phase.USER_SPEAKING
        else:
            acts += self._pause(cand.stopped_at if cand.stopped_at is not None else now)
        return acts

    # -- inputs
    def _vad_start(self, at: float) -> list[Action]:
        ph = self.phase
        if self._early is not None:  # speech again: the early analysis is of no stop now
            self._early = None
            return [Note("early_discarded"), *self._vad_start(at)]
        if ph is Phase.IDLE:
            return self._new_turn(at)
        if ph is Phase.USER_SPEAKING:
            return []
        if ph is Phase.USER_PAUSED:
            self.phase = Phase.USER_SPEAKING
            self.analysis_id += 1  # a verdict for the old pause is stale now
            return self._cancel_timer()
        # bot active
        icfg = self.cfg.interruption
        if not icfg.enabled:
            return self._barge_in(at)
        if (
            ph is Phase.BOT_SPEAKING
            and self.bot_started_at is not None
            and at < self.bot_started_at + icfg.echo_window
        ):
            return [Note("echo")]
        cand = self._cand
        if cand is not None and not cand.vetoed:
            cand.speaking = True
            cand.stopped_at = None
            return self._arm(max(at, cand.start + icfg.max_backchannel))
        self._cand = _Candidate(start=at)
        acts: list[Action] = []
        if icfg.pause_on_candidate and not self.paused:
            self.paused = self.epoch
            acts.append(PauseOutput(self.epoch, at))
        acts.append(Note("candidate"))
        return acts + self._arm(at + icfg.max_backchannel)

    def _vad_stop(self, at: float, pos: int = -1) -> list[Action]:
        ph = self.phase
        if ph is Phase.USER_SPEAKING:
            return [OwnStop("turn"), *self._pause(at, pos)]
        if ph in (Phase.AWAITING_RESPONSE, Phase.BOT_SPEAKING):
            cand = self._cand
            if cand is not None and not cand.vetoed and cand.speaking:
                cand.speaking = False
                cand.stopped_at = at
                # decided by its final (a short candidate), no timer needed meanwhile
                return [OwnStop("candidate"), *self._cancel_timer()]
            if cand is not None and cand.vetoed:
                self._cand = None
        return [OwnStop("none")]

    def _tick(self, now: float) -> list[Action]:
        if self.deadline is None or now < self.deadline:
            return []
        self.deadline = None
        ph = self.phase
        if ph is Phase.USER_PAUSED:
            self.phase = Phase.AWAITING_RESPONSE
            return [EndUserTurn(self.epoch, now)]
        cand = self._cand
        if self.bot_active and cand is not None and not cand.vetoed and cand.speaking:
            # lasted max_backchannel: no backchannel is this long
            return self._barge_in(now)
        return []

    def wants_verdict(self, vid: int) -> bool:
        """Would a verdict of analysis ``vid`` still be used (kept for the stop of its fall, or
        deciding the current pause)? False: it would be stale (the caller resumed, the turn
        ended without it, a newer analysis replaced it): running it can change nothing.
        The same conditions as the verdict's handling, so the two cannot disagree."""
        e = self._early
        if e is not None and vid == e.id and not e.done:
            return True
        return vid == self.analysis_id and self.phase is Phase.USER_PAUSED

    def _verdict(self, v: Verdict) -> list[Action]:
        if not self.wants_verdict(v.id):
            return [Note("stale_verdict")]
        e = self._early
        if e is not None and v.id == e.id:  # early: kept for the stop of this fall
            e.done = True
            e.probability = v.probability
            return [Note("early_verdict")]
        return self._decide(v.probability, v.now)

    def _decide(self, probability: float | None, now: float) -> list[Action]:
        """The verdict of the current pause (its own, or the reused early one)."""
        if probability is None:
            return [Note("verdict_failed")]
        if probability >= self.cfg.complete_threshold:
            self.phase = Phase.AWAITING_RESPONSE
            return [*self._cancel_timer(), EndUserTurn(self.epoch, now)]
        return [Note("incomplete")]

    # -- early analysis (VadFalling; early_analysis) ----------------------------------
    @property
    def early_id(self) -> int:
        """The analysis id of the pending early analysis (0: none)."""
        return self._early.id if self._early is not None else 0

    def _falling(self, f: VadFalling) -> list[Action]:
        if not (self.cfg.smart_turn and self.cfg.early_analysis) or self.phase is not Phase.USER_SPEAKING:
            return []
        e = self._early
        if e is not None and e.pos == f.pos:
            return []  # the same fall announced again: one analysis per fall
        acts: list[Action] = [Note("early_discarded")] if e is not None else []
        self.analysis_id += 1
        self._early = _Early(self.analysis_id, f.pos)
        return [*acts, Note("early_analysis"), RequestAnalysis(self.analysis_id, f.at, early=True)]

    def _take_early(self, pos: int) -> _Early | list[Action]:
        """At a stop: the early analysis of the same fall (taken), or the Notes of
        discarding one of another fall ([] when there was none)."""
        e = self._early
        self._early = None
        if e is None:
            return []
        if pos >= 0 and pos == e.pos and e.id == self.analysis_id:
            return e
        return [Note("early_discarded")]

    def _reuse_early(self, e: _Early, at: float) -> list[Action]:
        """The stop of the fall ``e`` analysed: no new request. ``analysis_id`` is still
        ``e.id``, so a verdict still on its way is this pause's own."""
        acts: list[Action] = [Note("early_reused")]
        if e.done:
            decided = self._decide(e.probability, at)
            if self.phase is Phase.AWAITING_RESPONSE:
                return acts + decided
            acts += decided
        return acts + self._arm(at + self.cfg.fallback_silence)

    def _interim(self, i: SttInterim) -> list[Action]:
        cand = self._cand
        if not self.bot_active or cand is None or cand.vetoed:
            return []
        cand.text = i.text
        icfg = self.cfg.interruption
        if cand.speaking and i.now - cand.start >= icfg.min_speech and icfg.has_real_word(i.text):
            return self._barge_in(i.now)
        return []

    def _final(self, f: SttFinal) -> list[Action]:
        if f.owner != "candidate":
            return []
        cand = self._cand
        if not self.bot_active or cand is None or cand.vetoed:
            return []
        icfg = self.cfg.interruption
        text = f.text.strip()
        cand.text = (cand.text + " " + text).strip() if text else cand.text
        if text and icfg.has_real_word(text):
            return self._barge_in(f.now)
        if cand.speaking:
            return []
        # stopped, and its final is empty or only backchannels: vetoed
        self._cand = None
        return [Note("vetoed"), *self._resume_output()]

    def _bot_ended(self, epoch: int) -> list[Action]:
        if epoch != self.epoch or not self.bot_active:
            return []
        cand = self._cand
        self._cand = None
        self.bot_started_at = None
        acts = self._resume_output() + self._cancel_timer()
        if cand is None or cand.vetoed:
            self.phase = Phase.IDLE
            return acts
        # the bot stopped by itself while a candidate was pending: a plain new turn
        self.epoch += 1
        acts.append(StartUserTurn(self.epoch, cand.start, from_candidate=True))
        if cand.speaking:
            self.phase = Phase.USER_SPEAKING
        else:
            acts += self._pause(cand.stopped_at if cand.stopped_at is not None else cand.start)
        return acts
