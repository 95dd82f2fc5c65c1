"""The chan_websocket leg (brisvox.gateway.carriers.asterisk_ws) and its handshake check, against a recording host.

* ``MEDIA_START`` admits the call at its format's rate with its metadata
  (connection/channel ids, the URI query's and the JSON channel variables'
  parameters, the caller and called number); the bot answers in the
  control format MEDIA_START came in;
* the caller's binary audio reaches the call decoded; the bot's audio goes
  out as one binary message per 20 ms frame (the optimal frame size);
* a Clear is ``FLUSH_MEDIA``, the agent's hang-up ``HANGUP`` then a close;
  ``DTMF_END`` reaches the agent; ``MEDIA_XOFF`` and ``ERROR`` are counted;
* malformed input closes at once before the call, is counted and charged to
  the fault budget during it;
* ``asterisk_ws_auth``: the Basic password or ``?token=`` is the native secret.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from websockets.datastructures import Headers

from brisvox.config.errors import ConfigError
from brisvox.gateway.carriers.asterisk_ws import TRANSFER_REASON, AsteriskWsSession
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.ws import auth as ws_auth
from brisvox.gateway.ws.auth import Grant
from brisvox.wire import asterisk_ws as aw
from brisvox.wire.exotel import basic_header
from tests.unit.test_gateway_telnyx import RecordingHost, feed
from tests.unit.test_gateway_vonage import BinaryConn
from tests.unit.test_gateway_ws_faults import BUDGET_REASON, Clock

ROUTE = WsRoute("/asterisk", "asterisk_ws", "echo")


def session(codec: str = "ulaw", fmt: str = aw.PLAIN, start: bool = True, path: str = "",
            **websocket: Any) -> tuple[AsteriskWsSession, RecordingHost, BinaryConn, Clock, aw.AsteriskStream]:
    host, conn, clock = RecordingHost(**websocket), BinaryConn(), Clock()
    if path:
        conn.request = SimpleNamespace(path=path)  # type: ignore[attr-defined]
    s = AsteriskWsSession(host, conn, ROUTE)  # type: ignore[arg-type]
    s.clock = clock
    tx = aw.AsteriskStream(codec, fmt, variables={"LANG": "fr"})
    if start:
        feed(s, tx.media_start())
        assert s.call is not None and not conn.closed
    return s, host, conn, clock, tx


@pytest.mark.parametrize("fmt", [aw.PLAIN, aw.JSON])
def test_media_start_admits_the_call_with_its_metadata(fmt: str) -> None:
    s, host, conn, clock, tx = session(fmt=fmt, path="/asterisk?token=s3&caller=%2B331&called=100")
    call = s.call
    assert host.rates == [8000]
    assert call.transport_ids == {"connection_id": tx.connection_id, "channel": tx.channel,
                                  "channel_id": tx.channel_id}
    want = {"caller": "+331", "called": "100", **({"LANG": "fr"} if fmt == aw.JSON else {})}
    assert call.params == want and (call.caller, call.called) == ("+331", "100")
    s.send_clear()
    s.hangup("agent done")
    assert conn.texts == [aw.command("FLUSH_MEDIA", fmt), aw.command("HANGUP", fmt)]
    assert (conn.close_code, conn.close_reason) == (1000, "agent done")


@pytest.mark.parametrize(("codec", "rate", "frame_bytes"), [("ulaw", 8000, 160), ("alaw", 8000, 160),
                                                            ("slin", 8000, 320), ("slin16", 16000, 640)])
def test_audio_both_ways_one_binary_message_per_20_ms(codec: str, rate: int, frame_bytes: int) -> None:
    s, host, conn, clock, tx = session(codec)
    assert host.rates == [rate] and s.rate == rate
    pcm = (np.arange(rate // 50, dtype=np.int16) * 7 - 500).astype(np.int16)
    wire = aw.FORMATS[codec].codec.encode(pcm)
    wire = wire.astype("<i2").tobytes() if wire.dtype.itemsize == 2 else wire.tobytes()
    feed(s, wire)
    assert np.array_equal(host.audio[-1], aw.FORMATS[codec].codec.decode(wire))
    assert s.send_audio(pcm, 0.0) and conn.binaries == [wire] and len(wire) == frame_bytes
    assert s.call.stats.packets_out == 1


def test_dtmf_xoff_error_and_ignored_events() -> None:
    s, host, conn, clock, tx = session()
    feed(s, tx.dtmf("5"))
    feed(s, "MEDIA_XOFF")
    feed(s, "MEDIA_XON")
    feed(s, "ERROR channel_id:1 error_text:Unknown command")
    feed(s, "QUEUE_DRAINED")
    feed(s, "SOMETHING_NEW a:b")
    feed(s, tx.media_start())
    assert host.digits == ["5"]
    assert host.counters == {"asterisk_ws_xoff": 1, "asterisk_ws_error": 1, "ws_malformed_unknown_event": 1,
                             "ws_malformed_duplicate_start": 1}
    assert not conn.closed
    done: list[tuple[bool, str]] = []
    s.transfer("sip:x@y", lambda ok, why: done.append((ok, why)))
    assert done == [(False, TRANSFER_REASON)]
    assert s.send_dtmf("7") == 0 and s.tick_dtmf(0.0) and conn.binaries  # in-band tones


@pytest.mark.parametrize(("msg", "code", "kind"), [
    ("{not json", 1007, "bad_json"),
    ("DTMF_END digit:5", 1007, "bad_message"),  # an event before MEDIA_START
    ("MEDIA_START connection_id:a format:opus", 1003, "bad_media_format"),
    ("MEDIA_START format:ulaw", 1007, "bad_start"),
    (b"\xff" * 160, 1008, "media_before_start"),
])
def test_malformed_before_the_call_closes_at_once(msg: str | bytes, code: int, kind: str) -> None:
    s, host, conn, clock, tx = session(start=False)
    feed(s, msg)
    assert conn.close_code == code and host.counters == {f"ws_malformed_{kind}": 1} and s.call is None


def test_malformed_during_the_call_is_charged_to_the_budget() -> None:
    s, host, conn, clock, tx = session("slin", fault_max=3, fault_window_s=10.0)
    for m in ("{bad", b"\x01\x02\x03", "DTMF_END digit:Z"):
        feed(s, m)
    assert not conn.closed and s.call.stats.malformed == 3
    assert {k: v for k, v in host.counters.items() if k.startswith("ws_malformed")} == {
        "ws_malformed_bad_json": 1, "ws_malformed_bad_media": 1, "ws_malformed_bad_dtmf": 1}
    feed(s, b"\x00" * 16002)  # over 1 s of slin
    assert (conn.close_code, conn.close_reason) == (1009, BUDGET_REASON.format(4, 10))


def test_auth_basic_password_or_query_token() -> None:
    only = [{"path": "/asterisk", "protocol": "asterisk_ws", "agent": "echo"}]
    cfg = WebSocketConfig.from_section({"native_secret": "s3", "host": "0.0.0.0", "routes": only})
    ok = ws_auth.asterisk_ws_auth(cfg, ROUTE, "/asterisk", Headers({"Authorization": basic_header("ast", "s3")}))
    assert isinstance(ok, Grant)
    assert isinstance(ws_auth.asterisk_ws_auth(cfg, ROUTE, "/asterisk?token=s3", Headers()), Grant)
    bad = ws_auth.asterisk_ws_auth(cfg, ROUTE, "/asterisk?token=s3", Headers({"Authorization": basic_header("a", "x")}))
    assert bad == ws_auth.BAD_TOKEN
    assert ws_auth.asterisk_ws_auth(cfg, ROUTE, "/asterisk", Headers()) == ws_auth.BAD_TOKEN
    open_cfg = WebSocketConfig.from_section({"host": "127.0.0.1", "trust_loopback": False, "routes": only})
    assert ws_auth.asterisk_ws_auth(open_cfg, ROUTE, "/asterisk", Headers()) == ws_auth.UNCONFIGURED


@pytest.mark.parametrize("protocol", ["asterisk_ws", "freeswitch"])
def test_a_public_listener_routing_a_pbx_needs_native_secret(protocol: str) -> None:
    only = [{"path": "/pbx", "protocol": protocol, "agent": "echo"}]
    with pytest.raises(ConfigError, match="native_secret"):
        WebSocketConfig.from_section({"host": "0.0.0.0", "routes": only})
