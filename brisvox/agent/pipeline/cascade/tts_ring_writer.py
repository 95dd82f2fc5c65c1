"""TtsRingWriter: bot audio into the call's tts ring, the epoch ledger, end marks.

Owns the tail of the output chain on the ring architecture (the agent writes
the tts ring, the worker converts it, the gateway paces the out ring):

* Audio of a live epoch is written into the ``tts`` ring (the worker converts
  it into the ``out`` ring, the gateway paces it). A new utterance is
  announced first (``TtsUtterance`` to the worker, with the ring position it
  starts at; the worker answers ``OutUtterance`` with its out-ring position,
  which the actor's inbound path gives to the book and to :meth:`on_out_utterance`).
  Not a pacer: it only keeps the ring at most ``max_ahead`` seconds ahead of
  playout, so a long answer never overruns a ring. Playout is the larger of
  a real-time estimate and the book's :meth:`~PlayoutBook.unreleased_s`
  (from the gateway's release reports): while a barge-in candidate holds the
  release (Pause), the writer stops too instead of filling the ring; one
  write waits at most ``max_ahead`` + ``max_hold`` (counted as
  ``hold_overflows`` when it gives up), so a release that never moves again
  cannot stall the stage for ever.
* Epoch ledger: the stage is KeepAll and filters epochs itself so it can
  count (``stale_dropped``, ``stale_control``); the floor is the newest of its
  own Clear epoch and the last Interrupt. Before the first audio of any epoch
  above ``tx_epoch`` it sends Clear{epoch} (idempotent through the shared
  :class:`~brisvox.agent.pipeline.stage.call_context.LedgerLink`; on an idle transport it cuts nothing; without it the
  second turn's audio would be refused by the gateway), marked ``lazy`` so
  the gateway can tell it from a barge-in when it races the new response's
  first frame (see ``ipc.frames.Clear``).
* The first audio the ring accepted for an epoch sends BotStarted upstream
  and marks FirstAudioOut, once per epoch.
* TtsEnded of a response with audio becomes an end Mark (unique name
  ``brisvox-end-<epoch>-<n>``, registered in the book for the response's
  last utterance, at that utterance's end out-position); its echo
  (:meth:`on_mark_played`) sends BotEnded upstream once per epoch
  (``ended_through``). A response without audio ends at once. A client that
  never echoes: the end is reported ``mark_timeout`` after the audio should
  have played out. A cut epoch never reports an end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioOut,
    BotEnded,
    BotStarted,
    Interrupt,
    PipelineFrame,
    Stop,
    TtsEnded,
)
from ipc.frames import Mark, TtsUtterance

log = logging.getLogger("brisvox.agent.out")


@dataclass(frozen=True, slots=True)
class TtsRingWriterConfig:
    max_ahead: float = 2.0
    mark_timeout: float = 10.0
    max_hold: float = 4.0  # above the gateway's pause bound ([gateway] pause_max_ms)


@dataclass(slots=True)
class OutStats:
    audio_frames: int = 0
    samples_written: int = 0
    stale_dropped: int = 0
    stale_control: int = 0
    clears_lazy: int = 0
    marks_sent: int = 0
    marks_echoed: int = 0
    mark_timeouts: int = 0
    direct_ends: int = 0
    duplicate_ends: int = 0
    utterances: int = 0
    ahead_waits: int = 0
    hold_overflows: int = 0


@dataclass(slots=True)
class _EpochOut:
    first_at: float
    play_end: float  # estimated end of playout of what was written
    last_utt: int
    utts: list[int]
    mark: str | None = None
    mark_deadline: float | None = None


class TtsRingWriter(Stage):
    DROP_STALE = False  # filters epochs itself (counted)

    def __init__(self, call: CallContext, cfg: TtsRingWriterConfig, inbox: Inbox) -> None:
        super().__init__(call, cfg, inbox)
        self.call_id = call.call_id
        self.cfg = cfg
        self.sink = call.sink
        self.gateway = call.gateway
        self.worker = call.worker
        self.clears = call.ledger
        self.book = call.book
        self.timeline = call.timeline
        self.upstream = call.upstream
        self.tts_rate = call.tts_rate
        self.st = OutStats()
        self.floor = 0
        self.tx_epoch = 0
        self._cur_utt: int | None = None
        self._play_end = 0.0
        self._epochs: dict[int, _EpochOut] = {}
        self._ended_through: set[int] = set()
        self._mark_seq = 0
        self._pending_marks: dict[int, str] = {}  # utterance -> mark name waiting for out_start

    def _is_stale(self, epoch: int) -> bool:
        return epoch < self.floor or epoch < self.clears.epoch or self.watch.stale(epoch)

    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, AudioOut):
            await self._audio(frame)
            return  # audio moves no mark deadline: nothing to re-arm
        if isinstance(frame, TtsEnded):
            self._tts_ended(frame.epoch)
        elif isinstance(frame, Interrupt):
            if frame.epoch > self.floor:
                self.floor = frame.epoch
            self.clears.clear(frame.epoch)
            self._cur_utt = None
            self._play_end = self.clock.now()
            for e in [e for e in self._epochs if e < frame.epoch]:
                eo = self._epochs.pop(e)
                if eo.mark is not None:
                    self._pending_marks = {u: m for u, m in self._pending_marks.items() if m != eo.mark}
        elif isinstance(frame, Stop):
            self.deadline = None
        self._rearm()

    async def _audio(self, f: AudioOut) -> None:
        e = f.epoch
        if self._is_stale(e):
            self.st.stale_dropped += 1
            return
        if e > self.tx_epoch:
            if self.clears.clear(e, lazy=True):
                self.st.clears_lazy += 1
            self.tx_epoch = e
            self._cur_utt = None
        # stay at most max_ahead seconds ahead of playout (estimated, or held by a Pause)
        now = self.clock.now()
        ahead = max(self._play_end - now, self.book.unreleased_s())
        if ahead > self.cfg.max_ahead:
            self.st.ahead_waits += 1
            give_up = now + ahead - self.cfg.max_ahead + self.cfg.max_hold
            while ahead > self.cfg.max_ahead:
                if now >= give_up:
                    self.st.hold_overflows += 1
                    break
                await self.clock.sleep(min(max(ahead - self.cfg.max_ahead, 0.02), give_up - now))
                if self._is_stale(e):  # epoch check right before the write
                    self.st.stale_dropped += 1
                    return
                now = self.clock.now()
                ahead = max(self._play_end - now, self.book.unreleased_s())
        if f.utterance != self._cur_utt:
            self._cur_utt = f.utterance
            pos = self.sink.write_pos
            self.st.utterances += 1
            self.book.utterance_tts_start(f.utterance, pos)
            self.worker.to_worker(TtsUtterance(self.call_id, f.utterance, e, pos))
        n = len(f.samples)
        self.sink.write(f.samples)
        self.book.add_audio(f.utterance, n)
        self.st.audio_frames += 1
        self.st.samples_written += n
        self._play_end = max(self._play_end, now) + n / self.tts_rate
        eo = self._epochs.get(e)
        if eo is None:
            eo = _EpochOut(now, self._play_end, f.utterance, [f.utterance])
            self._epochs[e] = eo
            self.timeline.first_audio_out(e, now)
            self.upstream.send(BotStarted(e, now))
        else:
            eo.play_end = self._play_end
            if eo.last_utt != f.utterance:
                eo.last_utt = f.utterance
                eo.utts.append(f.utterance)

    def _tts_ended(self, epoch: int) -> None:
        if self._is_stale(epoch):
            self.st.stale_control += 1
            return
        eo = self._epochs.get(epoch)
        if eo is None:
            self.st.direct_ends += 1
            self._report_end(epoch, "no_audio")
            return
        if eo.mark is not None:
            self.st.duplicate_ends += 1
            return
        self._mark_seq += 1
        name = f"brisvox-end-{epoch}-{self._mark_seq}"
        eo.mark = name
        eo.mark_deadline = eo.play_end + self.cfg.mark_timeout
        self.book.register_end_mark(eo.last_utt, name)
        u = self.book.utts.get(eo.last_utt)
        if u is not None and u.out_start is not None:
            self._send_mark(name, u.out_start + self.book.total_out(u))
        else:
            self._pending_marks[eo.last_utt] = name

    def _send_mark(self, name: str, position: int) -> None:
        self.st.marks_sent += 1
        self.gateway.to_gateway(Mark(self.call_id, name, position))

    def _report_end(self, epoch: int, reason: str) -> None:
        if epoch in self._ended_through:
            self.st.duplicate_ends += 1
            return
        self._ended_through.add(epoch)
        if len(self._ended_through) > 64:
            self._ended_through = {e for e in self._ended_through if e >= epoch - 32}
        self.upstream.send(BotEnded(epoch, reason))

    # -- inbound (called by the actor's pump; synchronous) --------------------------------
    def on_out_utterance(self, utt: int, out_pos: int) -> None:
        name = self._pending_marks.pop(utt, None)
        if name is not None:
            u = self.book.utts.get(utt)
            if u is not None:
                self._send_mark(name, out_pos + self.book.total_out(u))

    def on_mark_played(self, name: str) -> None:
        epoch = self.book.mark_played(name)
        if epoch is None or self._is_stale(epoch):
            self.st.stale_control += 1
            return
        self.st.marks_echoed += 1
        eo = self._epochs.get(epoch)
        if eo is not None:
            eo.mark_deadline = None
        self._report_end(epoch, "mark")

    # -- mark timeouts ----------------------------------------------------------------------
    def _rearm(self) -> None:
        dls = [eo.mark_deadline for e, eo in self._epochs.items() if eo.mark_deadline is not None]
        self.deadline = min(dls) if dls else None

    async def on_deadline(self, now: float) -> None:
        for e, eo in list(self._epochs.items()):
            if eo.mark_deadline is not None and now >= eo.mark_deadline:
                eo.mark_deadline = None
                if self._is_stale(e):
                    continue  # the transport moved past it: ends nothing
                self.st.mark_timeouts += 1
                self._report_end(e, "mark_timeout")
        # forget old epochs (bounded)
        if len(self._epochs) > 8:
            for e in sorted(self._epochs)[:-8]:
                if self._epochs[e].mark_deadline is None:
                    del self._epochs[e]
        self._rearm()

    def stats(self) -> dict[str, int]:
        d = super().stats()
        d.update({k: getattr(self.st, k) for k in self.st.__slots__})
        d["tx_epoch"] = self.tx_epoch
        return d
