"""Pause / Resume at the real gateway process, over a real Twilio Media Streams socket.

A fake agent process (ZeroMQ) drives the control frames and writes the out
ring; a Python client speaks Twilio's protocol. Every 20 ms frame of the bot's
audio carries its own G.711-exact value, so the client can tell exactly which
samples it got. What each test proves:

* ``test_pause_holds_and_resume_continues_from_the_held_position``: after a
  Pause the media stops within a pacer tick (at most the frame in flight
  arrives between Pause and Resume, where a 0.4 s hold would otherwise carry
  20); after Resume the client gets the rest, and the whole stream it got is
  exactly the audio written: no sample lost, none repeated; the hold was not
  an underrun; no Playback position moved while held.
* ``test_a_pause_ends_by_itself_after_pause_max_ms``: without Resume the
  gateway releases again after ``pause_max_ms`` (the gap the client sees is
  at least that long, and the audio is still complete); counted
  ``pauses_expired``.
* ``test_clear_after_pause_answers_the_held_position``: a Clear during a hold
  answers Cleared at the held position, which is exactly the number of
  samples the client received; nothing of the cut epoch follows; a Pause of
  the dead epoch is ignored (counted) and the next epoch plays in full.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from brisvox.wire import twilio
from brisvox.wire.g711 import PCMU
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc, attached_ring

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SID = "MZ00000000000000000000000000000002"
FRAME = 160
# 120 distinct values that survive G.711 mu-law exactly: one per 20 ms frame
LEVELS = np.unique(PCMU.decode(np.arange(256, dtype=np.uint8)))
LEVELS = LEVELS[np.abs(LEVELS) > 200][:120]


def new_stream() -> twilio.TwilioStream:
    return twilio.TwilioStream(stream_sid=SID, call_sid="CA2", account_sid="AC1")


def tagged(n_frames: int, first: int = 0) -> np.ndarray:
    """``n_frames`` frames, frame k filled with LEVELS[first + k] (distinct per frame)."""
    return np.repeat(LEVELS[first:first + n_frames], FRAME).astype(np.int16)


class Client:
    """A Twilio peer: records every media frame with its arrival time."""

    def __init__(self) -> None:
        self.stream = new_stream()  # what it sends
        self.media: list[tuple[float, np.ndarray]] = []
        self.events: list[tuple[float, str]] = []
        self.n = 0
        self.more = asyncio.Event()

    async def rx(self, ws) -> None:
        async for m in ws:
            d = twilio.bot_message(orjson.loads(m))
            now = time.monotonic()
            self.events.append((now, d.event))
            if d.event == "media":
                self.media.append((now, PCMU.decode(d.payload)))
                self.n += len(self.media[-1][1])
                self.more.set()

    def samples(self) -> np.ndarray:
        return np.concatenate([s for _, s in self.media]) if self.media else np.zeros(0, np.int16)

    def between(self, t0: float, t1: float) -> int:
        return sum(1 for t, _ in self.media if t0 <= t < t1)

    async def until_samples(self, n: int, timeout: float = 10.0) -> None:
        """Wait (bounded) until ``n`` samples arrived; the caller's asserts judge what came."""
        try:
            async with asyncio.timeout(timeout):
                while self.n < n:
                    self.more.clear()
                    await self.more.wait()
        except TimeoutError:
            pass


async def open_call(gw: GatewayProc, agent: FakeAgent, client: Client):
    ws = await connect(f"ws://127.0.0.1:{gw.ws_port}/twilio")
    await ws.send(client.stream.start())
    start = await asyncio.to_thread(agent.wait_for, F.CallStart)
    task = asyncio.create_task(client.rx(ws))
    return ws, task, start.call_id


async def close_call(ws, task, client: Client) -> None:
    await ws.send(client.stream.stop())
    await asyncio.sleep(0.1)
    task.cancel()
    await ws.close()


