"""The speech-to-speech contract: what the S2S stage drives and every S2S adapter speaks.

A speech-to-speech model (OpenAI Realtime, Gemini Live) replaces STT, turn
driver, LLM runner, segmenter and TTS with one session per call. The stage
(:mod:`brisvox.agent.pipeline.s2s.stage`) only ever sees these types; an
adapter translates its vendor's event protocol into them. Events are frozen
dataclasses; sessions and providers are :class:`typing.Protocol` classes.

Session life
    ``provider.connect(config, timeout)`` opens the socket, sends the vendor's
    session set-up (instructions, voice, tools, audio formats, turn detection)
    and returns once the vendor confirmed it (OpenAI ``session.updated``,
    Gemini ``setupComplete``) or raises :class:`ProviderError`. The
    conversation so far (``config.history``) is replayed by the adapter before
    ``connect`` returns (a reconnect mid-call), unless ``config.resume_handle``
    lets the vendor restore it (Gemini session resumption).

Audio
    In: PCM16 mono at ``session.input_rate`` (the stage resamples to it), or
    μ-law at 8 kHz when ``session.input_encoding == "g711_ulaw"``.
    ``send_audio`` never blocks on the model: the adapter queues a bounded
    amount and drops (and counts) audio when the socket is slow.
    Out: :class:`S2sAudio` is PCM16 mono at ``session.output_rate``.

Turn detection (``config.turn_detection``)
    ``"provider"``: the vendor's own VAD ends turns and starts responses by
    itself; :class:`S2sSpeechStarted` tells the stage the caller spoke (over
    the bot: a barge-in) and the vendor cancels its response itself.
    ``"brisvox"``: the vendor's VAD is off. The stage calls ``user_started()``
    at brisvox's VAD start and ``user_ended()`` when brisvox's turn logic ends
    the turn: the adapter commits the input (OpenAI ``input_audio_buffer.commit``
    then ``response.create``; Gemini ``activityEnd``, after which Gemini
    answers by itself).

Responses, items, tools
    Every response has the adapter's ``response_id`` (the vendor's, or minted);
    every piece of model audio belongs to an ``item_id`` (the vendor's output
    item; minted per model turn where the vendor has none). Tool calls arrive
    whole (:class:`S2sToolCall`, arguments as JSON text; the adapter assembles
    argument deltas). The stage answers every call of a response with one
    ``send_tool_results`` (in call order) and then ``create_response()``; an
    adapter whose vendor continues by itself after the results (Gemini) makes
    that a no-op.

Barge-in
    ``cancel_response()`` stops the response in flight (OpenAI
    ``response.cancel``; Gemini has no cancel message: in ``brisvox`` mode the
    adapter sends ``activityStart``, which interrupts the generation; in
    ``provider`` mode the vendor already interrupted itself). Then
    ``truncate(item_id, audio_end_ms, heard_text)`` tells the vendor how much
    of the item the caller heard: OpenAI ``conversation.item.truncate`` with
    ``audio_end_ms``; an adapter without truncation (``supports_truncate`` False)
    does what its protocol allows (Gemini: a client-content note with the heard
    text, documented in docs/S2S.md).

Errors and the end
    An :class:`S2sError` with ``fatal`` False is counted and the session lives
    on; the session ends with exactly one :class:`S2sClosed` (``error`` empty =
    we closed it), after which the iterator ends and sends raise
    ``ProviderError("closed")``. Oversized, garbage and out-of-order events are
    counted in ``session.dropped`` and never end the session unless the
    protocol says it is dead.

Timeouts: every method that may wait on the network takes ``timeout``; the stage
ALSO bounds every await on the call clock. Nothing here logs caller audio,
transcripts or tool arguments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from brisvox.providers.base import ProviderError

TurnDetection = Literal["provider", "brisvox"]


@dataclass(frozen=True, slots=True)
class S2sTool:
    """A function the model may call. ``parameters`` is a JSON Schema object."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class S2sItem:
    """One entry of the conversation replayed into a new session.

    ``kind``: ``"user"`` / ``"assistant"`` (``text``: what was said; for the
    assistant exactly what the caller heard), ``"tool_call"`` (``call_id``,
    ``name``, ``arguments`` JSON text) or ``"tool_result"`` (``call_id``,
    ``name``, ``output`` JSON text)."""

    kind: Literal["user", "assistant", "tool_call", "tool_result"]
    text: str = ""
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""


@dataclass(frozen=True, slots=True)
class S2sConfig:
    model: str = ""
    voice: str = ""
    instructions: str = ""
    tools: tuple[S2sTool, ...] = ()
    turn_detection: TurnDetection = "provider"
    language: str = "en"
    input_rate: int = 16000  # what the stage prefers to send; the session says what it takes
    g711_passthrough: bool = False  # offer μ-law 8 kHz input when the vendor accepts it
    history: tuple[S2sItem, ...] = ()
    resume_handle: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


