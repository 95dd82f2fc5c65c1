"""``python -m bench.harness.s2s_server``: the loopback OpenAI Realtime server as a process of its own.

For ``python -m bench s2s``: the provider's work is remote in production, so the bench runs
the fake (:class:`bench.harness.s2s_openai.FakeRealtime`, server VAD on the appended audio)
outside the daemon's process tree, where the daemon's CPU and memory figures do not see it.
Every response is the same scripted answer: ``--audio-ms`` of audio with a transcript,
streamed in ``--chunk-ms`` deltas as fast as the socket takes them (as the service streams
faster than real time). It listens on a free loopback port, prints ``ready <port>`` and runs until SIGTERM or
SIGINT, or ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from bench.harness.s2s_openai import FakeRealtime, Scripted

ANSWER = ("Thank you for calling. Our kitchen is open until ten tonight and the bar stays open until "
          "midnight, so there is plenty of time for dinner.")


async def serve(audio_ms: int, chunk_ms: int, max_seconds: float) -> None:
    # loud from its first sample (the load generator counts a bot frame as speech when it is loud)
    fake = FakeRealtime(default=Scripted(audio_ms=audio_ms, transcript=ANSWER, chunk_ms=chunk_ms, level=8000),
                        user_text="what time do you close", vad_threshold=300.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with fake:
        print(f"ready {fake.port}", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max_seconds)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.harness.s2s_server")
    ap.add_argument("--audio-ms", type=int, default=2000)
    ap.add_argument("--chunk-ms", type=int, default=100)
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    a = ap.parse_args()
    asyncio.run(serve(a.audio_ms, a.chunk_ms, a.max_seconds))


if __name__ == "__main__":
    main()
