"""Provider interfaces the call actor drives: streaming STT, streaming LLM, streaming TTS.

Owns the contract between the voice pipeline (``brisvox/agent``) and every
provider adapter (``brisvox/providers/*``: local models, OpenAI-compatible,
Deepgram, Cartesia, ...). The pipeline only ever sees these types; an adapter
translates its vendor's wire format into them. Events are frozen dataclasses;
sessions and providers are :class:`typing.Protocol` classes.

The three stages and what they need (as the STT stage, the LLM runner and the TTS
stage of ``brisvox/agent`` drive them):

STT (:class:`SttProvider` -> :class:`SttSession`)
    The stage warms the provider at call start (``warm``), then ``connect``s
    one session (prewarm), streams 16 kHz mono PCM16 into it
    (``send_audio``; the stage never awaits it from its frame loop and drops
    audio when the session is slow), and sends ``finalize()`` at every VAD stop.
    The session yields :class:`Transcript` events. Exactly one rule matters
    for the turn logic: **the answer to a Finalize is the transcript with
    ``from_finalize=True`` and ``speech_final=True``** (a provider that has
    no real finalize, e.g. a local batch model, emits exactly one such
    transcript per ``finalize()``, possibly with empty text). Transcripts
    with ``speech_final=True`` but ``from_finalize=False`` (the provider's own
    endpointing) close nothing. Finalizes are answered in the order they were
    sent; there are no per-finalize ids. A session that dies ends its event
    iterator (optionally after a :class:`SttClosed` with the reason); the
    stage answers every outstanding Finalize itself and reconnects.

LLM (:class:`LlmProvider`)
    ``stream(request)`` starts one streamed completion for an
    :class:`LlmRequest` (the whole context converted to provider-neutral
    :class:`LlmMessage` rows plus name-ordered :class:`LlmTool` specs) and
    returns an :class:`LlmStream`: an async iterator of :class:`TextDelta`,
    :class:`ToolCallDelta`, :class:`ProviderData`, :class:`Usage` and a final
    :class:`Done` (or an :class:`LlmError` as the last event). Tool-call deltas
    follow the assembly contract (partial JSON never runs): fragments are keyed by ``index``,
    ``id``/``name`` may arrive on any fragment (first non-empty wins), the
    ``arguments`` fragments concatenate to the JSON text, ``provider_data`` is
    sent whole on one fragment. Cancellation is ``await stream.aclose()``
    (the runner does it on barge-in; it must return promptly and release the
    HTTP stream). The runner bounds the time to the first event
    (``first_token`` timeout, default 8 s) and between events (``idle``,
    default 15 s) on the injected clock; adapters need not.

TTS (:class:`TtsProvider` -> :class:`TtsSession`)
    One session per call, connected at start (prewarm). The stage opens one
    *context* per text-bearing LLM round (an ``int`` id the stage mints;
    the same id is the utterance id of the playout book). Text arrives in
    chunks (``send_text``; ``continue_`` False on the first chunk of a
    context), ``flush(context)`` says no more text follows (the provider
    answers with :class:`TtsFlushed` after the last audio of that context),
    ``cancel(context)`` is non-blocking and overtakes queued text (barge-in;
    answered by :class:`TtsCancelled`, after which no event of that context
    may come). The session yields :class:`TtsAudio` (PCM16 mono at
    ``TtsSession.sample_rate``, any chunk size) and :class:`TtsWord`
    (word timings in seconds from the start of the context's audio; optional:
    a provider without timings sends none). Contexts are independent; audio of
    different contexts is never interleaved by the stage (it plays them in
    the order they were opened).

Timeouts: every method that may wait on the network takes an explicit
``timeout`` (seconds, on the caller's loop clock) or is documented as
non-blocking. The pipeline ALSO wraps every such await in ``asyncio.timeout``
on the call clock, so the parameter tells the adapter its budget (for its own
handshake or socket options), it is not the only bound (hence the
``noqa: ASYNC109`` on these signatures). Adapters must honour cancellation of
the awaiting task at any await. Defaults the pipeline uses are in
:class:`ProviderTimeouts`.

Errors: adapters raise :class:`ProviderError` (with a stable ``kind`` label:
"connect", "timeout", "auth", "rate_limited", "bad_request", "server",
"closed", "protocol") from ``warm``/``connect``/``send_*``; an LLM stream
that fails mid-way yields :class:`LlmError` as its last event instead of
raising, so the runner can keep the partial text.

Nothing here logs or stores caller audio, transcripts or tool arguments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

# --- common ------------------------------------------------------------------------


class ProviderError(Exception):
    """A provider operation failed. ``kind`` is a stable counter label; ``retryable``
    says whether trying again could help (HTTP 400/404/413/422 are not retryable;
    the resilience layer never re-issues ``bad_request``, the LLM runner nothing).
    ``retry_after``: seconds the server asked to wait before a retry (an HTTP
    ``Retry-After`` on a 429/503), None when it said nothing."""

    def __init__(self, kind: str, detail: str = "", *, retryable: bool = True,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class ProviderTimeouts:
    """The pipeline's default bounds on every network await (on the injected clock), in seconds."""

    warm: float = 0.4  # a warm-up that stalls delays the connect by at most this
    connect: float = 5.0
    send: float = 2.0
    finalize: float = 3.0  # an unanswered Finalize declares the STT session dead
    llm_first_token: float = 8.0
    llm_idle: float = 15.0
    tts_idle: float = 15.0  # a TTS session that owes events and is silent this long is dead
    close: float = 1.0


