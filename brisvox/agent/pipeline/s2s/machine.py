"""The S2S machine: epochs, barge-in and turn ends of a speech-to-speech call.

A pure state machine (the house model of :mod:`.turn_machine`): ``handle(input)``
returns actions; the S2S stage (:mod:`.s2s_stage`) does every I/O. Inputs are
brisvox's VAD events, the Smart Turn verdict, the bot's playout reports, the
tool phase's end, a timer, and the provider's events themselves
(:mod:`brisvox.providers.s2s.base`).

Epochs (the machine is the call's sole epoch authority, as the turn driver is
in the cascaded chain):

* A response the provider starts opens a NEW bot epoch, unless it continues a
  tool phase of the current epoch (the stage sent the results and asked for
  it): then it shares the epoch, so one user turn's tool chain is one epoch.
* A barge-in makes every epoch up to the current one dead (``floor`` =
  current + 1); the next response gets the floor. Audio, transcripts and tool
  calls of a response whose epoch is below the floor are dropped and counted
  (``stale_audio``, ``stale_events``): a provider that sends audio after a
  cancel never reaches the wire.
* ``EndBotTurn(epoch)`` once per epoch: when a response ends (completed,
  cancelled, failed) and no tool phase continues it.

Barge-in (``InterruptionConfig`` of the cascaded machine, its echo window and
``max_backchannel``; no local transcript exists, so no word check):

* The bot is *active* from its first audio of an epoch (``BotStarted``) until
  that epoch's playout ended (``BotEnded``), or while a response streams.
* brisvox's VAD start while active (past the echo window) is a candidate:
  ``Pause`` at once (the caller hears the bot stop as in the cascaded
  pipeline); confirmed when the speech lasts ``max_backchannel`` or the
  provider reports speech (``S2sSpeechStarted`` / ``S2sInterrupted``):
  ``BargeIn``; vetoed by a VAD stop before that: ``Resume``.
* The provider's own speech start or interruption while active is a barge-in
  at once (its model already stopped).
* ``BargeIn`` carries the response to cancel (the one streaming, if any).

Turn ends (``brisvox`` turn detection only; with ``provider`` the provider
decides): a VAD stop asks for a verdict (``AskVerdict``) when Smart Turn is
on, else ends the turn after ``silence``; a complete verdict ends it at once,
an incomplete one after ``incomplete_wait`` more silence; a VAD start before
that continues the turn. ``CommitTurn`` is emitted once per user turn.

The call's media state (``Media``: the gateway's ``CallMedia``): only an answered call
converses. Leaving "answered" (a hold) cuts the bot as a barge-in does (``BargeIn`` with
``by`` "media": the response cancelled, the Clear cuts where the caller stopped hearing)
and drops a candidate or an open user turn; until it is answered again brisvox's VAD and
the provider's speech events open nothing, and a response the provider starts anyway is
cut at once (nothing is played while held). Back to "answered" the machine says nothing.

Invariants: one timer slot (``deadline``); nothing but ``Closed`` is
accepted after closing; every epoch number is above every earlier one; while the media
is not "answered" no ``UserStarted``, ``CommitTurn``, ``Pause`` or ``Play`` is returned.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from brisvox.agent.pipeline.cascade.turn_machine import (  # the same VAD and media inputs
    ANSWERED,
    InterruptionConfig,
    Media,
    VadStart,
    VadStop,
)
from brisvox.providers.s2s import base as s2

# --- configuration ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class S2sTurnConfig:
    turn_detection: s2.TurnDetection = "provider"
    smart_turn: bool = True  # brisvox mode: ask Smart Turn at a VAD stop
    silence: float = 0.45  # brisvox mode without Smart Turn: silence that ends the turn
    incomplete_wait: float = 1.2  # brisvox mode: more silence after an incomplete verdict
    verdict_timeout: float = 0.5  # a verdict that does not come: decide as if complete
    interruption: InterruptionConfig = field(default_factory=InterruptionConfig)


# --- inputs ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    complete: bool | None  # None: no verdict (timeout, no worker)
    at: float


@dataclass(frozen=True, slots=True)
class BotStarted:
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class BotEnded:
    epoch: int


@dataclass(frozen=True, slots=True)
class ToolsDone:
    """The stage delivered the results of ``response_id``'s calls (``continued``: and
    asked for the response that continues the epoch)."""

    response_id: str
    continued: bool = True


@dataclass(frozen=True, slots=True)
class Timer:
    now: float


@dataclass(frozen=True, slots=True)
class SessionLost:
    """The provider session died (the stage reconnects or ends the call)."""

    at: float


Input = (VadStart | VadStop | Verdict | BotStarted | BotEnded | ToolsDone | Timer | SessionLost | Media
         | s2.S2sSpeechStarted | s2.S2sSpeechStopped | s2.S2sResponseStarted | s2.S2sAudio
         | s2.S2sOutputTranscript | s2.S2sToolCall | s2.S2sInterrupted | s2.S2sResponseDone)

# --- actions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pause:
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class Resume:
    epoch: int


@dataclass(frozen=True, slots=True)
class BargeIn:
    """``at``: the decision instant (-1: now, for a provider event)."""

    old_epoch: int
    new_epoch: int
    at: float
    cancel: str  # the response to cancel ("" when none streams)
    by: str  # "vad" | "provider" | "media" (the call left "answered": a hold)


@dataclass(frozen=True, slots=True)
class NewEpoch:
    """A response opened bot epoch ``epoch`` (round ``round`` of it)."""

    epoch: int
    round: int
    response_id: str


@dataclass(frozen=True, slots=True)
class Play:
    epoch: int
    round: int
    item_id: str
    pcm: bytes


@dataclass(frozen=True, slots=True)
class Said:
    epoch: int
    round: int
    item_id: str
    text: str


@dataclass(frozen=True, slots=True)
class RunTools:
    epoch: int
    round: int
    response_id: str
    calls: tuple[s2.S2sToolCall, ...]


@dataclass(frozen=True, slots=True)
class RoundEnded:
    """A response (round) of ``epoch`` ended: the stage puts its message in the context."""

    epoch: int
    round: int
    response_id: str
    status: str


@dataclass(frozen=True, slots=True)
class EndBotTurn:
    epoch: int


@dataclass(frozen=True, slots=True)
class SpeechBegan:
    """The caller began to speak (the confirmation gate hears of every start)."""

    at: float


@dataclass(frozen=True, slots=True)
class UserStarted:
    """brisvox mode: a user turn began (over an idle bot, or by a confirmed barge-in):
    tell the provider. A held candidate is not told until confirmed (Gemini's
    activityStart would stop the answer a backchannel must not stop)."""

    at: float


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """``provider`` mode: the provider heard the caller's turn end (the confirmation gate's user turn)."""


@dataclass(frozen=True, slots=True)
class AskVerdict:
    pos: int


@dataclass(frozen=True, slots=True)
class CommitTurn:
    at: float


@dataclass(frozen=True, slots=True)
class Count:
    what: str


Action = (Pause | Resume | BargeIn | NewEpoch | Play | Said | RunTools | RoundEnded | EndBotTurn | SpeechBegan
          | UserStarted | TurnEnded
          | AskVerdict | CommitTurn | Count)


@dataclass(slots=True)
class _Resp:
    epoch: int
    round: int
    calls: list[s2.S2sToolCall] = field(default_factory=list)
    done: bool = False


MAX_RESPONSES = 64  # responses remembered (their epochs), oldest forgotten first


class S2sMachine:
    def __init__(self, cfg: S2sTurnConfig) -> None:
        self.cfg = cfg
        self.epoch = 0  # the current bot epoch (0: none yet)
        self.floor = 0  # epochs below it are dead
        self.fresh = True  # the current epoch has no response yet
        self.rounds = 0  # responses of the current epoch so far
        self.continuing = False  # a tool phase of the current epoch asked for its continuation
        self.streaming: str = ""  # the response in flight
        self.active_epoch: int | None = None  # the epoch whose audio is playing (BotStarted..BotEnded)
        self.bot_started_at = 0.0
        self.ended: set[int] = set()
        self.speaking = False  # brisvox VAD: the caller is speaking
        self.candidate_at: float | None = None  # a barge-in candidate (held) since
        self.held_epoch: int | None = None
        self.turn_open = False  # brisvox mode: a user turn awaits its end
        self.stop_pos = 0
        self.awaiting_verdict = False
        self.deadline: float | None = None
        self.closed = False
        self.media = ANSWERED  # the call's media state (Media): it converses only when answered
        self._resp: OrderedDict[str, _Resp] = OrderedDict()

    # -- queries ---------------------------------------------------------------------------
    @property
    def bot_active(self) -> bool:
        return bool(self.streaming) or self.active_epoch is not None

    def epoch_of(self, response_id: str) -> int | None:
        r = self._resp.get(response_id)
        return None if r is None else r.epoch

    # -- the one entry point -----------------------------------------------------------------
    def handle(self, i: Input) -> list[Action]:
        if self.closed:
            return []
        if isinstance(i, Media):
            return self._media(i.state, i.at)
        if self.media != ANSWERED:
            muted = self._muted(i)
            if muted is not None:
                return muted
        match i:
            case VadStart():
                return self._vad_start(i.at)
            case VadStop():
                return self._vad_stop(i.at, i.pos)
            case Verdict():
                return self._verdict(i.complete, i.at)
            case Timer():
                return self._timer(i.now)
            case BotStarted():
                if i.epoch >= self.floor and i.epoch == self.epoch:
                    self.active_epoch = i.epoch
                    self.bot_started_at = i.at
                return []
            case BotEnded():
                if i.epoch == self.active_epoch:
                    self.active_epoch = None
                    return self._drop_candidate()
                return []
            case ToolsDone():
                r = self._resp.get(i.response_id)
                if r is not None and r.epoch == self.epoch and r.epoch >= self.floor and i.continued:
                    self.continuing = True
                    return []
                return self._end_epoch_if_idle(r.epoch if r is not None else None)
            case SessionLost():
                return self._session_lost()
            case s2.S2sSpeechStarted() | s2.S2sInterrupted():
                return self._provider_speech(i)
            case s2.S2sSpeechStopped():
                return [TurnEnded()] if self.cfg.turn_detection == "provider" else []
            case s2.S2sResponseStarted():
                return self._response_started(i.response_id)
            case s2.S2sAudio():
                r = self._live(i.response_id)
                return [Count("stale_audio")] if r is None else [Play(r.epoch, r.round, i.item_id, i.pcm)]
            case s2.S2sOutputTranscript():
                r = self._live(i.response_id)
                return [Count("stale_events")] if r is None else [Said(r.epoch, r.round, i.item_id, i.text)]
            case s2.S2sToolCall():
                r = self._live(i.response_id)
                if r is None:
                    return [Count("stale_tool_calls")]
                if any(c.call_id == i.call_id for c in r.calls):
                    return [Count("duplicate_tool_calls")]
                r.calls.append(i)
                return []
            case s2.S2sResponseDone():
                return self._response_done(i.response_id, i.status)
        return []

    # -- provider responses ---------------------------------------------------------------
    def _response_started(self, rid: str) -> list[Action]:
        if rid in self._resp:
            return [Count("duplicate_responses")]
        out: list[Action] = []
        if self.continuing and self.epoch >= self.floor:
            self.continuing = False
            self.rounds += 1
        else:
            self.continuing = False
            if not self.fresh or self.epoch < self.floor or self.epoch == 0:
                prev = self.epoch
                self.epoch = max(self.epoch + 1, self.floor)
                if prev and prev not in self.ended and prev >= self.floor:
                    out.append(EndBotTurn(prev))  # a new turn overtook it: nothing more of it follows
                    self.ended.add(prev)
            self.fresh = False
            self.rounds = 0
        self._resp[rid] = _Resp(self.epoch, self.rounds)
        while len(self._resp) > MAX_RESPONSES:
            self._resp.popitem(last=False)
        self.streaming = rid
        out.append(NewEpoch(self.epoch, self.rounds, rid))
        return out

    def _live(self, rid: str) -> _Resp | None:
        r = self._resp.get(rid)
        if r is None or r.epoch < self.floor or r.done:
            return None
        return r

    def _response_done(self, rid: str, status: str) -> list[Action]:
        r = self._resp.get(rid)
        if self.streaming == rid:
            self.streaming = ""
        if r is None or r.done:
            return [Count("stale_events")]
        r.done = True
        if r.epoch < self.floor:
            return [Count("stale_events")]
        if r.calls and status == "completed":
            return [RunTools(r.epoch, r.round, rid, tuple(r.calls))]  # the tool phase puts the round in the context
        out: list[Action] = [RoundEnded(r.epoch, r.round, rid, status)]
        if r.calls:
            out.append(Count("tool_calls_of_unfinished_response"))
        return out + self._end_epoch_if_idle(r.epoch)

    def _end_epoch_if_idle(self, epoch: int | None) -> list[Action]:
        if epoch is None or epoch in self.ended or epoch < self.floor or self.continuing:
            return []
        if self.streaming and self.epoch_of(self.streaming) == epoch:
            return []
        self.ended.add(epoch)
        if len(self.ended) > MAX_RESPONSES:
            self.ended = {e for e in self.ended if e >= epoch - MAX_RESPONSES // 2}
        return [EndBotTurn(epoch)]

    # -- the call's media state ---------------------------------------------------------------
    def _media(self, state: str, at: float) -> list[Action]:
        if state == self.media:
            return []
        self.media = state
        if state == ANSWERED:
            return [Count("media_answered")]
        self.speaking = False  # no UserStarted from the cut; the caller's speech is not a turn now
        self.turn_open = False
        self.awaiting_verdict = False
        if self.bot_active:
            return self._barge_in(at, "media")
        out = self._drop_candidate()
        self._arm(None)
        return out

    def _muted(self, i: Input) -> list[Action] | None:
        """While the call does not converse: what an input that could open a turn or play
        audio gives instead (None: handled as always)."""
        match i:
            case VadStart() | VadStop() | s2.S2sSpeechStarted() | s2.S2sSpeechStopped() | s2.S2sInterrupted():
                return [Count("media_muted")]
            case s2.S2sResponseStarted():
                started = self._response_started(i.response_id)
                if not any(isinstance(a, NewEpoch) for a in started):
                    return started
                return started + self._barge_in(-1.0, "media")  # nothing plays while held
        return None

    # -- barge-in ------------------------------------------------------------------------------
    def _barge_in(self, at: float, by: str) -> list[Action]:
        old = self.epoch
        self.floor = self.epoch + 1
        self.epoch = self.floor
        self.fresh = True
        self.rounds = 0
        self.continuing = False
        cancel, self.streaming = self.streaming, ""
        self.active_epoch = None
        self.candidate_at = None
        self.held_epoch = None
        self.ended = {e for e in self.ended if e >= old}
        self.ended.add(old)
        self._arm(None)
        out: list[Action] = [BargeIn(old, self.floor, at, cancel, by)]
        if self.cfg.turn_detection == "brisvox" and self.speaking and not self.turn_open:
            self.turn_open = True
            out.append(UserStarted(at))
        return out

    def _provider_speech(self, ev: s2.S2sSpeechStarted | s2.S2sInterrupted) -> list[Action]:
        if isinstance(ev, s2.S2sInterrupted) and self.epoch_of(ev.response_id) is not None:
            e = self.epoch_of(ev.response_id)
            if e is not None and e < self.floor:
                return [Count("stale_events")]  # that response was cut already
        if not self.bot_active:
            return []
        return self._barge_in(self.candidate_at if self.candidate_at is not None else -1.0, "provider")

    def _vad_start(self, at: float) -> list[Action]:
        self.speaking = True
        out: list[Action] = [SpeechBegan(at)]
        brisvox = self.cfg.turn_detection == "brisvox"
        if brisvox and (self.awaiting_verdict or self.deadline is not None):
            self.awaiting_verdict = False  # the turn goes on
            self._arm(None)
        ic = self.cfg.interruption
        if not self.bot_active:
            if brisvox:
                self.turn_open = True
                out.append(UserStarted(at))
            return out
        if not ic.enabled:
            return out + self._barge_in(at, "vad")
        if self.active_epoch is not None and at - self.bot_started_at < ic.echo_window:
            return out + [Count("echo_ignored")]
        self.candidate_at = at
        if ic.pause_on_candidate and self.active_epoch is not None:
            self.held_epoch = self.active_epoch
            out.append(Pause(self.active_epoch, at))
        self._arm(at + ic.max_backchannel)
        return out

    def _drop_candidate(self) -> list[Action]:
        out: list[Action] = []
        if self.held_epoch is not None:
            out.append(Resume(self.held_epoch))
            self.held_epoch = None
        if self.candidate_at is not None:
            self.candidate_at = None
            self._arm(None)
        return out

    def _vad_stop(self, at: float, pos: int) -> list[Action]:
        self.speaking = False
        out: list[Action] = []
        if self.candidate_at is not None:
            out += self._drop_candidate()  # shorter than a real barge-in: a backchannel, no turn
            out.append(Count("candidates_vetoed"))
            return out
        if self.cfg.turn_detection != "brisvox" or not self.turn_open:
            return out
        self.stop_pos = pos
        if self.cfg.smart_turn:
            self.awaiting_verdict = True
            self._arm(at + self.cfg.verdict_timeout)
            out.append(AskVerdict(pos))
        else:
            self._arm(at + self.cfg.silence)
        return out

    def _verdict(self, complete: bool | None, at: float) -> list[Action]:
        if not self.awaiting_verdict or self.speaking:
            return [Count("stale_verdicts")]
        self.awaiting_verdict = False
        if complete is False:
            self._arm(at + self.cfg.incomplete_wait)
            return []
        return self._commit(at)

    def _commit(self, at: float) -> list[Action]:
        self.turn_open = False
        self.awaiting_verdict = False
        self._arm(None)
        return [CommitTurn(at)]

    def _timer(self, now: float) -> list[Action]:
        if self.deadline is None or now < self.deadline:
            return []
        self.deadline = None
        if self.candidate_at is not None and self.speaking:
            return self._barge_in(self.candidate_at, "vad")
        if self.cfg.turn_detection == "brisvox" and self.turn_open and not self.speaking:
            return self._commit(now)  # silence after the stop, or a verdict that never came
        return []

    def _session_lost(self) -> list[Action]:
        """The responses of the dead session end where they are (nothing more of them comes)."""
        out: list[Action] = []
        rid, self.streaming = self.streaming, ""
        self.continuing = False
        r = self._resp.get(rid) if rid else None
        if r is not None and not r.done:
            r.done = True
            out.append(RoundEnded(r.epoch, r.round, rid, "failed"))
        out += self._end_epoch_if_idle(self.epoch if self.epoch else None)
        return out + self._drop_candidate()

    def _arm(self, at: float | None) -> None:
        self.deadline = at

    def close(self) -> None:
        self.closed = True
        self.deadline = None
