"""Vonage Voice API WebSockets against the real gateway process, the client playing Vonage.

* the credential: a gateway with ``native_secret`` refuses a Vonage socket
  without ``Authorization: Bearer`` (401) or with a token for another agent,
  and lets in one with a signed token for the route's agent, whose
  parameters become the call's;
* each content-type end to end (``audio/l16;rate=16000`` and ``8000``): the
  call runs at that rate and the echo agent's answer comes back as binary
  20 ms frames of little-endian L16, the caller's audio intact;
* the connected event's headers: the numbers and the ``uuid`` reach the agent.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from brisvox.client.transport import BotEvents, TransportError
from brisvox.client.vonage import VonageTransport
from brisvox.gateway.ws.auth import mint_token
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc, correlate
from tests.system.test_gateway_telnyx import chirp

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SECRET = "vonage-test-secret-0123456789abcdef"
ROUTES = [{"path": "/vonage", "protocol": "vonage", "agent": "default", "agents": ["echo"]}]


async def talk(gw: GatewayProc, rate: int, token: str, path: str = "/vonage/echo",
               ) -> tuple[np.ndarray, list[np.ndarray], dict]:
    """One call: a chirp then a second of silence, paced at 20 ms; (sent, frames heard, calls)."""
    heard: list[np.ndarray] = []
    t = VonageTransport(f"ws://127.0.0.1:{gw.ws_port}{path}", {"lang": "en"}, rate=rate, token=token,
                        caller="447700900000", called="442079460000")
    await t.open(BotEvents(on_audio=lambda pcm, now: heard.append(pcm.copy())))
    sent = chirp(rate)
    frame = rate // 50
    script = np.concatenate([sent, np.zeros(rate, np.int16)])
    t0 = time.monotonic()
    try:
        for k, i in enumerate(range(0, len(script) - frame + 1, frame)):
            await t.send_audio(script[i:i + frame])
            await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - time.monotonic()))
        calls = await asyncio.to_thread(gw.command, "calls")
    finally:
        await t.close()
    return sent, heard, calls


@pytest.mark.serial_light  # echo delay within 150-300 ms
def test_the_credential_and_each_content_type_end_to_end(tmp_path: Path) -> None:
    with FakeAgent(tmp_path) as agent, GatewayProc(
            tmp_path, peers={"agent-0": agent.endpoint}, inbox=True, gateway={"echo_delay_ms": 200},
            websocket={"native_secret": SECRET, "routes": ROUTES}) as gw:
        with pytest.raises(TransportError, match="401"):
            asyncio.run(talk(gw, 16000, ""))
        with pytest.raises(TransportError, match="401"):
            asyncio.run(talk(gw, 16000, mint_token(SECRET, "default", 60)))  # not for echo
        for rate in (16000, 8000):
            sent, heard, calls = asyncio.run(talk(gw, rate, mint_token(SECRET, "echo", 60)))
            (call,) = calls.values()
            assert call["transport"] == "vonage" and set(call["ids"]) == {"uuid"}
            assert heard and all(len(f) == rate // 50 for f in heard)  # one 20 ms frame a message
            delay_ms, corr = correlate(sent, np.concatenate(heard), rate)
            print(f"vonage {rate}: delay {delay_ms:.1f} ms, correlation {corr:.4f}")
            assert corr > 0.95 and 150 <= delay_ms <= 300, (delay_ms, corr)
        # the metadata the agent gets: the token's parameters, the headers' numbers and uuid
        asyncio.run(talk(gw, 8000, mint_token(SECRET, "default", 60, {"tenant": "acme"}), "/vonage"))
        start = agent.wait_for(F.CallStart, lambda f: f.transport == "vonage", 5.0)
        assert start.call_rate == 8000 and start.params == {"tenant": "acme"}
        assert (start.caller, start.called) == ("447700900000", "442079460000")
        assert set(start.transport_ids) == {"uuid"}
        stats = gw.stats()
        assert stats["ws_refused_auth"] == 1 and stats["ws_refused_token_agent"] == 1
        assert stats["calls_admitted_vonage"] == 3
