"""Asterisk chan_websocket against the real gateway process, the test peer playing Asterisk.

* the handshake answers the ``media`` subprotocol Asterisk offers;
* the credential: a gateway with ``native_secret`` refuses a connection
  without a Basic password or ``?token=`` (401) and with a wrong one (401),
  and lets in one whose ``websocket_client.conf`` password is the secret;
* slin16 in the JSON control format end to end: the call runs at 16 kHz and
  the echo agent's answer comes back in 640-byte binary frames (20 ms each),
  the caller's audio intact; the URI query (the dial string's ``v(...)``)
  and the channel variables reach the agent as the call's parameters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisvox.client.transport import BotEvents, TransportError
from brisvox.wire import asterisk_ws as aw
from ipc import frames as F
from tests.system.asterisk_ws_peer import AsteriskWsPeer
from tests.system.gateway_harness import FakeAgent, GatewayProc, correlate
from tests.system.test_gateway_telnyx import talk

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]

SECRET = "asterisk-test-secret-0123456789abcdef"
ROUTES = [{"path": "/asterisk", "protocol": "asterisk_ws", "agent": "default", "agents": ["echo"]}]


async def echo_call(gw: GatewayProc, password: str, path: str = "/asterisk/echo", codec: str = "slin16",
                    fmt: str = aw.JSON) -> tuple[np.ndarray, list[np.ndarray], dict]:
    got: list[np.ndarray] = []
    t = AsteriskWsPeer(f"ws://127.0.0.1:{gw.ws_port}{path}", codec, fmt, password=password)
    t.stream.variables = {"CALLERID_NUM": "+33123456789"}
    await t.open(BotEvents(on_audio=lambda pcm, now: got.append(pcm.copy())))
    assert t.ws.subprotocol == "media"  # offered as websocket_client.conf's protocols = media, answered
    sent, calls = await talk(t, gw, t.rate)
    return sent, got, calls


def refused_without_and_with_a_wrong_credential(call: Callable[..., Any], gw: GatewayProc) -> None:
    """``call(gw, credential)`` is refused 401 at the handshake without a credential and with a wrong one."""
    for bad in ("", "not-the-secret"):
        with pytest.raises(TransportError, match="401"):
            asyncio.run(call(gw, bad))


@pytest.mark.serial_light  # echo delay within 150-400 ms
def test_the_credential_and_slin16_json_end_to_end(tmp_path: Path) -> None:
    with FakeAgent(tmp_path) as agent, GatewayProc(
            tmp_path, peers={"agent-0": agent.endpoint}, inbox=True, gateway={"echo_delay_ms": 200},
            websocket={"native_secret": SECRET, "routes": ROUTES}) as gw:
        refused_without_and_with_a_wrong_credential(echo_call, gw)
        sent, frames, calls = asyncio.run(echo_call(gw, SECRET))
        (call,) = calls.values()
        assert call["transport"] == "asterisk_ws" and set(call["ids"]) == {"connection_id", "channel", "channel_id"}
        sizes = {len(f) for f in frames}
        assert sizes == {320}, sizes  # 320 samples: 640 bytes of slin16, one message per 20 ms
        delay_ms, corr = correlate(sent, np.concatenate(frames), 16000)
        print(f"asterisk_ws slin16: delay {delay_ms:.1f} ms, correlation {corr:.4f}, {len(frames)} frames")
        assert corr > 0.95 and 150 <= delay_ms <= 400, (delay_ms, corr)
        # the metadata the agent gets: the URI query (v(...)), the channel variables, the numbers
        asyncio.run(echo_call(gw, "", f"/asterisk?token={SECRET}&caller=%2B33111&called=3000", "ulaw"))
        start = agent.wait_for(F.CallStart, lambda f: f.transport == "asterisk_ws", 5.0)
        assert start.call_rate == 8000 and (start.caller, start.called) == ("+33111", "3000")
        assert start.params == {"caller": "+33111", "called": "3000", "CALLERID_NUM": "+33123456789"}