# --- STT ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SttConfig:
    """What a session is opened with. Audio is always PCM16 mono little-endian."""

    sample_rate: int = 16000
    language: str = "en"
    model: str = ""
    interim_results: bool = True
    keywords: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript segment.

    ``is_final``: the provider will not revise this segment (a "final segment";
    interims have False and replace the previous interim). ``speech_final``:
    the provider considers the utterance ended. ``from_finalize``: this is the
    answer to a :meth:`SttSession.finalize` (with ``speech_final`` it answers
    the OLDEST outstanding Finalize; a provider sends exactly one per
    Finalize, its ``text`` may be empty). ``start``/``end``: seconds of
    session audio the segment covers (0.0 if unknown).
    """

    text: str
    is_final: bool
    speech_final: bool = False
    from_finalize: bool = False
    confidence: float = 1.0
    start: float = 0.0
    end: float = 0.0
    language: str = ""


@dataclass(frozen=True, slots=True)
class SttClosed:
    """The session ended (the event iterator ends after it). ``error`` empty = clean close."""

    error: str = ""


SttEvent = Transcript | SttClosed


@runtime_checkable
class SttSession(Protocol):
    """One streaming recognition session (one per call; replaced after a death)."""

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        """Queue PCM16 mono at the session's rate. Raises ProviderError("closed")
        on a dead session, ProviderError("timeout") past ``timeout``."""
        ...

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        """Ask for the final transcript of the audio sent so far (answered by one
        Transcript with from_finalize and speech_final, in order)."""
        ...

    def events(self) -> AsyncIterator[SttEvent]:
        """The session's events, in order. Called once. Ends when the session closes."""
        ...

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        """Close the session; idempotent; never raises."""
        ...


@runtime_checkable
class SttSpanSink(Protocol):
    """Optional extension of an :class:`SttSession` (added for the local Whisper job):
    a session whose model reads caller audio from the call's in16 ring itself (an
    inference worker) wants the in16 positions ``[start, end)`` of each audio chunk
    the stage sends. The stage calls ``note_span`` right before ``send_audio`` when
    the session has it; sessions without it ignore positions."""

    def note_span(self, start: int, end: int) -> None: ...


@runtime_checkable
class SttProvider(Protocol):
    """An STT service. Optional attribute ``audio_batch`` (seconds, default 0): the
    provider takes caller audio in batches of about that length, so the call's pump
    may hold audio that long before offering it (it always flushes before a VAD
    event). Streaming vendors that want audio as it comes leave it unset."""

    name: str

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        """Pre-resolve DNS / open a pooled connection / load a model. Optional work;
        failures raise ProviderError and are only counted by the stage."""
        ...

    async def connect(self, config: SttConfig, timeout: float) -> SttSession:  # noqa: ASYNC109
        """Open a session (raises ProviderError on failure or past ``timeout``)."""
        ...


# --- LLM ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlmToolCall:
    """An assistant tool call as sent back to the provider in a later request.

    ``id`` is brisvox's stable id (``t<epoch>.<seq>``); ``provider_id`` the id the
    provider minted (echo it when the vendor requires its own id; empty if
    none). ``arguments`` is the JSON object as text. ``provider_data`` is
    the call's opaque round-trip data as JSON text ("" if none).
    """

    id: str
    name: str
    arguments: str
    provider_id: str = ""
    provider_data: str = ""


@dataclass(frozen=True, slots=True)
class LlmMessage:
    """One provider-neutral message of a request.

    role: "system" | "user" | "assistant" | "tool".
    * assistant: ``text`` (may be empty when ``tool_calls`` exist),
      ``tool_calls``, ``provider_data`` (response round-trip data, JSON text).
    * tool: ``call_id`` (the brisvox id of the call it answers), ``text`` the
      result content, ``is_error``; ``name`` the tool's name (some vendors need it).
    """

    role: Literal["system", "user", "assistant", "tool"]
    text: str = ""
    tool_calls: tuple[LlmToolCall, ...] = ()
    call_id: str = ""
    name: str = ""
    is_error: bool = False
    provider_data: str = ""


