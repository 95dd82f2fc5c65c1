"""The speech adapters (Deepgram STT; Cartesia, ElevenLabs, OpenAI speech TTS) over loopback servers
that speak each vendor's streaming protocol, plus the pipeline fallback when a provider breaks.

What each test proves:

* Deepgram: the query and ``Token`` header; interims, then exactly one
  ``from_finalize`` answer per Finalize, in order; KeepAlive after silence;
  garbage frames counted and skipped; a socket cut mid-utterance ends the
  events with SttClosed(error) and later sends raise ``closed``; a refused
  handshake is ``auth``; through the real SttStage a cut session still
  yields the UtteranceFinal the turn needs (the documented fallback).
* Cartesia: ``continue`` true per chunk and false on flush; audio, word
  timestamps and TtsFlushed; cancel answers TtsCancelled at once, sends the
  cancel request and nothing of the context follows; error / garbage / cut
  end the session with TtsClosed(error); through the real TtsStage a cut
  session still ends the response (TtsEnded), never a hung call.
* ElevenLabs: context messages, alignment -> words, flush + close_context ->
  TtsFlushed, cancel, garbage.
* OpenAI speech: PCM streamed per chunk (odd chunk sizes re-aligned), flush
  after the audio, HTTP 500 ends the session, cancel mid-synthesis releases
  the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from bench.harness.http_server import FakeHttpServer, Reply, json_reply
from bench.harness.ws_vendors import FakeCartesia, FakeDeepgram, FakeElevenLabs
from brisvox.agent.conversation.playout_book import PlayoutBook
from brisvox.agent.pipeline.cascade.stt_stage import SttStage, SttStageConfig
from brisvox.agent.pipeline.cascade.tts_stage import TtsStage, TtsStageConfig
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    AudioOut,
    Flush,
    LlmResponseEnded,
    LlmResponseStarted,
    PipelineFrame,
    Start,
    Stop,
    TextChunk,
    TtsEnded,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UtteranceFinal,
)
from brisvox.clock import CLOCK
from brisvox.providers.base import (
    ProviderError,
    SttClosed,
    SttConfig,
    Transcript,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsFlushed,
    TtsWord,
)
from brisvox.providers.cartesia import CartesiaTts
from brisvox.providers.deepgram import DeepgramStt
from brisvox.providers.elevenlabs import ElevenLabsTts, words_from_alignment
from brisvox.providers.http import close_all
from brisvox.providers.openai_tts import OpenAiTts

pytestmark = pytest.mark.timeout(60)

AUDIO_100MS = np.full(1600, 500, dtype=np.int16).tobytes()


async def take(it: Any, until: type, limit: float = 3.0) -> list[Any]:
    out: list[Any] = []

    async def go() -> None:
        async for ev in it:
            out.append(ev)
            if isinstance(ev, until):
                return

    await asyncio.wait_for(go(), limit)
    return out


async def opened(p: Any, config: Any, timeout: float = 2.0) -> tuple[Any, Any]:  # noqa: ASYNC109
    """A connected session and its event iterator."""
    s = await p.connect(config, timeout)
    return s, s.events().__aiter__()


@contextlib.asynccontextmanager
async def http_vendor(handler: Any) -> AsyncIterator[FakeHttpServer]:
    """The fake HTTP speech endpoint; the adapters' shared HTTP clients are closed on the way out."""
    async with FakeHttpServer(handler) as srv:
        try:
            yield srv
        finally:
            await close_all()


class Collect(Stage):
    def __init__(self, call: CallContext) -> None:
        super().__init__(call, None, Inbox("collect", 4096, sys_cap=256))
        self.frames: list[PipelineFrame] = []

    async def process(self, frame: PipelineFrame) -> None:
        self.frames.append(frame)


S = TypeVar("S", bound=Stage)


@contextlib.asynccontextmanager
async def stage_running(make: Callable[[CallContext], S],
                        book: PlayoutBook | None = None) -> AsyncIterator[tuple[S, Collect]]:
    """The stage ``make`` builds, piped into a :class:`Collect` sink, started (Start sent);
    stopped and its tasks closed on the way out."""
    call = CallContext.detached("t", clock=CLOCK, book=book)
    tasks = call.tasks
    stage = make(call)
    sink = Collect(call)
    stage.pipe(sink)
    stage.start()
    sink.start()
    stage.inbox.put_nowait(Start())
    await asyncio.sleep(0.2)
    try:
        yield stage, sink
    finally:
        stage.inbox.put_nowait(Stop("test"))
        if stage.task is not None:
            await asyncio.wait([stage.task], timeout=3)
        await tasks.close()


