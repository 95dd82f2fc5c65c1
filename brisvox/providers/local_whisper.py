"""LocalWhisperStt: the no-key speech-to-text (Whisper tiny.en) run as a job on the call's worker.

Owns the actor side of local transcription. Whisper is a batch model: the
session sends nothing while audio streams (the worker already has it in the
call's in16 ring) and, at each ``finalize()``, asks the worker to transcribe
the utterance ``[start, end)`` of in16; the answer is exactly ONE
``Transcript(is_final=True, speech_final=True, from_finalize=True)`` per
Finalize, in order (possibly empty text). No interims.

Where the utterance is: if the stage reports the in16 span of every audio
chunk (:class:`~brisvox.providers.base.SttSpanSink`, ``note_span``), the
span since the previous Finalize is exact. Otherwise it is estimated: it ends
at the in16 position the worker reported when the last audio chunk arrived
and is as long as the audio received since the previous Finalize (one
worker tick of error at most); the worker trims it to its voiced part anyway.
``preroll`` seconds before the start are included (VAD starts late by a
window), the length is capped at ``max_span`` seconds (6 s: the span since the
previous Finalize includes the whole time the bot spoke, and the worker can
only read what its in16 ring still holds, 8 s by default; the worker trims
the span to its voiced part).

Transcribe while the caller speaks (``early``, off by default): when the audio
received since the previous Finalize held speech and then stayed below the
worker's energy floor for :data:`QUIET_S` (its 150 ms pad and a frame), the
session asks the worker for the span so far at once, before the VAD's stop
arrives; its answer is not a transcript (no event). The worker remembers a
call's last transcription by the ring span of its voiced part, so the
Finalize's job right after, whose voiced part is the same span when the tail
stayed quiet, is answered from it without running the model: the final is the
batch transcription of the same samples, ready as early as the quiet tail
allows. Speech after the quiet gap re-arms it (one early job per gap, and
never one while another is queued or running, or a Finalize is queued); a
tail that is not quiet (noise above the floor) leaves the Finalize to do the
work, as without it. Jobs run in order (one queue), so the Finalize's job
follows the early one.

A refused or failed job answers its Finalize with empty text (counted in
``failed``): the turn proceeds with what it has, as after an STT death.
``warm()`` sends the empty span once per worker per process: the worker
loads the model before the first turn needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator

import numpy as np

from brisvox.providers.base import ProviderError, SttClosed, SttConfig, SttEvent, Transcript
from brisvox.providers.worker_jobs import JobChannel
from brisvox.providers.ws_common import EventPipe
from ipc.codec import Frame
from ipc.frames import ErrorReply, SttJob, SttJobResult

RATE = 16_000
# the one model the worker installs (workers.model_catalogue: whisper_tiny_en), and what it can hear
MODELS = ("whisper_tiny_en",)
LANGUAGES = ("en",)
MAX_SAMPLES = 30 * RATE
FLOOR_DBFS = -45.0  # the worker's voiced-part floor (workers.local_stt.FLOOR_DBFS)
QUIET_S = 0.17  # the worker pads the voiced part by 150 ms past its last loud 20 ms frame
MIN_SPEECH_S = 0.2  # less loud audio than this is not asked for early (the worker skips clips under 0.2 s)


async def stt_job(channel: JobChannel, call_id: str, start: int, end: int, timeout: float,  # noqa: ASYNC109
                  queue_deadline: float, language: str = "en", max_tokens: int = 96) -> Frame | None:
    """One transcription of in16 ``[start, end)`` by the call's worker: its answer
    (SttJobResult or ErrorReply), or None when none came (no worker, ``timeout``)."""
    job = SttJob(call_id=call_id, start_pos=start, end_pos=end,
                 deadline_ns=time.monotonic_ns() + int(queue_deadline * 1e9), language=language, max_tokens=max_tokens)
    try:
        return await channel.request(job, timeout)
    except ProviderError:
        return None


class LocalWhisperSession:
    def __init__(self, provider: LocalWhisperStt, language: str) -> None:
        self.p = provider
        self.language = language or "en"
        self._pipe = EventPipe(256)
        self._queue: deque[tuple[int, int, bool]] = deque()  # (start, end, early)
        self._wake = asyncio.Event()
        self._received = 0  # samples since the last Finalize
        self._end_est = 0
        self._span_start: int | None = None
        self._span_end: int | None = None
        self._closed = False
        self.failed = 0
        self.jobs = 0
        self.early_jobs = 0
        self._loud = 0  # loud samples received since the last early job (or Finalize)
        self._quiet = 0  # samples received since the last loud chunk
        self._early_open = False  # an early job is queued or running: no second one beside it
        self._task = asyncio.get_running_loop().create_task(self._run())

    # -- contract ------------------------------------------------------------------------
    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            raise ProviderError("closed", "session closed")
        n = len(pcm) // 2
        self._received += n
        self._end_est = self.p.channel.in16_pos(self.p.call_id)
        if self.p.early and n:
            self._listen(pcm, n)

    def _listen(self, pcm: bytes, n: int) -> None:
        x = np.frombuffer(pcm, dtype="<i2", count=n).astype(np.float32) / 32768.0
        if 10.0 * np.log10(float(np.mean(x * x)) + 1e-12) > FLOOR_DBFS:
            self._loud += n
            self._quiet = 0
            return
        self._quiet += n
        if self._loud >= MIN_SPEECH_S * RATE and self._quiet >= QUIET_S * RATE:
            start, end = self._span()
            self._loud = 0
            if end > start and not self._early_open and not self._queue:  # a queued Finalize does it anyway
                self._early_open = True
                self.early_jobs += 1
                self._queue.append((start, end, True))
                self._wake.set()

    def _span(self) -> tuple[int, int]:
        """The in16 span of the audio since the previous Finalize (``preroll`` before it, at most
        ``max_span`` long); (0, 0) when there was none."""
        pre = int(self.p.preroll * RATE)
        if self._span_start is not None and self._span_end is not None:
            start, end = self._span_start, self._span_end
        elif self._received:
            end = self._end_est
            start = end - self._received
        else:
            return 0, 0
        if end > start:
            start = max(0, start - pre, end - min(MAX_SAMPLES, int(self.p.max_span * RATE)))
        return start, end

    def note_span(self, start: int, end: int) -> None:
        if self._span_start is None:
            self._span_start = start
        self._span_end = end

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            raise ProviderError("closed", "session closed")
        start, end = self._span()
        self._received = self._loud = self._quiet = 0
        self._span_start = self._span_end = None
        self._queue.append((start, end, False))
        self._wake.set()

    def events(self) -> AsyncIterator[SttEvent]:
        return self._pipe.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._task, timeout)
        self._pipe.end(SttClosed(""))

    # -- the job loop (answers Finalizes in order) ----------------------------------------
    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            start, end, early = self._queue.popleft()
            text = ""
            if end > start:
                text = await self._transcribe(start, end, counted=not early)
            if early:
                self._early_open = False
                continue
            await self._pipe.put(Transcript(text, True, True, True, 1.0 if text else 0.0,
                                            start / RATE, end / RATE, self.language))

    async def _transcribe(self, start: int, end: int, counted: bool = True) -> str:
        """The worker's text for ``[start, end)`` ("" on a failure, counted in ``failed`` when
        ``counted``: an early job that fails costs nothing, the Finalize's job asks again)."""
        self.jobs += 1
        p = self.p
        reply = await stt_job(p.channel, p.call_id, start, end, p.job_timeout, p.queue_deadline, self.language,
                              p.max_tokens)
        if isinstance(reply, SttJobResult):
            return reply.text
        self.failed += counted
        if isinstance(reply, ErrorReply) and reply.kind == "bad_range" and start > 0:
            # an estimate off by a tick past the ring's end: retry up to the newest position
            newest = p.channel.in16_pos(p.call_id)
            if start < newest < end:
                return await self._transcribe(start, newest, counted)
        return ""


