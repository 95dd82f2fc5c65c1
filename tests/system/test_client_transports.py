"""brisvox/client transports against a real gateway process (no models): the echo line test.

For each protocol the client speaks (native WebSocket, Twilio Media Streams,
SIP/RTP through the client's own small UA), a call to the gateway's built-in
``echo`` agent: the client streams recorded speech on a 20 ms grid, presses
a DTMF digit in the middle, and records what comes back with the playout
recorder. Checks, from the client's side only:

* both audio directions work and the recorder's timeline is right: the
  recording is the caller's speech delayed by ``echo_delay_ms`` (the lag of
  the cross-correlation peak is 300 ms +- 60 ms and the peak is strong);
* the digit reached the gateway (its ``call_dtmf_in_total`` counter is 1;
  over SIP it travelled as RFC 4733 events) and, on the WebSocket
  protocols, the echo's clear came back to the client;
* SIP: the call was answered (200 + ACK, no INVITE retransmission on
  loopback) and our BYE ended it.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from brisvox.client.native import NativeTransport
from brisvox.client.recorder import PlayoutRecorder
from brisvox.client.sip import SipTransport
from brisvox.client.speech import read_wav
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport
from tests.system.gateway_harness import ECHO_ROUTES, GatewayProc, make_fixture

pytestmark = pytest.mark.system

DELAY_MS = 300


def transport_for(protocol: str, gw: GatewayProc):  # noqa: ANN201
    if protocol == "native":
        return NativeTransport(f"ws://127.0.0.1:{gw.ws_port}/ws/echo", rate=16000)
    if protocol == "twilio":
        return TwilioTransport(f"ws://127.0.0.1:{gw.ws_port}/twilio/echo")
    return SipTransport(f"sip:echo@127.0.0.1:{gw.sip_port}")


async def echo_call(t, speech: np.ndarray, dtmf_at: float, seconds: float):  # noqa: ANN001, ANN201
    rec = PlayoutRecorder(t.rate)
    clears: list[float] = []
    ends: list[str] = []
    events = BotEvents(on_audio=rec.on_audio, on_clear=lambda now: clears.append(now),
                       on_end=lambda why, now: ends.append(why))
    await t.open(events)
    t0 = time.monotonic()
    rec.t0 = t0
    frame = t.rate // 50
    pressed = None
    n = 0
    try:
        while n * 0.02 < seconds:
            x = speech[n * frame:(n + 1) * frame]
            if len(x) < frame:
                x = np.concatenate([x, np.zeros(frame - len(x), np.int16)])
            if pressed is None and n * 0.02 >= dtmf_at:
                pressed = time.monotonic()
                await t.send_dtmf("1")
            await t.send_audio(x)
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
    finally:
        await t.close()
    return rec, t0, pressed, clears, ends


def lag_of_echo(sent: np.ndarray, heard: np.ndarray, rate: int) -> tuple[float, float]:
    """(lag seconds of the best match within 0..1 s, normalized correlation at it)."""
    a = sent.astype(np.float64)
    b = heard.astype(np.float64)
    best, best_lag = -1.0, 0
    step = rate // 1000  # 1 ms
    n = min(len(a), len(b)) - rate
    for lag in range(0, rate, step):
        x, y = a[:n], b[lag:lag + n]
        den = np.sqrt(np.dot(x, x) * np.dot(y, y))
        c = float(np.dot(x, y) / den) if den else 0.0
        if c > best:
            best, best_lag = c, lag
    return best_lag / rate, best


@pytest.mark.serial_light  # the echo lag within 60 ms of the configured delay: wall-clock timing
@pytest.mark.parametrize("protocol", ["native", "twilio", "sip"])
def test_echo_call_round_trip_timeline_and_dtmf(short_tmp, protocol):
    fx = make_fixture(short_tmp, "One two three four five six seven eight nine ten, "
                                 "and the quick brown fox jumps over the lazy dog.")
    with GatewayProc(short_tmp, gateway={"echo_delay_ms": DELAY_MS, "echo_digit_clears": True},
                     inbox=True, websocket={"routes": ECHO_ROUTES}) as gw:
        t = transport_for(protocol, gw)
        speech = read_wav(fx["wav"], t.rate)
        dtmf_at = 2.0
        rec, t0, pressed, clears, ends = asyncio.run(echo_call(t, speech, dtmf_at, seconds=3.0))
        stats = gw.stats()
    heard = rec.track(until=t0 + 3.0)
    lag, corr = lag_of_echo(speech[: int(1.9 * t.rate)], heard[: int(1.9 * t.rate)], t.rate)
    assert abs(lag - DELAY_MS / 1000) <= 0.06, (lag, corr)
    assert corr > 0.9, (lag, corr)
    assert stats["call_dtmf_in_total"] == 1, stats
    assert not ends  # we hung up, the gateway did not
    if protocol in ("native", "twilio"):
        assert pressed is not None
        assert [c for c in clears if c >= pressed], "the echo's clear did not reach the client"
    else:
        assert t.status == 200
        assert t.counters["invite_sent"] == 1 and t.counters["ack_sent"] >= 1
        assert t.counters["dtmf_packets"] >= 5  # RFC 4733: growing duration + 3 end packets
        assert t.counters["rtp_in"] > 100
    assert not gw.leaked