async def until_frame(sink: Collect, kind: type) -> None:
    """Wait (3 s at most) until the sink has seen a frame of ``kind``."""
    for _ in range(150):
        if any(isinstance(f, kind) for f in sink.frames):
            return
        await asyncio.sleep(0.02)


async def speak_until_closed(p: Any, text: str) -> list[Any]:
    """Connect, send one text on context 1, and collect the events up to TtsClosed."""
    s, it = await opened(p, TtsConfig())
    await s.send_text(1, text, continue_=False, timeout=1.0)
    evs = await take(it, TtsClosed)
    await s.close(1.0)
    return evs


# -- Deepgram --------------------------------------------------------------------------------


def test_deepgram_interims_and_one_answer_per_finalize() -> None:
    async def main() -> tuple[list[Any], list[Any], FakeDeepgram]:
        async with FakeDeepgram() as srv:
            p = DeepgramStt("dg-key", base_url=srv.url, keepalive_interval=30)
            s, it = await opened(p, SttConfig(keywords=("brisvox",)))
            for _ in range(4):
                await s.send_audio(AUDIO_100MS * 2, 1.0)
            await s.finalize(1.0)
            first = await take(it, Transcript, 3.0)
            while not first[-1].from_finalize:
                first += await take(it, Transcript, 3.0)
            await s.send_audio(AUDIO_100MS * 2, 1.0)
            await s.finalize(1.0)
            await s.finalize(1.0)
            second: list[Any] = []
            while sum(1 for e in second if e.from_finalize) < 2:
                second += await take(it, Transcript, 3.0)
            await s.close(1.0)
            return first, second, srv

    first, second, srv = asyncio.run(main())
    interims = [e for e in first if not e.is_final]
    assert [e.text for e in interims] == ["book a", "book a table for", "book a table for two"]
    assert first[-1] == Transcript("book a table for two", True, True, True, 0.93, 0.0, 0.5)
    assert [e.from_finalize for e in second if e.is_final] == [True, True]
    path, headers = srv.log.paths[0], srv.log.headers[0]
    assert path.startswith("/v1/listen?model=nova-3&encoding=linear16&sample_rate=16000&channels=1")
    assert "interim_results=true" in path and "endpointing=300" in path and "keyterm=brisvox" in path
    assert headers["authorization"] == "Token dg-key"
    assert [c["type"] for c in srv.log.controls] == ["Finalize", "Finalize", "Finalize", "CloseStream"]


def test_deepgram_keepalive_after_silence() -> None:
    async def main() -> list[Any]:
        async with FakeDeepgram() as srv:
            s = await DeepgramStt("k", base_url=srv.url, keepalive_interval=0.2).connect(SttConfig(), 2.0)
            await asyncio.sleep(0.75)
            await s.close(1.0)
            return srv.log.controls

    controls = asyncio.run(main())
    assert sum(1 for c in controls if c["type"] == "KeepAlive") >= 2


def test_deepgram_garbage_is_counted_and_skipped() -> None:
    async def main() -> tuple[list[Any], int]:
        async with FakeDeepgram("garbage") as srv:
            s, it = await opened(DeepgramStt("k", base_url=srv.url), SttConfig())
            await s.send_audio(AUDIO_100MS * 4, 1.0)
            await s.finalize(1.0)
            evs: list[Any] = []
            while not (evs and evs[-1].from_finalize):
                evs += await take(it, Transcript)
            await s.close(1.0)
            return evs, s.bad_messages

    evs, bad = asyncio.run(main())
    assert bad >= 1 and evs[-1].from_finalize


def test_deepgram_cut_mid_utterance_closes_with_an_error() -> None:
    async def main() -> tuple[list[Any], str]:
        async with FakeDeepgram("cut") as srv:
            s, it = await opened(DeepgramStt("k", base_url=srv.url), SttConfig())
            for _ in range(4):
                try:
                    await s.send_audio(AUDIO_100MS * 2, 1.0)
                except ProviderError:
                    break
                await asyncio.sleep(0.02)
            evs = await take(it, SttClosed)
            try:
                await s.send_audio(AUDIO_100MS, 1.0)
                kind = "none"
            except ProviderError as e:
                kind = e.kind
            await s.close(1.0)
            return evs, kind

    evs, kind = asyncio.run(main())
    assert isinstance(evs[-1], SttClosed) and evs[-1].error
    assert kind == "closed"


