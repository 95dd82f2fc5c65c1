"""The simulated world around one call actor: caller, worker, gateway, wire.

Owns everything outside the actor in the simulation, on virtual time, in
one process, with in-memory rings (:class:`~brisvox.sim.memring.MemRing`):

* :class:`Caller`: a script of utterances, each started by a trigger (an
  absolute time, a delay after the caller's previous utterance, after the
  bot's first wire audio, after a number of bot words heard, after the bot's
  end mark was played), written into ``in16`` 20 ms at a time; DTMF presses.
* The worker (:meth:`SimPlatform._worker`): a 20 ms tick that runs an energy
  VAD over the new in16 audio (start after 40 ms of speech, backdated to the
  first speech sample; stop after 200 ms of silence, dated one past the last
  speech sample; with ``vad_fall_frames`` > 0 also a falling after that many
  silent frames, carrying the ``pos`` its stop will carry), converts the ``tts`` ring (24 kHz) into the ``out`` ring
  (8 kHz, exact decimation, phase per utterance) announcing each utterance's
  out position (OutUtterance), honours TtsCut, and answers Smart Turn
  requests from the caller's script (complete at the end of an utterance
  marked complete).
* The gateway (:class:`~brisvox.sim.gateway.SimGateway`): the real
  :class:`~brisvox.playout.gate.PlayoutGate` driven on the sim's ticks, 20 ms
  (160 samples) of the out ring released per tick to the wire, Playback every
  100 ms, Clear applied inline (cut at the release position, the gate closed
  until a newer epoch's utterance starts), Cleared with the final release
  position, marks echoed by the simulated client as their frame plays.
* :class:`Wire`: what reached the caller's ear, per utterance: the words
  decoded from the released samples and the out offset each started at.

Pause / Resume (a barge-in candidate holds the bot's audio) are the gate's:
``pause_log`` records every step.

The call's media state (:class:`Media` steps: a hold, an answer after early media): the
actor hears it and the gateway releases nothing while the call is not answered.

Fault switches: ``drop_cleared`` (no final position), ``cleared_delay``,
``echo_marks`` (False: a client that never echoes), ``echo_marks_on_clear``
(cut marks echoed anyway, as a raw Twilio client would: the gate swallows
them), ``smart_turn_fail``.

Smart Turn analyses take ``smart_turn_latency`` as if queued on the worker's job lane
the whole time: a ``SmartTurnCancel`` meanwhile answers the request at once with no
verdict, as the worker answers a queued analysis it drops (``smart_turn_cancelled``).
The Clear protocol is ``ipc/frames.py``'s: Clear(E) kills epochs <= E; its
Cleared lists the end marks the cut discarded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from brisvox.agent.host.actor import CallActor
from brisvox.providers.word_codec import NOISE, THRESHOLD, Decoder, Vocab, encode
from brisvox.sim.gateway import SimGateway
from brisvox.sim.memring import MemRing
from ipc.frames import (
    AmdStart,
    Clear,
    Frame,
    Mark,
    Pause,
    Resume,
    SmartTurnCancel,
    TtsCut,
    TtsUtterance,
)
from ipc.tick_events import (
    AmdBeepEvent,
    AmdGreetingEndEvent,
    AmdVerdictEvent,
    SpeechFalling,
    SpeechStart,
    SpeechStop,
    TickEvent,
)

TICK = 0.02
_EMPTY = np.zeros(0, dtype=np.int64)
IN_RATE = 16000
IN_FRAME = 320


# --- caller script -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Utter:
    """The caller says ``text``. Exactly one trigger: ``at`` (absolute), ``after``
    (after the previous utterance ended), ``after_bot`` (after the first bot
    audio heard since the previous utterance ended), ``after_bot_words`` (after
    that many bot words were heard since then), ``after_bot_done`` (after the
    bot's end mark played since then). ``complete``: Smart Turn says the turn is
    complete at its end."""

    text: str
    at: float | None = None
    after: float | None = None
    after_bot: float | None = None
    after_bot_words: int | None = None
    after_bot_done: float | None = None
    complete: bool = True
    noise: float = 0.0  # > 0: a non-word sound of that many seconds instead of text


@dataclass(frozen=True, slots=True)
class Press:
    digit: str
    at: float | None = None
    after: float | None = None


@dataclass(frozen=True, slots=True)
class HangUp:
    at: float | None = None
    after: float | None = None
    after_bot_done: float | None = None


@dataclass(frozen=True, slots=True)
class Media:
    """The call's media state becomes ``state`` (the gateway's CallMedia: "held" when the
    caller puts the call on hold, "answered" when they take it off, "answered" at the
    answer of a call that started in "early"): the actor is told, and the simulated
    gateway releases nothing while it is not "answered" (the SIP leg cannot send then).
    Triggers as :class:`Utter`'s ``at``, ``after``, ``after_bot``, ``after_bot_words``."""

    state: str
    at: float | None = None
    after: float | None = None
    after_bot: float | None = None
    after_bot_words: int | None = None


