"""The Pipecat side of the side-by-side benchmark: a Twilio Media Streams bot on Pipecat 1.14.

Built only from Pipecat's public API, the way its Twilio example builds a bot:
a FastAPI WebSocket endpoint reads Twilio's handshake with
``parse_telephony_websocket``, then runs one pipeline per call:

    FastAPIWebsocketTransport.input()   (TwilioFrameSerializer: mu-law 8 kHz)
    -> ScriptedSTT                      (final transcript 150 ms after VAD stop)
    -> user aggregator                  (SileroVADAnalyzer + LocalSmartTurnAnalyzerV3)
    -> ScriptedLLM                      (first token 300 ms after the turn ends)
    -> ScriptedTTS                      (first audio 80 ms after the text, 2 s at real time)
    -> FastAPIWebsocketTransport.output()
    -> assistant aggregator

The STT, LLM and TTS are custom FrameProcessors that reproduce the timing of
network services from ``bench/workload.toml`` (the same file brisvox's scripted
agent and the load generator read), so the engines are compared on identical
calls; the VAD and Smart Turn are Pipecat's own local ONNX analyzers.

Run with the Pipecat venv (``bench/pipecat/install.sh``):
``bench/.venv-pipecat/bin/python bench/pipecat/server.py --port 8790``.
One process serves any number of calls; the benchmark decides how many
processes to start (see ``bench/bench_pipecat.py``). Routes: ``/twilio``
(WebSocket), ``/health`` (JSON: pid, live calls).

Invariants: the scripted processors never block the event loop (asyncio
sleeps only); an interruption cancels a scripted LLM answer or TTS synthesis
in flight; nothing is logged per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for bench.workload

import uvicorn  # noqa: E402
from fastapi import FastAPI, WebSocket  # noqa: E402
from loguru import logger  # noqa: E402
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3  # noqa: E402
from pipecat.audio.vad.silero import SileroVADAnalyzer  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import (  # noqa: E402
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.runner.utils import parse_telephony_websocket  # noqa: E402
from pipecat.serializers.twilio import TwilioFrameSerializer  # noqa: E402
from pipecat.transports.websocket.fastapi import (  # noqa: E402
    FastAPIWebsocketParams,
    FastAPIWebsocketTransport,
)
from pipecat.turns.user_stop.turn_analyzer_user_turn_stop_strategy import (  # noqa: E402
    TurnAnalyzerUserTurnStopStrategy,
)
from pipecat.turns.user_turn_strategies import UserTurnStrategies  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from bench.workload import SAMPLE_RATE, Workload, bot_audio  # noqa: E402
from bench.workload import load as load_workload  # noqa: E402


class ScriptedSTT(FrameProcessor):
    """A streaming STT's timing: the final transcript of a turn arrives
    ``final_after_finalize_ms`` after the VAD reports the caller stopped (when
    Pipecat's STT services send their finalize request). Audio passes through."""

    def __init__(self, wl: Workload) -> None:
        super().__init__()
        self._delay = wl.stt.final_after_finalize_ms / 1000.0
        self._turn = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            self._turn += 1
            self.create_task(self._final(self._turn), f"{self}::final")
        await self.push_frame(frame, direction)

    async def _final(self, turn: int) -> None:
        await asyncio.sleep(self._delay)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        await self.push_frame(TranscriptionFrame(text=f"caller turn {turn}", user_id="caller",
                                                 timestamp=stamp, finalized=True))


class ScriptedLLM(FrameProcessor):
    """An LLM's timing: ``first_token_ms`` after the context arrives, the answer's
    text in one delta, then the end of the response. Interruptions cancel it."""

    def __init__(self, wl: Workload) -> None:
        super().__init__()
        self._delay = wl.llm.first_token_ms / 1000.0
        self._text = wl.llm.answer_text
        self._task: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            await self._cancel()
            self._task = self.create_task(self._answer(), f"{self}::answer")
            return  # consumed, as an LLM service does
        if isinstance(frame, InterruptionFrame):
            await self._cancel()
        await self.push_frame(frame, direction)

    async def _cancel(self) -> None:
        if self._task is not None:
            await self.cancel_task(self._task)
            self._task = None

    async def _answer(self) -> None:
        await asyncio.sleep(self._delay)
        await self.push_frame(LLMFullResponseStartFrame())
        await self.push_frame(LLMTextFrame(self._text))
        await self.push_frame(LLMFullResponseEndFrame())
        self._task = None


class ScriptedTTS(FrameProcessor):
    """A streaming TTS's timing: first audio ``first_audio_ms`` after the first
    text, then ``answer_ms`` of audio in ``chunk_ms`` chunks at real time, kept
    ``lead_ms`` ahead. Interruptions cancel the synthesis."""

    def __init__(self, wl: Workload) -> None:
        super().__init__()
        t = wl.tts
        self._first = t.first_audio_ms / 1000.0
        self._chunk_s = t.chunk_ms / 1000.0
        self._lead = t.lead_ms / 1000.0
        pcm = bot_audio(SAMPLE_RATE, t.answer_ms).tobytes()
        step = SAMPLE_RATE * t.chunk_ms // 1000 * 2
        self._chunks = [pcm[i:i + step] for i in range(0, len(pcm), step)]
        self._task: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            if self._task is None:
                self._task = self.create_task(self._speak(), f"{self}::speak")
            return  # consumed: the TTS speaks it
        if isinstance(frame, InterruptionFrame):
            if self._task is not None:
                await self.cancel_task(self._task)
                self._task = None
        await self.push_frame(frame, direction)

    async def _speak(self) -> None:
        await asyncio.sleep(self._first)
        await self.push_frame(TTSStartedFrame())
        t0 = time.monotonic()
        for i, chunk in enumerate(self._chunks):
            due = t0 + i * self._chunk_s - self._lead
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.push_frame(TTSAudioRawFrame(audio=chunk, sample_rate=SAMPLE_RATE, num_channels=1))
        await self.push_frame(TTSStoppedFrame())
        self._task = None


def build_app(wl: Workload) -> FastAPI:
    app = FastAPI()
    live = {"calls": 0, "served": 0}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True, "pid": os.getpid(), "calls": live["calls"], "served": live["served"]}

    @app.websocket("/twilio")
    async def twilio(websocket: WebSocket) -> None:
        await websocket.accept()
        _, call_data = await parse_telephony_websocket(websocket)
        serializer = TwilioFrameSerializer(
            stream_sid=call_data["stream_id"],
            call_sid=call_data["call_id"],
            # no Twilio REST credentials on a benchmark: the caller hangs up itself
            params=TwilioFrameSerializer.InputParams(auto_hang_up=False),
        )
        transport = FastAPIWebsocketTransport(
            websocket=websocket,
            params=FastAPIWebsocketParams(audio_in_enabled=True, audio_out_enabled=True,
                                          add_wav_header=False, serializer=serializer),
        )
        context = LLMContext()
        user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
            context,
            user_params=LLMUserAggregatorParams(
                vad_analyzer=SileroVADAnalyzer(),
                user_turn_strategies=UserTurnStrategies(
                    stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=LocalSmartTurnAnalyzerV3())]
                ),
            ),
        )
        pipeline = Pipeline([
            transport.input(),
            ScriptedSTT(wl),
            user_aggregator,
            ScriptedLLM(wl),
            ScriptedTTS(wl),
            transport.output(),
            assistant_aggregator,
        ])
        worker = PipelineWorker(pipeline, params=PipelineParams(
            audio_in_sample_rate=SAMPLE_RATE, audio_out_sample_rate=SAMPLE_RATE,
            enable_metrics=True, enable_usage_metrics=True))

        @transport.event_handler("on_client_disconnected")
        async def on_client_disconnected(transport, client) -> None:  # noqa: ANN001
            await worker.cancel()

        live["calls"] += 1
        live["served"] += 1
        try:
            # force_gc: collect garbage when the call's pipeline ends, as the
            # Twilio example does for a long-running server with many calls
            runner = WorkerRunner(handle_sigint=False, force_gc=True)
            await runner.add_workers(worker)
            await runner.run()
        finally:
            live["calls"] -= 1

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--workload", type=Path, default=None)
    ap.add_argument("--log-level", default="WARNING", help="Pipecat's loguru level")
    args = ap.parse_args()
    logger.remove()
    logger.add(sys.stderr, level=args.log_level)
    wl = load_workload(args.workload)
    uvicorn.run(build_app(wl), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
