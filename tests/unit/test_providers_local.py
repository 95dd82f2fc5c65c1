"""The actor side of the local providers over a scripted job channel (no models, no worker).

* LocalWhisper: an early job once the audio went quiet for the worker's pad (not
  before, once per gap, none with ``early = false``), with the Finalize's start; one
  from_finalize transcript per Finalize, in order; the span
  is the stage's exact span when noted, else estimated from the worker's in16
  position and the audio received (with pre-roll); an empty utterance is
  answered at once without a job; a refused job answers with empty text
  (counted), never a hang.
* LocalLlm: deltas in order become TextDelta, then Usage and Done; a worker
  error reply becomes an LlmError of the mapped kind; an out-of-order frame is
  a protocol error; closing early sends JobCancel; the context is trimmed.
* LocalPiper: samples named by TtsJobAudio frames are read from the job ring
  and yielded in order, then TtsFlushed; a cancel sends JobCancel and answers
  TtsCancelled; a failed job ends the session with TtsClosed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from brisvox.providers.base import (
    Done,
    LlmError,
    LlmMessage,
    LlmRequest,
    ProviderError,
    SttConfig,
    TextDelta,
    Transcript,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsFlushed,
    Usage,
)
from brisvox.providers.local_llm import LocalLlm, to_rows
from brisvox.providers.local_piper import LocalPiperTts
from brisvox.providers.local_whisper import LocalWhisperStt
from brisvox.providers.worker_jobs import JobRouter
from ipc.codec import Frame
from ipc.frames import (
    ErrorReply,
    JobAccepted,
    JobCancel,
    LlmJob,
    LlmJobDelta,
    SttJob,
    SttJobResult,
    TtsJob,
    TtsJobAudio,
)
from ipc.ring import Ring, ring_name


class Chan(JobRouter):
    """Answers requests with ``respond(frame) -> (reply, [streamed frames])``."""

    def __init__(self, respond: Callable[[Frame], tuple[Frame, list[Frame]]], pos: int = 0) -> None:
        super().__init__()
        self.respond = respond
        self.pos = pos
        self.requests: list[Frame] = []
        self.sent: list[Frame] = []

    def worker_of(self, call_id: str) -> int:
        return 0

    def in16_pos(self, call_id: str) -> int:
        return self.pos

    async def request(self, frame: Frame, timeout: float) -> Frame:  # noqa: ASYNC109
        self.requests.append(frame)
        reply, stream = self.respond(frame)
        loop = asyncio.get_running_loop()
        for i, f in enumerate(stream):
            loop.call_later(0.001 * (i + 1), self.deliver, f)
        return reply

    def send(self, frame: Frame) -> None:
        self.sent.append(frame)


def span_text(f: Frame) -> tuple[Frame, list[Frame]]:
    """A transcription job answered with its span as the text."""
    assert isinstance(f, SttJob)
    return SttJobResult(call_id="c", text=f"{f.start_pos}-{f.end_pos}", start_pos=f.start_pos,
                        end_pos=f.end_pos, queued_us=0, took_us=0), []


def test_whisper_one_answer_per_finalize_in_order() -> None:
    ch = Chan(span_text, pos=48_000)

    async def main() -> list[Any]:
        s = await LocalWhisperStt(ch, "c", preroll=0.1).connect(SttConfig(), 1.0)
        it = s.events().__aiter__()
        s.note_span(20_000, 20_320)
        s.note_span(20_320, 32_000)
        await s.finalize(1.0)  # exact span from the stage
        await s.finalize(1.0)  # nothing since: answered without a job
        await s.send_audio(b"\0\0" * 16_000, 1.0)
        await s.finalize(1.0)  # estimated: ends at the worker's in16 position
        out = [await it.__anext__() for _ in range(3)]
        await s.close(1.0)
        return out

    a, b, c = asyncio.run(main())
    assert a == Transcript("18400-32000", True, True, True, 1.0, 18400 / 16000, 32000 / 16000, "en")
    assert b.text == "" and b.from_finalize and b.speech_final
    assert c.text == "30400-48000"
    assert len(ch.requests) == 2


def _tone(n: int) -> bytes:
    t = np.arange(n) / 16000.0
    return (np.sin(2 * np.pi * 220.0 * t) * 8000).astype("<i2").tobytes()


def test_whisper_asks_early_once_the_audio_goes_quiet_and_the_finalize_asks_the_same_span() -> None:
    ch = Chan(span_text, pos=0)

    async def main(early: bool) -> tuple[list[Any], list[Frame]]:
        s = await LocalWhisperStt(ch, "c", preroll=0.1, early=early).connect(SttConfig(), 1.0)
        it = s.events().__aiter__()
        pos = 16_000

        async def chunk(pcm: bytes) -> None:
            nonlocal pos
            n = len(pcm) // 2
            s.note_span(pos, pos + n)
            pos += n
            await s.send_audio(pcm, 1.0)
            await asyncio.sleep(0)

        for _ in range(10):  # 0.4 s of speech
            await chunk(_tone(640))
        for _ in range(3):  # 120 ms quiet: not yet (the worker pads 150 ms)
            await chunk(b"\0\0" * 640)
        await asyncio.sleep(0.01)
        assert ch.requests == []
        for _ in range(2):  # 200 ms quiet: asked once
            await chunk(b"\0\0" * 640)
        await asyncio.sleep(0.01)
        assert len(ch.requests) == (1 if early else 0)
        for _ in range(3):  # more quiet: no second early job for the same gap
            await chunk(b"\0\0" * 640)
        await s.finalize(1.0)
        out = [await asyncio.wait_for(it.__anext__(), 2)]
        await s.close(1.0)
        return out, [f for f in ch.requests if isinstance(f, SttJob)]

    (final,), jobs = asyncio.run(main(True))
    assert len(jobs) == 2  # the early job, then the Finalize's
    early, last = jobs
    assert early.start_pos == last.start_pos == 16_000 - 1600  # the same start (pre-roll): the worker's frames align
    assert early.end_pos == 16_000 + 10 * 640 + 5 * 640 and last.end_pos == 16_000 + 18 * 640
    assert final.text == f"{last.start_pos}-{last.end_pos}"  # one event, the Finalize's answer
    ch.requests.clear()
    (_,), jobs = asyncio.run(main(False))
    assert len(jobs) == 1  # early = false: the Finalize's job only


def test_whisper_never_queues_a_second_early_job_beside_one_still_running() -> None:
    class Slow(Chan):
        def __init__(self) -> None:
            super().__init__(span_text)
            self.gate = asyncio.Event()

        async def request(self, frame: Frame, timeout: float) -> Frame:  # noqa: ASYNC109
            self.requests.append(frame)
            await self.gate.wait()
            return span_text(frame)[0]

    ch = Slow()

    async def main() -> tuple[int, int, Any]:
        s = await LocalWhisperStt(ch, "c", early=True).connect(SttConfig(), 1.0)
        it = s.events().__aiter__()
        pos = 16_000
        for _ in range(2):  # speech, a quiet gap, speech again, a quiet gap: the first job still runs
            for pcm in [_tone(640)] * 10 + [b"\0\0" * 640] * 5:
                s.note_span(pos, pos + 640)
                pos += 640
                await s.send_audio(pcm, 1.0)
            await asyncio.sleep(0.01)
        during = len(ch.requests)
        ch.gate.set()
        await s.finalize(1.0)
        ev = await asyncio.wait_for(it.__anext__(), 2)
        await s.close(1.0)
        return during, s.early_jobs, ev

    during, early, ev = asyncio.run(main())
    assert during == 1 and early == 1
    assert len(ch.requests) == 2 and ev.from_finalize  # the early job, then the Finalize's


def test_whisper_refused_job_answers_empty() -> None:
    ch = Chan(lambda f: (ErrorReply(kind="busy", call_id="c"), []), pos=32_000)

    async def main() -> tuple[Any, int]:
        s = await LocalWhisperStt(ch, "c").connect(SttConfig(), 1.0)
        it = s.events().__aiter__()
        await s.send_audio(b"\0\0" * 8000, 1.0)
        await s.finalize(1.0)
        ev = await asyncio.wait_for(it.__anext__(), 2)
        await s.close(1.0)
        return ev, s.failed

    ev, failed = asyncio.run(main())
    assert ev.text == "" and ev.from_finalize and failed == 1


def llm_respond(frames: list[tuple[str, dict[str, Any]]]) -> Callable[[Frame], tuple[Frame, list[Frame]]]:
    def respond(f: Frame) -> tuple[Frame, list[Frame]]:
        assert isinstance(f, LlmJob)
        out = [LlmJobDelta(call_id="c", job=f.job, seq=i, text=t, **kw) for i, (t, kw) in enumerate(frames)]
        return JobAccepted(call_id="c", job=f.job), out

    return respond


def collect(p: Any, req: LlmRequest) -> list[Any]:
    async def main() -> list[Any]:
        s = p.stream(req)
        out = [e async for e in s]
        await s.aclose()
        return out

    return asyncio.run(main())


REQ = LlmRequest((LlmMessage("system", "sys"), LlmMessage("user", "hi")), max_tokens=20)


def test_llm_stream_and_errors() -> None:
    ch = Chan(llm_respond([("Hello", {}), (" there.", {}),
                           ("", {"done": True, "stop_reason": "stop", "input_tokens": 5, "output_tokens": 3})]))
    evs = collect(LocalLlm(ch, "c"), REQ)
    assert evs == [TextDelta("Hello"), TextDelta(" there."), Usage(5, 3), Done("stop")]
    job = ch.requests[0]
    assert isinstance(job, LlmJob) and job.max_tokens == 20 and job.messages[0] == {"role": "system", "content": "sys"}
    assert ch.sent == []  # finished: no cancel

    refused = Chan(lambda f: (ErrorReply(kind="unsupported", detail="model missing", call_id="c"), []))
    evs = collect(LocalLlm(refused, "c"), REQ)
    assert len(evs) == 1 and isinstance(evs[0], LlmError) and evs[0].kind == "bad_request" and not evs[0].retryable

    failed = Chan(llm_respond([("Hi", {}), ("", {"done": True, "error": "job_failed: boom"})]))
    evs = collect(LocalLlm(failed, "c"), REQ)
    assert evs[0] == TextDelta("Hi") and isinstance(evs[-1], LlmError) and evs[-1].kind == "server"

    def skip(f: Frame) -> tuple[Frame, list[Frame]]:
        return JobAccepted(call_id="c", job=f.job), [LlmJobDelta(call_id="c", job=f.job, seq=1, text="x")]  # type: ignore[attr-defined]

    ch2 = Chan(skip)
    evs = collect(LocalLlm(ch2, "c"), REQ)
    assert isinstance(evs[-1], LlmError) and evs[-1].kind == "protocol"
    assert [type(f) for f in ch2.sent] == [JobCancel]  # the worker is told to stop


def test_llm_close_early_cancels() -> None:
    ch = Chan(llm_respond([("one", {}), ("two", {}), ("", {"done": True})]))

    async def main() -> None:
        s = LocalLlm(ch, "c").stream(REQ)
        assert await s.__anext__() == TextDelta("one")
        await s.aclose()

    asyncio.run(main())
    assert len(ch.sent) == 1 and isinstance(ch.sent[0], JobCancel) and ch.sent[0].job == ch.requests[0].job  # type: ignore[attr-defined]


def test_llm_rows_trimmed_from_the_oldest_turn() -> None:
    msgs = [LlmMessage("system", "S")] + [LlmMessage("user" if i % 2 == 0 else "assistant", f"m{i} " + "x" * 100)
                                          for i in range(40)]
    msgs.append(LlmMessage("tool", '{"ok":1}', call_id="t1.0", name="lookup"))
    rows = to_rows(msgs, 1000)
    assert rows[0] == {"role": "system", "content": "S"}
    assert rows[1]["role"] == "user" and sum(len(r["content"]) for r in rows) <= 1000 + 200
    assert rows[-1] == {"role": "user", "content": '[result of lookup] {"ok":1}'}


def test_piper_reads_the_job_ring(shm_clean: str) -> None:
    name = ring_name(shm_clean, "c", "ttsjob0")
    ring = Ring.create(name, 1 << 16, 22050)
    try:
        ramp = np.arange(3000, dtype=np.int16)

        def respond(f: Frame) -> tuple[Frame, list[Frame]]:
            assert isinstance(f, TtsJob)
            if f.text == "fail":
                return JobAccepted(call_id="c", job=f.job), [
                    TtsJobAudio(call_id="c", job=f.job, ring=name, rate=22050, start_pos=0, end_pos=0, done=True,
                                error="job_failed: x")]
            s0 = ring.write_pos
            ring.write(ramp[:1000])
            ring.write(ramp[1000:])
            return JobAccepted(call_id="c", job=f.job), [
                TtsJobAudio(call_id="c", job=f.job, ring=name, rate=22050, start_pos=s0, end_pos=s0 + 1000),
                TtsJobAudio(call_id="c", job=f.job, ring=name, rate=22050, start_pos=s0 + 1000, end_pos=s0 + 3000),
                TtsJobAudio(call_id="c", job=f.job, ring=name, rate=22050, start_pos=s0, end_pos=s0 + 3000, done=True)]

        ch = Chan(respond)

        async def main() -> tuple[list[Any], list[Any]]:
            s = await LocalPiperTts(ch, "c").connect(TtsConfig(), 1.0)
            it = s.events().__aiter__()
            await s.send_text(1, "Hello there.", continue_=False, timeout=1.0)
            await s.flush(1, 1.0)
            evs = []
            while not evs or not isinstance(evs[-1], TtsFlushed):
                evs.append(await asyncio.wait_for(it.__anext__(), 2))
            s.cancel(2)
            await s.send_text(3, "fail", continue_=False, timeout=1.0)
            tail = []
            while not tail or not isinstance(tail[-1], TtsClosed):
                tail.append(await asyncio.wait_for(it.__anext__(), 2))
            await s.close(1.0)
            return evs, tail

        evs, tail = asyncio.run(main())
        audio = b"".join(e.pcm for e in evs if isinstance(e, TtsAudio))
        assert audio == ramp.tobytes() and evs[-1] == TtsFlushed(1)
        assert tail[0] == TtsCancelled(2) and "job_failed" in tail[-1].error
    finally:
        ring.unlink()
        ring.close()


def test_llm_job_carries_the_model_and_decoding() -> None:
    ch = Chan(llm_respond([("", {"done": True, "stop_reason": "stop"})]))
    collect(LocalLlm(ch, "c", model="smollm2", temperature=0.0, repeat_penalty=1.1, seed=7), REQ)
    job = ch.requests[0]
    assert isinstance(job, LlmJob)
    assert (job.model, job.temperature, job.repeat_penalty, job.seed) == ("smollm2", 0.0, 1.1, 7)


def test_an_unknown_local_model_is_refused_at_construction() -> None:
    with pytest.raises(ProviderError, match="unknown model 'gpt-9'"):
        LocalLlm(Chan(llm_respond([])), "c", model="gpt-9")


def test_the_provider_knows_exactly_the_models_the_worker_serves() -> None:
    from brisvox.providers.local_llm import MODELS
    from workers.local_llm import LLM_MODELS
    from workers.model_catalogue import CATALOGUE

    assert set(MODELS) == set(LLM_MODELS) and all(m in CATALOGUE for m in MODELS)