@dataclass(frozen=True, slots=True)
class AmdScripted:
    """What the simulated worker's answering-machine detector reports, ``after`` seconds after
    the actor's AmdStart: ``kind`` "verdict" (with ``verdict`` and ``confidence``), "beep" or
    "greeting_end". No AmdStart, no report (the actor's own deadline then decides)."""

    kind: str
    after: float
    verdict: str = ""
    confidence: float = 0.0


Step = Utter | Press | HangUp | Media


@dataclass(slots=True)
class SpokenUtterance:
    text: str
    start_pos: int
    end_pos: int
    start_t: float
    end_t: float
    complete: bool


class Caller:
    def __init__(self, vocab: Vocab, steps: list[Step]) -> None:
        self.vocab = vocab
        self.steps = deque(steps)
        self.spoken: list[SpokenUtterance] = []
        self._cur: np.ndarray | None = None
        self._cur_off = 0
        self._cur_rec: SpokenUtterance | None = None
        self._parity = 0
        self.last_end_t = 0.0
        self.hangup_at: float | None = None
        self.done = False

    @property
    def speaking(self) -> bool:
        return self._cur is not None

    def _trigger_time(self, st: Step, wire: Wire, now: float) -> float | None:
        if st.at is not None:
            return st.at
        if st.after is not None:
            return self.last_end_t + st.after
        if isinstance(st, Utter | HangUp) and st.after_bot_done is not None:
            t = wire.mark_played_since(self.last_end_t)
            return None if t is None else t + st.after_bot_done
        if isinstance(st, Utter | Media):
            if st.after_bot is not None:
                t = wire.first_audio_since(self.last_end_t)
                return None if t is None else t + st.after_bot
            if st.after_bot_words is not None:
                return wire.word_time_since(self.last_end_t, st.after_bot_words)
        return None

    def tick(self, now: float, in16: MemRing, wire: Wire, platform: SimPlatform) -> None:
        """Write the next 20 ms of caller audio (speech or silence)."""
        if self._cur is None:
            while self.steps:
                st = self.steps[0]
                t = self._trigger_time(st, wire, now)
                if t is None or now + 1e-9 < t:
                    break
                self.steps.popleft()
                if isinstance(st, Press):
                    platform.actor.on_dtmf(st.digit)
                    self.last_end_t = now
                    continue
                if isinstance(st, Media):
                    platform.media(st.state)
                    self.last_end_t = now
                    continue
                if isinstance(st, HangUp):
                    self.hangup_at = now
                    self.done = True
                    break
                if st.noise > 0:
                    samples = np.full(int(st.noise * IN_RATE), NOISE, dtype=np.int16)
                else:
                    words = st.text.split()
                    samples, _ = encode(self.vocab, words, IN_RATE, self._parity)
                    self._parity = (self._parity + len(words)) % 2
                self._cur = samples
                self._cur_off = 0
                self._cur_rec = SpokenUtterance(st.text, in16.write_pos, -1, now, -1.0, st.complete)
                break
        if self._cur is not None:
            chunk = self._cur[self._cur_off : self._cur_off + IN_FRAME]
            self._cur_off += len(chunk)
            if len(chunk) < IN_FRAME:
                chunk = np.concatenate((chunk, np.zeros(IN_FRAME - len(chunk), dtype=np.int16)))
            in16.write(chunk)
            if self._cur_off >= len(self._cur):
                rec = self._cur_rec
                assert rec is not None
                rec.end_pos = rec.start_pos + len(self._cur)
                rec.end_t = now + TICK
                self.spoken.append(rec)
                self.last_end_t = rec.end_t
                self._cur = None
                self._cur_rec = None
        else:
            in16.write(np.zeros(IN_FRAME, dtype=np.int16))
            if not self.steps and not self.done:
                self.done = True


