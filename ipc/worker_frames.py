"""The worker-lane frames of ``ipc/frames.py``: gateway/actor <-> inference worker.

Split out of ``ipc/frames.py`` only for size; ``ipc/frames.py`` re-exports every
frame here, so ``from ipc.frames import AttachCall`` (and ``frames.AttachCall``)
keeps working and that module stays the one place to read the whole protocol.
The conventions are ``ipc/frames.py``'s (monotonic ``*_ns`` times, ring
positions as absolute sample counts, correlation ids in the envelope, every
frame naming its receiver ``to``). Frames are frozen slotted dataclasses
(:func:`ipc.codec.frame`); registering a tag twice is a programming error, so
this module is imported once, through ``ipc/frames.py``.
"""

from __future__ import annotations

from typing import Any

from ipc.codec import Frame, frame

__all__ = ["AttachCall", "SubscriberHello", "Attached", "DetachCall", "Detached", "WorkerTick", "TtsUtterance", "OutUtterance", "TtsCut", "SmartTurnRequest", "SmartTurnResult", "SttJob", "SttJobResult", "TtsJob", "TtsJobAudio", "LlmJob", "LlmJobDelta", "JobAccepted", "JobCancel"]


# --- worker lanes (gateway/actor <-> inference worker) ------------------------------

# A worker's realtime lane: every tick (20 ms) it reads each attached call's
# ``in`` ring, resamples to 16 kHz into ``in16``, runs one batched VAD over
# every call with a full window, converts ``tts`` (TTS rate) into ``out``
# (call rate), and sends ONE WorkerTick per subscriber. The job lane (Smart
# Turn, local STT/TTS/LLM) runs on its own thread(s) and never delays a tick.


@frame("attach_call", to="worker")
class AttachCall(Frame):
    """Subscriber -> worker: serve a call's rings. Reply: Attached or ErrorReply.

    ``subscriber`` is the DEALER identity that gets WorkerTicks for the call.
    On a re-attach after a worker death, ``speaking_since`` is the in16
    position of a VAD start that never got its stop (-1 if none): the new
    worker's first tick carries a synthesized stop (``reason`` "worker_lost")
    dated where the old worker's in16 ended (never before ``speaking_since``),
    and it resumes reading ``in`` where ``in16`` left off. ``gateway``, if
    set, is a DEALER identity connected to this worker that also gets
    OutUtterance (the gateway needs utterance starts for its epoch filter).
    Errors: bad_ring (missing ring, bad magic/version), bad_rate, bad_params,
    full. An attach naming a new ``incarnation`` first does what SubscriberHello does.
    """

    call_id: str
    subscriber: str
    instance: str
    call_rate: int
    tts_rate: int
    speaking_since: int = -1
    vad: dict[str, Any] | None = None  # VadParams overrides (thresholds, min speech/silence)
    gateway: str = ""
    incarnation: str = ""  # the subscriber process's (SubscriberHello); "" = not said


@frame("subscriber_hello", to="worker")
class SubscriberHello(Frame):
    """Subscriber -> worker, first on each link and again when the worker is reported ready:
    the sender's identity (which a restarted process keeps) is now ``incarnation`` (random per
    process). The worker detaches and unmaps every call of that identity attached by another
    incarnation, at once (the gateway still owns and unlinks their rings); the same incarnation
    again (a reconnect) keeps them. Not answered."""

    incarnation: str


@frame("attached", to="reply")
class Attached(Frame):
    call_id: str
    worker: int
    in16_pos: int


@frame("detach_call", to="worker")
class DetachCall(Frame):
    """Subscriber -> worker: stop serving the call (its rings stay). Reply: Detached."""

    call_id: str


@frame("detached", to="reply")
class Detached(Frame):
    call_id: str


@frame("worker_tick", to="subscriber")
class WorkerTick(Frame):
    """Worker -> subscriber, once per tick for all of that subscriber's calls, when the
    tick has news for it (else at least every 100 ms, empty, as a keepalive).

    ``positions``: call_id -> in16 write position, for the calls whose in16
    advanced in this tick.
    ``events``: the tick's events (VAD start/stop/falling, input gaps, VAD
    failure/recovery), each the wire object of a typed event of
    ``ipc/tick_events.py`` (what each kind carries), read with its ``from_wire``.
    """

    worker: int
    seq: int
    positions: dict[str, int]
    events: list[dict[str, Any]]  # tick_events.to_wire(event) objects
    sent_ns: int


@frame("tts_utterance", to="worker")
class TtsUtterance(Frame):
    """Actor -> worker: utterance ``utterance`` of ``epoch`` starts at ``tts_pos`` in the tts ring."""

    call_id: str
    utterance: int
    epoch: int
    tts_pos: int


