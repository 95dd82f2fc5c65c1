"""A scripted WebSocket caller for daemon tests and benches (native ``/ws`` protocol).

Owns :func:`one_call` (speak a recorded question, wait for the bot's answer,
talk over it after a seeded delay, listen to the second answer, hang up,
recording every frame with its ``time.monotonic()`` arrival) and
:func:`judge` (the call record's context against what this client received:
the interrupted answer cut after exactly the words whose audio arrived
before the clear, +-1 frame; no audio of the cut answer after the clear).
Word boundaries come from the scripted TTS's deterministic word durations.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np
import orjson

from brisvox.providers.word_codec import word_seconds
from brisvox.wire.native import NativeStream, server_message

RATE = 8000
FRAME = RATE // 50
TTS_RATE = 22050
ANSWER = (
    "Thank you for calling. Our kitchen is open until ten tonight and the bar stays open until midnight, "
    "so there is plenty of time for dinner or a drink after work with your friends."
)
SECOND = "Sorry, go ahead please."


def word_starts(text: str) -> list[int]:
    """Out-ring offsets (8 kHz) at which each word of the scripted TTS starts."""
    starts: list[int] = []
    t = 0.0
    for w in text.split():
        starts.append(int(t * TTS_RATE) * RATE // TTS_RATE)
        t += round(word_seconds(w) * TTS_RATE) / TTS_RATE
    return starts


async def one_call(port: int, speech: np.ndarray, seed: int) -> dict:
    rng = random.Random(seed)
    out: dict = {"frames": [], "clear_at": None, "call_id": None}
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/ws/default", max_size=2**20) as ws:
        stream = NativeStream(RATE)
        await ws.send(stream.start())
        started = server_message(orjson.loads(await ws.recv()))
        assert started.event == "started", started
        out["call_id"] = started.call_id
        t0 = time.monotonic()
        out["t0"] = t0
        state: dict[str, float | None] = {"first_audio": None, "barge_sent": None, "barge_end": None}

        async def rx() -> None:
            async for m in ws:
                now = time.monotonic() - t0
                if isinstance(m, bytes):
                    x = np.frombuffer(m, dtype="<i2")
                    out["frames"].append((now, x))
                    if state["first_audio"] is None and np.any(x):
                        state["first_audio"] = now
                else:
                    ev = server_message(orjson.loads(m))
                    # the first clear after the bot's audio started (earlier ones are the
                    # lazy clears of a new turn on an idle line)
                    if ev.event == "clear" and out["clear_at"] is None and state["first_audio"] is not None:
                        out["clear_at"] = (now, len(out["frames"]))

        task = asyncio.create_task(rx())
        loud = np.flatnonzero(np.abs(speech.astype(np.int32)) > 300)
        speech_end = int(loud[-1]) + 1 if len(loud) else len(speech)
        silence = np.zeros(FRAME, dtype="<i2")
        queue = [silence] * 25 + [speech[i : i + FRAME] for i in range(0, len(speech) - FRAME + 1, FRAME)]
        barge_after = rng.uniform(1.5, 3.0)
        next_t = time.monotonic()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if queue:
                fr = queue.pop(0)
            else:
                fr = silence
                if state["first_audio"] is not None and state["barge_sent"] is None:
                    if time.monotonic() - t0 >= state["first_audio"] + barge_after:
                        sent = time.monotonic() - t0
                        state["barge_sent"] = sent
                        queue = [speech[i : i + FRAME] for i in range(0, len(speech) - FRAME + 1, FRAME)]
                        # the caller's speech ends here (the clip has silence around it)
                        state["barge_end"] = sent + speech_end / RATE
                elif state["barge_end"] is not None and time.monotonic() - t0 > state["barge_end"] + 7.0:
                    break
            await ws.send(fr.astype("<i2").tobytes())
            next_t += 0.02
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
        await hang_up(ws, stream, task)
        out.update(state)
    return out


async def hang_up(ws: Any, stream: NativeStream, rx: asyncio.Task[None]) -> None:
    """Send the stop, then give the receiving task 2 s to see the socket close (cancelled after)."""
    await ws.send(stream.stop())
    try:
        async with asyncio.timeout(2.0):
            await rx
    except (TimeoutError, Exception):
        rx.cancel()


def judge(res: dict, record: dict) -> list[str]:
    bad: list[str] = []
    frames = res["frames"]
    assert res["clear_at"] is not None, "the client never got a clear"
    clear_t, clear_idx = res["clear_at"]
    # audio of the first answer: from its first non-silent frame up to the clear
    first = next(i for i, (_, x) in enumerate(frames) if np.any(x))
    received = sum(len(x) for _, x in frames[first:clear_idx] if np.any(x))
    starts = word_starts(ANSWER)
    words = ANSWER.split()
    options = {" ".join(words[: sum(1 for s in starts if s < received + d)]) for d in (-FRAME, 0, FRAME)}
    conv = record["conversation"]
    assistant = [m["text"] for m in conv if m["role"] == "assistant"]
    users = [m["content"] for m in conv if m["role"] == "user"]
    if len(users) != 2:
        bad.append(f"users {users}")
    if not assistant or " ".join(assistant[0].split()) not in options:
        bad.append(f"context {assistant[:1]} not in {sorted(options)} (received {received})")
    if len(assistant) < 2 or assistant[1] != SECOND:
        bad.append(f"second answer {assistant[1:]}")
    # no stale audio: after the clear, silence until the caller's barge-in speech
    # ended (the second answer cannot start before the VAD stop and the end-of-turn
    # silence after it, 650 ms later)
    stale = [t for t, x in frames[clear_idx:] if np.any(x) and t < res["barge_end"] + 0.3]
    if stale:
        bad.append(f"{len(stale)} non-silent frames after the clear")
    if record["stats"]["turn"]["interrupts"] != 1:
        bad.append(f"interrupts {record['stats']['turn']['interrupts']}")
    return bad