@pytest.mark.parametrize("mode,kind", [("reject", "auth"), ("busy", "rate_limited")])
def test_deepgram_refused_handshake(mode: str, kind: str) -> None:
    async def main() -> str:
        async with FakeDeepgram(mode) as srv:
            try:
                await DeepgramStt("k", base_url=srv.url).connect(SttConfig(), 2.0)
            except ProviderError as e:
                return e.kind
            return "connected"

    assert asyncio.run(main()) == kind


def test_stt_stage_answers_the_finalize_when_deepgram_dies_mid_utterance() -> None:
    """The provider dies after 400 ms of speech; the stage still emits the one UtteranceFinal
    (synthetic) for the VAD stop, and counts the death: the turn is not hung."""

    async def main() -> tuple[list[PipelineFrame], dict[str, int]]:
        async with FakeDeepgram("cut") as srv:
            cfg = SttStageConfig(reconnect_backoff=0.1)

            def make(call: CallContext) -> SttStage:
                return SttStage(call, cfg, Inbox("stt", 64, sys_cap=64), DeepgramStt("k", base_url=srv.url))

            async with stage_running(make) as (stage, sink):
                stage.inbox.put_nowait(UserStartedSpeaking(CLOCK.now(), 0))
                pos = 0
                for _ in range(6):
                    samples = np.full(1600, 700, dtype=np.int16)
                    await stage.inbox.put(AudioFrame(pos, samples))
                    pos += 1600
                    await asyncio.sleep(0.03)
                stage.inbox.put_nowait(UserStoppedSpeaking(CLOCK.now(), pos))
                await until_frame(sink, UtteranceFinal)
            return sink.frames, stage.stats()

    frames, stats = asyncio.run(main())
    finals = [f for f in frames if isinstance(f, UtteranceFinal)]
    assert len(finals) == 1
    assert stats["deaths"] >= 1


# -- Cartesia --------------------------------------------------------------------------------


def test_cartesia_contexts_words_and_flush() -> None:
    async def main() -> tuple[list[Any], FakeCartesia]:
        async with FakeCartesia() as srv:
            s, it = await opened(CartesiaTts("ck", base_url=srv.url, voice="v-1"), TtsConfig(sample_rate=16000))
            await s.send_text(7, "Hello there,", continue_=False, timeout=1.0)
            await s.send_text(7, " how are you?", continue_=True, timeout=1.0)
            await s.flush(7, 1.0)
            evs = await take(it, TtsFlushed)
            await s.close(1.0)
            return evs, srv

    evs, srv = asyncio.run(main())
    audio = b"".join(e.pcm for e in evs if isinstance(e, TtsAudio))
    assert len(audio) == 2 * int(16000 * 0.01 * len("Hello there,")) + 2 * int(16000 * 0.01 * len(" how are you?"))
    words = [(w.word, round(w.start, 3)) for w in evs if isinstance(w, TtsWord)]
    assert [w for w, _ in words] == ["Hello", "there,", "how", "are", "you?"]
    assert words[2][1] == pytest.approx(0.12)  # the second chunk's words follow the first's audio
    assert evs[-1] == TtsFlushed(7)
    c = srv.log.controls
    assert [m["continue"] for m in c] == [True, True, False]
    assert c[0]["context_id"] == "bv-7" and c[0]["voice"] == {"mode": "id", "id": "v-1"}
    assert c[0]["output_format"] == {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}
    assert c[0]["add_timestamps"] is True
    assert srv.log.headers[0]["x-api-key"] == "ck"


def test_cartesia_cancel_is_immediate_and_final() -> None:
    async def main() -> tuple[list[Any], list[Any]]:
        async with FakeCartesia() as srv:
            s, it = await opened(CartesiaTts("ck", base_url=srv.url), TtsConfig())
            await s.send_text(1, "First context text.", continue_=False, timeout=1.0)
            s.cancel(1)
            await s.send_text(1, "late text", continue_=True, timeout=1.0)  # dropped
            await s.send_text(2, "Second.", continue_=False, timeout=1.0)
            await s.flush(2, 1.0)
            evs = await take(it, TtsFlushed)
            await s.close(1.0)
            return evs, srv.log.controls

    evs, controls = asyncio.run(main())
    i = evs.index(TtsCancelled(1))
    assert all(getattr(e, "context", None) != 1 for e in evs[i + 1:])
    assert any(m.get("cancel") is True and m["context_id"] == "bv-1" for m in controls)
    assert not any(m.get("transcript") == "late text" for m in controls)


@pytest.mark.parametrize("mode", ["error", "garbage", "cut"])
def test_cartesia_broken_server_closes_the_session(mode: str) -> None:
    async def main() -> list[Any]:
        async with FakeCartesia(mode) as srv:
            return await speak_until_closed(CartesiaTts("ck", base_url=srv.url), "Hello.")

    evs = asyncio.run(main())
    assert isinstance(evs[-1], TtsClosed) and evs[-1].error


