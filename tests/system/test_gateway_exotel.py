"""Exotel Voicebot streams against the real gateway process, the client playing Exotel.

* the credential: a gateway with ``native_secret`` refuses an Exotel stream
  without a Basic password (401) or with a token for another agent, and lets
  in one whose password is a signed token for the route's agent, whose
  parameters become the call's;
* 16 and 24 kHz end to end: the call runs at the stream's rate and the echo
  agent's answer comes back at it, little-endian, the caller's audio intact,
  in Exotel's chunk sizes (multiples of 320 bytes, 3.2 KB or more but for
  the last of a talkspurt).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from brisvox.client.exotel import ExotelTransport
from brisvox.client.transport import BotEvents, TransportError
from brisvox.gateway.ws.auth import mint_token
from brisvox.wire.exotel import MIN_CHUNK_BYTES
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc, correlate
from tests.system.test_gateway_telnyx import talk

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SECRET = "exotel-test-secret-0123456789abcdef"
ROUTES = [{"path": "/exotel", "protocol": "exotel", "agent": "default", "agents": ["echo"]}]


async def echo_call(gw: GatewayProc, rate: int, token: str,
                    path: str = "/exotel/echo") -> tuple[np.ndarray, list[np.ndarray], dict]:
    got: list[np.ndarray] = []
    t = ExotelTransport(f"ws://127.0.0.1:{gw.ws_port}{path}?sample-rate={rate}", {"lang": "en"}, rate=rate,
                        token=token, caller="+919876543210", called="+918047491899")
    await t.open(BotEvents(on_audio=lambda pcm, now: got.append(pcm.copy())))
    sent, calls = await talk(t, gw, rate)
    return sent, got, calls


@pytest.mark.serial_light  # echo delay within 150-400 ms
def test_the_basic_credential_and_each_rate_end_to_end(tmp_path: Path) -> None:
    with FakeAgent(tmp_path) as agent, GatewayProc(
            tmp_path, peers={"agent-0": agent.endpoint}, inbox=True, gateway={"echo_delay_ms": 200},
            websocket={"native_secret": SECRET, "routes": ROUTES}) as gw:
        with pytest.raises(TransportError, match="401"):
            asyncio.run(echo_call(gw, 8000, ""))
        with pytest.raises(TransportError, match="401"):
            asyncio.run(echo_call(gw, 8000, mint_token(SECRET, "default", 60)))  # not for echo
        for rate in (16000, 24000):
            sent, chunks, calls = asyncio.run(echo_call(gw, rate, mint_token(SECRET, "echo", 60)))
            (call,) = calls.values()
            assert call["transport"] == "exotel" and set(call["ids"]) >= {"stream_sid", "call_sid"}
            sizes = [2 * len(c) for c in chunks]
            assert sizes and all(n % 320 == 0 for n in sizes), sizes
            assert sum(n < MIN_CHUNK_BYTES for n in sizes) <= 2, sizes  # the ends of talkspurts
            delay_ms, corr = correlate(sent, np.concatenate(chunks), rate)
            print(f"exotel {rate}: delay {delay_ms:.1f} ms, correlation {corr:.4f}, {len(sizes)} chunks")
            assert corr > 0.95 and 150 <= delay_ms <= 400, (delay_ms, corr)
        # the metadata the agent gets: the token's parameters, the start's numbers and ids, the rate
        asyncio.run(echo_call(gw, 8000, mint_token(SECRET, "default", 60, {"tenant": "acme"}), "/exotel"))
        start = agent.wait_for(F.CallStart, lambda f: f.transport == "exotel", 5.0)
        assert start.call_rate == 8000 and start.params == {"tenant": "acme"}
        assert (start.caller, start.called) == ("+919876543210", "+918047491899")
        assert set(start.transport_ids) >= {"stream_sid", "call_sid", "account_sid"}
        stats = gw.stats()
        assert stats["ws_refused_auth"] == 1 and stats["ws_refused_token_agent"] == 1
        assert stats["calls_admitted_exotel"] == 3