@pytest.mark.serial_light  # frames sent during the hold and no pacer underrun
def test_pause_holds_and_resume_continues_from_the_held_position(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, peers={"agent-0": agent.endpoint},
                                                    gateway={"pause_max_ms": 3000}, inbox=True) as gw:
        async def run():
            client = Client()
            ws, task, cid = await open_call(gw, agent, client)
            with attached_ring(gw.instance, "out") as out:
                audio = tagged(100)  # 2 s
                out.write(audio)
                agent.send(F.OutUtterance(call_id=cid, utterance=1, epoch=1, out_pos=0))
                await asyncio.sleep(0.5)
                t_pause = time.monotonic()
                agent.send(F.Pause(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                await asyncio.sleep(0.1)
                held = len(client.samples())
                pb_held = len(agent.of(F.Playback))
                await asyncio.sleep(0.3)
                t_resume = time.monotonic()
                in_hold = client.between(t_pause, t_resume)
                pb_after = [p for p in agent.of(F.Playback)[pb_held:] if cid in p.positions]
                agent.send(F.Resume(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                await client.until_samples(len(audio))
                stats = await asyncio.to_thread(gw.stats)
            await close_call(ws, task, client)
            return client, audio, held, in_hold, pb_after, stats

        client, audio, held, in_hold, pb_after, stats = asyncio.run(run())
        assert 0 < held < len(audio)
        assert in_hold <= 2, in_hold  # the frame in flight at most; 0.4 s would carry 20
        assert pb_after == []  # the release position did not move while held
        got = client.samples()
        assert len(got) == len(audio) and np.array_equal(got, audio)  # nothing lost or repeated
        assert stats["pauses"] == 1 and stats["resumes"] == 1
        assert stats.get("pauses_expired", 0) == 0
        assert stats["call_underruns_total"] == 0


@pytest.mark.serial_light  # no pacer underrun
def test_a_pause_ends_by_itself_after_pause_max_ms(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, peers={"agent-0": agent.endpoint},
                                                    gateway={"pause_max_ms": 500}, inbox=True) as gw:
        async def run():
            client = Client()
            ws, task, cid = await open_call(gw, agent, client)
            with attached_ring(gw.instance, "out") as out:
                audio = tagged(60)
                out.write(audio)
                agent.send(F.OutUtterance(call_id=cid, utterance=1, epoch=1, out_pos=0))
                await asyncio.sleep(0.3)
                agent.send(F.Pause(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                await client.until_samples(len(audio))
                stats = await asyncio.to_thread(gw.stats)
            await close_call(ws, task, client)
            return client, audio, stats

        client, audio, stats = asyncio.run(run())
        assert np.array_equal(client.samples(), audio)
        times = [t for t, _ in client.media]
        gap = max(b - a for a, b in zip(times, times[1:], strict=False))
        assert gap >= 0.5 - 0.03, gap  # held for pause_max_ms (one tick of grid slack)
        assert stats["pauses"] == 1 and stats["pauses_expired"] == 1
        assert stats["call_underruns_total"] == 0


def test_clear_after_pause_answers_the_held_position(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, peers={"agent-0": agent.endpoint},
                                                    gateway={"pause_max_ms": 3000}, inbox=True) as gw:
        async def run():
            client = Client()
            ws, task, cid = await open_call(gw, agent, client)
            with attached_ring(gw.instance, "out") as out:
                out.write(tagged(100))
                agent.send(F.OutUtterance(call_id=cid, utterance=1, epoch=1, out_pos=0))
                await asyncio.sleep(0.4)
                agent.send(F.Pause(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                await asyncio.sleep(0.3)
                received = len(client.samples())
                agent.send(F.Clear(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                cleared = await asyncio.to_thread(agent.wait_for, F.Cleared)
                await asyncio.sleep(0.2)
                after_cut = len(client.samples())
                # a late Pause of the dead epoch changes nothing; epoch 2 plays in full
                agent.send(F.Pause(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                w = out.write_pos
                nxt = tagged(20, first=100)
                out.write(nxt)
                agent.send(F.OutUtterance(call_id=cid, utterance=2, epoch=2, out_pos=w))
                await client.until_samples(after_cut + len(nxt))
                stats = await asyncio.to_thread(gw.stats)
            await close_call(ws, task, client)
            return client, received, cleared, after_cut, nxt, stats

        client, received, cleared, after_cut, nxt, stats = asyncio.run(run())
        assert cleared.epoch == 1
        assert cleared.position == received == after_cut  # the held position is what was played
        assert "clear" in [e for _, e in client.events]
        assert np.array_equal(client.samples()[after_cut:], nxt)
        assert stats["pauses"] == 1 and stats["pauses_cleared"] == 1 and stats["pauses_stale"] == 1