class LocalWhisperStt:
    def __init__(self, channel: JobChannel, call_id: str, *, max_tokens: int = 96, preroll: float = 0.2,
                 job_timeout: float = 8.0, queue_deadline: float = 3.0, max_span: float = 6.0,
                 early: bool = False, name: str = "local_whisper") -> None:
        self.name = name
        self.early = bool(early)
        self.max_span = max_span
        self.channel = channel
        self.call_id = call_id
        self.max_tokens = max_tokens
        self.preroll = preroll
        self.job_timeout = job_timeout
        self.queue_deadline = queue_deadline

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        w = self.channel.worker_of(self.call_id)
        if w < 0 or (w, "stt") in self.channel.warmed:
            return
        self.channel.warmed.add((w, "stt"))
        job = SttJob(call_id=self.call_id, start_pos=0, end_pos=0,  # the empty span: a warm-up
                     deadline_ns=time.monotonic_ns() + int(2e9), max_tokens=4)
        with contextlib.suppress(ProviderError):
            await self.channel.request(job, max(timeout, self.job_timeout))

    async def connect(self, config: SttConfig, timeout: float) -> LocalWhisperSession:  # noqa: ASYNC109
        if self.channel.worker_of(self.call_id) < 0:
            raise ProviderError("connect", "the call has no inference worker")
        return LocalWhisperSession(self, config.language)
