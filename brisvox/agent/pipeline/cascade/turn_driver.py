"""TurnDriver: the sole epoch authority of a call; runs the TurnMachine.

Owns:

* The :class:`~brisvox.agent.pipeline.cascade.turn_machine.TurnMachine` and the execution of
  its actions. One timer slot for the machine plus the driver's own
  deadlines (finals gate, response backstop, analysis deferral), all
  level-triggered on the stage deadline: on any wake every deadline is
  compared with ``clock.now()``.
* The barge-in path, in this order, inside one ``process`` step: timeline
  mark, the FAST clear hook (playout book note, epoch watch bump, Clear to the
  gateway, TtsCut to the worker; synchronous, no queue), then the system
  Interrupt downstream, then UserTurnStarted.
* The finals gate: one owed entry per forwarded VAD stop (who it belongs to,
  from the machine's OwnStop, and the turn epoch); final segments between two
  UtteranceFinals are joined into ONE SttFinal; a machine EndUserTurn is held
  while a stop of that turn is unanswered, up to ``final_wait``, extended
  ONCE by ``late_final_wait`` when the turn has no text and no interim at all.
  A gate timeout falls back to the latest interim only when no final text
  exists. An empty turn sends no UserTurnEnded and feeds the machine a
  synthetic BotAudioEnded. Late finals of a released turn are dropped and
  counted.
* Pause on candidate: the machine's PauseOutput / ResumeOutput go through
  the pause hook (PlayoutBook note, Pause / Resume to the gateway;
  synchronous inside the decision step, like the clear hook). A confirmed
  candidate needs no Resume: its Interrupt's Clear cuts at the held position.
* Resume is not barge-in: a VAD start while an end is held feeds the
  machine the synthetic BotAudioEnded first (so the start opens a new turn
  without guards, Interrupt or Clear), carries the held text into the new
  turn and re-attributes its owed finals.
* Smart Turn: ``RequestAnalysis`` asks the worker's job lane for the
  analysis ending where the VAD decided the stop (its ``decided_pos``: the
  speech and the pause after it, as the model expects; else the stop's
  ``pos``) (a helper task; the verdict
  comes back as a Wake on the upstream lane). It is deferred while the
  newest in16 position this stage knows ends before the stop (at most
  ``analysis_defer_max``); the actor's pump gives it every worker tick's
  position synchronously (:meth:`TurnDriver.note_audio_end`; an AudioFrame
  still works the same way), so in the daemon the stop never finds it behind; a failed or late analysis is counted and the
  machine's fallback silence ends the turn.
* An analysis that can no longer change the turn is not run: after every step the
  driver asks the machine (``wants_verdict``) about each analysis still on its way
  and about a deferred one; for one it no longer wants (the caller resumed, the turn
  ended on the fallback silence, the call hung up) it sends ``SmartTurnCancel`` (the
  worker drops it while it is still queued) or drops the deferred request, counted
  ``analyses_cancelled``. The verdict of a cancelled analysis (``None`` when it was
  dropped) is stale to the machine by the same test, so no turn is decided on it.
* Early analysis (the machine's ``early_analysis``): a UserSpeechFalling feeds
  ``VadFalling``; its ``RequestAnalysis(early=True)`` is asked for the audio up to
  the falling's ``decided_pos`` (the speech and the pause so far), through the
  same deferral and job as a stop's. Stops feed their ``pos`` so the machine can
  tell the stop of the same fall (which reuses the verdict) from another.
* Timeline marks (the latency breakdown of the load bench): the turn's VAD stop
  as it reaches this stage, the arrival of the verdict of the turn's current
  analysis (flagged early when it came before the stop) and of each STT final
  of the turn.
* The response backstop: after UserTurnEnded, ``response_deadline`` feeds a
  synthetic BotAudioEnded unless the epoch's first audio (BotStarted) or its
  end (BotEnded) arrives first.
* Speculation candidates (default off; the rules are
  :mod:`brisvox.agent.pipeline.speculation.offers`): the ``_spec_*`` methods offer a
  SpeculationCandidate downstream at a stop's final (and, with ``on_partial``, at the
  VAD stop) while the machine is paused in the open turn, and withdraw it on a resume.
* DTMF is re-tagged with the machine's epoch and passed on, and feeds the keypad
  aggregator (:mod:`.dtmf`; its timeout is one more deadline). An entry is the machine's
  ``Keypad`` (an Interrupt first while the bot is active), sent on as KeypadEntry: a user
  turn. It drops an open spoken turn (owed finals discarded, ``keypad_over_speech``).
  Caller audio, VAD events and transcripts stop here.
* Greet (the agent's greeting, at call start): the machine's BotTurn opens a
  bot turn of a new epoch; the driver sends Greeting(epoch, text) downstream
  and arms the response backstop as for a user turn. Ignored once the caller
  spoke; it waits while the call is not answered (early media).
* The call's media state (CallMediaChanged: the gateway's CallMedia) feeds the
  machine's ``Media``. Leaving "answered" cuts the bot through the same fast path
  as a barge-in (counted ``media_cuts``, not ``interrupts``) or drops the open user
  turn (``DropUserTurn``: its text, its held end and its owed finals belong to no
  turn now, ``turns_dropped``); nothing starts a turn until the call is answered again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from brisvox.agent.pipeline.cascade import dtmf
from brisvox.agent.pipeline.cascade import turn_machine as tm
from brisvox.agent.pipeline.speculation.offers import CandidateOffers
from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.call_io import WorkerLink
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    BotEnded,
    BotStarted,
    CallMediaChanged,
    DtmfFrame,
    Greet,
    Greeting,
    Interrupt,
    KeypadEntry,
    PipelineFrame,
    Stop,
    UserSpeechFalling,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscript,
    UserTurnEnded,
    UserTurnStarted,
    UtteranceFinal,
    Wake,
)
from ipc.frames import SmartTurnCancel

log = logging.getLogger("brisvox.agent.turn")

ClearHook = Callable[[int, float], None]
PauseHook = Callable[[int, float, bool], None]  # (epoch, at, paused): hold / release the bot's audio


@dataclass(frozen=True, slots=True)
class TurnDriverConfig:
    turn: tm.TurnConfig = field(default_factory=tm.TurnConfig)
    final_wait: float = 1.5
    late_final_wait: float = 1.5
    response_deadline: float = 20.0
    analysis_timeout: float = 0.5
    analysis_defer_max: float = 0.2
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)  # candidates (default off)
    keypad: dtmf.KeypadConfig = field(default_factory=dtmf.KeypadConfig)  # the agent's [dtmf]


@dataclass(slots=True)
class _Owed:
    owner: str  # "turn" | "candidate" | "none"
    epoch: int


@dataclass(slots=True)
class _Held:
    epoch: int
    at: float
    deadline: float
    extended: bool = False


@dataclass(slots=True)
class DriverStats:
    turns: int = 0
    turns_ended: int = 0
    empty_turns: int = 0
    interrupts: int = 0
    resumes: int = 0
    echo_ignored: int = 0
    vetoed: int = 0
    candidates: int = 0
    stale_verdicts: int = 0
    analyses: int = 0
    analyses_failed: int = 0
    analyses_deferred: int = 0
    analyses_cancelled: int = 0  # asked for (or deferred) and no longer wanted: cancelled or never sent
    gate_holds: int = 0
    gate_timeouts: int = 0
    gate_extensions: int = 0
    late_finals: int = 0
    unexpected_finals: int = 0
    response_deadlines: int = 0
    dtmf: int = 0
    keypad_over_speech: int = 0  # a keypad entry dropped an open spoken turn
    greetings: int = 0
    output_pauses: int = 0
    output_resumes: int = 0
    early_analyses: int = 0  # requested at a falling
    early_reused: int = 0  # a stop of the same fall took the early verdict (no request of its own)
    early_discarded: int = 0  # speech again, or a stop of another fall
    media_changes: int = 0  # CallMediaChanged frames (early, answered, held)
    media_cuts: int = 0  # the bot cut because the call left "answered" (a hold)
    media_muted: int = 0  # VAD starts and keypad entries ignored while not answered
    turns_dropped: int = 0  # open user turns dropped because the call left "answered"


class TurnDriver(Stage):
    DROP_STALE = False

    def __init__(self, call: CallContext, cfg: TurnDriverConfig, inbox: Inbox) -> None:
        super().__init__(call, cfg, inbox)
        self.cfg = cfg
        self.machine = tm.TurnMachine(cfg.turn)
        self.clear_hook: ClearHook = call.clear  # the barge-in fast path (CallContext.clear)
        self.pause_hook: PauseHook | None = call.pause
        self.link: WorkerLink | None = call.worker  # smart_turn
        self.timeline = call.timeline
        self.st = DriverStats()
        self._owed: deque[_Owed] = deque()
        self._segments: list[str] = []
        self._turn_text: list[str] = []
        self._cand_text: list[str] = []
        self._interim = ""
        self._held: _Held | None = None
        self._machine_deadline: float | None = None
        self._response: tuple[int, float] | None = None
        self._last_audio_end = -1
        self._stops: deque[tuple[float, int]] = deque(maxlen=8)  # (at, pos)
        self._pending_analysis: tuple[int, int, float] | None = None  # (id, pos, deadline)
        self._inflight: dict[int, int] = {}  # analysis id -> end pos: asked, no verdict yet
        self._cancelled: set[int] = set()  # analysis ids cancelled, their (stale) verdict still to come
        self._fall_pos = -1  # the analysis end of the latest falling (early analysis)
        self._open_turn = 0  # epoch of the turn whose text is collected (0: none)
        self._greeting = ""
        self._closed = False
        self._media_step = False  # the machine's actions being run answer a media change
        self.offers = CandidateOffers(cfg.speculation)
        self.keypad = dtmf.KeypadAggregator(cfg.keypad)

    # -- caller audio position -------------------------------------------------------
    def note_audio_end(self, end: int) -> None:
        """The caller audio available in in16 now ends at ``end``.

        The driver needs only this position (the worker reads the Smart Turn audio
        from in16 itself), so the actor's pump calls it synchronously on every
        worker tick instead of sending the driver an AudioFrame (no frame hop, no
        task wake). A deferred analysis whose stop position is now covered is sent
        at once (synchronous: it only spawns the job)."""
        if end > self._last_audio_end:
            self._last_audio_end = end
            pa = self._pending_analysis
            if pa is not None and end >= pa[1]:
                self._send_analysis()

    # -- frames ----------------------------------------------------------------------
    async def process(self, frame: PipelineFrame) -> None:
        if self._closed:
            return
        now = self.clock.now()
        if isinstance(frame, AudioFrame):
            self.note_audio_end(frame.end)
        elif isinstance(frame, UserStartedSpeaking):
            await self._spec_withdraw()
            if self._held is not None:
                await self._resume(frame.at)
            else:
                await self._feed(tm.VadStart(frame.at))
        elif isinstance(frame, UserStoppedSpeaking):
            self._stops.append((frame.at, max(frame.pos, frame.decided_pos)))
            await self._feed(tm.VadStop(frame.at, frame.pos))
            await self._spec_partial(now)
        elif isinstance(frame, UserSpeechFalling):
            await self._falling(frame)
        elif isinstance(frame, UserTranscript):
            if frame.final:
                if frame.text.strip():
                    self._segments.append(frame.text.strip())
            else:
                self._interim = frame.text
                if self.offers.gate is not None:
                    self.offers.changed(self._spec_text(), now)
                await self._feed(tm.SttInterim(frame.text, now))
        elif isinstance(frame, UtteranceFinal):
            await self._utterance_final(now)
        elif isinstance(frame, BotStarted):
            r = self._response
            if r is not None and r[0] == frame.epoch:
                self._response = None
            await self._feed(tm.BotAudioStarted(frame.epoch, frame.at or now))
        elif isinstance(frame, BotEnded):
            r = self._response
            if r is not None and r[0] == frame.epoch:
                self._response = None
            await self._feed(tm.BotAudioEnded(frame.epoch))
        elif isinstance(frame, Wake):
            if frame.kind == "verdict":
                vid: int
                prob: float | None
                vid, prob = frame.value  # type: ignore[misc]
                self._inflight.pop(vid, None)
                if vid in self._cancelled:
                    self._cancelled.discard(vid)
                elif prob is None:
                    self.st.analyses_failed += 1
                self._mark_verdict(vid, now)
                await self._feed(tm.Verdict(vid, prob, now))
        elif isinstance(frame, DtmfFrame):
            self.st.dtmf += 1
            await self.send(DtmfFrame(frame.digit, self.machine.epoch))
            await self._keys(self.keypad.handle(dtmf.Key(frame.digit, now)))
        elif isinstance(frame, Greet):
            self._greeting = frame.text
            await self._feed(tm.BotTurn(now))
        elif isinstance(frame, CallMediaChanged):
            self.st.media_changes += 1
            self._media_step = True
            try:
                await self._feed(tm.Media(frame.state, frame.at))
            finally:
                self._media_step = False
        elif isinstance(frame, Stop):
            self._closed = True
            self.machine.handle(tm.Hangup())
            self.keypad.handle(dtmf.Close())
            self._held = None
            self._cancel_stale()
            self._response = None
            self._machine_deadline = None
            self.deadline = None
            await self.send(frame)
            return
        else:
            await self.send(frame)
        self._cancel_stale()
        self._rearm()

    async def on_deadline(self, now: float) -> None:
        if self._closed:
            return
        if self._machine_deadline is not None and now >= self._machine_deadline:
            self._machine_deadline = None
            await self._feed(tm.Tick(now))
        h = self._held
        if h is not None and now >= h.deadline:
            if not h.extended and self.cfg.late_final_wait > 0 and not self._turn_text and not self._interim.strip():
                h.extended = True
                h.deadline = now + self.cfg.late_final_wait
                self.st.gate_extensions += 1
            else:
                self.st.gate_timeouts += 1
                await self._release(h.epoch)
        r = self._response
        if r is not None and now >= r[1]:
            self._response = None
            self.st.response_deadlines += 1
            await self._feed(tm.BotAudioEnded(r[0]))
        pa = self._pending_analysis
        if pa is not None and now >= pa[2]:
            self._send_analysis()
        if self.keypad.deadline is not None and now >= self.keypad.deadline:
            await self._keys(self.keypad.handle(dtmf.Tick(now)))
        await self._spec_gate(now)
        self._cancel_stale()
        self._rearm()

    def _rearm(self) -> None:
        cands = [self._machine_deadline]
        if self._held is not None:
            cands.append(self._held.deadline)
        if self._response is not None:
            cands.append(self._response[1])
        if self._pending_analysis is not None:
            cands.append(self._pending_analysis[2])
        cands += (self.offers.deadline, self.keypad.deadline)
        live = [c for c in cands if c is not None]
        self.deadline = min(live) if live else None

    # -- the machine -------------------------------------------------------------------
    async def _feed(self, inp: tm.TurnInput) -> None:
        for act in self.machine.handle(inp):
            await self._act(act)

    async def _act(self, act: tm.Action) -> None:
        if isinstance(act, tm.Interrupt):
            if self._media_step:
                self.st.media_cuts += 1
            else:
                self.st.interrupts += 1
            self.timeline.interrupt(act.old_epoch, act.new_epoch, act.at)
            self._response = None
            self._open_turn = 0
            self.offers.end_turn()
            try:
                self.clear_hook(act.new_epoch, act.at)  # FAST PATH: before anything is queued
            except Exception:  # a failed clear is counted; the Interrupt still follows
                log.exception("clear hook failed")
            self.watch.bump(act.new_epoch)
            self.send_nowait(Interrupt(act.new_epoch, act.old_epoch, act.at))
        elif isinstance(act, tm.StartUserTurn):
            self.st.turns += 1
            self.watch.bump(act.epoch)
            if act.from_candidate:
                self._turn_text = list(self._cand_text)
                for o in self._owed:
                    if o.owner == "candidate":
                        o.owner = "turn"
                        o.epoch = act.epoch
            else:
                self._turn_text = []
            self._cand_text = []
            self._open_turn = act.epoch
            self.timeline.speech_start(act.epoch, act.at)
            await self.send(UserTurnStarted(act.epoch))
        elif isinstance(act, tm.StartBotTurn):
            self.st.greetings += 1
            self.watch.bump(act.epoch)
            await self.send(Greeting(act.epoch, self._greeting))
            self._response = (act.epoch, self.clock.now() + self.cfg.response_deadline)
        elif isinstance(act, tm.OwnStop):
            owner = act.owner
            if owner == "candidate":
                self.st.candidates += 0  # counted at Note("candidate")
            self._owed.append(_Owed(owner, self.machine.epoch))
            if owner == "turn" and self._stops:
                self.timeline.speech_end(self.machine.epoch, self._stops[-1][0])
                self.timeline.vad_stop(self.machine.epoch, self.clock.now())
        elif isinstance(act, tm.ArmTimer):
            self._machine_deadline = act.at
        elif isinstance(act, tm.CancelTimer):
            self._machine_deadline = None
        elif isinstance(act, tm.RequestAnalysis):
            pos = self._fall_pos if act.early and self._fall_pos >= 0 else self._stop_pos(act.at)
            self._pending_analysis = (act.id, pos, self.clock.now() + self.cfg.analysis_defer_max)
            if self._last_audio_end < 0 or self._last_audio_end >= pos:
                self._send_analysis()
            else:
                self.st.analyses_deferred += 1
        elif isinstance(act, tm.EndUserTurn):
            if any(o.owner == "turn" and o.epoch == act.epoch for o in self._owed):
                self.st.gate_holds += 1
                self._held = _Held(act.epoch, act.at, self.clock.now() + self.cfg.final_wait)
            else:
                await self._release(act.epoch)
        elif isinstance(act, tm.PauseOutput | tm.ResumeOutput):
            paused = isinstance(act, tm.PauseOutput)
            if paused:
                self.st.output_pauses += 1
            else:
                self.st.output_resumes += 1
            if self.pause_hook is not None:
                try:  # synchronous, like the clear hook: the hold starts in this decision step
                    self.pause_hook(act.epoch, act.at if isinstance(act, tm.PauseOutput) else self.clock.now(), paused)
                except Exception:  # a failed pause is counted by the link; the gateway bounds any hold
                    log.exception("pause hook failed")
        elif isinstance(act, tm.DropUserTurn):
            self.st.turns_dropped += 1
            self._drop_turn()
        elif isinstance(act, tm.Note):
            k = act.kind
            if k == "media_muted":
                self.st.media_muted += 1
            elif k == "echo":
                self.st.echo_ignored += 1
            elif k == "vetoed":
                self.st.vetoed += 1
            elif k == "candidate":
                self.st.candidates += 1
            elif k == "stale_verdict":
                self.st.stale_verdicts += 1
            elif k == "early_analysis":
                self.st.early_analyses += 1
            elif k == "early_reused":
                self.st.early_reused += 1
            elif k == "early_discarded":
                self.st.early_discarded += 1

    def _drop_turn(self) -> None:
        """The open user turn goes unanswered: its text, held end and owed finals are no turn's."""
        self._open_turn, self._held, self._response = 0, None, None
        self._turn_text, self._cand_text, self._interim = [], [], ""
        self.offers.end_turn()
        for o in self._owed:
            o.owner = "none"

    # -- keypad entries (dtmf.py) ------------------------------------------------------
    async def _keys(self, acts: list[dtmf.KeypadAction]) -> None:
        """The aggregator's actions: a refused key is logged (the 1st, 2nd, 4th, ...: a flood logs
        a few lines, all counted); an entry is the machine's Keypad, its EndUserTurn the KeypadEntry."""
        for a in acts:
            if isinstance(a, dtmf.Refused):
                if (n := self.keypad.refused) & (n - 1) == 0:
                    log.warning("keypad: key %r refused (%s; %d refused so far)", a.digit, a.why, n)
                continue
            now = self.clock.now()
            self.st.keypad_over_speech += bool(self._open_turn or self._held is not None)
            self._held = None
            for o in self._owed:  # the voice's finals still owed belong to no turn now
                o.owner = "none"
            for act in self.machine.handle(tm.Keypad(now)):
                if not isinstance(act, tm.EndUserTurn):
                    await self._act(act)
                    continue
                self._open_turn, self._turn_text, self._interim = 0, [], ""
                self.offers.end_turn()
                self.timeline.turn_end(act.epoch, now)
                await self.send(KeypadEntry(act.epoch, a.digits, self.cfg.keypad.render(a.digits), now))
                self._response = (act.epoch, now + self.cfg.response_deadline)

    # -- early analysis and the verdict mark ---------------------------------------------
    async def _falling(self, frame: UserSpeechFalling) -> None:
        """A falling: the machine decides whether to analyse early (the analysis reads the
        audio up to where the VAD saw the fall, ``decided_pos``, else ``pos``)."""
        self._fall_pos = max(frame.pos, frame.decided_pos)
        await self._feed(tm.VadFalling(frame.at, frame.pos))

    def _mark_verdict(self, vid: int, now: float) -> None:
        """Timeline: the verdict of the current analysis (or the pending early one) came."""
        m = self.machine
        early = vid == m.early_id
        if early or (vid == m.analysis_id and m.phase is tm.Phase.USER_PAUSED):
            self.timeline.verdict(m.epoch, now, early)

    def _stop_pos(self, at: float) -> int:
        for a, p in reversed(self._stops):
            if a == at:
                return p
        return self._stops[-1][1] if self._stops else max(0, self._last_audio_end)

    def _cancel_stale(self) -> None:
        """Drop the deferred analysis and cancel those on their way that the machine no
        longer wants (a verdict of theirs would be stale): the worker does not run what is
        still queued. Called after every step (synchronous: it only sends a frame)."""
        m = self.machine
        pa = self._pending_analysis
        if pa is not None and not m.wants_verdict(pa[0]):
            self._pending_analysis = None
            self.st.analyses_cancelled += 1
        if not self._inflight:
            return
        for vid in [v for v in self._inflight if v not in self._cancelled and not m.wants_verdict(v)]:
            self._cancelled.add(vid)
            self.st.analyses_cancelled += 1
            if self.link is not None:
                try:
                    self.link.to_worker(SmartTurnCancel(call_id=self.call.call_id, end_pos=self._inflight[vid]))
                except Exception:  # the analysis then runs for nothing; its verdict is stale anyway
                    log.exception("smart turn cancel failed")

    def _send_analysis(self) -> None:
        pa = self._pending_analysis
        self._pending_analysis = None
        if pa is None:
            return
        vid, pos, _ = pa
        self.st.analyses += 1
        link = self.link
        self._inflight[vid] = pos
        if link is None:
            self.inbox.put_nowait(Wake("verdict", (vid, None)))
            return
        timeout = self.cfg.analysis_timeout
        inbox = self.inbox

        async def job() -> None:
            try:
                prob = await link.smart_turn(pos, timeout)
            except Exception:  # the fallback silence ends the turn
                prob = None
            inbox.put_nowait(Wake("verdict", (vid, prob)))

        self.tasks.spawn(job(), "smart-turn")

    # -- finals gate -------------------------------------------------------------------
    async def _utterance_final(self, now: float) -> None:
        text = " ".join(self._segments)
        self._segments = []
        if not self._owed:
            self.st.unexpected_finals += 1
            return
        o = self._owed.popleft()
        if o.owner == "turn":
            if o.epoch == self._open_turn and o.epoch == self.machine.epoch:
                if text:
                    self._turn_text.append(text)
                    self._interim = ""
                self.timeline.stt_final(o.epoch, now)
                await self._feed(tm.SttFinal(text, "turn", now))
                h = self._held
                if h is not None and not any(x.owner == "turn" and x.epoch == h.epoch for x in self._owed):
                    await self._release(h.epoch)
                await self._spec_final(o.epoch)
            else:
                self.st.late_finals += 1
        elif o.owner == "candidate":
            if text:
                self._cand_text.append(text)
            await self._feed(tm.SttFinal(text, "candidate", now))
        # "none": an echo or vetoed backchannel: dropped

    async def _release(self, epoch: int) -> None:
        self._held = None
        if epoch != self._open_turn:
            return
        self._open_turn = 0
        self.offers.end_turn()
        text = " ".join(self._turn_text).strip()
        if not text:
            text = self._interim.strip()
        self._turn_text = []
        self._interim = ""
        now = self.clock.now()
        self.timeline.turn_end(epoch, now)
        if not text:
            self.st.empty_turns += 1
            await self._feed(tm.BotAudioEnded(epoch))
            return
        self.st.turns_ended += 1
        await self.send(UserTranscript(text, True, epoch))
        await self.send(UserTurnEnded(epoch, text, now))
        self._response = (epoch, now + self.cfg.response_deadline)

    async def _resume(self, at: float) -> None:
        h = self._held
        assert h is not None
        self._held = None
        self.st.resumes += 1
        carried = list(self._turn_text)
        old = h.epoch
        self._open_turn = 0
        await self._feed(tm.BotAudioEnded(old))  # AwaitingResponse -> Idle, no guards
        await self._feed(tm.VadStart(at))
        new = self.machine.epoch
        self._turn_text = carried + self._turn_text
        for o in self._owed:
            if o.owner == "turn" and o.epoch == old:
                o.epoch = new

    # -- speculation candidates (speculation_offers.py) ---------------------------------
    def _spec_paused(self, epoch: int) -> bool:
        """The machine is paused in the open turn ``epoch`` and no end is held."""
        return (self.machine.phase is tm.Phase.USER_PAUSED and epoch == self._open_turn == self.machine.epoch
                and self._held is None)

    def _spec_text(self) -> str:
        """The finals heard so far, else the latest interim for the current stop."""
        current = " ".join(self._segments) or self._interim.strip()
        return " ".join([*self._turn_text, current]).strip()

    async def _spec_send(self, f: PipelineFrame | None) -> None:
        if f is not None:
            await self.send(f)

    async def _spec_final(self, epoch: int) -> None:
        """A stop's final: offer the turn's final text once no other stop of it is owed."""
        if not self.offers.enabled or not self._spec_paused(epoch):
            return
        if any(o.owner == "turn" and o.epoch == epoch for o in self._owed):
            return
        self.offers.gate = None  # the stop's own final cancels a stable-partial wait
        await self._spec_send(self.offers.offer(epoch, " ".join(self._turn_text)))

    async def _spec_partial(self, now: float) -> None:
        """``on_partial``: at the VAD stop that paused the machine (held by the gate if set)."""
        epoch = self.machine.epoch
        if not self.offers.on_partial or not self._spec_paused(epoch):
            return
        text = self._spec_text()
        if not text:
            return
        if self.offers.cfg.partial_stable_for > 0:
            self.offers.hold(epoch, text, now)
        else:
            await self._spec_send(self.offers.offer(epoch, text))

    async def _spec_gate(self, now: float) -> None:
        g = self.offers.due(now)
        if g is None:
            return
        if g.text.strip() and self._spec_paused(g.epoch):
            await self._spec_send(self.offers.offer(g.epoch, g.text))
        else:
            await self._spec_send(self.offers.withdraw())

    async def _spec_withdraw(self) -> None:
        """A VAD start: a resume withdraws the standing candidate."""
        await self._spec_send(self.offers.withdraw())

    def stats(self) -> dict[str, int]:
        d = super().stats()
        d.update({k: getattr(self.st, k) for k in self.st.__slots__})
        d.update(self.offers.stats())
        d.update(self.keypad.stats())
        return d