def test_tts_stage_ends_the_response_when_cartesia_dies() -> None:
    """A session cut mid-utterance: the stage marks it lost and still sends TtsEnded."""

    async def main() -> list[PipelineFrame]:
        async with FakeCartesia("cut") as srv:
            book = PlayoutBook(CLOCK, 8000, 24000)
            cfg = TtsStageConfig(ring_rate=24000, reconnect_backoff=0.1)

            def make(call: CallContext) -> TtsStage:
                return TtsStage(call, cfg, Inbox("tts", 64, sys_cap=64), CartesiaTts("ck", base_url=srv.url))

            async with stage_running(make, book) as (stage, sink):
                book.register_round(1, 0)
                await stage.inbox.put(LlmResponseStarted(1, 0))
                await stage.inbox.put(TextChunk(1, 0, "Hello there.", last=True))
                await stage.inbox.put(Flush(1, 0))
                await stage.inbox.put(LlmResponseEnded(1))
                await until_frame(sink, TtsEnded)
            return sink.frames

    frames = asyncio.run(main())
    assert [f for f in frames if isinstance(f, TtsEnded)] == [TtsEnded(1)]
    assert not any(isinstance(f, AudioOut) for f in frames)


# -- ElevenLabs ------------------------------------------------------------------------------


def test_elevenlabs_context_alignment_and_flush() -> None:
    async def main() -> tuple[list[Any], FakeElevenLabs]:
        async with FakeElevenLabs() as srv:
            p = ElevenLabsTts("xi", voice="joe", base_url=srv.url, voice_settings={"stability": 0.5})
            s, it = await opened(p, TtsConfig())
            await s.send_text(3, "Hi you", continue_=False, timeout=1.0)
            await s.send_text(3, " there", continue_=True, timeout=1.0)
            await s.flush(3, 1.0)
            evs = await take(it, TtsFlushed)
            s.cancel(4)
            await s.close(1.0)
            return evs, srv

    evs, srv = asyncio.run(main())
    words = [(w.word, round(w.start, 3), round(w.end, 3)) for w in evs if isinstance(w, TtsWord)]
    assert words == [("Hi", 0.0, 0.02), ("you", 0.03, 0.06), ("there", 0.07, 0.12)]
    assert evs[-1] == TtsFlushed(3)
    c = srv.log.controls
    assert c[0] == {"text": "Hi you", "context_id": "bv-3", "voice_settings": {"stability": 0.5}}
    assert c[2] == {"context_id": "bv-3", "flush": True} and c[3] == {"context_id": "bv-3", "close_context": True}
    assert "output_format=pcm_24000" in srv.log.paths[0] and srv.log.headers[0]["xi-api-key"] == "xi"


def test_elevenlabs_words_from_alignment() -> None:
    al = {"chars": list("ab cd"), "charStartTimesMs": [0, 10, 20, 30, 40], "charDurationsMs": [10] * 5}
    assert words_from_alignment(al, 1.0) == [("ab", 1.0, 1.02), ("cd", 1.03, 1.05)]


def test_elevenlabs_garbage_closes_the_session() -> None:
    async def main() -> list[Any]:
        async with FakeElevenLabs("garbage") as srv:
            return await speak_until_closed(ElevenLabsTts("xi", voice="joe", base_url=srv.url), "Hello")

    evs = asyncio.run(main())
    assert evs[-1].error == "garbage from the server"


# -- OpenAI speech ---------------------------------------------------------------------------


def test_openai_speech_streams_pcm_in_order() -> None:
    pcm = np.arange(3001, dtype=np.int16).tobytes()
    chunks = [pcm[:1001], pcm[1001:4001], pcm[4001:]]  # odd sizes: samples split across chunks

    async def main() -> tuple[list[Any], list[Any]]:
        async with http_vendor(lambda r: Reply(200, chunks, content_type="audio/pcm")) as srv:
            s, it = await opened(OpenAiTts("sk", base_url=srv.url + "/v1", voice="verse"), TtsConfig())
            await s.send_text(1, "Hello there.", continue_=False, timeout=1.0)
            await s.send_text(1, " Second sentence.", continue_=True, timeout=1.0)
            await s.flush(1, 1.0)
            evs = await take(it, TtsFlushed)
            await s.close(1.0)
            return evs, [r.json for r in srv.requests]

    evs, bodies = asyncio.run(main())
    audio = b"".join(e.pcm for e in evs if isinstance(e, TtsAudio))
    assert audio == pcm + pcm
    assert all(len(e.pcm) % 2 == 0 for e in evs if isinstance(e, TtsAudio))
    assert [b["input"] for b in bodies] == ["Hello there.", " Second sentence."]
    assert bodies[0]["response_format"] == "pcm" and bodies[0]["voice"] == "verse"


