"""TtsStage: text chunks -> the TTS provider -> audio for TtsRingWriter.

Owns the call's TTS session:

* One provider context per text-bearing round; its id (session-monotonic)
  is the utterance id of the playout book, registered as (epoch, round).
  The exact raw slice is recorded in the book (``push_sent``) just before it
  goes to the provider, so the book holds exactly what was sent.
  Whitespace-only chunks are recorded, never spoken; before a round's first
  spoken chunk they are kept (bounded) and recorded with it.
* TtsEnded exactly once per response: when LlmResponseEnded arrived and no
  context of that epoch is pending. The provider flush goes out BEFORE the
  end is considered, and a context counts as done only AFTER its audio tail
  was handed on, so a TtsEnded never overtakes audio.
* The reader task converts provider PCM to the tts ring rate (soxr, one
  stream per context, reset at every context) and sends AudioOut through the
  guarded sender (dropped once the driver decided a newer epoch); events of
  unknown or cancelled contexts are dropped.
* Interrupt (or a newer epoch without one): cancel every open context of
  older epochs on the provider's priority path, forget them.
* Faults: the session connects at Start (prewarm, bounded), again when a
  round finds it dead (after ``reconnect_backoff``, 1 s fixed, counted from
  the death: :attr:`TtsStageConfig.reconnect_policy`; no connect is tried
  in a turn after ``max_reconnects`` + 1 (3 + 1) failures in it, a
  :class:`~brisvox.runtime.retry.RetryBudget` refilled by a new epoch); a session that
  dies marks its open utterances lost in the book and ends their responses;
  a provider silent for ``timeouts.tts_idle`` while it owes events is
  declared dead the same way.
* Clips (:mod:`.tts_clips`): a fixed line (``TextChunk.clip``: a filler) is played
  from its pre-rendered clip when the cache has it: an utterance of its own (an id
  from the same sequence, registered in the book, its text recorded as sent, its
  word timings given to the book), its audio sent as AudioOut with NO provider
  request, so the end mark, the played-text cut and a barge-in treat it like any
  utterance. It plays only after every earlier utterance's audio was handed on (at
  most ``timeouts.tts_idle`` waited for; at once when the provider already sends a
  later utterance: no order is left to keep) and provider audio of a later
  utterance waits for it. A miss renders the line through the provider as usual and stores
  the clip when that context ends cleanly (on first use). The cache is the stage's
  own with ``clip_scope`` empty, else the agent's process-wide one (per voice and
  ring rate, shared by the agent's calls).

DropStale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from brisvox.agent.pipeline.cascade.tts_clips import Capture, Clip, ClipCache, cache_for, voice_key
from brisvox.agent.pipeline.stage.base import Inbox, Stage, cancel_and_join
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioOut,
    Flush,
    Interrupt,
    LlmResponseEnded,
    LlmResponseStarted,
    PipelineFrame,
    Start,
    Stop,
    TextChunk,
    TtsEnded,
)
from brisvox.providers.base import (
    ProviderError,
    ProviderTimeouts,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsFlushed,
    TtsProvider,
    TtsSession,
    TtsWord,
)
from brisvox.runtime.retry import RetryBudget, RetryPolicy

log = logging.getLogger("brisvox.agent.tts")

WHITESPACE_LEAD_CAP = 64 * 1024


@dataclass(frozen=True, slots=True)
class TtsStageConfig:
    ring_rate: int = 24000
    max_reconnects: int = 3
    reconnect_backoff: float = 1.0
    timeouts: ProviderTimeouts = field(default_factory=ProviderTimeouts)
    tts: TtsConfig = field(default_factory=TtsConfig)
    clip_scope: str = ""  # the agent whose clips are shared by its calls ("": this call's own)

    @property
    def reconnect_policy(self) -> RetryPolicy:
        """A connect after a death or a failed connect waits ``reconnect_backoff`` (fixed, no
        jitter) from it."""
        return RetryPolicy(base=self.reconnect_backoff, multiplier=1.0, cap=self.reconnect_backoff)


@dataclass(slots=True)
class _Ctx:
    epoch: int
    round: int
    flushed: bool = False
    done: bool = False
    cancelled: bool = False
    owed_since: float | None = None
    resampler: Any = None
    clip: bool = False  # played from a clip: no provider context
    capture: Capture | None = None  # a fixed line's first rendering, kept as its clip


@dataclass(slots=True)
class TtsStats:
    warms: int = 0
    warm_failures: int = 0
    connects: int = 0
    connect_failures: int = 0
    deaths: int = 0
    stalls: int = 0
    contexts: int = 0
    cancels: int = 0
    text_dropped: int = 0
    whitespace_dropped: int = 0
    unknown_events: int = 0
    tts_ended: int = 0
    duplicate_ends: int = 0
    audio_chunks: int = 0
    clips_played: int = 0
    clips_rendered: int = 0


class TtsStage(Stage):
    DROP_STALE = True

    def __init__(self, call: CallContext, cfg: TtsStageConfig, inbox: Inbox, provider: TtsProvider) -> None:
        super().__init__(call, cfg, inbox)
        self.provider = provider
        self.cfg = cfg
        self.book = call.book
        self.st = TtsStats()
        self.session: TtsSession | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._died_at: float | None = None
        self._policy = cfg.reconnect_policy
        # a turn's connects: max_reconnects + 1 failures (a failed connect or a death takes one)
        # end them until a new epoch refills the budget
        self._attempts = RetryBudget(max(0, cfg.max_reconnects + 1))
        self._failure_epoch = -1
        self._warmed = False
        self._next_id = 1
        self._ctx: dict[int, _Ctx] = {}
        self._round_ctx: dict[tuple[int, int], int] = {}
        self._lead_ws: dict[tuple[int, int], str] = {}
        self._ended: set[int] = set()  # epochs whose LlmResponseEnded arrived
        self._end_sent: set[int] = set()
        self._clips: ClipCache | None = None  # resolved on first use (the provider's name is in the key)
        self._playing: set[int] = set()  # clip utterances whose audio is being sent
        self._held: int | None = None  # the provider utterance whose audio waits for a clip
        self._out_changed = asyncio.Event()  # an utterance finished handing on its audio

    # -- frames -------------------------------------------------------------------------
    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, TextChunk):
            await (self._clip(frame) if frame.clip else self._text(frame))
        elif isinstance(frame, LlmResponseStarted):
            self._kick_connect(frame.epoch)
        elif isinstance(frame, Flush):
            cid = self._round_ctx.get((frame.epoch, frame.round))
            if cid is not None:
                await self._flush(cid)
        elif isinstance(frame, LlmResponseEnded):
            e = frame.epoch
            for cid, c in list(self._ctx.items()):
                if c.epoch == e and not c.flushed:
                    await self._flush(cid)
            if e in self._ended:
                self.st.duplicate_ends += 1
            self._ended.add(e)
            await self._check_end(e)
        elif isinstance(frame, Interrupt):
            self._cancel_older(frame.epoch)
            await self.send(frame)
        elif isinstance(frame, Start):
            self._kick_connect(0)
            await self.send(frame)
        elif isinstance(frame, Stop):
            await self.send(frame)
        else:
            await self.send(frame)
        self._arm_stall()

    async def on_new_epoch(self, epoch: int) -> None:
        self._cancel_older(epoch)

    def _cancel_older(self, epoch: int) -> None:
        for cid, c in list(self._ctx.items()):
            if c.epoch < epoch:
                if not c.done and not c.clip and self.session is not None:
                    self.session.cancel(cid)
                    self.st.cancels += 1
                c.cancelled = True
                del self._ctx[cid]
                self._playing.discard(cid)
                self._out_changed.set()
        for key in [k for k in self._round_ctx if k[0] < epoch]:
            del self._round_ctx[key]
        for key in [k for k in self._lead_ws if k[0] < epoch]:
            del self._lead_ws[key]
        self._ended = {e for e in self._ended if e >= epoch}
        self._end_sent = {e for e in self._end_sent if e >= epoch - 1}

    async def _text(self, f: TextChunk) -> None:
        key = (f.epoch, f.round)
        cid = self._round_ctx.get(key)
        if not f.text.strip():
            if cid is None:
                lead = self._lead_ws.get(key, "")
                if len(lead) + len(f.text) > WHITESPACE_LEAD_CAP:
                    self.st.whitespace_dropped += 1
                else:
                    self._lead_ws[key] = lead + f.text
            else:
                self.book.push_sent(cid, f.text)
            return
        first = cid is None
        if first:
            session = await self._ensure_session(f.epoch)
            if session is None or self.watch.stale(f.epoch):
                self.st.text_dropped += 1
                return
            cid = self._next_id
            self._next_id += 1
            self._round_ctx[key] = cid
            self._ctx[cid] = _Ctx(f.epoch, f.round, capture=Capture(f.text, self.cfg.ring_rate) if f.clip else None)
            self.book.register_utterance(f.epoch, f.round, cid)
            self.st.contexts += 1
        assert cid is not None
        c = self._ctx.get(cid)
        session = self.session
        if c is None or session is None:
            self.st.text_dropped += 1
            return
        if not first and c.capture is not None:
            c.capture.spoiled = True  # the context carries more than the fixed line
        self.book.push_sent(cid, self._lead_ws.pop(key, "") + f.text)
        if c.owed_since is None:
            c.owed_since = self.clock.now()
        to = self.cfg.timeouts.send
        try:
            async with self.clock.timeout(to):
                await session.send_text(cid, f.text, continue_=not first, timeout=to)
        except (ProviderError, TimeoutError, OSError):
            self.book.mark_lost(cid)
            await self._session_died(session, "send")

    async def _clip(self, f: TextChunk) -> None:
        """A fixed line: played from its clip when the cache has it, else rendered by the
        provider (``_text``, which captures it for the cache)."""
        key = (f.epoch, f.round)
        clip = None if key in self._round_ctx or not f.text.strip() else self.clip_cache().get(f.text)
        if clip is None:
            await self._text(f)
            return
        if self.watch.stale(f.epoch):
            self.st.text_dropped += 1
            return
        cid = self._next_id
        self._next_id += 1
        c = _Ctx(f.epoch, f.round, flushed=True, clip=True)
        self._round_ctx[key] = cid
        self._ctx[cid] = c
        self.book.register_utterance(f.epoch, f.round, cid)
        self.book.push_sent(cid, self._lead_ws.pop(key, "") + f.text)
        for word, start, end in clip.words:
            self.book.add_word(cid, word, start, end)
        self.st.clips_played += 1
        self._playing.add(cid)
        self.tasks.spawn(self._play(cid, c, clip), "tts-clip")

    def clip_cache(self) -> ClipCache:
        """The clips of this agent and voice (created on first use; a warm transfer puts its
        hold audio there)."""
        if self._clips is None:
            t = self.cfg.tts
            name = str(getattr(self.provider, "name", type(self.provider).__name__))
            self._clips = cache_for(self.cfg.clip_scope, voice_key(name, t.voice, t.model, t.language, t.speed,
                                                                   t.extra, self.cfg.ring_rate))
        return self._clips

    async def _play(self, cid: int, c: _Ctx, clip: Clip) -> None:
        """A clip's audio, once every earlier utterance's audio was handed on (bounded)."""
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(self.cfg.timeouts.tts_idle):
                while not c.cancelled and any(k < cid and not x.done for k, x in self._ctx.items()):
                    if self._held is not None and self._held > cid:
                        break  # a provider sent a later utterance first: no order to keep, no stall
                    self._out_changed.clear()
                    await self._out_changed.wait()
        try:
            for piece in clip.pieces():
                if c.cancelled or not await self.guarded_send(AudioOut(c.epoch, cid, piece)):
                    break
                self.st.audio_chunks += 1
        finally:
            c.done = True
            self._playing.discard(cid)
            self._out_changed.set()
        await self._check_end(c.epoch)

    async def _after_clips(self, cid: int) -> None:
        """Provider audio of ``cid`` waits for the clips of earlier utterances."""
        if not any(k < cid for k in self._playing):
            return
        self._held = cid
        self._out_changed.set()  # a clip still waiting for an earlier utterance plays now
        try:
            while any(k < cid for k in self._playing):
                self._out_changed.clear()
                await self._out_changed.wait()
        finally:
            self._held = None

    def _keep_clip(self, c: _Ctx) -> None:
        cap, c.capture = c.capture, None
        clip = cap.clip() if cap is not None and not c.cancelled else None
        if clip is not None:
            self.clip_cache().put(clip)
            self.st.clips_rendered += 1

    async def _flush(self, cid: int) -> None:
        c = self._ctx.get(cid)
        session = self.session
        if c is None or c.flushed:
            return
        c.flushed = True
        if session is None:
            c.done = True
            self._out_changed.set()
            return
        if c.owed_since is None:
            c.owed_since = self.clock.now()
        to = self.cfg.timeouts.send
        try:
            async with self.clock.timeout(to):
                await session.flush(cid, to)
        except (ProviderError, TimeoutError, OSError):
            self.book.mark_lost(cid)
            await self._session_died(session, "flush")

    async def _check_end(self, epoch: int) -> None:
        if epoch not in self._ended or epoch in self._end_sent:
            return
        if any(c.epoch == epoch and not c.done for c in self._ctx.values()):
            return
        self._end_sent.add(epoch)
        self.st.tts_ended += 1
        await self.guarded_send(TtsEnded(epoch))

    # -- session ------------------------------------------------------------------------
    def _kick_connect(self, epoch: int) -> None:
        if self.session is not None or self._connecting is not None and not self._connecting.done():
            return
        if epoch != self._failure_epoch:
            self._failure_epoch = epoch
            self._attempts.reset()
        if not self._attempts.available():
            return
        self._connecting = self.tasks.spawn(self._connect(), "tts-connect")

    async def _connect(self) -> None:
        to = self.cfg.timeouts
        if not self._warmed:
            self._warmed = True
            self.st.warms += 1
            try:
                async with self.clock.timeout(min(to.connect, to.warm)):
                    await self.provider.warm(min(to.connect, to.warm))
            except (ProviderError, TimeoutError, OSError):
                self.st.warm_failures += 1
        if self._died_at is not None:
            spent = self._attempts.capacity - self._attempts.level()
            await self.clock.sleep_until(self._died_at + self._policy.delay(spent))
        self.st.connects += 1
        try:
            async with self.clock.timeout(to.connect):
                session = await self.provider.connect(self.cfg.tts, to.connect)
        except (ProviderError, TimeoutError, OSError) as e:
            self.st.connect_failures += 1
            self._attempts.take()
            self._died_at = self.clock.now()
            log.warning("tts connect failed: %s", type(e).__name__)
            return
        self.session = session
        self._reader = self.tasks.spawn(self._read(session), "tts-reader")

    async def _ensure_session(self, epoch: int) -> TtsSession | None:
        if self.session is not None:
            return self.session
        self._kick_connect(epoch)
        t = self._connecting
        if t is None:
            return None
        # wait for the connect, abandoned when an interrupt for a newer epoch is queued
        while not t.done():
            if self.inbox.has_interrupt_after(epoch):
                return None
            await asyncio.wait([t], timeout=0.05)
        return self.session

    async def _session_died(self, session: TtsSession, why: str) -> None:
        if self.session is not session:
            return
        self.session = None
        self.st.deaths += 1
        self._died_at = self.clock.now()
        self._attempts.take()
        log.warning("tts session died (%s)", why)
        reader = self._reader
        self._reader = None
        if reader is not None and reader is not asyncio.current_task():
            await cancel_and_join(reader, 0.5)
        try:
            async with self.clock.timeout(self.cfg.timeouts.close):
                await session.close(self.cfg.timeouts.close)
        except (TimeoutError, ProviderError, OSError):
            pass
        epochs = set()
        for cid, c in list(self._ctx.items()):
            if not c.done and not c.clip:  # a clip needs no session
                self.book.mark_lost(cid)
                c.done = True
                epochs.add(c.epoch)
        self._out_changed.set()
        for e in sorted(epochs):
            await self._check_end(e)

    async def _read(self, session: TtsSession) -> None:
        ring_rate = self.cfg.ring_rate
        try:
            async for ev in session.events():
                if isinstance(ev, TtsAudio):
                    c = self._ctx.get(ev.context)
                    if c is None or c.cancelled:
                        self.st.unknown_events += 1
                        continue
                    c.owed_since = None
                    samples = np.frombuffer(ev.pcm, dtype=np.int16)
                    if session.sample_rate != ring_rate:
                        samples = self._resample(c, samples, session.sample_rate)
                    if len(samples):
                        if self._playing:
                            await self._after_clips(ev.context)
                            if c.cancelled:
                                continue
                        if c.capture is not None:
                            c.capture.audio(samples)
                        self.st.audio_chunks += 1
                        await self.guarded_send(AudioOut(c.epoch, ev.context, samples))
                elif isinstance(ev, TtsWord):
                    c = self._ctx.get(ev.context)
                    if c is None:
                        continue
                    c.owed_since = None
                    self.book.add_word(ev.context, ev.word, ev.start, ev.end)
                    if c.capture is not None:
                        c.capture.word(ev.word, ev.start, ev.end)
                elif isinstance(ev, TtsFlushed):
                    c = self._ctx.get(ev.context)
                    if c is None:
                        continue
                    if c.resampler is not None:
                        tail = self._resample(c, np.zeros(0, dtype=np.int16), session.sample_rate, last=True)
                        if len(tail):
                            if self._playing:
                                await self._after_clips(ev.context)
                            if c.capture is not None:
                                c.capture.audio(tail)
                            await self.guarded_send(AudioOut(c.epoch, ev.context, tail))
                    c.done = True
                    c.owed_since = None
                    if c.capture is not None:
                        self._keep_clip(c)
                    self._out_changed.set()
                    await self._check_end(c.epoch)
                elif isinstance(ev, TtsCancelled):
                    continue
                elif isinstance(ev, TtsClosed):
                    break
        except (ProviderError, OSError):
            pass
        except asyncio.CancelledError:
            raise
        if self.session is session:
            # died under us: must not cancel ourselves inside _session_died
            self._reader = None
            await self._session_died(session, "closed")

    def _resample(self, c: _Ctx, samples: np.ndarray, src: int, last: bool = False) -> np.ndarray:
        import soxr

        if c.resampler is None:
            c.resampler = soxr.ResampleStream(src, self.cfg.ring_rate, 1, dtype="int16", quality="HQ")
        out = c.resampler.resample_chunk(samples, last=last)
        return np.asarray(out, dtype=np.int16).reshape(-1)

    # -- stall watchdog ----------------------------------------------------------------
    def _arm_stall(self) -> None:
        owed = [c.owed_since for c in self._ctx.values() if c.owed_since is not None and not c.done]
        if owed:
            self.arm(min(owed) + self.cfg.timeouts.tts_idle)

    async def on_deadline(self, now: float) -> None:
        owed = [c.owed_since for c in self._ctx.values() if c.owed_since is not None and not c.done]
        if owed and self.session is not None and now >= min(owed) + self.cfg.timeouts.tts_idle:
            self.st.stalls += 1
            await self._session_died(self.session, "stall")
        self._arm_stall()

    async def on_stop(self) -> None:
        if self._connecting is not None:
            await cancel_and_join(self._connecting, 0.5)
        s = self.session
        self.session = None
        if self._reader is not None:
            await cancel_and_join(self._reader, 0.5)
        if s is not None:
            try:
                async with self.clock.timeout(self.cfg.timeouts.close):
                    await s.close(self.cfg.timeouts.close)
            except (TimeoutError, ProviderError, OSError):
                pass

    def stats(self) -> dict[str, int]:
        d = super().stats()
        d.update({k: getattr(self.st, k) for k in self.st.__slots__})
        return d