# --- events ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class S2sSpeechStarted:
    """The vendor's VAD heard the caller start (``provider`` mode only).
    ``audio_ms``: position in the session's input audio, -1 when unknown."""

    audio_ms: int = -1


@dataclass(frozen=True, slots=True)
class S2sSpeechStopped:
    audio_ms: int = -1


@dataclass(frozen=True, slots=True)
class S2sInputTranscript:
    """What the vendor transcribed of the caller (``final`` False: a delta to append)."""

    text: str
    final: bool = True


@dataclass(frozen=True, slots=True)
class S2sResponseStarted:
    response_id: str


@dataclass(frozen=True, slots=True)
class S2sAudio:
    response_id: str
    item_id: str
    pcm: bytes


@dataclass(frozen=True, slots=True)
class S2sOutputTranscript:
    """A delta of the model's own transcript of ``item_id`` (append in order)."""

    response_id: str
    item_id: str
    text: str


@dataclass(frozen=True, slots=True)
class S2sToolCall:
    response_id: str
    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (validated by the tool engine)


@dataclass(frozen=True, slots=True)
class S2sToolCancelled:
    """The vendor withdrew calls it had asked for (Gemini ``toolCallCancellation``)."""

    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class S2sInterrupted:
    """The vendor stopped its response because the caller spoke (Gemini ``interrupted``)."""

    response_id: str


@dataclass(frozen=True, slots=True)
class S2sResponseDone:
    """``status``: completed | cancelled | failed | incomplete."""

    response_id: str
    status: str = "completed"
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class S2sResumable:
    """The vendor's latest session-resumption handle (empty: not resumable now)."""

    handle: str


@dataclass(frozen=True, slots=True)
class S2sError:
    code: str
    message: str = ""
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class S2sClosed:
    """The session ended (the iterator ends after it). ``error`` empty = closed by us."""

    error: str = ""


S2sEvent = (S2sSpeechStarted | S2sSpeechStopped | S2sInputTranscript | S2sResponseStarted | S2sAudio
            | S2sOutputTranscript | S2sToolCall | S2sToolCancelled | S2sInterrupted | S2sResponseDone
            | S2sResumable | S2sError | S2sClosed)


@dataclass(frozen=True, slots=True)
class S2sToolResult:
    call_id: str
    name: str
    output: str  # JSON text


# --- session and provider ------------------------------------------------------------


@runtime_checkable
class S2sSession(Protocol):
    input_rate: int
    input_encoding: Literal["pcm16", "g711_ulaw"]
    output_rate: int
    supports_truncate: bool
    dropped: int  # vendor events counted and dropped (oversized, garbage, unknown, out of order)

    def send_audio(self, audio: bytes) -> None:
        """Queue caller audio (non-blocking; bounded, drops and counts when the socket is slow).
        Raises ProviderError("closed") on a dead session."""
        ...

    async def user_started(self, timeout: float) -> None:  # noqa: ASYNC109
        """``brisvox`` turn detection: the caller started speaking."""
        ...

    async def user_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        """``brisvox`` turn detection: the turn ended; commit the input and get an answer."""
        ...

    async def create_response(self, timeout: float) -> None:  # noqa: ASYNC109
        """Ask for a response (after tool results); a no-op where the vendor continues by itself."""
        ...

    async def cancel_response(self, timeout: float) -> None:  # noqa: ASYNC109
        """Stop the response in flight (barge-in). Never raises for an idle session."""
        ...

    async def truncate(self, item_id: str, audio_end_ms: int, heard_text: str,
                       timeout: float) -> None:  # noqa: ASYNC109
        """The caller heard ``audio_end_ms`` of ``item_id`` (``heard_text`` of its transcript)."""
        ...

    async def send_tool_results(self, results: Sequence[S2sToolResult], timeout: float) -> None:  # noqa: ASYNC109
        """Answer the calls of one response, in call order, in one go where the protocol allows."""
        ...

    async def send_note(self, text: str, timeout: float) -> None:  # noqa: ASYNC109
        """A note for the model (a late tool result), as context only: no response is asked for."""
        ...

    def events(self) -> AsyncIterator[S2sEvent]:
        """The session's events, in order. Called once. Ends after S2sClosed."""
        ...

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        """Close the session; idempotent; never raises."""
        ...


@runtime_checkable
class S2sProvider(Protocol):
    name: str

    async def connect(self, config: S2sConfig, timeout: float) -> S2sSession: ...  # noqa: ASYNC109


__all__ = [
    "ProviderError",
    "S2sAudio",
    "S2sClosed",
    "S2sConfig",
    "S2sError",
    "S2sEvent",
    "S2sInputTranscript",
    "S2sInterrupted",
    "S2sItem",
    "S2sOutputTranscript",
    "S2sProvider",
    "S2sResponseDone",
    "S2sResponseStarted",
    "S2sResumable",
    "S2sSession",
    "S2sSpeechStarted",
    "S2sSpeechStopped",
    "S2sTool",
    "S2sToolCall",
    "S2sToolCancelled",
    "S2sToolResult",
    "TurnDetection",
]
