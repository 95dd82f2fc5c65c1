"""One call through the whole product with the local models: brisvoxd with the agent
processes serving agent definitions (``[agents] providers = "definitions"``).

The ``scripted`` agent (configs/agents/scripted.toml) runs local Whisper (STT)
and local Piper (TTS) as jobs on the inference worker, with the scripted
rule LLM. The caller speaks a recorded question; the call record must hold
the Whisper transcript as the user turn and the agent's fallback line as the
answer, and the client must have received that answer's audio.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed

from bench.harness.daemon import Daemon, agents_config, write_config, ws_port
from brisvox.agent.host.call_record import read_records
from brisvox.wire.native import NativeStream, server_message

pytestmark = [pytest.mark.system, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
SPEECH = ROOT / "tests" / "fixtures" / "generated" / "turn_complete.8k.wav"
FALLBACK = "I am a scripted demo. Say: repeat after me, or press one, or goodbye."


def _models_ok() -> bool:
    try:
        from workers import models

        d = models.default_models_dir()
        return all((d / models.CATALOGUE[n].filename).is_file() for n in ("silero_vad", "whisper_tiny_en", "piper_joe"))
    except Exception:  # noqa: BLE001 - any failure means "not installed"
        return False


@pytest.mark.serial  # real-time audio into local Whisper: starved of CPU it mishears the question
def test_a_call_through_local_whisper_and_piper(short_tmp):
    if not _models_ok():
        pytest.skip("local models are not installed (brisvox models install)")
    routes = 'routes = [{ path = "/ws", protocol = "native", agent = "default", agents = ["scripted"] }]'
    extra = agents_config(ROOT / "configs" / "agents", short_tmp / "records", smart_turn=True, websocket=routes)
    d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(120)
        port = ws_port(d.child(snap, "gateway-0"))
        speech, _ = sf.read(SPEECH, dtype="int16")

        async def call() -> tuple[str, list[np.ndarray]]:
            from websockets.asyncio.client import connect

            got: list[np.ndarray] = []
            async with connect(f"ws://127.0.0.1:{port}/ws/scripted") as ws:
                stream = NativeStream(8000)
                await ws.send(stream.start())
                started = server_message(orjson.loads(await ws.recv()))
                assert started.event == "started" and started.agent == "scripted"

                stop: list[str] = []

                async def rx() -> None:
                    async for m in ws:
                        if isinstance(m, bytes):
                            got.append(np.frombuffer(m, dtype="<i2"))
                        elif server_message(orjson.loads(m)).event == "stop":
                            stop.append(m)  # the gateway ended the call: it says why

                task = asyncio.create_task(rx())
                silence = np.zeros(160, dtype=np.int16)
                frames = [silence] * 25 + [speech[i : i + 160] for i in range(0, len(speech) - 159, 160)]
                frames += [silence] * 500
                nxt = time.monotonic()
                try:
                    for fr in frames:
                        await ws.send(fr.astype("<i2").tobytes())
                        nxt += 0.02
                        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
                except ConnectionClosed as e:
                    pytest.fail(f"the gateway closed the call: {e}; its stop: {stop}; daemon log:\n{d.logs()[-3000:]}")
                await ws.send(stream.stop())
                await asyncio.sleep(0.3)
                task.cancel()
            return started.call_id, got

        call_id, got = asyncio.run(call())
        d.wait_for(lambda s: any(r["call_id"] == call_id for r in read_records(short_tmp / "records")),
                   30, "the call record")
        rec = next(r for r in read_records(short_tmp / "records") if r["call_id"] == call_id)
        conv = rec["conversation"]
        users = [m["content"] for m in conv if m["role"] == "user"]
        answers = [m["text"] for m in conv if m["role"] == "assistant"]
        assert len(users) == 1 and "tell me" in users[0].lower()
        assert answers == [FALLBACK]
        spoken = sum(len(g) for g in got if np.any(g)) / 8000
        assert spoken > 2.0  # Piper's rendering of the fallback line reached the caller
        assert rec["turns"][0]["response_ms"] is not None
    finally:
        d.close()
