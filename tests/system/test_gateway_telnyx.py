"""Telnyx Media Streaming against the real gateway process, the client playing Telnyx.

* the stream token: a gateway with ``native_secret`` refuses a Telnyx stream
  without the ``x-telnyx-streaming-auth-token`` header (401) and lets in one
  with a signed token for the route's agent, whose parameters become the
  call's;
* L16 at 16 kHz end to end: the call runs at 16 kHz and the echo agent's
  answer comes back big-endian at 16 kHz, the caller's audio intact;
* PCMA at 8 kHz the same way.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisvox.client.telnyx import TelnyxTransport
from brisvox.client.transport import BotEvents, TransportError
from brisvox.gateway.ws.auth import mint_token
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc, correlate

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SECRET = "telnyx-test-secret-0123456789abcdef"
ROUTES = [{"path": "/telnyx", "protocol": "telnyx", "agent": "default", "agents": ["echo"]}]


def chirp(rate: int, seconds: float = 1.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * (300 + 400 * t) * t)).astype(np.int16)


async def talk(t: Any, gw: GatewayProc, rate: int) -> tuple[np.ndarray, dict]:
    """The caller's side of an echo call on the open transport ``t``: a chirp at ``rate`` in
    real-time 20 ms frames, then 1 s of silence; (what was sent, the gateway's calls at the
    end). ``t`` is closed whatever happens."""
    sent = chirp(rate)
    frame = rate // 50
    t0 = time.monotonic()
    try:
        for i in range(len(sent) // frame):
            await t.send_audio(sent[i * frame:(i + 1) * frame])
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
        for _ in range(50):
            await t.send_audio(np.zeros(frame, np.int16))
            await asyncio.sleep(0.02)
        calls = await asyncio.to_thread(gw.command, "calls")
    finally:
        await t.close()
    return sent, calls


async def echo_call(gw: GatewayProc, encoding: str, rate: int, token: str,
                    path: str = "/telnyx/echo") -> tuple[np.ndarray, np.ndarray, dict]:
    got: list[np.ndarray] = []
    t = TelnyxTransport(f"ws://127.0.0.1:{gw.ws_port}{path}", {"lang": "en"}, encoding=encoding, rate=rate,
                        token=token, caller="+13122010094", called="+13122123456")
    await t.open(BotEvents(on_audio=lambda pcm, now: got.append(pcm.copy())))
    sent, calls = await talk(t, gw, rate)
    return sent, np.concatenate(got) if got else np.zeros(0, np.int16), calls


@pytest.mark.serial_light  # echo delay within 150-300 ms
def test_the_stream_token_and_each_format_end_to_end(tmp_path: Path) -> None:
    with FakeAgent(tmp_path) as agent, GatewayProc(
            tmp_path, peers={"agent-0": agent.endpoint}, inbox=True, gateway={"echo_delay_ms": 200},
            websocket={"native_secret": SECRET, "routes": ROUTES}) as gw:
        with pytest.raises(TransportError, match="401"):
            asyncio.run(echo_call(gw, "PCMU", 8000, ""))
        with pytest.raises(TransportError, match="401"):
            asyncio.run(echo_call(gw, "PCMU", 8000, mint_token(SECRET, "default", 60)))  # not for echo
        for encoding, rate in (("L16", 16000), ("PCMA", 8000)):
            sent, got, calls = asyncio.run(echo_call(gw, encoding, rate, mint_token(SECRET, "echo", 60)))
            (call,) = calls.values()
            assert call["transport"] == "telnyx" and set(call["ids"]) >= {"stream_id", "call_control_id"}
            delay_ms, corr = correlate(sent, got, rate)
            print(f"telnyx {encoding} {rate}: delay {delay_ms:.1f} ms, correlation {corr:.4f}")
            assert corr > 0.95 and 150 <= delay_ms <= 300, (delay_ms, corr)
        # the metadata the agent gets: the token's parameters, the start's numbers and ids
        asyncio.run(echo_call(gw, "PCMU", 8000, mint_token(SECRET, "default", 60, {"tenant": "acme"}), "/telnyx"))
        start = agent.wait_for(F.CallStart, lambda f: f.transport == "telnyx", 5.0)
        assert start.call_rate == 8000 and start.params == {"tenant": "acme"}
        assert (start.caller, start.called) == ("+13122010094", "+13122123456")
        assert set(start.transport_ids) >= {"stream_id", "call_control_id", "call_session_id"}
        stats = gw.stats()
        assert stats["ws_refused_auth"] == 1 and stats["ws_refused_token_agent"] == 1
        assert stats["calls_admitted_telnyx"] == 3
