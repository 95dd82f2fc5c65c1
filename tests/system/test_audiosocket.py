"""The AudioSocket listener under hostile peers, at the real gateway process on loopback.

One gateway (``python -m brisvox.gateway``) with ``[audiosocket]`` on and tight limits
(4 connections a source, 0.5 s for the UUID message, 1 s media timeout) and a fake agent:

* a flood of connections from one source: the ones beyond its share are closed at accept
  and counted, the held ones are closed once their UUID is overdue, and a call placed after
  the flood is served;
* a slow peer: no UUID (closed, ``audiosocket_first_message_timeout``), or a UUID then half a
  message and silence (the call ends "media timeout");
* garbage and protocol misuse (DTMF before the UUID, a second UUID, audio of another rate,
  Asterisk's error message): each ends only its own connection, with its counter and the
  call's end reason;
* a gateway whose ``allow`` does not hold the source closes every connection at accept;
* a gateway at ``rate = 16000`` carries kind ``0x12`` audio both ways, sample for sample,
  and refuses 8 kHz audio on such a call.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisvox.client.transport import BotEvents
from ipc import frames as F
from ipc.ring import Ring, ring_name
from tests.system.audiosocket_peer import AudioSocketPeer, message
from tests.system.gateway_harness import FakeAgent, GatewayProc

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

PER_SOURCE = 4
FIRST_S = 0.5
MEDIA_S = 1.0


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[GatewayProc, FakeAgent]]:
    tmp = Path(tempfile.mkdtemp(prefix="bva", dir="/tmp"))
    try:
        with FakeAgent(tmp) as agent, GatewayProc(
                tmp, peers={"agent-0": agent.endpoint}, inbox=True,
                audiosocket={"max_connections_per_source": PER_SOURCE, "first_message_s": FIRST_S,
                             "media_timeout_s": MEDIA_S, "max_message_bytes": 1024}) as gw:
            yield gw, agent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def closed_at_once(port: int, timeout: float = 0.3) -> bool:
    """Connect; True when the server ends the connection (EOF or reset) within ``timeout``."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        s.close()


async def call_end(agent: FakeAgent, call_uuid: str, timeout: float = 5.0) -> F.CallEnd:
    start = await asyncio.to_thread(agent.wait_for, F.CallStart,
                                    lambda f: (f.transport_ids or {}).get("uuid") == call_uuid, timeout)
    return await asyncio.to_thread(agent.wait_for, F.CallEnd, lambda f: f.call_id == start.call_id, timeout)


async def served(gw: GatewayProc, agent: FakeAgent) -> None:
    """A well-behaved call is admitted, reaches the agent, and ends on its hangup message."""
    p = AudioSocketPeer("127.0.0.1", gw.audiosocket_port)
    await p.open()
    try:
        await p.send_audio(np.zeros(160, np.int16))
        await asyncio.to_thread(agent.wait_for, F.CallStart, lambda f: (f.transport_ids or {}).get("uuid") == p.uuid, 5.0)
    finally:
        await p.close()
    assert (await call_end(agent, p.uuid)).reason == "hangup"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def talk(p: AudioSocketPeer, samples: int = 160) -> None:
    """20 ms of silence every 20 ms, as Asterisk sends the caller's audio (the media timer is 1 s)."""
    while True:
        await p.send_audio(np.zeros(samples, np.int16))
        await asyncio.sleep(0.02)


def test_a_flood_from_one_source_is_bounded_and_a_later_call_is_served(env):
    gw, agent = env
    before = gw.stats()
    held = [socket.create_connection(("127.0.0.1", gw.audiosocket_port), timeout=2) for _ in range(PER_SOURCE)]
    try:
        time.sleep(0.1)
        refused = sum(closed_at_once(gw.audiosocket_port) for _ in range(8))
        assert refused == 8
        after = gw.stats()
        assert after["audiosocket_refused_source_connections"] == before["audiosocket_refused_source_connections"] + 8
        assert after["audiosocket_connections_open"] == PER_SOURCE
        for s in held:  # none sent its UUID: each is closed once first_message_s passed
            s.settimeout(FIRST_S + 2)
            assert s.recv(1) == b""
    finally:
        for s in held:
            s.close()
    time.sleep(0.1)
    after = gw.stats()
    assert after["audiosocket_first_message_timeout"] >= before["audiosocket_first_message_timeout"] + PER_SOURCE
    assert after["audiosocket_connections_open"] == 0
    run(served(gw, agent))


