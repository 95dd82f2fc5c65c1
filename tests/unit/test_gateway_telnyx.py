"""The Telnyx leg (brisvox.gateway.carriers.telnyx) and its handshake check, against a recording host.

* ``start`` admits the call at the stream's rate, with its metadata (ids,
  parameters or a signed token's, ``from``/``to``), malformed ones dropped
  and counted; a full gateway closes with 1013;
* media of each format reaches the call decoded; the bot's audio goes out in
  the same format (L16 big-endian), marks and clear as documented, digits
  in-band at the stream's rate;
* malformed input closes at once before the call, is counted and charged
  to the fault budget during it; unknown events, repeated starts and
  Telnyx's own ``error`` frames are counted, never charged;
* ``telnyx_auth``: the stream token header or ``?token=`` is the native
  secret or a signed token for the route's agent; without ``native_secret``
  only a loopback (or ``allow_unauthenticated``) listener lets anyone in.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.datastructures import Headers

from brisvox.config.errors import ConfigError
from brisvox.gateway.carriers.telnyx import TRANSFER_REASON, TelnyxSession
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.core.calls import AdmissionError
from brisvox.gateway.ws import auth as ws_auth
from brisvox.gateway.ws.auth import Grant
from brisvox.wire import dtmf, native, telnyx
from brisvox.wire.g711 import PCMA, PCMU
from tests.unit.test_gateway_ws_faults import BUDGET_REASON, Clock, Conn, Host

ROUTE = WsRoute("/telnyx", "telnyx", "echo")
PCM = np.full(160, 1000, np.int16)


class RecordingHost(Host):
    def __init__(self, **websocket: Any) -> None:
        super().__init__(**websocket)
        self.marks: list[str] = []
        self.digits: list[str] = []
        self.rates: list[int] = []
        self.full = False

    def admit(self, transport: str, agent: str, call_rate: int, **kw: Any) -> Any:
        if self.full:
            raise AdmissionError("full")
        self.rates.append(call_rate)
        return super().admit(transport, agent, call_rate, **kw)

    def mark_echo(self, call: Any, name: str) -> None:
        self.marks.append(name)

    def dtmf_in(self, call: Any, digit: str, duration_ms: int) -> None:
        self.digits.append(digit)


def session(fmt: telnyx.MediaFormat = telnyx.DEFAULT_FORMAT, start: bool = True, grant: Grant | None = None,
            **websocket: Any) -> tuple[TelnyxSession, RecordingHost, Conn, Clock, telnyx.TelnyxStream]:
    host, conn, clock = RecordingHost(**websocket), Conn(), Clock()
    if grant is not None:
        conn.grant = grant  # type: ignore[attr-defined]
    s = TelnyxSession(host, conn, ROUTE)  # type: ignore[arg-type]
    s.clock = clock
    tx = telnyx.TelnyxStream(1, "t", fmt=fmt)
    if start:
        s.on_text(tx.connected().encode())
        s.on_text(tx.start({"lang": "en"}, caller="+1555", called="+1666").encode())
        assert s.call is not None and not conn.closed
    return s, host, conn, clock, tx


def feed(s: TelnyxSession, msg: str | bytes) -> None:
    if isinstance(msg, bytes):
        s.on_binary(msg)
    else:
        s.on_text(msg.encode())


def media(tx: telnyx.TelnyxStream, wire: bytes) -> str:
    return tx.media(base64.b64encode(wire).decode())


# -- the call -----------------------------------------------------------------------------


def test_start_admits_the_call_with_its_metadata() -> None:
    s, host, conn, clock, tx = session()
    call = s.call
    assert host.rates == [8000] and s.stream_id == tx.stream_id
    assert call.transport_ids["stream_id"] == tx.stream_id
    assert call.transport_ids["call_control_id"] == tx.call_control_id
    assert call.params == {"lang": "en"} and (call.caller, call.called) == ("+1555", "+1666")
    assert "call_params_dropped" not in host.counters


def test_a_signed_tokens_parameters_replace_the_streams() -> None:
    s, *_ = session(grant=Grant({"tenant": "a"}))
    assert s.call.params == {"tenant": "a"}


def test_dropped_metadata_is_counted_and_a_full_gateway_closes_with_1013() -> None:
    s, host, conn, clock, tx = session(start=False)
    start = orjson.loads(tx.start())
    start["start"]["call_control_id"] = "x" * 500
    feed(s, orjson.dumps(start).decode())
    assert host.counters["call_params_dropped"] == 1 and "call_control_id" not in s.call.transport_ids
    s, host, conn, clock, tx = session(start=False)
    host.full = True
    feed(s, tx.start())
    assert (conn.close_code, conn.close_reason) == (1013, "try again later") and s.call is None


@pytest.mark.parametrize(("key", "wire"), [
    (("PCMU", 8000), PCMU.encode(PCM).tobytes()),
    (("PCMA", 8000), PCMA.encode(PCM).tobytes()),
    (("L16", 8000), PCM.astype(">i2").tobytes()),
    (("L16", 16000), np.full(320, 1000, ">i2").tobytes()),
])
def test_each_format_both_ways(key, wire) -> None:
    fmt = telnyx.FORMATS[key]
    s, host, conn, clock, tx = session(fmt)
    assert host.rates == [fmt.rate] and s.rate == fmt.rate
    feed(s, media(tx, wire))
    assert len(host.audio) == 1 and np.array_equal(host.audio[0], fmt.codec.decode(wire))
    outbound = orjson.loads(media(tx, wire))
    outbound["media"]["track"] = "outbound"
    feed(s, orjson.dumps(outbound).decode())
    assert len(host.audio) == 1  # the bot's own audio, not the caller's
    samples = np.full(fmt.frame, 1000, np.int16)
    assert s.send_audio(samples, 0.0)
    sent = orjson.loads(conn.texts[-1])
    assert list(sent) == ["event", "media"] and list(sent["media"]) == ["payload"]
    assert base64.b64decode(sent["media"]["payload"]) == fmt.codec.encode(samples).tobytes()
    assert s.call.stats.packets_out == 1


def test_marks_clear_digits_stop_and_transfer() -> None:
    s, host, conn, clock, tx = session()
    s.send_mark("m1")
    s.send_clear()
    assert [orjson.loads(t) for t in conn.texts] == [{"event": "mark", "mark": {"name": "m1"}}, {"event": "clear"}]
    feed(s, tx.mark("m1"))
    feed(s, tx.dtmf("5"))
    assert host.marks == ["m1"] and host.digits == ["5"]
    done: list[tuple[bool, str]] = []
    s.transfer("sip:op@x", lambda ok, why: done.append((ok, why)))
    assert done == [(False, TRANSFER_REASON)]
    feed(s, tx.stop())
    assert (conn.close_code, conn.close_reason) == (1000, "stop") and s.call.end_reason == "stop"


@pytest.mark.parametrize("key", [("PCMU", 8000), ("L16", 16000)])
def test_digits_out_are_in_band_tones_at_the_streams_rate(key) -> None:
    fmt = telnyx.FORMATS[key]
    s, host, conn, clock, tx = session(fmt)
    assert s.send_dtmf("7Z") == 1
    frames = []
    while s.tick_dtmf(time.monotonic()):
        frames.append(fmt.codec.decode(base64.b64decode(orjson.loads(conn.texts[-1])["media"]["payload"])))
    assert all(len(f) == fmt.frame for f in frames[:-1])
    x = np.concatenate(frames)[:fmt.rate // 10].astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    freqs = np.fft.rfftfreq(len(x), 1 / fmt.rate)

    def power(f: float) -> float:
        return float(spec[np.abs(freqs - f) < 15].max())

    lo, hi = dtmf.FREQS["7"]
    assert min(power(lo), power(hi)) > 10 * max(power(697), power(1477))
    s.send_dtmf("1")
    s.send_clear()
    assert not s.tick_dtmf(0.0)  # a Clear drops the tones


def test_hangup_closes_with_the_reasons_code() -> None:
    s, host, conn, clock, tx = session()
    s.hangup("stage_failed: asr")
    assert (conn.close_code, s.call.end_reason) == (1011, "stage_failed: asr")


# -- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "code"), [
    ("{not json", 1007), ("[1]", 1007), (b"\x00", 1003), ('{"event":"media","media":{"payload":""}}', 1008),
    ('{"event":"start"}', 1007), ('{"event":"start","stream_id":"s","start":{"media_format":{"encoding":"G722"}}}', 1003),
])
def test_malformed_before_the_call_closes_at_once(bad, code) -> None:
    s, host, conn, clock, tx = session(start=False)
    feed(s, bad)
    assert conn.closed and conn.close_code == code and s.call is None and host.call is None


TELNYX_BAD: dict[str, tuple[str | bytes, int]] = {
    "bad_json": ("{not json", 1007),
    "bad_message": ("[1, 2]", 1007),
    "bad_media": ('{"event":"media","media":{}}', 1007),
    "bad_base64": ('{"event":"media","media":{"payload":"@@@"}}', 1007),
    "bad_mark": ('{"event":"mark","mark":{}}', 1007),
    "bad_dtmf": ('{"event":"dtmf","dtmf":{"digit":"Z"}}', 1007),
    "binary_frame": (b"\x00\x01", 1003),
    "media_too_large": (telnyx.BotStream().media(b"\xff" * 8001).decode(), 1009),
}


@pytest.mark.parametrize("bad", list(TELNYX_BAD))
def test_mid_call_malformed_is_counted_dropped_then_the_budget_closes(bad) -> None:
    s, host, conn, clock, tx = session(fault_max=20, fault_window_s=10.0)
    msg, code = TELNYX_BAD[bad]
    for _ in range(20):
        feed(s, msg)
        clock.t += 0.01
        feed(s, media(tx, PCMU.encode(PCM).tobytes()))
    assert not conn.closed and host.counters[f"ws_malformed_{bad}"] == 20 and len(host.audio) == 20
    feed(s, msg)
    reason = BUDGET_REASON.format(21, 10)
    assert (conn.close_code, conn.close_reason) == (code, reason) and s.call.end_reason == reason


def test_an_odd_l16_payload_is_bad_media() -> None:
    s, host, conn, clock, tx = session(telnyx.FORMATS["L16", 16000], hangup_on_error=True)
    feed(s, media(tx, b"\x00\x01\x02"))
    assert (conn.close_code, conn.close_reason) == (1007, "L16 payload of odd length")


def test_unknown_events_repeated_starts_and_telnyx_errors_are_never_charged() -> None:
    s, host, conn, clock, tx = session(hangup_on_error=True)
    for _ in range(3):
        feed(s, '{"event":"future_event"}')
        feed(s, tx.start())
        feed(s, tx.error("100005", "rate_limit_reached", "Too many requests"))
        feed(s, tx.connected())
    assert not conn.closed
    assert host.counters["ws_malformed_unknown_event"] == 3
    assert host.counters["ws_malformed_duplicate_start"] == 3
    assert host.counters["ws_telnyx_errors"] == 3 and s.call.stats.malformed == 6


# -- the handshake ----------------------------------------------------------------------------


def auth(path: str = "/telnyx", headers: dict[str, str] | list[tuple[str, str]] | None = None,
         route: WsRoute = ROUTE, **cfg: Any) -> Any:
    h = Headers()
    for k, v in (headers.items() if isinstance(headers, dict) else headers or []):
        h[k] = v
    return ws_auth.telnyx_auth(WebSocketConfig.from_section(cfg), route, path, h)


TELNYX_ONLY = [{"path": "/telnyx", "protocol": "telnyx", "agent": "echo"}]


def test_without_a_secret_only_a_loopback_or_lab_listener_lets_telnyx_in() -> None:
    assert auth() is ws_auth.UNCONFIGURED  # loopback is not trusted by default
    assert auth(trust_loopback=True) is ws_auth.OPEN
    with pytest.raises(ConfigError, match="native_secret"):  # refused at start, naming the key
        auth(host="0.0.0.0", routes=TELNYX_ONLY)
    assert auth(host="0.0.0.0", routes=TELNYX_ONLY, allow_unauthenticated=True) is ws_auth.OPEN


def test_the_stream_token_is_the_native_secret_or_a_signed_token_for_the_agent() -> None:
    secret = "s" * 32
    hdr = telnyx.AUTH_HEADER
    assert auth(headers={hdr: secret}, native_secret=secret) is ws_auth.OPEN
    assert auth(f"/telnyx?token={secret}", native_secret=secret) is ws_auth.OPEN
    tok = ws_auth.mint_token(secret, "echo", 60, {"tenant": "a"})
    assert auth(headers={hdr: tok}, native_secret=secret) == Grant({"tenant": "a"})
    assert auth(headers={hdr: ws_auth.mint_token(secret, "sales", 60)}, native_secret=secret) is ws_auth.WRONG_AGENT
    expired = native.sign_token(secret, "echo", int(time.time()) - 5)
    assert auth(headers={hdr: expired}, native_secret=secret) is ws_auth.EXPIRED_TOKEN
    for bad in ({}, {hdr: "nope"}, {"Authorization": f"Bearer {secret}"}):
        assert auth(headers=bad, native_secret=secret) is ws_auth.BAD_TOKEN
    repeated = [(hdr, secret), (hdr, secret)]
    assert auth(headers=repeated, native_secret=secret) is ws_auth.BAD_TOKEN
    # the header, when sent, is the credential: a query token does not rescue a bad one
    assert auth(f"/telnyx?token={secret}", headers={hdr: "nope"}, native_secret=secret) is ws_auth.BAD_TOKEN
