"""The Vonage leg (brisvox.gateway.carriers.vonage) and its handshake check, against a recording host.

The connected events are the examples of Vonage's Voice API guide "WebSockets"
(developer.vonage.com/en/voice/voice-api/concepts/websockets; the fixtures
of tests/unit/test_wire_vonage.py).

* ``websocket:connected`` admits the call at the content-type's rate, with
  its metadata (the headers, or a signed token's parameters; ``uuid`` and
  ``from``/``to``), malformed headers dropped and counted; a full gateway
  closes with 1013;
* binary audio of each rate reaches the call; the bot's audio goes out as
  binary 20 ms messages (a short one padded), marks as ``notify`` whose
  ``websocket:notify`` is the echo, Clear as ``clear``, digits in-band;
* malformed input closes at once before the call, is counted and charged
  to the fault budget during it; unknown events, repeated connected events
  and ``websocket:cleared`` are never charged;
* ``vonage_auth``: ``Authorization: Bearer`` or ``?token=`` is the native
  secret or a signed token for the route's agent; without ``native_secret``
  only a loopback (or ``allow_unauthenticated``) listener lets anyone in.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.datastructures import Headers

from brisvox.config.errors import ConfigError
from brisvox.gateway.carriers.vonage import TRANSFER_REASON, VonageSession
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.ws import auth as ws_auth
from brisvox.gateway.ws.auth import Grant
from brisvox.wire import dtmf, native, vonage
from tests.unit.test_gateway_telnyx import RecordingHost
from tests.unit.test_gateway_ws_faults import BUDGET_REASON, Clock, Conn
from tests.unit.test_wire_vonage import DOC_CONNECTED, DOC_DTMF

ROUTE = WsRoute("/vonage", "vonage", "echo")
UUID = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"


class BinaryConn(Conn):
    def __init__(self) -> None:
        super().__init__()
        self.binaries: list[bytes] = []

    def send_binary(self, data: bytes) -> bool:
        self.binaries.append(data)
        return not self.closed


def connected(rate: int = 16000, **headers: Any) -> str:
    return orjson.dumps({**DOC_CONNECTED, "content-type": f"audio/l16;rate={rate}", **headers}).decode()


def session(rate: int = 16000, start: bool = True, grant: Grant | None = None,
            **websocket: Any) -> tuple[VonageSession, RecordingHost, BinaryConn, Clock]:
    host, conn, clock = RecordingHost(**websocket), BinaryConn(), Clock()
    if grant is not None:
        conn.grant = grant  # type: ignore[attr-defined]
    s = VonageSession(host, conn, ROUTE)  # type: ignore[arg-type]
    s.clock = clock
    if start:
        s.on_text(connected(rate, uuid=UUID, **{"from": "447700900000", "to": "442079460000"}).encode())
        assert s.call is not None and not conn.closed
    return s, host, conn, clock


def feed(s: VonageSession, msg: str | bytes) -> None:
    if isinstance(msg, bytes):
        s.on_binary(msg)
    else:
        s.on_text(msg.encode())


def pcm(rate: int, level: int = 1000) -> np.ndarray:
    return np.full(rate // 50, level, np.int16)


# -- the call -----------------------------------------------------------------------------


def test_connected_admits_the_call_with_its_metadata() -> None:
    s, host, conn, clock = session()
    call = s.call
    assert host.rates == [16000] and s.rate == 16000 and s.stream_id == UUID
    assert call.transport_ids == {"uuid": UUID}
    assert call.params == {"prop1": "value1", "prop2": "value2", "uuid": UUID, "from": "447700900000",
                           "to": "442079460000"}
    assert (call.caller, call.called) == ("447700900000", "442079460000")
    assert "call_params_dropped" not in host.counters


def test_a_signed_tokens_parameters_replace_the_headers() -> None:
    s, *_ = session(grant=Grant({"tenant": "a"}))
    assert s.call.params == {"tenant": "a"}


def test_dropped_headers_are_counted_and_a_full_gateway_closes_with_1013() -> None:
    s, host, conn, clock = session(start=False)
    feed(s, connected(address={"city": "New York City"}, system_roles=[1, 2]))
    assert host.counters["call_params_dropped"] == 2 and s.call.params == {"prop1": "value1", "prop2": "value2"}
    s, host, conn, clock = session(start=False)
    host.full = True
    feed(s, connected())
    assert (conn.close_code, conn.close_reason) == (1013, "try again later") and s.call is None


@pytest.mark.parametrize("rate", [8000, 16000])
def test_each_rate_both_ways(rate: int) -> None:
    s, host, conn, clock = session(rate)
    assert host.rates == [rate]
    sent = (np.arange(rate // 50) * 50 - 4000).astype(np.int16)
    feed(s, sent.astype("<i2").tobytes())
    assert len(host.audio) == 1 and np.array_equal(host.audio[0], sent)
    feed(s, b"")  # no samples: nothing
    assert len(host.audio) == 1
    assert s.send_audio(sent, 0.0)
    assert conn.binaries == [sent.astype("<i2").tobytes()] and len(conn.binaries[0]) == rate // 25
    assert s.call.stats.packets_out == 1 and conn.texts == []


def test_a_short_or_long_frame_goes_out_as_whole_padded_messages() -> None:
    s, host, conn, clock = session(8000)
    assert s.send_audio(np.ones(100, np.int16), 0.0) and s.send_audio(np.ones(400, np.int16), 0.0)
    assert [len(b) for b in conn.binaries] == [320, 320, 320, 320]
    assert conn.binaries[0] == np.concatenate([np.ones(100), np.zeros(60)]).astype("<i2").tobytes()
    assert s.call.stats.packets_out == 4
    conn.close()
    assert not s.send_audio(pcm(8000), 0.0) and not s.send_audio(np.ones(50, np.int16), 0.0)


def test_marks_clear_digits_and_transfer() -> None:
    s, host, conn, clock = session()
    s.send_mark("m1")
    s.send_clear()
    assert [orjson.loads(t) for t in conn.texts] == [{"action": "notify", "payload": {"mark": "m1"}},
                                                     {"action": "clear"}]
    feed(s, vonage.VonageStream.notified({"mark": "m1"}))
    feed(s, vonage.VonageStream.cleared())
    feed(s, orjson.dumps(DOC_DTMF).decode())
    feed(s, vonage.VonageStream.dtmf("#", 100))
    assert host.marks == ["m1"] and host.digits == ["5", "#"] and s.call.stats.malformed == 0
    done: list[tuple[bool, str]] = []
    s.transfer("sip:op@x", lambda ok, why: done.append((ok, why)))
    assert done == [(False, TRANSFER_REASON)]


def test_digits_before_the_call_are_dropped() -> None:
    s, host, conn, clock = session(start=False)
    feed(s, orjson.dumps(DOC_DTMF).decode())
    feed(s, vonage.VonageStream.notified({"mark": "m"}))
    assert host.digits == [] and host.marks == [] and not conn.closed


@pytest.mark.parametrize("rate", [8000, 16000])
def test_digits_out_are_in_band_tones_at_the_streams_rate(rate: int) -> None:
    s, host, conn, clock = session(rate)
    assert s.send_dtmf("7Z") == 1
    while s.tick_dtmf(time.monotonic()):
        pass
    tones = dtmf.tone_sequence("7", rate)  # what an in-band leg plays (tests/unit/test_gateway_telnyx.py hears it)
    assert all(len(b) == rate // 25 for b in conn.binaries) and len(conn.binaries) == -(-len(tones) // (rate // 50))
    sent = np.concatenate([np.frombuffer(b, "<i2") for b in conn.binaries])
    assert np.array_equal(sent[:len(tones)], tones) and not sent[len(tones):].any()  # the tail padded
    s.send_dtmf("1")
    s.send_clear()
    assert not s.tick_dtmf(0.0)  # a Clear drops the tones


def test_hangup_and_the_callers_close_end_the_leg() -> None:
    s, host, conn, clock = session()
    s.hangup("stage_failed: asr")
    assert (conn.close_code, s.call.end_reason) == (1011, "stage_failed: asr")
    s, host, conn, clock = session()
    s.on_closed(1000, "")
    assert s.call.transport_done and s.call.end_reason == "closed 1000"


# -- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "code"), [
    ("{not json", 1007), ("[1]", 1007), (b"\x00\x00", 1008),
    ('{"event":"websocket:connected"}', 1003), (connected().replace("16000", "24000"), 1003),
    ('{"event":"websocket:connected","content-type":"audio/pcmu;rate=8000"}', 1003),
])
def test_malformed_before_the_call_closes_at_once(bad: str | bytes, code: int) -> None:
    s, host, conn, clock = session(start=False)
    feed(s, bad)
    assert conn.closed and conn.close_code == code and s.call is None and host.call is None


def test_no_connected_event_in_time_closes_with_1008() -> None:
    s, host, conn, clock = session(start=False)
    s._no_start()
    assert (conn.close_code, conn.close_reason) == (1008, "no start message")
    assert host.counters["ws_malformed_no_start"] == 1


VONAGE_BAD: dict[str, tuple[str | bytes, int]] = {
    "bad_json": ("{not json", 1007),
    "bad_message": ("[1, 2]", 1007),
    "bad_media": (b"\x00\x01\x02", 1007),
    "media_too_large": (bytes(32002), 1009),
    "bad_mark": ('{"event":"websocket:notify","payload":{"customKey":"customValue"}}', 1007),
    "bad_dtmf": ('{"event":"websocket:dtmf","digit":"Z","duration":260}', 1007),
}


@pytest.mark.parametrize("bad", list(VONAGE_BAD))
def test_mid_call_malformed_is_counted_dropped_then_the_budget_closes(bad: str) -> None:
    s, host, conn, clock = session(fault_max=20, fault_window_s=10.0)
    msg, code = VONAGE_BAD[bad]
    for _ in range(20):
        feed(s, msg)
        clock.t += 0.01
        feed(s, pcm(16000).tobytes())
    assert not conn.closed and host.counters[f"ws_malformed_{bad}"] == 20 and len(host.audio) == 20
    assert s.call.stats.malformed == 20
    feed(s, msg)
    reason = BUDGET_REASON.format(21, 10)
    assert (conn.close_code, conn.close_reason) == (code, reason) and s.call.end_reason == reason


def test_unknown_events_repeated_connected_and_cleared_are_never_charged() -> None:
    s, host, conn, clock = session(hangup_on_error=True)
    for _ in range(3):
        feed(s, '{"event":"websocket:future"}')
        feed(s, '{"no_event":1}')
        feed(s, connected(8000))
        feed(s, vonage.VonageStream.cleared())
    assert not conn.closed and s.rate == 16000
    assert host.counters["ws_malformed_unknown_event"] == 6
    assert host.counters["ws_malformed_duplicate_start"] == 3 and s.call.stats.malformed == 9


# -- the handshake ----------------------------------------------------------------------------

SECRET = "s" * 32
VONAGE_ONLY = [{"path": "/vonage", "protocol": "vonage", "agent": "echo"}]


def check(path: str, pairs: list[tuple[str, str]], **cfg: Any) -> Any:
    return ws_auth.vonage_auth(WebSocketConfig.from_section(cfg), ROUTE, path, Headers(pairs))


@pytest.mark.parametrize(("cfg", "want"), [
    ({}, ws_auth.UNCONFIGURED),  # loopback is not trusted by default
    ({"trust_loopback": True}, ws_auth.OPEN),  # a trusted loopback listener (make run)
    ({"host": "0.0.0.0", "routes": VONAGE_ONLY, "allow_unauthenticated": True}, ws_auth.OPEN),  # a lab
])
def test_without_a_secret_only_a_loopback_or_lab_listener_lets_vonage_in(cfg: dict[str, Any], want: Any) -> None:
    assert check("/vonage", [], **cfg) is want
    with pytest.raises(ConfigError, match="native_secret"):  # any other listener: refused at start
        WebSocketConfig.from_section({"host": "0.0.0.0", "routes": VONAGE_ONLY})
    assert WebSocketConfig.from_section({"routes": VONAGE_ONLY}).missing_credentials() == \
        [("native_secret", "vonage")]


def bearer(value: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {value}")]  # the endpoint's authorization, type custom


@pytest.mark.parametrize(("path", "pairs", "want"), [
    ("/vonage", bearer(SECRET), ws_auth.OPEN),
    (f"/vonage?token={SECRET}", [], ws_auth.OPEN),
    # tokens are minted when the case runs, not at collection (a long suite outlives their ttl)
    ("/vonage", lambda: bearer(ws_auth.mint_token(SECRET, "echo", 600, {"tenant": "a"})), Grant({"tenant": "a"})),
    ("/vonage", lambda: bearer(ws_auth.mint_token(SECRET, "sales", 600)), ws_auth.WRONG_AGENT),
    (lambda: f"/vonage?token={native.sign_token(SECRET, 'echo', int(time.time()) - 5)}", [], ws_auth.EXPIRED_TOKEN),
    ("/vonage", bearer("eyJhbGciOiJSUzI1NiJ9.e30.sig"), ws_auth.BAD_TOKEN),  # authorization type vonage: a JWT
    ("/vonage", [("Authorization", SECRET)], ws_auth.BAD_TOKEN),  # not a Bearer value
    ("/vonage", [], ws_auth.BAD_TOKEN),
    ("/vonage", bearer(SECRET) * 2, ws_auth.BAD_TOKEN),  # a repeated header
])
def test_the_credential_is_the_native_secret_or_a_signed_token_for_the_agent(path: str, pairs: Any,
                                                                             want: Any) -> None:
    path, pairs = (path() if callable(path) else path), (pairs() if callable(pairs) else pairs)
    assert check(path, pairs, native_secret=SECRET) == want
