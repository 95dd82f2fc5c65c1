"""FreeSWITCH mod_audio_stream against the real gateway process, the test peer playing FreeSWITCH.

* the credential: a gateway with ``native_secret`` refuses a stream without
  ``Authorization: Bearer`` or ``?token=`` (401) and with a wrong one, and
  lets in one whose ``STREAM_EXTRA_HEADERS`` bearer is the secret;
* 16 kHz end to end (``uuid_audio_stream ... mono 16k``, ``?sample-rate=16000``):
  the echo agent's answer comes back in ``streamAudio`` chunks of 3.2 KB or
  more (multiples of 320 bytes) at 16 kHz, the caller's audio intact; the
  metadata reaches the agent as the call's parameters and numbers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from brisvox.client.transport import BotEvents
from brisvox.wire.exotel import MIN_CHUNK_BYTES
from ipc import frames as F
from tests.system.freeswitch_peer import FreeSwitchPeer
from tests.system.gateway_harness import FakeAgent, GatewayProc, correlate
from tests.system.test_gateway_asterisk_ws import refused_without_and_with_a_wrong_credential
from tests.system.test_gateway_telnyx import talk

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SECRET = "freeswitch-test-secret-0123456789abcdef"
ROUTES = [{"path": "/freeswitch", "protocol": "freeswitch", "agent": "default", "agents": ["echo"]}]


async def echo_call(gw: GatewayProc, token: str, path: str = "/freeswitch/echo?sample-rate=16000",
                    rate: int = 16000) -> tuple[np.ndarray, list[np.ndarray]]:
    got: list[np.ndarray] = []
    t = FreeSwitchPeer(f"ws://127.0.0.1:{gw.ws_port}{path}", rate, {"caller": "+33111", "called": "3000"}, token)
    await t.open(BotEvents(on_audio=lambda pcm, now: got.append(pcm.copy())))
    sent, _ = await talk(t, gw, rate)
    return sent, got


@pytest.mark.serial_light  # echo delay within 150-500 ms (a chunk of 100 ms is kept before it goes)
def test_the_credential_and_16_khz_end_to_end(tmp_path: Path) -> None:
    with FakeAgent(tmp_path) as agent, GatewayProc(
            tmp_path, peers={"agent-0": agent.endpoint}, inbox=True, gateway={"echo_delay_ms": 200},
            websocket={"native_secret": SECRET, "routes": ROUTES}) as gw:
        refused_without_and_with_a_wrong_credential(echo_call, gw)
        sent, chunks = asyncio.run(echo_call(gw, SECRET))
        sizes = [2 * len(c) for c in chunks]
        assert sizes and all(n % 320 == 0 for n in sizes), sizes
        assert sum(n < MIN_CHUNK_BYTES for n in sizes) <= 2, sizes  # the ends of talkspurts
        delay_ms, corr = correlate(sent, np.concatenate(chunks), 16000)
        print(f"freeswitch 16k: delay {delay_ms:.1f} ms, correlation {corr:.4f}, {len(sizes)} chunks")
        assert corr > 0.95 and 150 <= delay_ms <= 500, (delay_ms, corr)
        asyncio.run(echo_call(gw, "", f"/freeswitch?token={SECRET}", 8000))
        start = agent.wait_for(F.CallStart, lambda f: f.transport == "freeswitch", 5.0)
        assert start.call_rate == 8000 and (start.caller, start.called) == ("+33111", "3000")
        assert start.params is not None and start.params["caller"] == "+33111" and "uuid" in start.params
