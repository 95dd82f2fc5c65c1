"""One simulated caller (pure state machine): what it sends each 20 ms and what it records.

Owns the script of one call: silence, then line 1; wait for the bot's answer;
either let it finish and pause, or barge in (start the next line a planned
delay after the answer's first audio reached the caller); ... ; a tail of
silence; hang up. It attributes each bot frame to the turn whose answer it
belongs to, handles Twilio ``clear`` (discard buffered audio, echo pending
marks at once) and echoes ``mark`` when the audio before it has played.

It performs no I/O: the runner calls ``next_payload(now)`` once per frame tick
(``None`` means hang up now) and feeds ``on_media``/``on_clear``/``on_mark``;
``due_marks(now)`` returns the mark names to echo. The frames it hands out are
opaque to it: whatever the runner gave it per line (the runner's pre-encoded
:class:`bench.loadgen.wire.MediaPayload`, plain strings in tests).

Invariants: the caller always sends exactly one frame per tick while the call
lasts (speech or silence, like a phone); a turn's speech end is the send time
of its last speech frame; bot audio is attributed to turn k from the end of
line k until a clear ends a barged answer, line k+1 ends (after a barge-in) or
line k+1 starts (otherwise); a clear that comes
before an answer started (a server may clear before each new answer) does not
end that answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from bench.loadgen.stats import CallResult, Turn
from bench.workload import SAMPLE_RATE, CallPlan
from brisvox.wire.g711 import ulaw_loud_fraction


class Phase(Enum):
    LEAD_IN = "lead_in"
    SPEAKING = "speaking"
    WAITING = "waiting"
    PAUSE = "pause"
    TAIL = "tail"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class CallerTiming:
    """Seconds."""

    lead_in: float
    pause_after_bot: float
    response_timeout: float
    tail: float
    answer: float  # expected length of one bot answer
    idle_gap: float = 1.0  # an answer whose audio stopped this long is over, even if short

    @classmethod
    def from_workload(cls, wl) -> CallerTiming:  # wl: bench.workload.Workload
        c = wl.caller
        return cls(lead_in=c.lead_in_ms / 1000, pause_after_bot=c.pause_after_bot_ms / 1000,
                   response_timeout=c.response_timeout_ms / 1000, tail=c.tail_ms / 1000,
                   answer=wl.tts.answer_ms / 1000)


SPEECH_FRACTION = 0.25  # a bot frame is speech when a quarter of its samples are loud


class CallScript:
    def __init__(self, plan: CallPlan, line_frames: Sequence[Sequence[Any]], silence_frame: Any,
                 timing: CallerTiming) -> None:
        if len(line_frames) != plan.turns:
            raise ValueError("one list of frames per planned turn")
        self.plan = plan
        self.frames = line_frames
        self.silence = silence_frame
        self.timing = timing
        self.result = CallResult(index=plan.index,
                                 turns=[Turn(index=k, barge_in_ms=plan.barge_in_ms[k])
                                        for k in range(plan.turns)])
        self.phase = Phase.LEAD_IN
        self.k = 0  # current line/turn
        self.pos = 0  # next frame of the current line
        self.t_next = 0.0  # end of the current timed phase
        self.attrib: Turn | None = None  # the turn receiving bot audio
        self.barged: Turn | None = None  # a barged answer still waiting for its clear
        self._barge_pending = False  # the line being spoken is a barge-in
        self._marks: list[tuple[float, str]] = []  # (due, name) not yet echoed
        self._echo_now: list[str] = []  # marks to echo at the next chance (after a clear)

    @property
    def turns(self) -> list[Turn]:
        return self.result.turns

    # --- the caller's side: one frame per tick --------------------------------------

    def start(self, now: float) -> None:
        self.phase = Phase.LEAD_IN
        self.t_next = now + self.timing.lead_in
        self.result.t_connect = now

    def next_payload(self, now: float) -> Any | None:
        """The frame to send now (one of the line frames or the silence frame), or None: hang up."""
        if self.phase is Phase.LEAD_IN and now >= self.t_next:
            self._begin_line(0, barge=False)
        elif self.phase is Phase.WAITING:
            self._check_answer(now)
        elif self.phase is Phase.PAUSE and now >= self.t_next:
            if self.k + 1 < self.plan.turns:
                self._begin_line(self.k + 1, barge=False)
            else:
                self.phase = Phase.TAIL
                self.t_next = now + self.timing.tail
        if self.phase is Phase.TAIL and now >= self.t_next:
            self.phase = Phase.DONE
        if self.phase is Phase.DONE:
            if self.barged is not None:
                self.barged.finish_barge()
            self.result.t_end = now
            return None
        if self.phase is Phase.SPEAKING:
            return self._speak(now)
        return self.silence

    def _begin_line(self, k: int, barge: bool) -> None:
        if not barge:
            # the previous answer is over: bot audio from now until this line ends
            # answers nothing (e.g. a false end of turn in mid-line) and is counted
            # as unattributed, never as late frames of the old answer
            self.attrib = None
            if self.barged is not None:  # its clear never came; stop waiting for it
                self.barged.finish_barge()
                self.barged = None
        self.phase = Phase.SPEAKING
        self.k = k
        self.pos = 0
        self._barge_pending = barge

    def _speak(self, now: float) -> Any:
        turn = self.turns[self.k]
        frames = self.frames[self.k]
        if self.pos == 0:
            turn.t_speech_start = now
            if self._barge_pending and self.k > 0:
                prev = self.turns[self.k - 1]
                prev.on_barge(now)
                self.barged = prev
        payload = frames[self.pos]
        self.pos += 1
        if self.pos >= len(frames):
            turn.t_speech_end = now
            # a barged answer whose clear has not come yet stays in self.barged
            self.attrib = turn
            self.phase = Phase.WAITING
        return payload

    def _check_answer(self, now: float) -> None:
        turn = self.turns[self.k]
        p = turn.playout
        assert turn.t_speech_end is not None
        if p.t_first is None:
            if now - turn.t_speech_end >= self.timing.response_timeout:
                turn.unanswered = True
                self._after_answer(now)
            return
        barge_ms = self.plan.barge_in_ms[self.k]
        if barge_ms is not None and self.k + 1 < self.plan.turns:
            if now >= p.t_first + barge_ms / 1000.0:
                self._begin_line(self.k + 1, barge=True)
            return
        end = p.play_end or now
        complete = p.speech_s >= self.timing.answer - 0.040 and now >= end
        stalled = turn.t_last_frame is not None and now - turn.t_last_frame >= self.timing.idle_gap
        if complete or stalled or turn.t_clear is not None and now >= end:
            self._after_answer(now)

    def _after_answer(self, now: float) -> None:
        self.phase = Phase.PAUSE
        self.t_next = now + self.timing.pause_after_bot

    # --- the bot's side -----------------------------------------------------------------

    def on_media(self, now: float, payload: bytes) -> None:
        dur = len(payload) / SAMPLE_RATE
        speech = ulaw_loud_fraction(payload) >= SPEECH_FRACTION
        turn = self.attrib
        if turn is None:
            self.result.unattributed_frames += 1
            return
        turn.on_frame(now, dur, speech)

    def on_clear(self, now: float) -> None:
        for _, name in self._marks:  # Twilio answers every pending mark on a clear
            self._echo_now.append(name)
        self._marks.clear()
        if self.barged is not None:
            self.barged.on_clear(now)
            if self.attrib is self.barged:
                self.attrib = None
            self.barged = None
            return
        turn = self.attrib
        if turn is not None and turn.playout.t_first is not None:
            turn.on_clear(now)  # a clear in mid-answer without a barge-in
            self.attrib = None

    def on_mark(self, now: float, name: str) -> None:
        turn = self.attrib
        end = turn.playout.play_end if turn is not None else None
        self._marks.append((max(now, end or now), name))

    def due_marks(self, now: float) -> list[str]:
        out = self._echo_now
        self._echo_now = []
        keep: list[tuple[float, str]] = []
        for due, name in self._marks:
            (out.append(name) if due <= now else keep.append((due, name)))
        self._marks = keep
        self.result.marks_echoed += len(out)
        return out
