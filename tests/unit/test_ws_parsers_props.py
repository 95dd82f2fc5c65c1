"""Property: the Twilio and native JSON message parsers return a value or raise their typed
error (TwilioError, NativeError; a JSON decode error before them) for any text frame
(arbitrary bytes, byte mutations of valid messages, and valid messages whose values were
replaced by arbitrary JSON or removed), and what they return is in range. The gateway's
sessions fed the same frames never raise, and close only with a documented code."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.gateway.carriers.native import FAULT_CLOSE_CODES
from brisvox.wire import native, twilio
from brisvox.wire.dtmf import DIGITS
from brisvox.wire.jsontext import MAX_PARAM_NAME, MAX_PARAM_VALUE, MAX_PARAMS
from tests.unit.sip_mutations import byte_mutated, json_mutated
from tests.unit.test_gateway_ws_faults import session

PROPS = settings(max_examples=300, deadline=None)
SID = "MZprops0001"
TW = twilio.TwilioStream(stream_sid=SID, call_sid="CA1", account_sid="AC1")
TWILIO_VALID = [TW.connected(), TW.start({"lang": "fr"}), TW.media("/////w=="), TW.mark("m1"), TW.dtmf("5"),
                TW.stop(), twilio.BotStream(SID).media(b"\xff" * 160).decode()]
NATIVE_VALID = [native.NativeStream(16000, {"a": "b"}, marks="echo").start(), native.NativeStream.mark("m"),
                native.NativeStream.dtmf("#", 120), native.NativeStream.stop()]
TWILIO_CODES = set(twilio.CLOSE_CODES.values()) | {1000, 1013, 1011}
NATIVE_CODES = set(FAULT_CLOSE_CODES.values()) | {1000, 1003, 1008, 1011, 1013}


def frames(valid: list[str]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=300), json_mutated(valid), byte_mutated(valid))


def twilio_parse(data: bytes) -> Any:
    """What the gateway's Twilio session asks of the wire for one text frame."""
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(msg) is not dict:
        return None
    try:
        ev = msg.get("event")
        if ev == "start":
            start = twilio.parse_start(msg)
            assert 0 < len(start.stream_sid) <= twilio.MAX_SID and '"' not in start.stream_sid
            assert all(len(v) <= twilio.MAX_SID for v in start.ids.values())
            _bounded(start.params)
            return start
        if ev == "media":
            raw = twilio.media_payload(msg)
            assert raw is None or (type(raw) is bytes and len(raw) <= twilio.MAX_MEDIA_BYTES)
            return raw
        if ev == "mark":
            name = twilio.mark_name(msg)
            assert type(name) is str
            return name
        if ev == "dtmf":
            digit = twilio.dtmf_digit(msg)
            assert digit in DIGITS
            return digit
    except twilio.TwilioError as e:
        assert e.kind in twilio.CLOSE_CODES and e.code == twilio.CLOSE_CODES[e.kind]
    return None


def native_parse(data: bytes) -> Any:
    """What the gateway's native session asks of the wire for one text frame."""
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    try:
        ev = native.event_name(msg)
        if ev == "start":
            start = native.parse_start(msg)
            assert start.rate in native.RATES
            _bounded(start.params)
            return start
        if ev == "mark":
            return native.mark_name(msg)
        if ev == "dtmf":
            digit, dur = native.parse_dtmf(msg)
            assert digit in DIGITS and type(dur) is int and dur >= 0
            return digit
    except native.NativeError as e:
        assert e.code and e.close in (0, 1003)
    return None


def _bounded(params: dict[str, str] | None) -> None:
    if params is not None:
        assert len(params) <= MAX_PARAMS
        assert all(type(k) is str and len(k) <= MAX_PARAM_NAME and type(v) is str and len(v) <= MAX_PARAM_VALUE
                   for k, v in params.items())


@PROPS
@given(frames(TWILIO_VALID))
def test_twilio_parsers(data: bytes) -> None:
    twilio_parse(data)


@PROPS
@given(frames(NATIVE_VALID))
def test_native_parsers(data: bytes) -> None:
    native_parse(data)


@PROPS
@given(st.sampled_from(("twilio", "native")), st.booleans(), st.lists(frames(TWILIO_VALID + NATIVE_VALID),
                                                                         min_size=1, max_size=6))
def test_sessions_never_raise_and_close_with_a_documented_code(kind: str, started: bool,
                                                                 msgs: list[bytes]) -> None:
    s, host, conn, clock = session(kind, start=started, fault_max=3, fault_window_s=10.0)
    for m in msgs:
        s.on_text(m)
        clock.t += 0.01
    if conn.closed:
        assert conn.close_code in (TWILIO_CODES if kind == "twilio" else NATIVE_CODES), conn.close_code