@dataclass(frozen=True, slots=True)
class LlmTool:
    """A tool offered to the model. ``parameters`` is a JSON Schema object (draft 2020-12)."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """One completion request. ``tools`` are name-ordered (prompt-cache stability).

    ``messages[0]`` is the system prompt when there is one. ``max_tokens`` 0 =
    the provider's default. ``extra`` carries adapter-specific knobs from the
    agent definition (reasoning effort, ...). ``idempotency_key`` lets an adapter
    send a stable request id (retries of the same request reuse it).
    """

    messages: tuple[LlmMessage, ...]
    tools: tuple[LlmTool, ...] = ()
    temperature: float | None = None
    max_tokens: int = 0
    tool_choice: Literal["auto", "none", "required"] = "auto"
    idempotency_key: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Spoken text, in order."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of tool call ``index`` (0-based, per response); assembly: module docstring."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    provider_data: Any = None


@dataclass(frozen=True, slots=True)
class ProviderData:
    """Round-trip data for the whole response (e.g. a reasoning signature); sent whole."""

    value: Any


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Done:
    """The response is complete. ``stop_reason``: "stop" | "tool_calls" | "length" | ...
    ``provider_data``: response round-trip data when it comes with the end."""

    stop_reason: str = "stop"
    provider_data: Any = None


@dataclass(frozen=True, slots=True)
class LlmError:
    """The stream failed; it ends after this event. ``retryable`` and ``retry_after``
    as for ProviderError."""

    kind: str
    detail: str = ""
    retryable: bool = True
    retry_after: float | None = None


LlmEvent = TextDelta | ToolCallDelta | ProviderData | Usage | Done | LlmError


@runtime_checkable
class LlmStream(Protocol):
    """An in-flight response: iterate it for events; ``aclose()`` cancels it."""

    def __aiter__(self) -> AsyncIterator[LlmEvent]: ...

    async def __anext__(self) -> LlmEvent: ...

    async def aclose(self) -> None:
        """Cancel the response and release its connection. Idempotent, prompt, never raises."""
        ...


@runtime_checkable
class LlmProvider(Protocol):
    name: str

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        """Open a pooled connection (e.g. an unauthenticated HEAD) or load a model."""
        ...

    def stream(self, request: LlmRequest) -> LlmStream:
        """Start a streamed completion. Must not block; connection errors surface as
        an LlmError event (or a ProviderError raised from the first ``__anext__``)."""
        ...


# --- TTS ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TtsConfig:
    """What a session is opened with. ``sample_rate`` is what the stage asks for;
    the session reports what it actually produces in ``TtsSession.sample_rate``."""

    voice: str = ""
    language: str = "en"
    model: str = ""
    sample_rate: int = 24000
    speed: float = 1.0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TtsAudio:
    """PCM16 mono little-endian at the session's rate, for ``context``."""

    context: int
    pcm: bytes


@dataclass(frozen=True, slots=True)
class TtsWord:
    """A word of ``context``: ``start``/``end`` seconds from the start of that context's audio."""

    context: int
    word: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class TtsFlushed:
    """Every audio chunk of ``context`` has been delivered (answer to ``flush``)."""

    context: int


@dataclass(frozen=True, slots=True)
class TtsCancelled:
    """``context`` was cancelled; nothing of it follows."""

    context: int


@dataclass(frozen=True, slots=True)
class TtsClosed:
    """The session ended (the iterator ends after it). ``error`` empty = clean close."""

    error: str = ""


TtsEvent = TtsAudio | TtsWord | TtsFlushed | TtsCancelled | TtsClosed


@runtime_checkable
class TtsSession(Protocol):
    sample_rate: int

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        """Queue ``text`` for ``context`` (continue_ False opens the context).
        Text may start with whitespace (raw slices of the LLM text); adapters pass
        it on or strip it as their vendor wants."""
        ...

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        """No more text for ``context``: synthesize what is buffered, then TtsFlushed."""
        ...

    def cancel(self, context: int) -> None:
        """Non-blocking; overtakes queued text. Answered by TtsCancelled (unknown ids too)."""
        ...

    def events(self) -> AsyncIterator[TtsEvent]:
        """The session's events, in order. Called once. Ends when the session closes."""
        ...

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        """Close the session; idempotent; never raises."""
        ...


@runtime_checkable
class TtsProvider(Protocol):
    name: str

    def idle_limit(self) -> float | None:
        """Seconds after which the vendor closes an idle session (None = never)."""
        ...

    async def warm(self, timeout: float) -> None: ...  # noqa: ASYNC109

    async def connect(self, config: TtsConfig, timeout: float) -> TtsSession: ...  # noqa: ASYNC109


__all__ = [
    "Done",
    "LlmError",
    "LlmEvent",
    "LlmMessage",
    "LlmProvider",
    "LlmRequest",
    "LlmStream",
    "LlmTool",
    "LlmToolCall",
    "ProviderData",
    "ProviderError",
    "ProviderTimeouts",
    "SttClosed",
    "SttConfig",
    "SttEvent",
    "SttProvider",
    "SttSession",
    "SttSpanSink",
    "TextDelta",
    "ToolCallDelta",
    "Transcript",
    "TtsAudio",
    "TtsCancelled",
    "TtsClosed",
    "TtsConfig",
    "TtsEvent",
    "TtsFlushed",
    "TtsProvider",
    "TtsSession",
    "TtsWord",
    "Usage",
]
