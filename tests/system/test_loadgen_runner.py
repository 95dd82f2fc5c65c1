"""The load generator over a real WebSocket against a small fake Twilio bot on loopback.

Proves the runner, caller script and bookkeeping work together over a real
socket: calls connect with Twilio's handshake, speech is streamed, answers are
timed, a barge-in gets the bot's ``clear`` and is measured, marks are echoed,
and calls hang up with ``stop``. The fake bot answers 100 ms after 300 ms of
caller silence with 1 s of audio (real-time paced, then a mark) and clears
when the caller talks over it. Needs espeak-ng and sox (scripts/apt-packages.txt).
"""

from __future__ import annotations

import asyncio
import shutil
import time

import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve

from bench import workload
from bench.loadgen.runner import run_load
from brisvox.wire import g711, twilio

pytestmark = pytest.mark.system

ANSWER_FRAMES = 50  # 1 s


def short_workload() -> workload.Workload:
    text = workload.DEFAULT_PATH.read_text()
    for old, new in [("turns_per_call = 4", "turns_per_call = 2"),
                     ("min_turn_samples = 12", "min_turn_samples = 2"),
                     ("min_turn_samples_quick = 8", "min_turn_samples_quick = 2"),
                     ("answer_ms = 2000", "answer_ms = 1000"),
                     ("first = 2", "first = 1"),
                     ("after_ms = 600", "after_ms = 300"),
                     ("spread_ms = 600", "spread_ms = 200"),
                     ("lead_in_ms = 800", "lead_in_ms = 300"),
                     ("pause_after_bot_ms = 600", "pause_after_bot_ms = 300"),
                     ("run_timeout_s = 240", "run_timeout_s = 60")]:
        assert old in text, old
        text = text.replace(old, new, 1)
    return workload.parse(text)


class FakeBot:
    def __init__(self) -> None:
        self.frame = g711.ulaw_encode(workload.bot_audio(8000, 20))
        self.starts: list[str] = []
        self.stops = 0
        self.marks_back: list[str] = []

    async def handler(self, ws: ServerConnection) -> None:
        out: twilio.BotStream | None = None
        loud_run = quiet_run = 0
        speaking = False
        answer: asyncio.Task[None] | None = None
        turn = 0
        async for raw in ws:
            m = orjson.loads(raw)
            ev = m["event"]
            if ev == "start":
                sid = twilio.parse_start(m).stream_sid
                out = twilio.BotStream(sid)
                self.starts.append(sid)
            elif ev == "media":
                assert out is not None, "media before start"
                payload = twilio.media_payload(m)
                assert payload is not None, "the caller's own track"
                loud = g711.ulaw_loud_fraction(payload) > 0.1
                loud_run, quiet_run = (loud_run + 1, 0) if loud else (0, quiet_run + 1)
                if loud_run >= 5 and not speaking:
                    speaking = True
                    if answer is not None and not answer.done():
                        answer.cancel()
                        await ws.send(out.clear.decode())
                if speaking and quiet_run >= 15:
                    speaking = False
                    turn += 1
                    answer = asyncio.create_task(self.answer(ws, out, turn))
            elif ev == "mark":
                self.marks_back.append(twilio.mark_name(m))
            elif ev == "stop":
                self.stops += 1
                break

    async def answer(self, ws: ServerConnection, out: twilio.BotStream, turn: int) -> None:
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        media = out.media(self.frame).decode()  # a str: a text frame
        for i in range(ANSWER_FRAMES):
            await asyncio.sleep(max(0.0, t0 + i * 0.02 - time.monotonic()))
            await ws.send(media)
        await ws.send(out.mark(f"end-{turn}").decode())


@pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("sox")), reason="needs espeak-ng and sox")
def test_two_calls_with_a_barge_in_each(tmp_path) -> None:
    wl = short_workload()
    bot = FakeBot()

    async def main() -> dict:
        async with serve(bot.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await run_load([f"ws://127.0.0.1:{port}/twilio"], 2, wl, cache_dir=tmp_path)

    s = asyncio.run(main())
    assert s["calls_ok"] == 2 and s["errors"] == []
    assert sorted(bot.starts) == ["MZbench000000", "MZbench000001"] and bot.stops == 2
    assert s["turns"] == 4 and s["unanswered"] == 0 and s["turn_ms"]["n"] == 4
    # every latency includes the bot's 300 ms endpointing (15 frames it counts as they arrive) + 100 ms
    # delay: about 400 ms, less at most one frame when a late timer tick sends two frames at once
    # (the quiet frames then reach the bot sooner after the last speech frame's send stamp)
    assert s["turn_ms"]["p50"] >= 400 - 20
    assert s["barge_ins"] == 2 and s["clears_missing"] == 0 and s["clear_ms"]["n"] == 2
    assert s["frames_after_clear"] == 0 and s["unattributed_frames"] == 0
    # the second answer of each call played out and its mark came back; the barged ones were cut
    assert sorted(bot.marks_back) == ["end-2", "end-2"] and s["marks_echoed"] == 2
    assert s["short_answers"] == 0
