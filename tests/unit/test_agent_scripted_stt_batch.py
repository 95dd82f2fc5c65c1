"""The scripted STT takes caller audio in batches without changing its timing.

``ScriptedStt.audio_batch`` lets the actor's pump hand over up to 80 ms of
caller audio at once; interims must still come ``interim_delay_ms`` after the
speech that completed them (timed from the audio's own end, not its arrival)
and the final ``final_ms`` after the finalize, exactly as with 20 ms chunks.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from brisvox.providers import scripted_speech as ss
from brisvox.providers.base import SttConfig, Transcript
from brisvox.sim.vloop import run_virtual


def _run(chunks_per_send: int, quiet_lead: int = 0) -> list[tuple[float, bool, str]]:
    async def main() -> list[tuple[float, bool, str]]:
        loop = asyncio.get_running_loop()
        prov = ss.ScriptedStt(final_ms=150, interim_ms=100, interim_delay_ms=100)
        s = await prov.connect(SttConfig(), 1.0)
        got: list[tuple[float, bool, str]] = []

        async def rx() -> None:
            async for ev in s.events():
                if isinstance(ev, Transcript):
                    got.append((round(loop.time() - t0, 3), ev.is_final, ev.text))

        t0 = loop.time()
        task = asyncio.create_task(rx())
        loud = (np.ones(320, np.int16) * 3000).tobytes()
        quiet = np.zeros(320, np.int16).tobytes()
        chunks = [quiet] * quiet_lead + [loud] * 25
        pending = b""
        for i, c in enumerate(chunks):
            await asyncio.sleep(0.02)  # the chunk was spoken during the last 20 ms
            pending += c
            if (i + 1) % chunks_per_send == 0 or i == len(chunks) - 1:
                await s.send_audio(pending, 1.0)
                pending = b""
        await s.finalize(1.0)
        await asyncio.sleep(0.5)
        await s.close(1.0)
        await task
        return got

    return run_virtual(main)


@pytest.mark.parametrize("per_send", [2, 4, 5])
def test_batched_audio_gives_the_same_transcripts_at_the_same_times(per_send):
    assert _run(per_send) == _run(1)
    assert _run(per_send, quiet_lead=3) == _run(1, quiet_lead=3)


def test_unbatched_timing_is_the_workload_timing():
    got = _run(1)
    assert [t for t, final, _ in got if not final] == [0.2, 0.3, 0.4, 0.5, 0.6]
    assert [(t, text) for t, final, text in got if final] == [(0.65, "caller turn 1")]


def test_the_batch_is_offered_only_when_interims_can_stay_on_time():
    assert ss.ScriptedStt().audio_batch == ss.AUDIO_BATCH_S
    assert ss.ScriptedStt(interim_delay_ms=50).audio_batch == 0.0