@frame("out_utterance", to=("subscriber", "gateway"))
class OutUtterance(Frame):
    """Worker -> actor and gateway: that utterance starts at ``out_pos`` in the out ring
    (resampler ramp-in dropped, so word offsets stay exact). Sent as soon as the
    utterance's first audio is in the out ring (converted at once, outside the
    worker's tick), so the gateway releases its first frame on receipt."""

    call_id: str
    utterance: int
    epoch: int
    out_pos: int


@frame("tts_cut", to="worker")
class TtsCut(Frame):
    """Actor -> worker: epoch ``epoch`` was interrupted; drop tts audio before ``tts_pos``
    and reset the output resampler (unless audio after ``tts_pos``, which is a newer
    epoch's, was already converted: then the running stream is kept)."""

    call_id: str
    epoch: int
    tts_pos: int


@frame("smart_turn", to="worker")
class SmartTurnRequest(Frame):
    """Actor -> worker job lane: score the 8 s of in16 ending at ``end_pos``.
    Reply: SmartTurnResult, or ErrorReply: expired (past ``deadline_ns``
    before it started), superseded (a newer request for the same call came
    while this one was still queued), busy (job queue full), timeout (ran too
    long), unknown_call, bad_range (``end_pos`` not in the in16 ring),
    job_failed."""

    call_id: str
    end_pos: int
    deadline_ns: int


@frame("smart_turn_result", to="reply")
class SmartTurnResult(Frame):
    call_id: str
    end_pos: int
    probability: float
    queued_us: int
    took_us: int


# Local model jobs (the no-key stack; workers/local_jobs.py, brisvox/providers/local_*.py).
# They run on per-kind job lanes of the call's worker, never on the tick thread.
# Requests carry a correlation id and are answered at once (JobAccepted) or with
# the result (SttJobResult) or an ErrorReply: expired, busy, unknown_call,
# bad_range, unsupported (model missing), job_failed, timeout. Streamed output
# travels WITHOUT a correlation id, keyed by (call_id, job): LLM tokens as
# LlmJobDelta, synthesized audio as TtsJobAudio naming positions in the call's
# job-output ring (written by the worker only; audio never travels in a frame).


@frame("stt_job", to="worker")
class SttJob(Frame):
    """Actor -> worker: transcribe in16 ``[start_pos, end_pos)`` (the VAD-gated utterance)
    with the local Whisper model, at most ``max_tokens`` tokens. Reply: SttJobResult."""

    call_id: str
    start_pos: int
    end_pos: int
    deadline_ns: int
    language: str = "en"
    max_tokens: int = 96


@frame("stt_job_result", to="reply")
class SttJobResult(Frame):
    call_id: str
    text: str
    start_pos: int
    end_pos: int
    queued_us: int
    took_us: int


@frame("tts_job", to="worker")
class TtsJob(Frame):
    """Actor -> worker: synthesize ``text`` with the local voice. Reply: JobAccepted (then
    TtsJobAudio frames) or ErrorReply."""

    call_id: str
    job: int
    text: str
    deadline_ns: int
    voice: str = ""
    speed: float = 1.0


@frame("tts_job_audio", to="subscriber")
class TtsJobAudio(Frame):
    """Worker -> actor: samples ``[start_pos, end_pos)`` of ring ``ring`` (at ``rate``) belong
    to ``job``; ``done`` on the last frame of the job (``error`` set if it failed)."""

    call_id: str
    job: int
    ring: str
    rate: int
    start_pos: int
    end_pos: int
    done: bool = False
    error: str = ""


@frame("llm_job", to="worker")
class LlmJob(Frame):
    """Actor -> worker: a chat completion with the local model. ``messages`` are
    ``{"role", "content"}`` rows. Reply: JobAccepted (then LlmJobDelta frames) or ErrorReply."""

    call_id: str
    job: int
    messages: list[dict[str, Any]]
    deadline_ns: int
    max_tokens: int = 128
    temperature: float = 0.2
    model: str = ""  # a local LLM of the worker's catalogue; "" = the worker's default
    repeat_penalty: float = 1.0  # 1.0 = off
    seed: int = 0  # sampling seed (temperature > 0): the same prompt gives the same answer


@frame("llm_job_delta", to="subscriber")
class LlmJobDelta(Frame):
    """Worker -> actor: generated text of ``job`` in order (``seq`` from 0); the last frame has
    ``done`` with ``stop_reason`` ("stop", "length", "cancelled") or ``error``, and the usage."""

    call_id: str
    job: int
    seq: int
    text: str = ""
    done: bool = False
    stop_reason: str = ""
    error: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


@frame("job_accepted", to="reply")
class JobAccepted(Frame):
    call_id: str
    job: int


@frame("job_cancel", to="worker")
class JobCancel(Frame):
    """Actor -> worker, fire-and-forget: stop ``job`` (queued: dropped; running: stopped at
    its next token or sentence). Its stream still ends with a done frame."""

    call_id: str
    job: int
