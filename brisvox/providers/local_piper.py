"""LocalPiperTts: the no-key voice (Piper joe, 22,050 Hz) synthesized by the call's inference worker.

Owns the actor side of local synthesis. Each text chunk of a context is one
TtsJob; the worker writes the PCM into the call's job-output ring (its own
ring, one writer: the worker's TTS lane; the actor never writes it) and
streams TtsJobAudio frames naming ``[start_pos, end_pos)`` of that ring; this
session reads exactly those samples and yields them as TtsAudio, so the
TTS stage converts and writes them into the call's ``tts`` ring as it does
for any provider (a ring has exactly one writer for its whole life). Order, flush
and cancel follow :class:`~brisvox.providers.openai_tts.SerialTtsSession`;
a cancel sends JobCancel (the worker stops at the next sentence).

Failures: a refused job (busy, unsupported: no model, no worker) or a job
that ends with an error ends the session with TtsClosed(reason): the stage
marks the utterance lost and reconnects. A worker that goes silent for
``job_timeout`` seconds mid-job is the same failure (``timeout``). Samples a
slow reader lost to the ring's overrun are counted in ``lost``. No word
timings (the playout book estimates from the speaking rate).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from brisvox.providers.base import ProviderError, TtsConfig
from brisvox.providers.local_llm import worker_error
from brisvox.providers.openai_tts import SerialTtsSession
from brisvox.providers.worker_jobs import JobChannel
from ipc.frames import ErrorReply, JobAccepted, JobCancel, TtsJob, TtsJobAudio
from ipc.ring import Ring, RingError

RATE = 22_050
VOICES = ("joe",)  # the one voice the worker installs (workers.model_catalogue: piper_joe)


class _Rings:
    def __init__(self) -> None:
        self.ring: Ring | None = None
        self.lost = 0

    def get(self, name: str) -> Ring:
        if self.ring is None or self.ring.name != name:
            self.close()
            try:
                self.ring = Ring.attach(name, RATE)
            except RingError as e:
                raise ProviderError("protocol", f"job ring: {e}") from None
        return self.ring

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class LocalPiperTts:
    def __init__(self, channel: JobChannel, call_id: str, *, job_timeout: float = 5.0, request_timeout: float = 2.0,
                 name: str = "local_piper") -> None:
        self.name = name
        self.channel = channel
        self.call_id = call_id
        self.job_timeout = job_timeout
        self.request_timeout = request_timeout
        self.lost = 0

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        w = self.channel.worker_of(self.call_id)
        if w < 0 or (w, "tts") in self.channel.warmed:
            return
        self.channel.warmed.add((w, "tts"))
        rings = _Rings()
        with contextlib.suppress(ProviderError, TimeoutError):
            async with asyncio.timeout(max(timeout, 10.0)):
                async for _ in self._synth(rings, "Hi.", 1.0):
                    pass
        rings.close()

    async def connect(self, config: TtsConfig, timeout: float) -> SerialTtsSession:  # noqa: ASYNC109
        if self.channel.worker_of(self.call_id) < 0:
            raise ProviderError("connect", "the call has no inference worker")
        rings = _Rings()

        async def on_close() -> None:
            rings.close()

        speed = config.speed or 1.0
        return SerialTtsSession(lambda ctx, text: self._synth(rings, text, speed), RATE, on_close=on_close)

    async def _synth(self, rings: _Rings, text: str, speed: float) -> AsyncIterator[bytes]:
        ch = self.channel
        job = ch.next_job()
        q: asyncio.Queue[TtsJobAudio] = asyncio.Queue()
        unlisten = ch.listen(self.call_id, job, q.put_nowait)  # type: ignore[arg-type]
        finished = False
        try:
            reply: Any = await ch.request(TtsJob(call_id=self.call_id, job=job, text=text,
                                                 deadline_ns=time.monotonic_ns() + int(3e9), speed=speed),
                                          self.request_timeout)
            if isinstance(reply, ErrorReply):
                finished = True
                raise worker_error(reply)
            if not isinstance(reply, JobAccepted):
                finished = True
                raise ProviderError("protocol", f"unexpected reply {reply.TYPE}", retryable=False)
            while True:
                try:
                    f = await asyncio.wait_for(q.get(), self.job_timeout)
                except TimeoutError:
                    raise ProviderError("timeout", f"no audio from the worker for {self.job_timeout:g}s") from None
                if f.end_pos > f.start_pos and not f.done:
                    got = rings.get(f.ring).read_range(f.start_pos, f.end_pos)
                    if got.lost:
                        self.lost += got.lost
                    if len(got.samples):
                        yield got.samples.astype("<i2", copy=False).tobytes()
                if f.done:
                    finished = True
                    if f.error and f.error != "cancelled":
                        raise ProviderError("server", f"local tts: {f.error}"[:300])
                    return
        finally:
            unlisten()
            if not finished:
                ch.send(JobCancel(call_id=self.call_id, job=job))
