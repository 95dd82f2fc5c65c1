"""Per-turn timeline of one call: the instants the latency figures are made of.

Owns the timeline marks: user speech start/end (backdated to the audio), the
VAD stop as the turn driver got it, the Smart Turn verdict of the turn's
analysis (``verdict_early``: it came before the stop), the turn's latest STT
final, turn end (the gated release), per LLM round (keyed by the round's number,
:class:`RoundMarks`) its request, first token and end (``llm_done``: the stream
ended, whole or not), the answer's end (``answered``: no round follows), first audio
written to the tts ring, the worker's first utterance position,
interruption. Times are call-clock seconds (the loop's clock: in the daemon's
stdlib asyncio loop that is ``time.monotonic()``, shared by every process of
the host, so a bench can join them with its own ``time.monotonic()`` stamps).
The call record reports ``turn_latencies()``; the bench reads the raw marks.
Bounded: at most ``max_turns`` turns are kept (oldest dropped, counted); at most
:data:`MAX_ROUNDS` rounds of a turn are timed (the marks of a later round are not
kept: the turn counts it in ``rounds_dropped``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAX_ROUNDS = 32


@dataclass(slots=True)
class RoundMarks:
    """One LLM round of a turn (call-clock seconds; None: not reached)."""

    request: float | None = None
    first_token: float | None = None
    done: float | None = None


@dataclass(slots=True)
class TurnMarks:
    epoch: int
    speech_start: float | None = None
    speech_end: float | None = None
    vad_stop: float | None = None  # the turn's (latest) VAD stop reached the turn driver
    verdict: float | None = None  # the verdict of the turn's current Smart Turn analysis came
    verdict_early: bool = False  # ... before the stop (an early analysis at the VAD falling)
    stt_final: float | None = None  # the turn's latest STT final reached the turn driver
    turn_end: float | None = None
    rounds: dict[int, RoundMarks] = field(default_factory=dict)  # round number -> its marks
    rounds_dropped: int = 0  # rounds beyond MAX_ROUNDS: not timed
    answered: float | None = None  # the bot's answer to the turn ended: no round of it follows
    first_audio_out: float | None = None
    first_out_utterance: float | None = None  # the worker announced the first utterance's out position
    interrupted_at: float | None = None
    interrupted_by: int | None = None

    def round(self, rnd: int) -> RoundMarks | None:
        """Round ``rnd``'s marks (made at its first mark); None past :data:`MAX_ROUNDS`."""
        r = self.rounds.get(rnd)
        if r is None:
            if len(self.rounds) >= MAX_ROUNDS:
                return None
            r = self.rounds[rnd] = RoundMarks()
        return r

    def ordered(self) -> list[RoundMarks]:
        return [self.rounds[k] for k in sorted(self.rounds)]

    @property
    def llm_requests(self) -> list[float]:
        """The timed rounds' request marks, in round order."""
        return [r.request for r in self.ordered() if r.request is not None]

    @property
    def llm_first_tokens(self) -> list[float]:
        """The timed rounds' first-token marks, in round order."""
        return [r.first_token for r in self.ordered() if r.first_token is not None]

    def first_round(self) -> RoundMarks | None:
        """The turn's first requested round (the one a caller waits for)."""
        for r in self.ordered():
            if r.request is not None:
                return r
        return None

    def first_token(self) -> float | None:
        """The turn's first token: the earliest of its rounds' (a first round that called a tool
        silently has none; the spoken one after it has)."""
        toks = [r.first_token for r in self.rounds.values() if r.first_token is not None]
        return min(toks) if toks else None

    def llm_done(self) -> float | None:
        """The turn's last round's end: set once every timed round that was requested ended."""
        asked = [r for r in self.rounds.values() if r.request is not None]
        if not asked or any(r.done is None for r in asked):
            return None
        return max(r.done for r in asked if r.done is not None)