def test_a_slow_peer_is_timed_out(env):
    gw, agent = env

    async def go() -> None:
        before = await asyncio.to_thread(gw.stats)
        silent = AudioSocketPeer("127.0.0.1", gw.audiosocket_port, send_uuid=False)
        await silent.open()
        t0 = time.monotonic()
        try:
            assert await silent.closed_by_server(FIRST_S + 2)
        finally:
            await silent.close()
        assert FIRST_S - 0.1 <= time.monotonic() - t0
        after = await asyncio.to_thread(gw.stats)
        assert after["audiosocket_first_message_timeout"] == before["audiosocket_first_message_timeout"] + 1
        stalled = AudioSocketPeer("127.0.0.1", gw.audiosocket_port)  # a UUID, then half a header, then nothing
        await stalled.open()
        try:
            await stalled.send_raw(b"\x10\x01")
            end = await call_end(agent, stalled.uuid, MEDIA_S + 5)
            assert end.reason == "media timeout"
            assert await stalled.closed_by_server()
            assert stalled.kinds[-1:] == [0x00]
        finally:
            await stalled.close()

    run(go())


@pytest.mark.parametrize(("data", "counter", "reason"), [
    (b"\x7f\x13\x99garbage", "audiosocket_malformed_unknown_kind", "protocol error: unknown_kind"),
    (message(0x10, b"\x00" * 2000), "audiosocket_malformed_oversized", "protocol error: oversized"),
    (message(0x01, uuid.uuid4().bytes), "audiosocket_malformed_duplicate_uuid", "protocol error: duplicate_uuid"),
    (message(0x12, b"\x00" * 640), "audiosocket_malformed_wrong_rate", "protocol error: wrong_rate"),
    (message(0x10, b"\x00" * 3), "audiosocket_malformed_odd_audio", "protocol error: odd_audio"),
    (message(0x03, b"Z"), "audiosocket_malformed_bad_dtmf", "protocol error: bad_dtmf"),
    (message(0xFF, b"\x02"), "audiosocket_peer_error", "peer error 0x02"),
], ids=lambda v: v if isinstance(v, str) and v.startswith("audiosocket_") else "")  # no random bytes in ids
def test_misuse_on_a_live_call_ends_that_call_only(env, data, counter, reason):
    gw, agent = env

    async def go() -> None:
        before = await asyncio.to_thread(gw.stats)
        live = AudioSocketPeer("127.0.0.1", gw.audiosocket_port)
        bad = AudioSocketPeer("127.0.0.1", gw.audiosocket_port)
        await live.open()
        talking = asyncio.create_task(talk(live))
        await bad.open()
        try:
            live_start = await asyncio.to_thread(agent.wait_for, F.CallStart,
                                                 lambda f: (f.transport_ids or {}).get("uuid") == live.uuid, 5.0)
            await asyncio.to_thread(agent.wait_for, F.CallStart,
                                    lambda f: (f.transport_ids or {}).get("uuid") == bad.uuid, 5.0)
            await bad.send_raw(data)
            assert await bad.closed_by_server()
            assert (await call_end(agent, bad.uuid)).reason == reason
            await live.send_dtmf("9")  # the other call goes on
            got = await asyncio.to_thread(agent.wait_for, F.Dtmf, lambda f: f.call_id == live_start.call_id, 5.0)
            assert got.digit == "9"
            calls = await asyncio.to_thread(gw.command, "calls")
            assert calls[live_start.call_id]["state"] == "active" and not live.eof.is_set()
        finally:
            talking.cancel()
            await asyncio.gather(talking, return_exceptions=True)
            await bad.close()
            await live.close()
        after = await asyncio.to_thread(gw.stats)
        assert after[counter] == before.get(counter, 0) + 1

    run(go())


def test_dtmf_before_the_uuid_is_refused(env):
    gw, _ = env

    async def go() -> None:
        before = await asyncio.to_thread(gw.stats)
        p = AudioSocketPeer("127.0.0.1", gw.audiosocket_port, send_uuid=False)
        await p.open()
        try:
            await p.send_dtmf("1")
            assert await p.closed_by_server()
        finally:
            await p.close()
        after = await asyncio.to_thread(gw.stats)
        assert after["audiosocket_malformed_no_uuid"] == before.get("audiosocket_malformed_no_uuid", 0) + 1

    run(go())


