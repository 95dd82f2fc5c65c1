"""brisvox/wire/native.py: the native ``/ws`` protocol's messages both ways.

A client's messages (``NativeStream``) parse back with the gateway's parsers;
the parsers refuse what the gateway refuses, with the protocol's error codes
(and a close code where the call cannot go on); the gateway's messages are
the bytes ``orjson.dumps`` makes and read back with ``server_message``.
"""

from __future__ import annotations

import orjson
import pytest

from brisvox.wire import native
from brisvox.wire.native import NativeError, NativeStream


def refusal(fn, *args) -> tuple[str, int]:
    with pytest.raises(NativeError) as e:
        fn(*args)
    return e.value.code, e.value.close


# -- client -> gateway -----------------------------------------------------------------------


def test_client_messages_are_compact_json_and_parse_back() -> None:
    s = NativeStream(16000, {"user": "u-17"}, marks="echo")
    assert s.start() == '{"event":"start","rate":16000,"params":{"user":"u-17"},"marks":"echo"}'
    assert NativeStream(8000).start() == orjson.dumps({"event": "start", "rate": 8000}).decode()
    st = native.parse_start(orjson.loads(s.start()))
    assert st == native.Start(16000, True, {"user": "u-17"})
    assert native.parse_start(orjson.loads(NativeStream(8000).start())) == native.Start(8000, False, None)
    assert native.event_name(orjson.loads(s.mark("m1"))) == "mark"
    assert native.mark_name(orjson.loads(s.mark("m1"))) == "m1"
    assert native.parse_dtmf(orjson.loads(s.dtmf("5", 120))) == ("5", 120)
    assert native.parse_dtmf(orjson.loads(s.dtmf("b"))) == ("B", 0)
    assert native.parse_dtmf({"digit": "1", "duration_ms": -5}) == ("1", 0)
    assert native.parse_dtmf({"digit": "1", "duration_ms": "long"}) == ("1", 0)
    assert native.event_name(orjson.loads(s.stop())) == "stop"


def test_start_refusals_and_offered_rates() -> None:
    assert native.parse_start({"rate": 44100}).rate == 44100  # every protocol rate by default
    assert refusal(native.parse_start, {"rate": 44100}, (8000, 16000)) == ("bad_rate", 1003)
    assert refusal(native.parse_start, {"rate": 11025}) == ("bad_rate", 1003)
    assert refusal(native.parse_start, {"rate": "16000"}) == ("bad_rate", 1003)
    assert refusal(native.parse_start, {}) == ("bad_rate", 1003)
    assert refusal(native.parse_start, {"rate": 8000, "marks": "later"}) == ("bad_start", 0)
    # parameters: an oversized or malformed one is dropped whole and counted, never refused
    many = {f"p{i}": "v" * (256 if i % 2 else 257) for i in range(80)}
    start = native.parse_start({"rate": 8000, "params": many})
    assert start.params is not None and len(start.params) == 32 and {len(v) for v in start.params.values()} == {256}
    assert start.dropped == 48
    st = native.parse_start({"rate": 8000, "params": ["a"]})
    assert st.params is None and st.dropped == 1
    st = native.parse_start({"rate": 8000, "params": {"n": 5, "ok": True, "x": None, "l": [1], "c": "a\nb"}})
    assert st.params == {"n": "5", "ok": "true"} and st.dropped == 3


def test_message_refusals_are_recoverable() -> None:
    for bad in ([1, 2], "x", {}, {"event": 5}):
        assert refusal(native.event_name, bad) == ("bad_message", 0)
    assert refusal(native.mark_name, {"event": "mark"}) == ("bad_mark", 0)
    for bad in ({"digit": "Z"}, {"digit": "12"}, {"digit": 5}, {}):
        assert refusal(native.parse_dtmf, bad) == ("bad_dtmf", 0)


# -- gateway -> client -----------------------------------------------------------------------


def test_gateway_messages_are_orjson_bytes() -> None:
    assert native.started("c7f3a9e0100001", 16000, "echo") == orjson.dumps(
        {"event": "started", "call_id": "c7f3a9e0100001", "rate": 16000, "frame_ms": 20, "agent": "echo"})
    assert native.CLEAR == orjson.dumps({"event": "clear"})
    for name in ("brisvox-end-1-1", 'q"uote\\ \n', "é✓"):
        assert native.mark(name) == orjson.dumps({"event": "mark", "name": name})
    assert native.dtmf("123") == orjson.dumps({"event": "dtmf", "digits": "123"})
    assert native.transfer("sip:queue@127.0.0.1") == orjson.dumps({"event": "transfer", "target": "sip:queue@127.0.0.1"})
    assert native.error("unknown_event", "unknown event 'hello'") == orjson.dumps(
        {"event": "error", "code": "unknown_event", "message": "unknown event 'hello'"})
    assert native.stop("client stop") == orjson.dumps({"event": "stop", "reason": "client stop"})


def test_gateway_messages_read_back() -> None:
    def read(data: bytes) -> native.ServerMessage:
        return native.server_message(orjson.loads(data))

    m = read(native.started("c1", 8000, "default"))
    assert (m.event, m.call_id, m.rate, m.frame_ms, m.agent) == ("started", "c1", 8000, 20, "default")
    assert read(native.CLEAR) == native.ServerMessage("clear")
    assert read(native.mark("m")).name == "m"
    assert read(native.dtmf("12")).digits == "12"
    assert read(native.transfer("sip:x")).target == "sip:x"
    e = read(native.error("bad_json", "invalid JSON"))
    assert (e.code, e.message) == ("bad_json", "invalid JSON")
    assert read(native.stop("agent unavailable")).reason == "agent unavailable"
    assert read(b'{"event":"stop"}').reason == ""
    assert read(b'{"event":"hello"}') == native.ServerMessage("hello")
    assert native.server_message([1]).event == "invalid" and native.server_message({"e": 1}).event == "invalid"
    assert read(b'{"event":"started","rate":"x"}').rate == 0
