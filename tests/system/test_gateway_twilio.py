"""Twilio Media Streams against the real gateway process, with a Python client
speaking the protocol: echo agent round trip (audio, marks, DTMF -> clear), and a
fake agent process driving the control frames (Mark/MarkPlayed, Clear/Cleared,
the epoch ledger, Dtmf, Playback, Hangup)."""

from __future__ import annotations

import asyncio
import binascii
import time

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from brisvox.wire import twilio
from brisvox.wire.g711 import PCMU
from ipc import frames as F
from tests.system.gateway_harness import (
    ECHO_ROUTES,
    FakeAgent,
    GatewayProc,
    attached_ring,
    correlate,
    have,
    make_fixture,
)

pytestmark = [pytest.mark.system, pytest.mark.skipif(not (have("espeak-ng") and have("sox")),
                                                     reason="espeak-ng and sox make the fixture")]


SID = "MZ00000000000000000000000000000001"


def new_stream() -> twilio.TwilioStream:
    """Twilio's side of the call (its messages, counted as Twilio counts them)."""
    return twilio.TwilioStream(stream_sid=SID, call_sid="CA1", account_sid="AC1")


def media_msg(stream: twilio.TwilioStream, payload: bytes) -> str:
    return stream.media(binascii.b2a_base64(payload, newline=False).decode())


def read(m: str | bytes) -> twilio.BotMessage:
    return twilio.bot_message(orjson.loads(m))