def test_openai_speech_server_error_closes_the_session() -> None:
    async def main() -> list[Any]:
        async with http_vendor(lambda r: json_reply(500, {"error": "x"})) as srv:
            return await speak_until_closed(OpenAiTts("sk", base_url=srv.url + "/v1"), "Hello.")

    evs = asyncio.run(main())
    assert evs[-1].error.startswith("server")


@pytest.mark.serial_light  # cancelled within 1 s
def test_openai_speech_cancel_mid_synthesis() -> None:
    async def main() -> tuple[list[Any], float, int]:
        r = Reply(200, [b"\x01\x00" * 100], content_type="audio/pcm", forever=b"\x02\x00" * 100, forever_every=0.02)
        async with http_vendor(lambda req: r) as srv:
            s, it = await opened(OpenAiTts("sk", base_url=srv.url + "/v1"), TtsConfig())
            await s.send_text(1, "A very long text.", continue_=False, timeout=1.0)
            first = await take(it, TtsAudio)
            t0 = time.monotonic()
            s.cancel(1)
            evs = first + await take(it, TtsCancelled)
            took = time.monotonic() - t0
            for _ in range(50):
                if srv.open_connections == 0:
                    break
                await asyncio.sleep(0.02)
            await s.close(1.0)
            return evs, took, srv.open_connections

    evs, took, still_open = asyncio.run(main())
    assert evs[-1] == TtsCancelled(1) and took < 1.0
    assert still_open == 0


# -- live variants (real services; skip without BRISVOX_LIVE_TESTS=1 and the key) -------------------

LIVE_TTS = [("cartesia", "CARTESIA_API_KEY"), ("elevenlabs", "ELEVENLABS_API_KEY"), ("openai_tts", "OPENAI_API_KEY")]


def _live(key_env: str, what: str) -> str:
    import os

    if os.environ.get("BRISVOX_LIVE_TESTS") != "1" or not os.environ.get(key_env):
        pytest.skip(f"live test: set BRISVOX_LIVE_TESTS=1 and {key_env} to run it against {what}")
    return os.environ[key_env]


@pytest.mark.parametrize("name,key_env", LIVE_TTS)
def test_live_tts_speaks(name: str, key_env: str) -> None:
    key = _live(key_env, name)
    p: Any = {"cartesia": lambda: CartesiaTts(key, voice="a0e99841-438c-4a64-b679-ae501e7d6091"),
              "elevenlabs": lambda: ElevenLabsTts(key, voice="21m00Tcm4TlvDq8ikWAM"),
              "openai_tts": lambda: OpenAiTts(key)}[name]()

    async def main() -> list[Any]:
        s, it = await opened(p, TtsConfig(sample_rate=24000), 10.0)
        await s.send_text(1, "Hello from the brisvox test suite.", continue_=False, timeout=5.0)
        await s.flush(1, 5.0)
        evs = await take(it, TtsFlushed, 30.0)
        await s.close(2.0)
        await close_all()
        return evs

    evs = asyncio.run(main())
    assert sum(len(e.pcm) for e in evs if isinstance(e, TtsAudio)) > 2 * 24000 // 2


def test_live_deepgram_transcribes() -> None:
    key = _live("DEEPGRAM_API_KEY", "deepgram")
    import shutil
    import subprocess

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is needed to make the live test's speech")
    wav = subprocess.run(["espeak-ng", "--stdout", "-s", "150", "book a table for two"], capture_output=True,
                         check=True).stdout
    import io
    import wave

    with wave.open(io.BytesIO(wav)) as w:
        rate, pcm = w.getframerate(), w.readframes(w.getnframes())

    async def main() -> list[Any]:
        s, it = await opened(DeepgramStt(key), SttConfig(sample_rate=rate), 10.0)
        for i in range(0, len(pcm), 3200):
            await s.send_audio(pcm[i : i + 3200], 5.0)
            await asyncio.sleep(0.05)
        await s.finalize(5.0)
        evs: list[Any] = []
        while not (evs and getattr(evs[-1], "from_finalize", False)):
            evs += await take(it, Transcript, 15.0)
        await s.close(2.0)
        return evs

    evs = asyncio.run(main())
    assert "table" in " ".join(e.text for e in evs if e.is_final).lower()