def test_a_source_outside_allow_is_closed_at_accept():
    tmp = Path(tempfile.mkdtemp(prefix="bva", dir="/tmp"))
    try:
        with FakeAgent(tmp) as agent, GatewayProc(tmp, peers={"agent-0": agent.endpoint}, inbox=True,
                                                  audiosocket={"allow": ["10.0.0.0/8"]}) as gw:
            assert closed_at_once(gw.audiosocket_port) and closed_at_once(gw.audiosocket_port)
            stats = gw.stats()
            assert stats["audiosocket_refused_allowlist"] == 2 and stats["audiosocket_accepted"] == 0
            assert not agent.of(F.CallStart)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_16_khz_gateway_carries_16_khz_audio_both_ways():
    tmp = Path(tempfile.mkdtemp(prefix="bva", dir="/tmp"))

    async def go(gw: GatewayProc, agent: FakeAgent) -> None:
        p = AudioSocketPeer("127.0.0.1", gw.audiosocket_port, rate=16000)
        heard: list[np.ndarray] = []
        await p.open(BotEvents(on_audio=lambda pcm, now: heard.append(pcm.copy())))
        talking = asyncio.create_task(talk(p, 320))
        try:
            start = await asyncio.to_thread(agent.wait_for, F.CallStart,
                                            lambda f: (f.transport_ids or {}).get("uuid") == p.uuid, 5.0)
            assert start.call_rate == 16000 and start.transport == "audiosocket"
            deadline = time.monotonic() + 5
            while (await asyncio.to_thread(gw.command, "calls"))[start.call_id]["in_pos"] < 3200:
                assert time.monotonic() < deadline, "the caller's 16 kHz audio did not reach the in ring"
                await asyncio.sleep(0.05)
            bot = (np.arange(3200) % 2000 - 1000).astype(np.int16)  # 200 ms at 16 kHz
            out = Ring.attach(ring_name(gw.instance, start.call_id, "out", start.ring_key))
            try:
                pos = out.write_pos
                out.write(bot)
                agent.send(F.OutUtterance(call_id=start.call_id, utterance=1, epoch=1, out_pos=pos))
                deadline = time.monotonic() + 5
                while sum(len(a) for a in heard) < len(bot):
                    assert time.monotonic() < deadline, "the bot's audio did not arrive"
                    await asyncio.sleep(0.02)
            finally:
                out.close()
            assert np.array_equal(np.concatenate(heard)[:len(bot)], bot)
            assert {k for k in p.kinds if k >= 0x10} == {0x12} and all(len(a) == 320 for a in heard)
            talking.cancel()
            await p.send_raw(message(0x10, b"\x00" * 320))  # 8 kHz audio on a 16 kHz call
            assert await p.closed_by_server()
            end = await asyncio.to_thread(agent.wait_for, F.CallEnd, lambda f: f.call_id == start.call_id, 5.0)
            assert end.reason == "protocol error: wrong_rate"
        finally:
            talking.cancel()
            await asyncio.gather(talking, return_exceptions=True)
            await p.close()

    try:
        with FakeAgent(tmp) as agent, GatewayProc(tmp, peers={"agent-0": agent.endpoint}, inbox=True,
                                                  audiosocket={"rate": 16000}) as gw:
            run(go(gw, agent))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_gateway_share_of_one_source_bounds_its_audiosocket_calls():
    """``[gateway] max_calls_per_source`` (every transport's per-source share) holds for AudioSocket:
    the call beyond it is told to hang up and closed, counted, and the others go on."""
    tmp = Path(tempfile.mkdtemp(prefix="bva", dir="/tmp"))

    async def go(gw: GatewayProc, agent: FakeAgent) -> None:
        peers = [AudioSocketPeer("127.0.0.1", gw.audiosocket_port) for _ in range(3)]
        try:
            for p in peers[:2]:
                await p.open()
                await asyncio.to_thread(agent.wait_for, F.CallStart,
                                        lambda f, p=p: (f.transport_ids or {}).get("uuid") == p.uuid, 5.0)
            await peers[2].open()
            assert await peers[2].closed_by_server() and peers[2].kinds == [0x00]
            assert not peers[0].eof.is_set() and not peers[1].eof.is_set()
            stats = await asyncio.to_thread(gw.stats)
            assert stats["audiosocket_refused_source"] == 1
            assert not [f for f in agent.of(F.CallStart) if (f.transport_ids or {}).get("uuid") == peers[2].uuid]
        finally:
            for p in peers:
                await p.close()

    try:
        with FakeAgent(tmp) as agent, GatewayProc(tmp, peers={"agent-0": agent.endpoint}, inbox=True,
                                                  gateway={"max_calls_per_source": 2}, audiosocket={}) as gw:
            run(go(gw, agent))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
