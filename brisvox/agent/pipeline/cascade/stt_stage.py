"""SttStage: caller audio to the STT provider, transcripts and UtteranceFinals back.

Owns the call's STT session:

* ``process`` never awaits the provider. A session that is an
  ``SttSpanSink`` (a model reading in16 itself) gets each chunk's in16
  positions (``note_span``) right before the chunk. Audio is queued (bounded,
  drop-newest at ``audio_queue``, counted) for ONE session task, and not
  forwarded (nothing after this stage uses it): the turn driver takes the in16 positions it needs from the
  actor's pump (``TurnDriver.note_audio_end``), so caller audio costs no
  frame hop and no task wake past this stage. A provider that declares
  ``audio_batch`` (seconds; e.g. the scripted STT) gets its audio from the
  pump in batches of that size (see ``CallActor.on_worker``); 0 or absent
  (streaming vendors) means every worker tick's audio at once. That one
  session task owns the provider session, the ledger of unanswered
  Finalizes and every frame the stage emits besides the forwarded VAD
  events, so transcripts and UtteranceFinals are strictly ordered.
* Finalize at every VAD stop, right after forwarding the stop. It never
  precedes the speech it finalizes: the stop travels the system lane and can
  overtake queued audio, so the Finalize is held until an audio frame
  reaching the stop position was processed, or ``max_finalize_defer`` (1 s,
  the stage's own deadline) passed, or the call stops.
* Early finalize (``early_finalize``; needs the VAD's falling events, the
  workers' ``[vad] fall_delay_ms`` > 0): a UserSpeechFalling (silence began at
  ``pos``, the stop of this fall will carry exactly ``pos``) sends the Finalize
  of that fall at once (held the same way until audio reaching ``pos`` was
  processed), so its final is on its way before the stop is decided. The stop
  whose ``pos`` equals the falling's, with no UserStartedSpeaking between, sends
  no Finalize of its own: it claims the early one, whose answer is then the
  stop's UtteranceFinal (emitted by the session task when the answer comes
  after the claim, or by the stage right after forwarding the stop when the
  answer came before: its text already went out then, so the order of text,
  stop and UtteranceFinal is kept). An early Finalize that no stop claims (the
  caller went on: a newer falling, a stop of another ``pos``, a start) is an
  orphan: its answer emits its final text and NO UtteranceFinal, so the words
  join the next stop's final and the driver's one-UtteranceFinal-per-stop
  count is unchanged. At most one early Finalize per fall; none while a
  quarter of ``finalize_queue`` is queued (counted ``early_skipped``: the stop
  then finalizes as without early finalize).
* Finalizes are queued for the session task, bounded at ``finalize_queue``
  (32): a Finalize past the bound never reaches the provider and is answered
  synthetically (``finalize_overflow``), in its place in the order: an
  overflow Finalize is a count owed after the last queued one (and every
  later Finalize joins that count until the session task reached it), and
  the session task moves the count onto the newest entry of the ledger of
  unanswered Finalizes (answered right after that one is) or answers it at
  once when nothing is unanswered. The ledger is bounded the same way (a
  Finalize that finds ``finalize_queue`` unanswered is not sent: it joins
  the newest entry's count). Memory: at most ``finalize_queue`` entries in
  each, whatever the caller's VAD does.
* Exactly one UtteranceFinal per Finalize of a stop (an orphan early one has none): the answer is the provider's
  ``from_finalize and speech_final`` transcript (oldest Finalize first); a
  Finalize unanswered after ``timeouts.finalize`` declares the session dead;
  a dead or missing session answers every outstanding or new Finalize
  synthetically. A synthetic answer (and a real empty answer with no final
  segment since the last UtteranceFinal) first promotes the latest interim to
  a final segment, so the caller's words are not lost.
* Connect at Start (after a bounded warm-up), reconnect after a failed
  connect or a death with a fixed backoff counted from the death
  (``reconnect_backoff``, 1 s: :attr:`SttStageConfig.reconnect_policy`), at
  most ``max_reconnects`` (3) consecutive attempts (a
  :class:`~brisvox.runtime.retry.RetryBudget` without refill), then degraded
  until the next UserStartedSpeaking grants a fresh budget. The budget is
  restored when a session delivers a final segment or lives ``healthy_after``
  seconds.

User side: epoch 0, KeepAll.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from brisvox.agent.pipeline.stage.base import Inbox, Stage, cancel_and_join
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    PipelineFrame,
    Start,
    Stop,
    UserSpeechFalling,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscript,
    UtteranceFinal,
)
from brisvox.providers.base import (
    ProviderError,
    ProviderTimeouts,
    SttClosed,
    SttConfig,
    SttProvider,
    SttSession,
    Transcript,
)
from brisvox.runtime.retry import RetryBudget, RetryPolicy

log = logging.getLogger("brisvox.agent.stt")


@dataclass(frozen=True, slots=True)
class SttStageConfig:
    audio_queue: int = 64
    finalize_queue: int = 32
    max_finalize_defer: float = 1.0
    early_finalize: bool = False  # Finalize at the VAD's falling event; the stop of the same fall reuses it
    max_reconnects: int = 3
    reconnect_backoff: float = 1.0
    healthy_after: float = 10.0
    timeouts: ProviderTimeouts = field(default_factory=ProviderTimeouts)
    stt: SttConfig = field(default_factory=SttConfig)

    @property
    def reconnect_policy(self) -> RetryPolicy:
        """A reconnect waits ``reconnect_backoff`` (fixed, no jitter) from the death."""
        return RetryPolicy(base=self.reconnect_backoff, multiplier=1.0, cap=self.reconnect_backoff)


@dataclass(slots=True)
class SttStats:
    warms: int = 0
    warm_failures: int = 0
    connects: int = 0
    connect_failures: int = 0
    deaths: int = 0
    finalizes: int = 0
    answered: int = 0
    synthetic: int = 0
    late_answers: int = 0
    finalize_timeouts: int = 0
    finalize_deferred: int = 0
    finalize_defer_expired: int = 0
    interims_promoted: int = 0
    audio_dropped: int = 0
    audio_no_session: int = 0
    finalize_overflow: int = 0
    early_finalizes: int = 0  # sent at a falling
    early_claimed: int = 0  # answered the stop of their fall (no second Finalize)
    early_orphaned: int = 0  # the caller went on: the text joined the next stop's final
    early_skipped: int = 0  # not sent: the queue was a quarter full (the stop finalized as usual)
    interims_dropped: int = 0
    degraded: int = 0


@dataclass(slots=True, eq=False)
class _Fin:
    """One Finalize on its way. A stop's is ``claimed`` from the start; an early one
    (sent at a falling) is claimed by the stop of its fall, or never (an orphan).
    ``answered``: the answer came while the early one was unclaimed (its text went
    out, its UtteranceFinal is owed to the claim; ``synthetic`` how it was answered)."""

    claimed: bool = True
    answered: bool = False
    synthetic: bool = False


class SttStage(Stage):
    DROP_STALE = False

    def __init__(self, call: CallContext, cfg: SttStageConfig, inbox: Inbox, provider: SttProvider) -> None:
        super().__init__(call, cfg, inbox)
        self.provider = provider
        self.cfg = cfg
        self.st = SttStats()
        self._audio: deque[tuple[bytes, int, int]] = deque()  # (pcm, in16 start, end)
        self._finalizes: deque[_Fin] = deque()  # queued for the session task, <= finalize_queue
        self._overflow = 0  # Finalizes past the bound: answered synthetically after every queued one
        self._held: deque[tuple[int, float, _Fin]] = deque()  # (stop or falling pos, defer deadline, its Finalize)
        self._early: tuple[int, _Fin] | None = None  # the early Finalize of the current fall (its pos), unclaimed
        self._processed_end = -1
        self._wake = asyncio.Event()
        self._grant = False
        self._session_task: asyncio.Task[None] | None = None
        self._stopping = False
        # owned by the session task: the unanswered Finalizes, oldest first, each [sent at, synthetic
        # answers owed right after its own, the _Fin] (<= finalize_queue entries)
        self._outstanding: deque[list] = deque()
        self._interim = ""
        self._final_since_uf = False
        self._uf_due: deque[_Fin] = deque()  # early Finalizes answered, then claimed: their UF owed now

    # -- stage side ------------------------------------------------------------------
    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, AudioFrame):
            # not forwarded: the turn driver, the only stage after this one that used
            # caller audio, takes its positions from the pump (TurnDriver.note_audio_end)
            end = frame.pos + len(frame.samples)
            if len(self._audio) >= self.cfg.audio_queue:
                self.st.audio_dropped += 1
            else:
                self._audio.append((frame.samples.tobytes(), frame.pos, end))
                self._wake.set()
            self._processed_end = end
            held = self._held
            while held and held[0][0] <= end:
                self._queue_finalize(held.popleft()[2])
            return
        if isinstance(frame, UserStoppedSpeaking):
            await self.send(frame)
            early, self._early = self._early, None
            if early is not None and early[0] == frame.pos:  # the stop of the early Finalize's fall
                fin = early[1]
                fin.claimed = True
                self.st.early_claimed += 1
                if fin.answered:  # its text is out (or going): the session task closes the stop now
                    self._uf_due.append(fin)
                    self._wake.set()
                return
            if early is not None:
                self.st.early_orphaned += 1
            self._finalize_at(frame.pos, _Fin())
            return
        if isinstance(frame, UserSpeechFalling):
            await self.send(frame)
            if not self.cfg.early_finalize:
                return
            if self._early is not None:  # a newer fall: the caller spoke on since the last one
                self.st.early_orphaned += 1
                self._early = None
            if self._overflow or len(self._finalizes) + len(self._held) >= max(1, self.cfg.finalize_queue // 4):
                self.st.early_skipped += 1
                return
            fin = _Fin(claimed=False)
            self._early = (frame.pos, fin)
            self.st.early_finalizes += 1
            self._finalize_at(frame.pos, fin)
            return
        if isinstance(frame, UserStartedSpeaking):
            await self.send(frame)
            if self._early is not None:
                self.st.early_orphaned += 1
                self._early = None
            self._grant = True
            self._wake.set()
            return
        if isinstance(frame, Start):
            self._session_task = self.tasks.spawn(self._session_main(), "stt-session")
            await self.send(frame)
            return
        if isinstance(frame, Stop):
            while self._held:
                self._queue_finalize(self._held.popleft()[2])
            await self.send(frame)
            return
        await self.send(frame)

    def _finalize_at(self, pos: int, fin: _Fin) -> None:
        """Queue ``fin`` once audio reaching ``pos`` was processed (held until then, at
        most ``max_finalize_defer``)."""
        if not self._held and self._processed_end >= pos:
            self._queue_finalize(fin)
        else:
            self.st.finalize_deferred += 1
            dl = self.clock.now() + self.cfg.max_finalize_defer
            self._held.append((pos, dl, fin))
            self.arm(dl)

    async def on_deadline(self, now: float) -> None:
        while self._held and self._held[0][1] <= now:
            self.st.finalize_defer_expired += 1
            self._queue_finalize(self._held.popleft()[2])
        if self._held:
            self.arm(self._held[0][1])

    def _queue_finalize(self, fin: _Fin) -> None:
        if self._overflow or len(self._finalizes) >= self.cfg.finalize_queue:
            # answered synthetically, in order, by the session task (never sent)
            self.st.finalize_overflow += 1
            if not fin.claimed:  # an early one: answered empty now; a claim closes the stop at once
                fin.answered = fin.synthetic = True
                return
            self._overflow += 1
        else:
            self._finalizes.append(fin)
        self._wake.set()

    async def on_stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._session_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._session_task), self.cfg.timeouts.close + 0.5)
            except (TimeoutError, asyncio.CancelledError):
                await cancel_and_join(self._session_task, 0.5)

    # -- emission (session task only) -----------------------------------------------
    def _emit_interim(self, text: str) -> None:
        if not self.send_nowait(UserTranscript(text, False)):
            self.st.interims_dropped += 1

    async def _put(self, frame: PipelineFrame) -> None:
        if self._stopping:
            self.send_nowait(frame)  # the driver may be gone: never block after Stop
        else:
            await self.send(frame)

    async def _emit_final(self, text: str) -> None:
        await self._put(UserTranscript(text, True))

    async def _answer(self, t: Transcript | None, fin: _Fin | None = None) -> None:
        """Answer the oldest outstanding Finalize: ``t`` the provider's answer, None synthetic.
        ``fin`` None: an overflow answer (a stop's)."""
        await self._close_due()  # a claimed early Finalize is older than this one
        if t is None:
            self.st.synthetic += 1
        else:
            self.st.answered += 1
        if fin is not None and not fin.claimed:  # early, no stop yet: the text now, the UF to the claim
            fin.answered, fin.synthetic = True, t is None  # before any await: a claim from now on is due
            if t is not None and t.text.strip():
                self._final_since_uf, self._interim = True, ""
                await self._emit_final(t.text)
            return
        if t is not None and t.text.strip():
            await self._emit_final(t.text)
            self._final_since_uf = True
        await self._close_utterance(t is None, self._put)

    async def _close_due(self) -> None:
        """The UtteranceFinals of early Finalizes claimed after their answer (in claim order)."""
        while self._uf_due:
            await self._close_utterance(self._uf_due.popleft().synthetic, self._put)

    async def _close_utterance(self, synthetic: bool, put: Callable[[PipelineFrame], Awaitable[None]]) -> None:
        """The UtteranceFinal of a stop, after promoting the latest interim when no final segment
        came since the last one (the caller's words are not lost)."""
        if not self._final_since_uf and self._interim.strip():
            self.st.interims_promoted += 1
            await put(UserTranscript(self._interim, True))
        self._interim = ""
        self._final_since_uf = False
        await put(UtteranceFinal(synthetic=synthetic))

    async def _answer_queued_synthetically(self) -> None:
        await self._close_due()
        while self._finalizes or self._overflow:
            fin = None
            if self._finalizes:
                fin = self._finalizes.popleft()
            else:
                self._overflow -= 1
            self.st.finalizes += 1
            await self._answer(None, fin)

    async def _answer_oldest(self, t: Transcript | None) -> None:
        """Answer the oldest unanswered Finalize, then the overflow answers owed after it."""
        _, owed, fin = self._outstanding.popleft()
        await self._answer(t, fin)
        for _ in range(int(owed)):
            await self._answer(None)

    async def _owe_after_newest(self, n: int) -> None:
        """``n`` synthetic answers owed after every Finalize sent so far."""
        if self._outstanding:
            self._outstanding[-1][1] += n
        else:
            for _ in range(n):
                await self._answer(None)

    # -- the session task ------------------------------------------------------------
    async def _session_main(self) -> None:
        cfg = self.cfg
        to = cfg.timeouts
        try:
            self.st.warms += 1
            async with self.clock.timeout(min(to.connect, to.warm)):
                await self.provider.warm(min(to.connect, to.warm))
        except (ProviderError, TimeoutError, OSError):
            self.st.warm_failures += 1
        policy = cfg.reconnect_policy
        budget = RetryBudget(max(0, cfg.max_reconnects))  # consecutive reconnects; no refill over time
        died_at: float | None = None
        first = True
        while not self._stopping:
            if not first:
                if not budget.available():
                    self.st.degraded += 1
                    self._grant = False
                    while not self._grant and not self._stopping:
                        await self._idle_without_session(None)
                    if self._stopping:
                        break
                    budget.reset()  # a speech start grants a fresh budget
                budget.take()  # with no token (max_reconnects 0) the granted attempt is made all the same
                delay = policy.delay(budget.capacity - budget.level())
                resume = (died_at if died_at is not None else self.clock.now()) + delay
                while self.clock.now() < resume and not self._stopping:
                    await self._idle_without_session(resume)
                if self._stopping:
                    break
            first = False
            session = await self._connect()
            if session is None:
                died_at = self.clock.now()
                await self._answer_queued_synthetically()
                continue
            healthy = await self._run_session(session)
            died_at = self.clock.now()
            if healthy:
                budget.reset()
        await self._answer_queued_synthetically()

    async def _idle_without_session(self, until: float | None) -> None:
        """No session: drop audio, answer Finalizes at once, wait for a wake."""
        n = len(self._audio)
        if n:
            self.st.audio_no_session += n
            self._audio.clear()
        await self._answer_queued_synthetically()
        self._wake.clear()
        if self._finalizes or self._overflow or self._uf_due or self._stopping:
            return  # queued while the answers above were awaited: their wake was cleared
        if until is None:
            await self._wake.wait()
        else:
            try:
                async with asyncio.timeout_at(until):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _connect(self) -> SttSession | None:
        to = self.cfg.timeouts
        self.st.connects += 1
        try:
            async with self.clock.timeout(to.connect):
                return await self.provider.connect(self.cfg.stt, to.connect)
        except (ProviderError, TimeoutError, OSError) as e:
            self.st.connect_failures += 1
            log.warning("stt connect failed: %s", type(e).__name__)
            return None

    async def _run_session(self, session: SttSession) -> bool:
        """Drive one session until it dies or the call stops. True if it was healthy."""
        cfg = self.cfg
        to = cfg.timeouts
        started = self.clock.now()
        healthy = False
        events: deque[object] = deque()
        wake = self._wake

        async def reader() -> None:
            try:
                async for ev in session.events():
                    events.append(ev)
                    wake.set()
            except (ProviderError, OSError) as e:
                events.append(SttClosed(type(e).__name__))
            else:
                events.append(SttClosed(""))
            wake.set()

        rtask = self.tasks.spawn(reader(), "stt-reader")
        note_span = getattr(session, "note_span", None)
        dead = False
        try:
            while not dead:
                if not healthy and self.clock.now() - started >= cfg.healthy_after:
                    healthy = True
                await self._close_due()
                while events:
                    ev = events.popleft()
                    if isinstance(ev, SttClosed):
                        dead = True
                        break
                    assert isinstance(ev, Transcript)
                    if ev.from_finalize and ev.speech_final:
                        if not self._outstanding:
                            self.st.late_answers += 1
                            continue
                        if ev.text.strip():
                            healthy = True
                        await self._answer_oldest(ev)
                    elif ev.is_final:
                        if ev.text.strip():
                            healthy = True
                            self._final_since_uf = True
                            self._interim = ""
                            await self._emit_final(ev.text)
                    else:
                        self._interim = ev.text
                        self._emit_interim(ev.text)
                if dead:
                    break
                if self._stopping:
                    break
                # commands: audio first (a Finalize must follow the audio queued before it)
                try:
                    while self._audio:
                        pcm, start, end = self._audio.popleft()
                        if note_span is not None:
                            note_span(start, end)  # SttSpanSink: the in16 positions of this chunk
                        await session.send_audio(pcm, to.send)
                    if self._finalizes:
                        fin = self._finalizes.popleft()
                        self.st.finalizes += 1
                        if len(self._outstanding) >= cfg.finalize_queue:
                            self.st.finalize_overflow += 1
                            if fin.claimed:
                                await self._owe_after_newest(1)
                            else:  # an early one past the ledger's bound: answered empty at once
                                await self._answer(None, fin)
                        else:
                            await session.finalize(to.send)
                            self._outstanding.append([self.clock.now(), 0, fin])
                        continue
                    if self._overflow:  # every queued Finalize went before them
                        n, self._overflow = self._overflow, 0
                        self.st.finalizes += n
                        await self._owe_after_newest(n)
                        continue
                except (ProviderError, TimeoutError, OSError):
                    dead = True
                    break
                now = self.clock.now()
                if self._outstanding and now >= self._outstanding[0][0] + to.finalize:
                    self.st.finalize_timeouts += 1
                    dead = True
                    break
                # no wake for healthy_after: "lived long enough" is judged when the session ends
                deadline = self._outstanding[0][0] + to.finalize if self._outstanding else None
                if events or self._audio or self._finalizes or self._overflow or self._uf_due or self._stopping:
                    continue
                wake.clear()
                if deadline is None:
                    await wake.wait()
                else:
                    try:
                        async with asyncio.timeout_at(deadline):
                            await wake.wait()
                    except TimeoutError:
                        pass
        finally:
            if not healthy and self.clock.now() - started >= cfg.healthy_after:
                healthy = True
            if dead:
                self.st.deaths += 1
            await cancel_and_join(rtask, 0.5)
            try:
                async with self.clock.timeout(to.close):
                    await session.close(to.close)
            except (TimeoutError, ProviderError, OSError):
                pass
        while self._outstanding:
            await self._answer_oldest(None)
        return healthy

    def stats(self) -> dict[str, int]:
        d = super().stats()
        d.update({k: getattr(self.st, k) for k in self.st.__slots__})
        return d