class Timeline:
    def __init__(self, max_turns: int = 512) -> None:
        self.turns: OrderedDict[int, TurnMarks] = OrderedDict()
        self.max_turns = max_turns
        self.dropped = 0

    def turn(self, epoch: int) -> TurnMarks:
        t = self.turns.get(epoch)
        if t is None:
            t = TurnMarks(epoch)
            self.turns[epoch] = t
            while len(self.turns) > self.max_turns:
                self.turns.popitem(last=False)
                self.dropped += 1
        return t

    def speech_start(self, epoch: int, at: float) -> None:
        t = self.turn(epoch)
        if t.speech_start is None:
            t.speech_start = at

    def speech_end(self, epoch: int, at: float) -> None:
        self.turn(epoch).speech_end = at

    def vad_stop(self, epoch: int, at: float) -> None:
        self.turn(epoch).vad_stop = at

    def verdict(self, epoch: int, at: float, early: bool = False) -> None:
        t = self.turn(epoch)
        t.verdict = at
        t.verdict_early = early

    def stt_final(self, epoch: int, at: float) -> None:
        self.turn(epoch).stt_final = at

    def turn_end(self, epoch: int, at: float) -> None:
        self.turn(epoch).turn_end = at

    def llm_request(self, epoch: int, at: float, rnd: int) -> None:
        """Round ``rnd`` asked the model (a round past :data:`MAX_ROUNDS` is counted, not timed)."""
        t = self.turn(epoch)
        r = t.round(rnd)
        if r is None:
            t.rounds_dropped += 1
        elif r.request is None:
            r.request = at

    def llm_first_token(self, epoch: int, at: float, rnd: int) -> None:
        r = self.turn(epoch).round(rnd)
        if r is not None and r.first_token is None:
            r.first_token = at

    def llm_done(self, epoch: int, at: float, rnd: int) -> None:
        """Round ``rnd``'s stream ended (Done, an error, a timeout or a halt)."""
        r = self.turn(epoch).round(rnd)
        if r is not None and r.done is None:
            r.done = at

    def answered(self, epoch: int, at: float) -> None:
        """The turn's answer is complete (its last round ended: the LLM runner's LlmResponseEnded,
        the S2S epoch's end); its audio may still be playing."""
        t = self.turn(epoch)
        if t.answered is None:
            t.answered = at

    def first_audio_out(self, epoch: int, at: float) -> None:
        t = self.turn(epoch)
        if t.first_audio_out is None:
            t.first_audio_out = at

    def out_utterance(self, epoch: int, at: float) -> None:
        t = self.turns.get(epoch)
        if t is not None and t.first_out_utterance is None:
            t.first_out_utterance = at

    def interrupt(self, old: int, new: int, at: float) -> None:
        t = self.turn(old)
        t.interrupted_at = at
        t.interrupted_by = new

    def turn_latencies(self) -> list[dict[str, Any]]:
        """Per turn, milliseconds: end-of-speech -> turn end, turn end -> LLM request,
        request -> first token (both of the turn's first round), turn end -> first audio out
        (the response latency); ``llm_rounds``: every timed round (``round``, ``first_token_ms``,
        ``llm_ms``: request -> llm_done, and its raw marks); plus the raw ``t_*`` marks in
        call-clock seconds (``t_first_token``: the turn's earliest first token, of any round;
        ``t_llm_done``: the last round's end; ``t_answered``: the answer complete)."""
        out: list[dict[str, Any]] = []

        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000.0, 1)

        for t in self.turns.values():
            if t.turn_end is None:
                continue
            first = t.first_round()
            req = first.request if first is not None else None
            rounds = [{"round": k, "first_token_ms": ms(r.request, r.first_token), "llm_ms": ms(r.request, r.done),
                       "t_request": r.request, "t_first_token": r.first_token, "t_llm_done": r.done}
                      for k, r in sorted(t.rounds.items()) if r.request is not None]
            out.append(
                {
                    "epoch": t.epoch,
                    "end_of_turn_ms": ms(t.speech_end, t.turn_end),
                    "request_ms": ms(t.turn_end, req),
                    "first_token_ms": ms(req, first.first_token if first is not None else None),
                    "response_ms": ms(t.turn_end, t.first_audio_out),
                    "voice_to_voice_ms": ms(t.speech_end, t.first_audio_out),
                    "rounds": len(rounds) + t.rounds_dropped,
                    "rounds_dropped": t.rounds_dropped,
                    "llm_rounds": rounds,
                    "interrupted": t.interrupted_at is not None,
                    # raw marks on the call clock (time.monotonic() in the daemon), for benches
                    "t_speech_end": t.speech_end,
                    "t_vad_stop": t.vad_stop,
                    "t_verdict": t.verdict,
                    "verdict_early": t.verdict_early,
                    "t_stt_final": t.stt_final,
                    "t_turn_end": t.turn_end,
                    "t_request": req,
                    "t_first_token": t.first_token(),
                    "t_llm_done": t.llm_done(),
                    "t_answered": t.answered,
                    "t_first_audio": t.first_audio_out,
                    "t_out_utterance": t.first_out_utterance,
                    "t_interrupted": t.interrupted_at,
                }
            )
        return out