# --- the wire ------------------------------------------------------------------------------


@dataclass(slots=True)
class HeardUtterance:
    utterance: int
    epoch: int
    released: int = 0  # out samples that reached the wire
    words: list[tuple[str, int, float]] = field(default_factory=list)  # (word, out offset, time)
    first_t: float | None = None


class Wire:
    """What reached the caller: per utterance, the words and where each started."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.utts: dict[int, HeardUtterance] = {}
        self.order: list[int] = []
        self._dec: dict[int, Decoder] = {}
        self.audio_times: list[float] = []  # time of the first frame of each burst
        self.frames = 0
        self.frames_after_clear: list[tuple[float, int, int]] = []  # (t, utt, epoch) stale audio (must stay empty)
        self.clears: list[tuple[float, int]] = []  # (t, epoch)
        self.marks: list[tuple[float, str]] = []
        self._last_frame_t = -1.0
        self.word_times: list[float] = []

    def receive(self, t: float, utt: int, epoch: int, samples: np.ndarray) -> None:
        self.frames += 1
        if self.clears and epoch < self.clears[-1][1]:
            self.frames_after_clear.append((t, utt, epoch))
        h = self.utts.get(utt)
        if h is None:
            h = HeardUtterance(utt, epoch)
            self.utts[utt] = h
            self.order.append(utt)
            self._dec[utt] = Decoder(self.vocab)
        if h.first_t is None:
            h.first_t = t
        if self._last_frame_t < 0 or t - self._last_frame_t > TICK * 1.5:
            self.audio_times.append(t)
        self._last_frame_t = t
        # word starts: a run that begins in this frame
        s = samples.astype(np.int32)
        s[np.abs(s) < THRESHOLD] = 0
        dec = self._dec[utt]
        prev = dec.cur
        starts = np.flatnonzero(np.diff(np.concatenate(([prev], s))) != 0)
        for i in starts:
            v = int(s[i])
            if v != 0 and self.vocab.known(abs(v) - 1000):
                h.words.append((self.vocab.word(abs(v) - 1000), h.released + int(i), t))
                self.word_times.append(t)
        dec.feed(samples)
        h.released += len(samples)

    def first_audio_since(self, t0: float) -> float | None:
        for t in self.audio_times:
            if t >= t0:
                return t
        return None

    def word_time_since(self, t0: float, n: int) -> float | None:
        k = 0
        for t in self.word_times:
            if t >= t0:
                k += 1
                if k >= n:
                    return t
        return None

    def mark_played_since(self, t0: float) -> float | None:
        for t, _ in self.marks:
            if t >= t0:
                return t
        return None

    def heard_words(self, utt: int, upto: int | None = None) -> list[str]:
        h = self.utts.get(utt)
        if h is None:
            return []
        return [w for w, off, _ in h.words if upto is None or off < upto]


# --- the platform ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorldConfig:
    call_rate: int = 8000
    tts_rate: int = 24000
    vad_start_frames: int = 2
    vad_stop_frames: int = 10
    vad_fall_frames: int = 0  # > 0 (below vad_stop_frames): a falling after that many silent frames (off: none)
    playback_every: int = 5  # ticks (100 ms)
    drop_cleared: bool = False
    cleared_delay: float = 0.002
    echo_marks: bool = True
    echo_marks_on_clear: bool = False
    smart_turn_fail: bool = False
    smart_turn_latency: float = 0.03
    pause_max: float = 2.5  # a Pause ends by itself after this long (the gateway's pause_max_ms)
    amd: tuple[AmdScripted, ...] = ()  # the detector's reports, timed from the AmdStart


class SimPlatform:
    """Implements :class:`~brisvox.agent.pipeline.stage.call_io.CallLink` for one actor and runs
    the worker and gateway ticks. Build it, give it the actor, ``start()``."""

    def __init__(self, vocab: Vocab, caller: Caller, cfg: WorldConfig | None = None) -> None:
        self.cfg = cfg or WorldConfig()
        self.vocab = vocab
        self.caller = caller
        self.in16 = MemRing(IN_RATE, 1 << 22)
        self.tts = MemRing(self.cfg.tts_rate, 1 << 22)
        self.out = MemRing(self.cfg.call_rate, 1 << 21)
        self.wire = Wire(vocab)
        self.actor: CallActor = None  # type: ignore[assignment]
        self.ticks = 0
        # worker state
        self._vad_speaking = False
        self._vad_run = 0
        self._vad_sil = 0
        self._vad_first = 0
        self._vad_last_end = 0
        self._vad_pos = 0
        self._vad_fell = False  # a falling was sent for the current silence
        self._tts_read = 0
        self._utt_starts: deque[tuple[int, int, int]] = deque()  # (tts_pos, utt, epoch)
        self._cur_utt: tuple[int, int, int] | None = None  # (utt, epoch, phase origin tts pos)
        self._phase = 0
        self.gw = SimGateway(self.cfg, self.out, self.wire)
        self._dead_below = 0  # epochs below this are dead (the last Clear's epoch + 1)
        self.smart_turn_requests = 0
        self.smart_turn_cancelled = 0
        self._smart_turn_waits: dict[int, asyncio.Event] = {}  # end_pos -> set by a SmartTurnCancel
        self.sent: list[Frame] = []
        self._task: asyncio.Task[None] | None = None
        self.stopped = False
        self.stale_tts_after_clear = 0  # old-epoch audio the actor wrote after a Clear (must stay 0)
        self.media_log: list[tuple[float, str]] = []  # (t, state) of every Media step
        self.amd_starts: list[tuple[float, AmdStart]] = []  # (t, frame) of every AmdStart the actor sent
        self._amd_due: list[tuple[float, AmdScripted]] = []

    # the gateway's records, for the scenarios' checks
    @property
    def clear_log(self) -> list[tuple[float, int, int]]:
        return self.gw.clear_log

    @property
    def pause_log(self) -> list[tuple[float, str, int, int]]:
        return self.gw.pause_log

    @property
    def max_unreleased(self) -> int:
        return self.gw.max_unreleased

    @property
    def clear_wall_ns(self) -> list[int]:
        return self.gw.clear_wall_ns

    # -- CallLink ------------------------------------------------------------------------
    def to_gateway(self, frame: Frame) -> None:
        if isinstance(frame, Clear):
            self._dead_below = max(self._dead_below, frame.epoch + 1)
            self.gw.clear(frame.epoch, frame.sent_ns, frame.lazy)
        elif isinstance(frame, Pause):
            self.gw.pause(frame.epoch)
        elif isinstance(frame, Resume):
            self.gw.resume(frame.epoch)
        elif isinstance(frame, Mark):
            self.gw.mark(frame.name, frame.position)
        else:
            self.sent.append(frame)

    def media(self, state: str) -> None:
        """The call's media state changed (a :class:`Media` step): the gateway and the actor hear it."""
        self.gw.sending = state == "answered"
        self.media_log.append((asyncio.get_running_loop().time(), state))
        self.actor.on_media(state)

    def to_worker(self, frame: Frame) -> None:
        if isinstance(frame, TtsUtterance):
            self._utt_starts.append((frame.tts_pos, frame.utterance, frame.epoch))
        elif isinstance(frame, AmdStart):
            t = asyncio.get_running_loop().time()
            self.amd_starts.append((t, frame))
            self._amd_due = sorted(((t + s.after, s) for s in self.cfg.amd), key=lambda x: x[0])
        elif isinstance(frame, SmartTurnCancel):
            ev = self._smart_turn_waits.get(frame.end_pos)
            if ev is not None:
                ev.set()
        elif isinstance(frame, TtsCut):
            if frame.tts_pos > self._tts_read:
                self._tts_read = frame.tts_pos
            self._cur_utt = None
            while self._utt_starts and self._utt_starts[0][0] < self._tts_read:
                self._utt_starts.popleft()
        else:
            self.sent.append(frame)

    async def smart_turn(self, end_pos: int, timeout: float) -> float | None:  # noqa: ASYNC109
        self.smart_turn_requests += 1
        cancel = self._smart_turn_waits[end_pos] = asyncio.Event()
        try:
            await asyncio.wait_for(cancel.wait(), self.cfg.smart_turn_latency)
            self.smart_turn_cancelled += 1
            return None  # dropped while queued: answered ``cancelled``
        except TimeoutError:
            pass
        finally:
            if self._smart_turn_waits.get(end_pos) is cancel:
                del self._smart_turn_waits[end_pos]
        if self.cfg.smart_turn_fail:
            return None
        for u in reversed(self.caller.spoken):
            if u.end_pos <= end_pos + 800 and end_pos - u.end_pos < 8000:
                return 0.9 if u.complete else 0.1
        return 0.1

    # -- worker -----------------------------------------------------------------------------
    def _vad(self, now: float) -> list[TickEvent]:
        """The simulated worker's VAD (an energy gate): its events carry no decision
        horizon (``at`` 0: unknown) and no time (``ns`` 0)."""
        events: list[TickEvent] = []
        call_id = self.actor.call_id
        w = self.in16.write_pos
        while self._vad_pos + IN_FRAME <= w:
            fr = self.in16.read_range(self._vad_pos, self._vad_pos + IN_FRAME).samples
            speech = np.flatnonzero(np.abs(fr.astype(np.int32)) >= THRESHOLD) if fr.any() else _EMPTY
            p0 = self._vad_pos
            self._vad_pos += IN_FRAME
            if len(speech):
                if self._vad_run == 0:
                    self._vad_first = p0 + int(speech[0])
                self._vad_run += 1
                self._vad_sil = 0
                self._vad_fell = False
                self._vad_last_end = p0 + int(speech[-1]) + 1
                if not self._vad_speaking and self._vad_run >= self.cfg.vad_start_frames:
                    self._vad_speaking = True
                    events.append(SpeechStart(call_id=call_id, pos=self._vad_first, at=0, ns=0))
            else:
                if not self._vad_speaking:
                    self._vad_run = 0
                else:
                    self._vad_sil += 1
                    fall = self.cfg.vad_fall_frames
                    if 0 < fall < self.cfg.vad_stop_frames and self._vad_sil == fall and not self._vad_fell:
                        self._vad_fell = True
                        events.append(SpeechFalling(call_id=call_id, pos=self._vad_last_end, at=0, ns=0))
                    if self._vad_sil >= self.cfg.vad_stop_frames:
                        self._vad_speaking = False
                        self._vad_run = 0
                        events.append(SpeechStop(call_id=call_id, pos=self._vad_last_end, at=0, ns=0))
        return events

    def _amd_event(self, s: AmdScripted) -> TickEvent:
        cid, pos = self.actor.call_id, self.in16.write_pos
        if s.kind == "verdict":
            return AmdVerdictEvent(call_id=cid, pos=pos, ns=0, verdict=s.verdict, confidence=s.confidence,
                                   ms=round(s.after * 1000), rule="scripted")
        if s.kind == "beep":
            return AmdBeepEvent(call_id=cid, pos=pos, ns=0, hz=1000.0)
        return AmdGreetingEndEvent(call_id=cid, pos=pos, ns=0)

    def _convert(self) -> None:
        tts = self.tts
        ratio = self.cfg.tts_rate // self.cfg.call_rate
        while self._tts_read < tts.write_pos:
            if self._utt_starts and self._utt_starts[0][0] <= self._tts_read:
                pos, utt, epoch = self._utt_starts.popleft()
                self._cur_utt = (utt, epoch, pos)
                self.gw.utterance(utt, epoch, self.out.write_pos)
                self.actor.on_out_utterance(utt, epoch, self.out.write_pos)
                continue
            nxt = self._utt_starts[0][0] if self._utt_starts else tts.write_pos
            end = min(tts.write_pos, nxt)
            r = tts.read_range(self._tts_read, end)
            if self._cur_utt is not None and len(r.samples):
                utt, epoch, origin = self._cur_utt
                if epoch < self._dead_below:
                    self.stale_tts_after_clear += len(r.samples)
                first = (-(r.start - origin)) % ratio
                self.out.write(r.samples[first::ratio])
            self._tts_read = end

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while not self.stopped:
            now = loop.time()
            self.caller.tick(now, self.in16, self.wire, self)
            events = self._vad(now)
            while self._amd_due and self._amd_due[0][0] <= now:
                events.append(self._amd_event(self._amd_due.pop(0)[1]))
            self.actor.on_worker(self.in16.write_pos, events)
            self._convert()
            self.gw.tick(now)
            self.ticks += 1
            nxt += TICK
            await asyncio.sleep(max(0.0, nxt - loop.time()))

    def start(self, actor: CallActor) -> None:
        self.actor = actor
        self.gw.actor = actor
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-platform")

    async def stop(self) -> None:
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