@pytest.mark.serial_light  # echo delay within 180-260 ms
def test_twilio_echo_marks_dtmf_clear(short_tmp):
    fx = make_fixture(short_tmp, "Testing the echo line, one two three.")
    ulaw = fx["ulaw"].read_bytes()
    sent = np.fromfile(fx["ref"], dtype="<i2")
    with GatewayProc(short_tmp, gateway={"echo_delay_ms": 200, "echo_mark_ms": 500}, inbox=True,
                     websocket={"routes": ECHO_ROUTES}) as gw:

        async def client():
            events: list[tuple[float, twilio.BotMessage]] = []
            stream = new_stream()
            async with connect(f"ws://127.0.0.1:{gw.ws_port}/twilio/echo") as ws:
                await ws.send(stream.connected())
                await ws.send(stream.start({"lang": "en"}))

                async def rx():
                    async for m in ws:
                        d = read(m)
                        events.append((time.monotonic(), d))
                        if d.event == "mark":  # played at once: echo it (the round trip)
                            await ws.send(stream.mark(d.name))

                task = asyncio.create_task(rx())
                t0 = time.monotonic()
                for i in range(len(ulaw) // 160):
                    await ws.send(media_msg(stream, ulaw[i * 160:(i + 1) * 160]))
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
                await asyncio.sleep(0.4)
                t_dtmf = time.monotonic()
                await ws.send(stream.dtmf("5"))
                await asyncio.sleep(0.3)
                stats = await asyncio.to_thread(gw.stats)
                await ws.send(stream.stop())
                await asyncio.sleep(0.2)
                task.cancel()
            return events, t_dtmf, stats

        events, t_dtmf, stats = asyncio.run(client())
        kinds = [d.event for _, d in events]
        assert "invalid" not in kinds
        media = [d for _, d in events if d.event == "media"]
        assert all(d.stream_sid == SID for d in media)
        got = np.concatenate([PCMU.decode(d.payload) for d in media])
        delay_ms, corr = correlate(sent, got)
        print(f"twilio echo: delay {delay_ms:.1f} ms, correlation {corr:.4f}")
        assert corr > 0.99 and 180 <= delay_ms <= 260
        # marks follow media and come back as played
        assert "mark" in kinds and kinds.index("mark") > kinds.index("media")
        assert stats["call_marks_played_total"] >= 1
        assert stats["call_dtmf_in_total"] == 1
        # the digit made the echo agent clear: a clear message after the dtmf
        clears = [t for t, d in events if d.event == "clear"]
        assert clears and clears[0] >= t_dtmf
        assert stats["call_clears_total"] == 1
        deadline = time.monotonic() + 3
        while gw.segments() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gw.segments() == []
        assert gw.stats()["calls_active"] == 0


def const_frames(value: int, n_samples: int) -> np.ndarray:
    return np.full(n_samples, value, dtype=np.int16)


def test_twilio_with_agent_frames(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, peers={"agent-0": agent.endpoint}) as gw:

        async def client():
            msgs: list[twilio.BotMessage] = []
            stream = new_stream()
            async with connect(f"ws://127.0.0.1:{gw.ws_port}/twilio") as ws:
                await ws.send(stream.start({"customer": "42"}))
                start = await asyncio.to_thread(agent.wait_for, F.CallStart)
                assert start.transport == "twilio" and start.call_rate == 8000
                assert start.params == {"customer": "42"} and start.transport_ids["callSid"] == "CA1"
                cid = start.call_id

                async def rx():
                    async for m in ws:
                        d = read(m)
                        msgs.append(d)
                        if d.event == "mark":
                            await ws.send(stream.mark(d.name))

                task = asyncio.create_task(rx())
                with attached_ring(gw.instance, "out") as out:
                    # utterance 1 (epoch 1): 0.4 s, end mark
                    out.write(const_frames(1000, 3200))
                    agent.send(F.OutUtterance(call_id=cid, utterance=1, epoch=1, out_pos=0))
                    agent.send(F.Mark(call_id=cid, name="u1-end", position=3200))
                    played = await asyncio.to_thread(agent.wait_for, F.MarkPlayed, lambda f: f.name == "u1-end")
                    assert played.position == 3200
                    # utterance 2 (epoch 1): 2 s, cut by a Clear after ~0.3 s
                    out.write(const_frames(1000, 16000))
                    agent.send(F.OutUtterance(call_id=cid, utterance=2, epoch=1, out_pos=3200))
                    agent.send(F.Mark(call_id=cid, name="u2-end", position=19200))
                    await asyncio.sleep(0.3)
                    n_before = len(msgs)
                    agent.send(F.Clear(call_id=cid, epoch=1, sent_ns=time.monotonic_ns()))
                    cleared = await asyncio.to_thread(agent.wait_for, F.Cleared)
                    assert cleared.epoch == 1 and cleared.marks == ["u2-end"]
                    assert 3200 < cleared.position < 19200
                    # stale tail of epoch 1 written after the cut: never released
                    out.write(const_frames(1000, 4000))
                    await asyncio.sleep(0.2)
                    after_clear = msgs[n_before:]
                    i_clear = [d.event for d in after_clear].index("clear")
                    stale = [d for d in after_clear[i_clear + 1:] if d.event == "media"]
                    assert stale == []
                    # epoch 2 starts: only its audio plays
                    w = out.write_pos
                    out.write(const_frames(-3000, 1600))
                    agent.send(F.OutUtterance(call_id=cid, utterance=3, epoch=2, out_pos=w))
                    await asyncio.sleep(0.4)
                    new = [d for d in msgs[n_before:] if d.event == "media"][len(
                        [d for d in after_clear[:i_clear] if d.event == "media"]):]
                    vals = np.concatenate([PCMU.decode(d.payload) for d in new])
                    assert len(vals) == 1600
                    assert set(vals.tolist()) == {int(PCMU.decode(PCMU.encode(np.array([-3000], np.int16)))[0])}
                    # DTMF in, Playback positions, SendDtmf out (in-band tones), then Hangup
                    await ws.send(stream.dtmf("7"))
                    d = await asyncio.to_thread(agent.wait_for, F.Dtmf)
                    assert d.digit == "7" and d.call_id == cid
                    pb = agent.of(F.Playback)
                    assert pb and all(cid in p.positions for p in pb)
                    positions = [p.positions[cid] for p in pb]
                    assert positions == sorted(positions)
                    n = len(msgs)
                    agent.send(F.SendDtmf(call_id=cid, digits="12"))
                    await asyncio.sleep(0.5)
                    assert sum(1 for d in msgs[n:] if d.event == "media") >= 10
                    agent.send(F.Hangup(call_id=cid, reason="done"))
                    await asyncio.sleep(0.3)
                task.cancel()
            return ws.close_code

        code = asyncio.run(client())
        assert code == 1000
        deadline = time.monotonic() + 3
        while gw.segments() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gw.segments() == []
