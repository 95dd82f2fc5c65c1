"""Frames that flow between the stages of ONE call actor (not ``ipc/frames.py``).

Owns the vocabulary of the in-process pipeline::

    pump -> SttStage -> TurnDriver -> LlmRunner -> SegmenterStage -> TtsStage -> TtsRingWriter

Every frame is a frozen slotted dataclass with an ``epoch`` (0 for user-side
frames) and a class-level ``LANE``:

* ``SYSTEM``: overtakes everything queued in a stage's inbox (Start, Stop,
  Interrupt, the VAD events). Never dropped silently (a full system lane is
  counted as a defect).
* ``UPSTREAM``: frames that travel against the flow (BotStarted / BotEnded
  from TtsRingWriter and the LlmRunner to the TurnDriver, Smart Turn verdicts
  returning to the driver). Delivered with a non-blocking put; drops are
  counted.
* ``DATA``: everything else, in order, through bounded lanes.

A frame class with ``LOSSLESS`` set is never dropped by a full SYSTEM or
UPSTREAM lane (:meth:`~brisvox.agent.pipeline.stage.base.Inbox.put_nowait`):
Stop and Interrupt, and the end-of-speech signals BotStarted and BotEnded,
whose loss would leave the turn machine waiting for a bot that already
spoke or finished. Their producers bound them: Stop once per call, at most
one Interrupt, one BotStarted and two BotEnded (the ring writer's, the
runner's for a silent turn) per epoch, and epochs are made only by the
TurnDriver, the stage they are queued for.

Invariants: frames are immutable; audio payloads are numpy int16 arrays that
no stage mutates after sending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

SYSTEM = 0
UPSTREAM = 1
DATA = 2


class PipelineFrame:
    """Base: every frame has ``epoch`` and a class-level ``LANE``."""

    __slots__ = ()
    LANE: ClassVar[int] = DATA
    LOSSLESS: ClassVar[bool] = False  # a full system or upstream lane takes it all the same
    epoch: int


# --- system lane -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start(PipelineFrame):
    LANE: ClassVar[int] = SYSTEM
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Stop(PipelineFrame):
    """Hang-up: every stage finishes its work for the call and forwards it."""

    LANE: ClassVar[int] = SYSTEM
    LOSSLESS: ClassVar[bool] = True
    reason: str = "hangup"
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Interrupt(PipelineFrame):
    """Barge-in: ``epoch`` is the NEW epoch; everything older is stale. ``at`` is the
    decision instant on the call clock."""

    LANE: ClassVar[int] = SYSTEM
    LOSSLESS: ClassVar[bool] = True
    epoch: int
    old_epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class UserStartedSpeaking(PipelineFrame):
    """VAD start, backdated: ``pos`` is the in16 position of the first speech sample,
    ``at`` the call-clock time of that sample."""

    LANE: ClassVar[int] = SYSTEM
    at: float
    pos: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class UserStoppedSpeaking(PipelineFrame):
    """VAD stop: ``pos`` is one past the last speech sample (in16), ``at`` its time.
    ``decided_pos`` (0: unknown) is the in16 position where the VAD decided the stop,
    after its silence window: the end of the audio Smart Turn analyses (the model
    expects the trailing pause; a tail cut at ``pos`` can read as unfinished)."""

    LANE: ClassVar[int] = SYSTEM
    at: float
    pos: int
    epoch: int = 0
    decided_pos: int = 0


@dataclass(frozen=True, slots=True)
class UserSpeechFalling(PipelineFrame):
    """VAD falling (opt-in, the worker's ``vad.fall_delay_ms``): silence began at ``pos``
    (time ``at``), the stop of this fall, if it comes, will carry exactly ``pos``;
    ``decided_pos`` (0: unknown) is where the VAD saw it: the end of the audio an
    early Smart Turn analysis reads."""

    LANE: ClassVar[int] = SYSTEM
    at: float
    pos: int
    epoch: int = 0
    decided_pos: int = 0


@dataclass(frozen=True, slots=True)
class Wake(PipelineFrame):
    """A stage's own helper reporting back (e.g. a Smart Turn verdict)."""

    LANE: ClassVar[int] = UPSTREAM
    kind: str
    value: object = None
    epoch: int = 0


# --- user side (data lane, epoch 0 unless re-tagged) -------------------------------------


@dataclass(frozen=True, slots=True)
class AudioFrame(PipelineFrame):
    """16 kHz caller audio read from the in16 ring: samples ``[pos, pos+len)``."""

    pos: int
    samples: np.ndarray
    gap: bool = False
    epoch: int = 0

    @property
    def end(self) -> int:
        return self.pos + len(self.samples)


@dataclass(frozen=True, slots=True)
class UserTranscript(PipelineFrame):
    """A transcript segment from the STT stage (interim: lossy; final: reliable).
    Downstream of the driver: the joined final text of a turn."""

    text: str
    final: bool
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class UtteranceFinal(PipelineFrame):
    """Exactly one per Finalize: the STT has said everything about that stop."""

    synthetic: bool = False
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class DtmfFrame(PipelineFrame):
    digit: str
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class KeypadEntry(PipelineFrame):
    """Driver -> runner: the caller's keypad entry (``digits``, the keys aggregated by
    :mod:`.dtmf`, without the terminator) as the user turn ``epoch``; ``text`` is the
    turn the LLM reads (the agent's ``[dtmf] text``), ``at`` when the entry ended."""

    epoch: int
    digits: str
    text: str = ""
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class UserTurnStarted(PipelineFrame):
    epoch: int


@dataclass(frozen=True, slots=True)
class UserTurnEnded(PipelineFrame):
    """The gated end of a user turn with its joined text (never empty)."""

    epoch: int
    text: str
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class SpeculationCandidate(PipelineFrame):
    """Driver -> runner: a candidate end of the open turn ``epoch`` with its text so far
    (a later one of the same epoch replaces it); empty ``text``: the candidate is
    withdrawn (the caller resumed). A type of its own rather than a non-final
    UserTranscript: the same type flows into the driver carrying the STT's interims, and
    downstream of the driver a UserTranscript is the turn's final text. It travels in the
    data lane with the final UserTranscript and UserTurnEnded, so a candidate never
    races the turn end it may be committed by."""

    epoch: int
    text: str


@dataclass(frozen=True, slots=True)
class Greet(PipelineFrame):
    """The actor asks the driver for a greeting at call start (system lane: never dropped)."""

    LANE: ClassVar[int] = SYSTEM
    text: str
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class CallMediaChanged(PipelineFrame):
    """The actor passes on the call's media state (the gateway's ``CallMedia``: "early",
    "answered", "held") at ``at`` (system lane: ordered with the VAD events, never dropped)."""

    LANE: ClassVar[int] = SYSTEM
    state: str
    at: float
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Greeting(PipelineFrame):
    """Driver -> runner: speak ``text`` as the whole response of the bot turn ``epoch``."""

    epoch: int
    text: str


# --- bot side (data lane, DropStale) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlmResponseStarted(PipelineFrame):
    """Round ``round`` of the turn ``epoch`` starts (ordinal: number of Started frames
    of the epoch before it; fillers and fallback lines are rounds too)."""

    epoch: int
    round: int


@dataclass(frozen=True, slots=True)
class LlmText(PipelineFrame):
    """``clip``: the whole text of a fixed line (a filler) that may be played from its
    pre-rendered clip (the segmenter keeps it in one chunk; the TTS stage renders it once)."""

    epoch: int
    round: int
    text: str
    clip: bool = False


@dataclass(frozen=True, slots=True)
class Flush(PipelineFrame):
    """Speak what was sent so far (before a tool runs)."""

    epoch: int
    round: int


@dataclass(frozen=True, slots=True)
class LlmResponseEnded(PipelineFrame):
    """The whole response of the turn is over (all rounds)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class TextChunk(PipelineFrame):
    """A raw slice of a round's text (leading whitespace included)."""

    epoch: int
    round: int
    text: str
    last: bool = False  # the round's final chunk (the segmenter finished the stream)
    clip: bool = False  # a fixed line's whole text: played from its clip once rendered


@dataclass(frozen=True, slots=True)
class AudioOut(PipelineFrame):
    """Synthesized PCM16 at the tts ring rate for ``utterance``."""

    epoch: int
    utterance: int
    samples: np.ndarray


@dataclass(frozen=True, slots=True)
class TtsEnded(PipelineFrame):
    """TtsStage -> TtsRingWriter: the response of ``epoch`` has no more audio."""

    epoch: int


# --- upstream -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BotStarted(PipelineFrame):
    """TtsRingWriter -> TurnDriver: the first audio of ``epoch`` was handed over."""

    LANE: ClassVar[int] = UPSTREAM
    LOSSLESS: ClassVar[bool] = True
    epoch: int
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class BotEnded(PipelineFrame):
    """-> TurnDriver: the response of ``epoch`` finished playing (end mark echoed,
    mark timeout, or a response without audio)."""

    LANE: ClassVar[int] = UPSTREAM
    LOSSLESS: ClassVar[bool] = True
    epoch: int
    reason: str = "mark"
