"""The echo agent through a real inference worker: in -> worker -> in16 -> echo -> tts
(16 kHz) -> worker -> out -> pacer. The audio that comes back over the native
WebSocket protocol correlates with what was sent, after the echo delay."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest
import soundfile as sf
from websockets.asyncio.client import connect

from brisvox.wire.native import NativeStream, server_message
from tests.system.gateway_harness import ECHO_ROUTES, GatewayProc, correlate, have, make_fixture

pytestmark = [pytest.mark.system, pytest.mark.skipif(not (have("espeak-ng") and have("sox")),
                                                     reason="espeak-ng and sox make the fixture")]


@pytest.fixture
def worker(short_tmp):
    from workers.harness import WorkerProc

    ep = f"ipc://{short_tmp}/w0.sock"
    w = WorkerProc(0, ep, max_calls=8, extra=["--no-smart-turn"])
    try:
        w.start(timeout=60)
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(f"worker did not start: {e}")
    try:
        yield ep
    finally:
        w.stop()


@pytest.mark.serial_light  # echo delay within 250-420 ms
@pytest.mark.parametrize("rate", [8000, 16000])
def test_echo_through_worker_resampling(short_tmp, worker, rate):
    fx = make_fixture(short_tmp, "Echo through the worker, one two three.", rate=rate)
    pcm, _ = sf.read(fx["wav"], dtype="int16")
    with GatewayProc(short_tmp, inbox=True, peers={"worker-0": worker},
                     gateway={"echo_use_workers": True, "echo_delay_ms": 300},
                     websocket={"routes": ECHO_ROUTES}) as gw:

        async def client():
            got = []
            frame = rate // 50
            async with connect(f"ws://127.0.0.1:{gw.ws_port}/ws/echo") as ws:
                await ws.send(NativeStream(rate).start())
                started = server_message(orjson.loads(await ws.recv()))
                assert started.event == "started" and started.agent == "echo" and started.rate == rate

                async def rx():
                    async for m in ws:
                        if isinstance(m, bytes):
                            got.append(np.frombuffer(m, dtype="<i2"))

                task = asyncio.create_task(rx())
                t0 = time.monotonic()
                for i in range(len(pcm) // frame):
                    await ws.send(pcm[i * frame:(i + 1) * frame].tobytes())
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
                await asyncio.sleep(0.8)
                stats = await asyncio.to_thread(gw.stats)
                task.cancel()
            return np.concatenate(got), stats

        got, stats = asyncio.run(client())
        assert stats["echo_via_worker"] == 1
        delay_ms, corr = correlate(pcm[: len(pcm) // (rate // 50) * (rate // 50)], got, rate)
        print(f"echo via worker at {rate} Hz: delay {delay_ms:.1f} ms, correlation {corr:.3f}")
        assert corr > 0.9
        assert 250 <= delay_ms <= 420
    assert gw.leaked == []
