"""Per-turn timeline of one call: the instants the latency figures are made of.

Owns the timeline marks: user speech start/end (backdated to the audio), the
VAD stop as the turn driver got it, the Smart Turn verdict of the turn's
analysis (``verdict_early``: it came before the stop), the turn's latest STT
final, turn end (the gated release), LLM request / first token per round,
first audio written to the tts ring, the worker's first utterance position,
interruption. Times are call-clock seconds (the loop's clock: in the daemon's
stdlib asyncio loop that is ``time.monotonic()``, shared by every process of
the host, so a bench can join them with its own ``time.monotonic()`` stamps).
The call record reports ``turn_latencies()``; the bench reads the raw marks.
Bounded: at most ``max_turns`` turns are kept (oldest dropped, counted).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


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
    llm_requests: list[float] = field(default_factory=list)
    llm_first_tokens: list[float] = field(default_factory=list)
    first_audio_out: float | None = None
    first_out_utterance: float | None = None  # the worker announced the first utterance's out position
    interrupted_at: float | None = None
    interrupted_by: int | None = None


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

    def llm_request(self, epoch: int, at: float) -> int:
        t = self.turn(epoch)
        t.llm_requests.append(at)
        return len(t.llm_requests) - 1

    def llm_first_token(self, epoch: int, at: float) -> None:
        self.turn(epoch).llm_first_tokens.append(at)

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

    def turn_latencies(self) -> list[dict[str, float | int | None]]:
        """Per turn, milliseconds: end-of-speech -> turn end, turn end -> LLM request,
        request -> first token, turn end -> first audio out (the response latency);
        plus the raw ``t_*`` marks in call-clock seconds."""
        out: list[dict[str, float | int | None]] = []

        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000.0, 1)

        for t in self.turns.values():
            if t.turn_end is None:
                continue
            req = t.llm_requests[0] if t.llm_requests else None
            tok = t.llm_first_tokens[0] if t.llm_first_tokens else None
            out.append(
                {
                    "epoch": t.epoch,
                    "end_of_turn_ms": ms(t.speech_end, t.turn_end),
                    "request_ms": ms(t.turn_end, req),
                    "first_token_ms": ms(req, tok),
                    "response_ms": ms(t.turn_end, t.first_audio_out),
                    "voice_to_voice_ms": ms(t.speech_end, t.first_audio_out),
                    "rounds": len(t.llm_requests),
                    "interrupted": t.interrupted_at is not None,
                    # raw marks on the call clock (time.monotonic() in the daemon), for benches
                    "t_speech_end": t.speech_end,
                    "t_vad_stop": t.vad_stop,
                    "t_verdict": t.verdict,
                    "verdict_early": t.verdict_early,
                    "t_stt_final": t.stt_final,
                    "t_turn_end": t.turn_end,
                    "t_request": req,
                    "t_first_token": tok,
                    "t_first_audio": t.first_audio_out,
                    "t_out_utterance": t.first_out_utterance,
                    "t_interrupted": t.interrupted_at,
                }
            )
        return out
