"""S2sStage: one speech-to-speech session between the caller's audio and the tts ring.

The chain of an S2S call (``brisvox/agent/pipeline/chain.py``, :data:`S2S_CHAIN`)::

    pump -> S2sStage -> TtsRingWriter

It replaces STT, turn driver, LLM runner, segmenter and TTS; it keeps the
epochs, the clear and pause hooks (:class:`CallContext`), the playout book,
the tool engine and the bounds. The decisions are the pure
:class:`~brisvox.agent.pipeline.s2s.machine.S2sMachine`'s; this stage does the
I/O. Two tasks feed the machine, one at a time on the call's loop: the stage
loop (caller audio, brisvox's VAD events, the playout reports, the timer) and
the session's reader (the provider's events; it wakes the loop when the
machine's timer moved). Every send of model audio is a guarded send: a frame
of an epoch the machine cut never enters the tts ring.

* Caller audio: every AudioFrame is converted (:mod:`.s2s_audio`) and queued
  on the session without waiting; before the session is up it is dropped
  and counted (``audio_before_session``).
* Model audio: one playout-book utterance per provider item, one round per
  response; the model's transcript deltas are the utterance's sent text.
  ``TtsEnded`` ends a bot epoch (the writer's end mark, BotEnded back here).
* Barge-in (:class:`BargeIn`): the fast path synchronously (watch, book,
  Clear and TtsCut, Interrupt to the writer, Pause/Resume as the machine
  says), the provider's response cancelled, then, on a helper task, the
  tool phase of the cut epoch ended, the cut rounds' messages put into the
  context, the book settled and applied (the context keeps what was heard),
  and the provider told the same: ``truncate(item, heard_ms, heard_text)``
  from the book's own heard position (:meth:`PlayoutBook.heard_ms`).
* Tools (:mod:`.s2s_tools`): the calls of a completed response go through the
  ToolEngine (validation, retry budget, idempotency, already_done, the
  confirmation gate fed by speech starts and user turns); the results go back
  in call order, then one ``create_response``.
* Failure policy: a session that dies is reconnected (``max_reconnects``
  per call, ``reconnect_backoff`` apart, each bounded by ``connect_timeout``:
  :attr:`S2sStageConfig.reconnect_policy`)
  with the conversation so far (or the provider's resumption handle); when
  that fails the fallback line is spoken through the local TTS (when the agent
  has one) and the call is hung up (``s2s_failed``). Every await is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from brisvox.agent.conversation.context import AssistantMessage, Context, UserMessage
from brisvox.agent.pipeline.s2s import machine as M
from brisvox.agent.pipeline.s2s.audio import InputConverter, OutputConverter
from brisvox.agent.pipeline.s2s.tools import S2sTools, history_items
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    AudioOut,
    BotEnded,
    BotStarted,
    CallMediaChanged,
    Greet,
    Interrupt,
    PipelineFrame,
    Start,
    Stop,
    TtsEnded,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    Wake,
)
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.providers import s2s as _s2s  # noqa: F401 - the package of the contract
from brisvox.providers.base import ProviderError, TtsProvider
from brisvox.providers.s2s.base import (
    S2sClosed,
    S2sConfig,
    S2sError,
    S2sInputTranscript,
    S2sProvider,
    S2sResumable,
    S2sSession,
    S2sToolCancelled,
)
from brisvox.runtime.retry import RetryPolicy
from ipc.frames import Hangup

log = logging.getLogger("brisvox.agent.s2s")

DEFAULT_FALLBACK = "I'm sorry, I can't continue this call right now. Please call again later. Goodbye."


@dataclass(frozen=True, slots=True)
class S2sStageConfig:
    turn: M.S2sTurnConfig = field(default_factory=M.S2sTurnConfig)
    session: S2sConfig = field(default_factory=S2sConfig)
    connect_timeout: float = 5.0
    send_timeout: float = 2.0
    max_reconnects: int = 3
    reconnect_backoff: float = 0.25
    verdict_threshold: float = 0.5
    fallback_line: str = DEFAULT_FALLBACK
    fallback_timeout: float = 8.0
    truncate_timeout: float = 1.0

    @property
    def reconnect_policy(self) -> RetryPolicy:
        """``max_reconnects`` reconnects per call after the first connect, each
        ``reconnect_backoff`` (fixed, no jitter) after the failure."""
        return RetryPolicy(base=self.reconnect_backoff, multiplier=1.0, cap=self.reconnect_backoff,
                           max_attempts=max(0, self.max_reconnects) + 1)


@dataclass(slots=True)
class _Round:
    text: list[str] = field(default_factory=list)
    utt: int | None = None
    item: str = ""
    in_ctx: bool = False
    samples: int = 0  # model audio received for the round, at the tts ring rate
    truncated: bool = False  # the provider was told what was heard of it (once)


@dataclass(slots=True)
class S2sStats:
    connects: int = 0
    reconnects: int = 0
    reconnect_failures: int = 0
    session_errors: int = 0
    audio_before_session: int = 0
    audio_send_failures: int = 0
    audio_in_chunks: int = 0
    audio_out_chunks: int = 0
    responses: int = 0
    barge_ins: int = 0
    barge_ins_by_provider: int = 0
    pauses: int = 0
    resumes: int = 0
    cancels: int = 0
    truncations: int = 0
    truncate_failures: int = 0
    turns_committed: int = 0
    verdicts: int = 0
    user_transcripts: int = 0
    fallback_spoken: int = 0
    provider_errors: int = 0
    dropped_events: int = 0
    media_changes: int = 0  # CallMediaChanged frames (early, answered, held)
    media_cuts: int = 0  # the bot cut because the call left "answered" (a hold)
    counts: dict[str, int] = field(default_factory=dict)


class S2sStage(Stage):
    DROP_STALE = False

    def __init__(self, call: CallContext, cfg: S2sStageConfig, inbox: Inbox, *, provider: S2sProvider,
                 engine: ToolEngine | None = None, context: Context | None = None,
                 fallback_tts: TtsProvider | None = None) -> None:
        super().__init__(call, cfg, inbox)
        self.cfg = cfg
        self.provider = provider
        self.fallback_tts = fallback_tts
        self.ctx = context if context is not None else Context()
        self.book = call.book
        self.timeline = call.timeline
        self.machine = M.S2sMachine(cfg.turn)
        self.st = S2sStats()
        self.tools = S2sTools(self, engine)
        self.session: S2sSession | None = None
        self._conv_in: InputConverter | None = None
        self._conv_out: OutputConverter | None = None
        self._rounds: dict[tuple[int, int], _Round] = {}
        self._items: dict[str, tuple[int, int]] = {}  # provider item -> (epoch, round)
        self._utt_seq = 0
        self._resume_handle = ""
        self._stopping = False
        self._reader: asyncio.Task[Any] | None = None
        self._ctx_lock = asyncio.Lock()
        self._pending_user: list[str] = []
        self._last_commit: float | None = None
        self._last_stop: tuple[float, float] | None = None  # (backdated speech end, arrival) of the newest VAD stop
        self._first_audio_due: set[tuple[int, int]] = set()  # (epoch, round)s whose first model audio is not stamped yet
        self._turn_noted = False  # a user turn was reported to the confirmation gate since the last bot turn
        self._greet_waits = False  # a Greet came before the call was answered (early media)
        self._stop_due: int | None = None  # an epoch the provider opened before brisvox's VAD stop came
        self._response_at = 0.0  # when the newest bot turn's response started
        self.fallback_epoch = -1
        self.fallback_played = asyncio.Event()

    # -- the stage loop ----------------------------------------------------------------
    async def process(self, frame: PipelineFrame) -> None:
        match frame:
            case AudioFrame():
                self._audio_in(frame)
            case UserStartedSpeaking():
                await self._feed(M.VadStart(frame.at))
            case UserStoppedSpeaking():
                self._stop_mark(frame.at)
                await self._feed(M.VadStop(frame.at, frame.pos))
            case BotStarted():
                await self._feed(M.BotStarted(frame.epoch, frame.at))
            case BotEnded():
                if frame.epoch == self.fallback_epoch:
                    self.fallback_played.set()
                await self._feed(M.BotEnded(frame.epoch))
            case Wake():
                if frame.kind == "verdict":
                    await self._feed(M.Verdict(frame.value if isinstance(frame.value, bool) else None,
                                               self.clock.now()))
            case Start():
                self._reader = self.tasks.spawn(self._session_life(), f"{self.name}:session", stage=self.name)
            case Greet():
                if self.machine.media != M.ANSWERED:
                    self._greet_waits = True  # early media: the greeting is asked for at the answer
                else:
                    self._greet()
            case CallMediaChanged():
                self.st.media_changes += 1
                await self._feed(M.Media(frame.state, frame.at))
                if self.machine.media == M.ANSWERED and self._greet_waits:
                    self._greet_waits = False
                    self._greet()
            case Stop():
                await self.send(frame)
        self.deadline = self.machine.deadline

    def _greet(self) -> None:
        if self.session is not None:
            self.tasks.spawn(self._quiet(self.session.create_response(self.cfg.send_timeout)),
                             f"{self.name}:greet", stage=self.name)

    async def on_deadline(self, now: float) -> None:
        await self._feed(M.Timer(now))
        self.deadline = self.machine.deadline

    async def on_stop(self) -> None:
        self._stopping = True
        self.machine.close()
        if self.session is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.session.close(1.0), 1.5)
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        await self.tools.stop()
        async with self._ctx_lock:
            self._commit_rounds()
            self.book.apply(self.ctx)

    def _audio_in(self, f: AudioFrame) -> None:
        s, conv = self.session, self._conv_in
        if s is None or conv is None:
            self.st.audio_before_session += 1
            return
        try:
            s.send_audio(conv.convert(f.samples))
            self.st.audio_in_chunks += 1
        except ProviderError:
            self.st.audio_send_failures += 1

    # -- the machine ------------------------------------------------------------------------
    async def _feed(self, i: M.Input, from_reader: bool = False) -> None:
        actions = self.machine.handle(i)
        for a in actions:
            await self._act(a)
        if from_reader and self.machine.deadline != self.deadline:
            self.deadline = self.machine.deadline
            self.inbox.put_nowait(Wake("timer"))

    async def _act(self, a: M.Action) -> None:  # noqa: C901 - one dispatch over the action types
        match a:
            case M.Play():
                await self._play(a)
            case M.Said():
                r = self._round(a.epoch, a.round, a.item_id)
                r.text.append(a.text)
                if r.utt is not None:
                    self.book.push_sent(r.utt, a.text)
            case M.NewEpoch():
                self._new_round(a)
            case M.EndBotTurn():  # the epoch's last response ended: its answer is complete
                self.timeline.answered(a.epoch, self.clock.now())
                await self.guarded_send(TtsEnded(a.epoch))
            case M.RoundEnded():
                self._round_done(a.epoch, a.round)
                async with self._ctx_lock:
                    self._commit_round(a.epoch, a.round)
            case M.RunTools():  # a response that called tools ended: its end, then the tool phase
                self._round_done(a.epoch, a.round)
                self.tools.run(a)
            case M.BargeIn():
                self._barge_in(a)
            case M.Pause():
                self.st.pauses += 1
                self.call.pause(a.epoch, a.at, True)
            case M.Resume():
                self.st.resumes += 1
                self.call.pause(a.epoch, self.clock.now(), False)
            case M.SpeechBegan():
                self.tools.note_speech_started()
            case M.UserStarted():
                if self.session is not None:
                    self.tasks.spawn(self._quiet(self.session.user_started(self.cfg.send_timeout)),
                                     f"{self.name}:user_started", stage=self.name)
            case M.AskVerdict():
                self.tasks.spawn(self._verdict(a.pos), f"{self.name}:verdict", stage=self.name)
            case M.TurnEnded():
                self._note_turn()
            case M.CommitTurn():
                self.st.turns_committed += 1
                self._last_commit = a.at
                self._note_turn()
                if self.session is not None:
                    self.tasks.spawn(self._quiet(self.session.user_ended(self.cfg.send_timeout)),
                                     f"{self.name}:commit", stage=self.name)
            case M.Count():
                self.st.counts[a.what] = self.st.counts.get(a.what, 0) + 1

    def _round(self, epoch: int, rnd: int, item: str) -> _Round:
        r = self._rounds.get((epoch, rnd))
        if r is None:
            r = self._rounds[(epoch, rnd)] = _Round()
        if item and r.utt is None:
            self._utt_seq += 1
            r.utt, r.item = self._utt_seq, item
            self._items[item] = (epoch, rnd)
            self.book.register_utterance(epoch, rnd, r.utt)
            for t in r.text:
                self.book.push_sent(r.utt, t)
        return r

    def _new_round(self, a: M.NewEpoch) -> None:
        self.st.responses += 1
        self.book.register_round(a.epoch, a.round)
        self._round(a.epoch, a.round, "")
        if a.round == 0:
            if not self._turn_noted:
                self.tools.note_user_turn()  # a provider without turn events (Gemini): its answer says the turn ended
            self._turn_noted = False
            self.tasks.spawn(self.tools.deliver_notes(), f"{self.name}:notes", stage=self.name)
            # the turn's marks: the caller's speech end and the VAD stop (brisvox's), the turn end
            # (brisvox's commit, or the provider's own decision: its response starting), the
            # "request" (the same instant) and, at its first audio, the model's "first token"
            now = self.clock.now()
            end = self._last_commit if self._last_commit is not None else now
            self._stop_due = a.epoch
            if self._last_stop is not None and self._last_stop[1] >= self._response_at:
                self._stop_mark(*self._last_stop)
            self._last_stop = None
            self._response_at = now
            self.timeline.turn_end(a.epoch, end)
            self.timeline.llm_request(a.epoch, end, 0)
            self._last_commit = None
        else:  # a later response of the turn (after its tool results): its request is its start
            self.timeline.llm_request(a.epoch, self.clock.now(), a.round)
        self._first_audio_due.add((a.epoch, a.round))
        if len(self._first_audio_due) > 256:  # bounded: responses that never played
            self._first_audio_due = {k for k in self._first_audio_due if k[0] >= a.epoch}
        if len(self._rounds) > 128:  # bounded: the oldest rounds are in the context or dead
            for k in sorted(self._rounds)[:-64]:
                r = self._rounds.pop(k)
                if r.item:
                    self._items.pop(r.item, None)

    def _round_done(self, epoch: int, rnd: int) -> None:
        """The response of round ``rnd`` ended (completed, cut or failed): its ``llm_done`` mark."""
        self._first_audio_due.discard((epoch, rnd))
        self.timeline.llm_done(epoch, self.clock.now(), rnd)

    def _note_turn(self) -> None:
        if not self._turn_noted:
            self._turn_noted = True
            self.tools.note_user_turn()

    def _stop_mark(self, speech_end: float, arrived: float | None = None) -> None:
        """brisvox's VAD stop: the speech end and stop marks of the bot turn it led to (the
        provider's VAD may have opened that turn before this stop came)."""
        arrived = self.clock.now() if arrived is None else arrived
        e = self._stop_due
        if e is None:
            self._last_stop = (speech_end, arrived)
            return
        self._stop_due = None
        self.timeline.speech_end(e, speech_end)
        self.timeline.vad_stop(e, arrived)

    async def _play(self, a: M.Play) -> None:
        conv = self._conv_out
        if conv is None:
            return
        r = self._round(a.epoch, a.round, a.item_id)
        samples = conv.convert(a.pcm)
        if (a.epoch, a.round) in self._first_audio_due:
            self._first_audio_due.discard((a.epoch, a.round))
            self.timeline.llm_first_token(a.epoch, self.clock.now(), a.round)  # the model's first audio came
        if len(samples) and r.utt is not None:
            r.samples += len(samples)
            self.st.audio_out_chunks += 1
            await self.guarded_send(AudioOut(a.epoch, r.utt, samples))

    # -- the context --------------------------------------------------------------------------
    def _commit_round(self, epoch: int, rnd: int, calls: tuple[Any, ...] = ()) -> int | None:
        """Put round ``(epoch, rnd)``'s message into the context (once); its index."""
        r = self._rounds.get((epoch, rnd))
        if r is None or r.in_ctx:
            return None
        r.in_ctx = True
        text = "".join(r.text)
        if not text.strip() and not calls:
            return None
        self.ctx.push(AssistantMessage(text, tuple(calls)))
        idx = len(self.ctx) - 1
        self.book.set_msg_index(epoch, rnd, idx)
        return idx

    def _commit_rounds(self, below: int | None = None) -> None:
        for (e, rnd) in sorted(self._rounds):
            if below is None or e < below:
                self._commit_round(e, rnd)

    def _user_text(self, text: str) -> None:
        if not text.strip():
            return
        self.st.user_transcripts += 1
        if self.ctx.has_open_tool_calls():
            self._pending_user.append(text)  # after the results (a call and its result stay together)
            return
        self.ctx.push(UserMessage(text))

    def flush_pending_user(self) -> None:
        while self._pending_user and not self.ctx.has_open_tool_calls():
            self.ctx.push(UserMessage(self._pending_user.pop(0)))

    # -- barge-in -----------------------------------------------------------------------------
    def _barge_in(self, a: M.BargeIn) -> None:
        at = a.at if a.at >= 0 else self.clock.now()
        if a.by == "media":
            self.st.media_cuts += 1  # a hold, not a barge-in
        else:
            self.st.barge_ins += 1
        if a.by == "provider":
            self.st.barge_ins_by_provider += 1
        self.watch.bump(a.new_epoch)
        self.call.clear(a.new_epoch, at)  # the book first, then Clear and TtsCut
        if self.next is not None:
            self.next.inbox.put_nowait(Interrupt(a.new_epoch, a.old_epoch, at))
        self.timeline.interrupt(a.old_epoch, a.new_epoch, at)
        for (e, rnd) in self._rounds:
            if e < a.new_epoch:
                br = self.book.round(e, rnd)
                if br is not None and not br.applied and br.interrupted_at is None:
                    br.interrupted_at = at
        self.tools.cut(a.new_epoch)
        self.tools.clear_confirmations()  # a barge-in drops every pending confirmation (as the runner's)
        s = self.session
        if a.cancel and s is not None:
            self.st.cancels += 1
            self.tasks.spawn(self._quiet(s.cancel_response(self.cfg.send_timeout)), f"{self.name}:cancel",
                             stage=self.name)
        self.tasks.spawn(self._settle_cut(a.new_epoch), f"{self.name}:truncate", stage=self.name)

    async def _settle_cut(self, floor: int) -> None:
        """The cut rounds into the context as heard, and the provider told the same."""
        await self.tools.join_cut()
        cut = [(k, r) for k, r in self._rounds.items() if k[0] < floor and r.utt is not None and not r.truncated]
        for _k, r in cut:
            r.truncated = True
        for _k, r in cut:
            self._align_words(r)
        async with self._ctx_lock:
            self._commit_rounds(below=floor)
            self.flush_pending_user()
            await self.book.apply_to(self.ctx)
        s = self.session
        if s is None:
            return
        for (_e, _rnd), r in cut:
            assert r.utt is not None
            u = self.book.utts.get(r.utt)
            if u is None or not u.cut:
                continue  # played whole before the cut: nothing to take back
            ms = self.book.heard_ms(r.utt) or 0
            heard = self.book.heard(u, interrupted=True).heard
            try:
                async with asyncio.timeout(self.cfg.truncate_timeout):
                    await s.truncate(r.item, ms, heard, self.cfg.truncate_timeout)
                self.st.truncations += 1
            except (ProviderError, TimeoutError):
                self.st.truncate_failures += 1

    def _align_words(self, r: _Round) -> None:
        """Word timings estimated over the round's own audio (the providers send none): each
        word's share of the audio is its share of the transcript's letters, one letter more
        per word for its edges. An estimate, counted as one in the book's stats."""
        assert r.utt is not None
        u = self.book.utts.get(r.utt)
        words = "".join(r.text).split()
        if u is None or u.words or not words or r.samples <= 0:
            return
        total = r.samples / self.call.tts_rate
        weights = [len(w) + 1.0 for w in words]
        scale = total / sum(weights)
        t = 0.0
        for w, wt in zip(words, weights, strict=True):
            self.book.add_word(r.utt, w, t, t + wt * scale)
            t += wt * scale

    # -- Smart Turn ------------------------------------------------------------------------------
    async def _verdict(self, pos: int) -> None:
        p: float | None = None
        with contextlib.suppress(Exception):
            p = await self.call.worker.smart_turn(pos, self.cfg.turn.verdict_timeout)
        self.st.verdicts += 1
        self.inbox.put_nowait(Wake("verdict", None if p is None else p >= self.cfg.verdict_threshold))

    # -- the session -------------------------------------------------------------------------------
    def _session_config(self) -> S2sConfig:
        cfg = replace(self.cfg.session, turn_detection=self.cfg.turn.turn_detection,
                      tools=self.tools.specs() or self.cfg.session.tools)
        if self.st.connects:
            cfg = replace(cfg, history=history_items(self.ctx), resume_handle=self._resume_handle)
        return cfg

    async def _connect(self) -> S2sSession:
        async with asyncio.timeout(self.cfg.connect_timeout):
            s = await self.provider.connect(self._session_config(), self.cfg.connect_timeout)
        self.st.connects += 1
        self._conv_in = InputConverter(s.input_rate, s.input_encoding)
        self._conv_out = OutputConverter(s.output_rate, self.call.tts_rate)
        return s

    async def _session_life(self) -> None:
        attempts = self.cfg.reconnect_policy.attempts()  # the call's: never refilled
        while not self._stopping:
            try:
                self.session = await self._connect()
            except (ProviderError, TimeoutError, OSError) as e:
                self.st.reconnect_failures += 1
                log.warning("call %s: S2S connect failed: %s", self.call.call_id, e)
                wait = attempts.next_delay()
                if wait is None:
                    break
                await self.clock.sleep(wait)
                continue
            if attempts.retries:
                self.st.reconnects += 1
                if len(self.ctx) and isinstance(self.ctx[len(self.ctx) - 1], UserMessage):
                    # the turn the dead session owed an answer to is answered by the new one
                    self.tasks.spawn(self._quiet(self.session.create_response(self.cfg.send_timeout)),
                                     f"{self.name}:resume", stage=self.name)
            error = await self._read(self.session)
            if self._stopping:
                return
            self.st.session_errors += 1
            log.warning("call %s: S2S session ended: %s", self.call.call_id, error or "closed")
            dead, self.session = self.session, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(dead.close(0.5), 1.0)
            self._mark_lost()
            await self._feed(M.SessionLost(self.clock.now()), from_reader=True)
            wait = attempts.next_delay()
            if wait is None:
                break
            await self.clock.sleep(wait)
        if not self._stopping:
            await self._give_up()

    async def _read(self, s: S2sSession) -> str:
        async for ev in s.events():
            match ev:
                case S2sClosed():
                    self.st.dropped_events += getattr(s, "dropped", 0)
                    return ev.error or "closed by the provider"
                case S2sInputTranscript():
                    if ev.final:
                        async with self._ctx_lock:
                            self._user_text(ev.text)
                case S2sError():
                    self.st.provider_errors += 1
                    log.info("call %s: S2S provider error %s", self.call.call_id, ev.code)
                    if ev.fatal:
                        return f"error: {ev.code}"
                case S2sResumable():
                    self._resume_handle = ev.handle
                case S2sToolCancelled():
                    self.tools.cancel_calls(ev.call_ids)
                case _:
                    await self._feed(ev, from_reader=True)
        return "events ended"

    def _mark_lost(self) -> None:
        rid = self.machine.streaming
        e = self.machine.epoch_of(rid) if rid else None
        for (ep, _rnd), r in self._rounds.items():
            if e is not None and ep == e and r.utt is not None and not r.in_ctx:
                self.book.mark_lost(r.utt)

    async def _give_up(self) -> None:
        """The session cannot be had back: the fallback line (local TTS), then the hang-up."""
        log.error("call %s: the S2S session could not be restored; ending the call", self.call.call_id)
        await self.tools.stop()
        if self.fallback_tts is not None and self.cfg.fallback_line.strip():
            from brisvox.agent.pipeline.s2s.fallback import speak_line

            try:
                async with asyncio.timeout(self.cfg.fallback_timeout):
                    played = await speak_line(self, self.fallback_tts, self.cfg.fallback_line)
                if played:
                    self.st.fallback_spoken += 1
            except (TimeoutError, ProviderError) as e:
                log.warning("call %s: the fallback line failed: %s", self.call.call_id, type(e).__name__)
        self.call.gateway.to_gateway(Hangup(call_id=self.call.call_id, reason="s2s_failed"))

    async def _quiet(self, coro: Any) -> None:
        """A control message to the provider: bounded, its failure counted (the reader sees a dead session)."""
        try:
            async with asyncio.timeout(self.cfg.send_timeout + 0.5):
                await coro
        except (ProviderError, TimeoutError):
            self.st.counts["control_failures"] = self.st.counts.get("control_failures", 0) + 1

    def stats(self) -> dict[str, int]:
        d = super().stats()
        for k in S2sStats.__slots__:
            v = getattr(self.st, k)
            if isinstance(v, int):
                d[k] = v
        d.update(self.st.counts)
        d["epoch"] = self.machine.epoch
        d.update(self.tools.stats())
        return d
