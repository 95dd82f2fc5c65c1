"""The caller of ``brisvox call`` as a pure state machine: what to send, and what the bot's audio means.

Owns the call's plan (lines to speak, digits to press), the 20 ms frame the
caller sends at each tick, the barge-in, which bot audio answers which turn,
and the per-turn measurements taken at the client. No I/O and no clock
reads: the runner calls :meth:`CallerScript.tick` once per 20 ms with the
time and sends what it returns, and feeds :meth:`on_bot_audio`,
:meth:`on_clear`, :meth:`on_bot_dtmf` and :meth:`on_end` with arrival times.

The call, step by step:

* lead-in silence; if the bot speaks first, that is turn 0 (a greeting) and
  the caller waits for it to end;
* a line is spoken frame by frame; "caller stopped" is the moment its last
  loud sample went out (:func:`brisvox.client.speech.speech_bounds`), and
  from then on loud bot audio belongs to this turn: the first loud frame
  gives the latency, an answer ends after ``answer_gap`` seconds without
  loud audio, or is unanswered after ``answer_wait``;
* a press step sends DTMF digits and waits at most ``press_wait`` for an
  audible reaction;
* a barge-in: ``barge_in`` seconds after the first audio of step
  ``barge_turn``'s answer, the next line starts over the bot, at the first
  tick from then on when the bot's loud audio is playing at the client (a
  pause between the answer's clauses is waited out; an answer that ends
  first is not barged). The barged
  answer's audio stops at the client when its last loud frame has played,
  or when a ``clear`` drops what was buffered, whichever is first; that
  time, taken when the barging line's speech ends, gives ``stop_ms``
  (caller started talking over the bot -> bot audio stopped);
* after the last answer, a tail of silence, then hang up.

Invariants: exactly one frame per tick while the call lasts (speech or
silence, like a phone; during a press the transport may replace it with
DTMF events); turn results only gain information (no field is reset);
after :meth:`on_end` or the hang-up, :meth:`tick` returns ``hangup`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from brisvox.client.speech import Line, is_loud


class Phase(Enum):
    LEAD_IN = "lead_in"
    GREETING = "greeting"
    SPEAKING = "speaking"
    WAITING = "waiting"
    PAUSE = "pause"
    TAIL = "tail"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Step:
    """A line to speak, or digits to press."""

    line: Line | None = None
    digits: str = ""

    @property
    def kind(self) -> str:
        return "line" if self.line is not None else "press"

    @property
    def label(self) -> str:
        return self.line.label if self.line is not None else f"DTMF {self.digits}"


@dataclass(frozen=True, slots=True)
class ScriptTiming:
    """Seconds."""

    lead_in: float = 1.0  # silence before the first line (a greeting in it is waited for)
    answer_wait: float = 20.0  # longest wait for the first audio of an answer
    press_wait: float = 3.0  # after DTMF: longest wait for an audible reaction
    answer_gap: float = 1.5  # bot silence that ends an answer
    pause: float = 0.5  # caller silence after an answer, before the next step
    tail: float = 0.5  # silence after the last answer, before hanging up
    barge_in: float | None = None  # talk over an answer this long after its first audio
    barge_turn: int = 1  # ... the answer to this step (1-based)


@dataclass
class TurnResult:
    """One turn as the client saw it (times are ``time.monotonic()`` seconds)."""

    index: int  # 0 = the bot's greeting, then 1.. = the steps
    kind: str  # greeting | line | press
    label: str
    t_speech_start: float | None = None  # the line's first loud sample went out (press: digits sent)
    t_speech_end: float | None = None  # caller stopped: its last loud sample went out
    t_first_audio: float | None = None  # first loud bot audio of the answer arrived
    t_last_audio: float | None = None  # end of the answer's last loud audio as heard
    answer_s: float = 0.0  # loud bot audio of the answer, seconds
    unanswered: bool = False
    barged: bool = False  # the caller talked over this answer
    barge_onset: float | None = None  # when the caller started talking over it
    t_clear: float | None = None  # a clear arrived after the barge-in
    bot_stopped: float | None = None  # barged: the bot's audio stopped at the client
    overlap_s: float = 0.0  # bot audio of this turn heard while the caller spoke the next line

    @property
    def latency_ms(self) -> float | None:
        """Caller stopped -> first bot audio at the client."""
        if self.t_first_audio is None or self.t_speech_end is None or self.kind == "greeting":
            return None
        return (self.t_first_audio - self.t_speech_end) * 1000.0

    @property
    def stop_ms(self) -> float | None:
        """Barge-in: caller started talking over the bot -> bot audio stopped at the client."""
        if self.bot_stopped is None or self.barge_onset is None:
            return None
        return (self.bot_stopped - self.barge_onset) * 1000.0


@dataclass(frozen=True, slots=True)
class TickOut:
    frame: np.ndarray | None = None  # 20 ms of caller audio (None once hung up)
    digits: str = ""  # DTMF to press now
    hangup: bool = False


@dataclass
class CallerScript:
    steps: list[Step]
    rate: int
    timing: ScriptTiming = field(default_factory=ScriptTiming)

    def __post_init__(self) -> None:
        self.frame = self.rate // 50
        self.silence = np.zeros(self.frame, dtype=np.int16)
        self.turns: list[TurnResult] = []
        self.phase = Phase.LEAD_IN
        self.k = -1  # current step
        self.pos = 0  # next sample of the current line
        self.t_next = 0.0  # end of a timed phase
        self.t_start = 0.0
        self.t_end: float | None = None
        self.end_reason = ""
        self.attrib: TurnResult | None = None  # the turn receiving bot audio
        self.barged: TurnResult | None = None  # the answer being talked over
        self._barge_line = False
        self._cur: TurnResult | None = None  # the turn of the current step
        self._press = ""  # digits to press at this tick
        self._play_end = 0.0  # playout end of everything received so far
        self._loud_end = 0.0  # playout end of the last loud frame (cut by a clear)
        self.bot_digits: list[tuple[float, str]] = []
        self.unattributed_s = 0.0
        self.clears = 0
        if self.timing.barge_in is not None:
            b = self.timing.barge_turn
            if not 1 <= b < len(self.steps) or self.steps[b].line is None:
                raise ValueError("a barge-in needs a line after the barged turn to speak over the bot")

    # -- the caller's side ---------------------------------------------------------------
    def start(self, now: float) -> None:
        self.t_start = now
        self.phase = Phase.LEAD_IN
        self.t_next = now + self.timing.lead_in

    def tick(self, now: float) -> TickOut:
        """What the caller sends now (one frame per call of this method)."""
        ph = self.phase
        if ph is Phase.DONE:
            return TickOut(hangup=True)
        if ph is Phase.LEAD_IN and now >= self.t_next:
            self._next_step(now)
        elif ph is Phase.GREETING:
            g = self.attrib
            assert g is not None
            if g.t_last_audio is not None and now - g.t_last_audio >= self.timing.answer_gap:
                self.attrib = None
                self._pause(now)
        elif ph is Phase.WAITING:
            self._check_answer(now)
        elif ph is Phase.PAUSE and now >= self.t_next:
            self._next_step(now)
        if self.phase is Phase.TAIL and now >= self.t_next:
            self._finish(now, "hung up")
        if self.phase is Phase.DONE:
            return TickOut(hangup=True)
        if self.phase is Phase.SPEAKING:
            return TickOut(frame=self._speak(now))
        if self._press:
            digits, self._press = self._press, ""
            return TickOut(frame=self.silence, digits=digits)
        return TickOut(frame=self.silence)

    def _next_step(self, now: float, barge: bool = False) -> None:
        self.k += 1
        if self.k >= len(self.steps):
            self.phase = Phase.TAIL
            self.t_next = now + self.timing.tail
            return
        step = self.steps[self.k]
        turn = TurnResult(index=self.k + 1, kind=step.kind, label=step.label)
        self.turns.append(turn)
        self._cur = turn
        if step.line is not None:
            self.phase = Phase.SPEAKING
            self.pos = 0
            self._barge_line = barge
        else:
            turn.t_speech_start = turn.t_speech_end = now
            self._press = step.digits
            self.attrib = turn
            self.phase = Phase.WAITING

    def _speak(self, now: float) -> np.ndarray:
        step = self.steps[self.k]
        line = step.line
        turn = self._cur
        assert line is not None and turn is not None
        a = self.pos
        b = a + self.frame
        x = line.samples[a:b]
        if len(x) < self.frame:
            x = np.concatenate([x, self.silence[: self.frame - len(x)]])
        lo, hi = line.speech_start, line.speech_end
        if hi <= lo:  # a line with no loud part: it "ends" with the file
            lo, hi = 0, len(line.samples)
        if turn.t_speech_start is None and a <= lo < b:
            turn.t_speech_start = now + (lo - a) / self.rate
            if self._barge_line and self.barged is not None:
                self.barged.barge_onset = turn.t_speech_start
        if turn.t_speech_end is None and a < hi <= b:
            turn.t_speech_end = now + (hi - a) / self.rate
            if self._barge_line and self.barged is not None:
                self._close_barge(turn.t_speech_end)
            self.attrib = turn
        self.pos = b
        if self.pos >= len(line.samples):
            if turn.t_speech_end is None:  # defensive: an empty line
                turn.t_speech_end = now
                self.attrib = turn
            self.phase = Phase.WAITING
        return x

    def _close_barge(self, at: float) -> None:
        """The barging line's speech ended: when did the barged answer stop at the client?"""
        b = self.barged
        assert b is not None
        b.bot_stopped = min(self._loud_end, at)
        self.barged = None

    def _check_answer(self, now: float) -> None:
        turn = self._cur
        assert turn is not None and turn.t_speech_end is not None
        t = self.timing
        if turn.t_first_audio is None:
            wait = t.press_wait if turn.kind == "press" else t.answer_wait
            if now - turn.t_speech_end >= wait:
                turn.unanswered = True
                self._pause(now)
            return
        if t.barge_in is not None and self.k + 1 == t.barge_turn and now >= turn.t_first_audio + t.barge_in \
                and now < self._loud_end:  # talking over the bot: not into a pause between its clauses
            turn.barged = True
            self.barged = turn
            self.attrib = turn  # its audio keeps coming until the bot stops
            self._next_step(now, barge=True)
            return
        if turn.t_last_audio is not None and now - turn.t_last_audio >= t.answer_gap:
            self._pause(now)

    def _pause(self, now: float) -> None:
        self.phase = Phase.PAUSE
        self.t_next = now + self.timing.pause
        if self.k + 1 >= len(self.steps):  # nothing left to say: straight to the tail
            self.phase = Phase.TAIL
            self.k = len(self.steps)
            self.t_next = now + self.timing.tail

    def _finish(self, now: float, reason: str) -> None:
        if self.barged is not None:
            self._close_barge(now)
        self.phase = Phase.DONE
        self.t_end = now
        self.end_reason = self.end_reason or reason

    # -- the bot's side ---------------------------------------------------------------------
    def on_bot_audio(self, pcm: np.ndarray, now: float) -> None:
        dur = len(pcm) / self.rate
        start = max(now, self._play_end)
        self._play_end = start + dur
        if self.phase is Phase.DONE or not is_loud(pcm):
            return
        self._loud_end = self._play_end
        if self.phase is Phase.LEAD_IN:
            g = TurnResult(index=0, kind="greeting", label="(the bot spoke first)")
            self.turns.insert(0, g)
            self.attrib = g
            self.phase = Phase.GREETING
        turn = self.attrib
        if turn is None:
            self.unattributed_s += dur
            return
        if turn.t_first_audio is None:
            turn.t_first_audio = start
        turn.t_last_audio = self._play_end
        turn.answer_s += dur
        if self.phase is Phase.SPEAKING and turn is not self._cur:  # the caller is speaking its next line
            turn.overlap_s += dur

    def on_clear(self, now: float) -> None:
        """Drop what was buffered: nothing received before ``now`` plays after it."""
        self.clears += 1
        self._play_end = min(self._play_end, now)
        self._loud_end = min(self._loud_end, now)
        b = self.barged
        if b is not None and b.barge_onset is not None and now >= b.barge_onset and b.t_clear is None:
            b.t_clear = now
        for turn in self.turns:
            if turn.t_last_audio is not None and turn.t_last_audio > now:
                turn.t_last_audio = max(now, turn.t_first_audio or now)

    def on_bot_dtmf(self, digits: str, now: float) -> None:
        self.bot_digits.append((now, digits))

    def on_end(self, reason: str, now: float) -> None:
        if self.phase is not Phase.DONE:
            self.end_reason = reason
            self._finish(now, reason)

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE
