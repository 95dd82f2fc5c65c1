"""Property: every carrier's ``start`` parser (Twilio, Telnyx, Plivo, Exotel with its URL's
``sample-rate``, Vonage's ``websocket:connected``, native) and the TwiML webhook's request
head return a value or refuse with their typed error, whatever the input: arbitrary JSON in
place of the values of a valid start (Unicode digits among them: ``"²"`` passes
``str.isdigit`` and fails ``int``), byte mutations of it, and numbers sent as strings of any
digits. What a parser returns is in range; the webhook always answers one HTTP status, 400
for a malformed or repeated-header head, never raising and never 500.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.control import twiml
from brisvox.runtime.log_limit import LogLimiter
from brisvox.wire import exotel, native, plivo, telnyx, twilio, vonage
from brisvox.wire.jsontext import MAX_PARAM_NAME, MAX_PARAM_VALUE, MAX_PARAMS, ascii_int
from brisvox.wire.mediastream import CLOSE_CODES, StreamError
from tests.unit.sip_mutations import UNICODE_DIGITS, byte_mutated, json_mutated

PROPS = settings(max_examples=250, deadline=None)

STARTS: dict[str, list[str]] = {
    "twilio": [twilio.TwilioStream(stream_sid="MZp1", call_sid="CA1", account_sid="AC1").start({"From": "+1"})],
    "telnyx": [telnyx.TelnyxStream(fmt=f).start({"a": "b"}, "+1", "+2") for f in telnyx.FORMATS.values()],
    "plivo": [plivo.PlivoStream(fmt=plivo.Format(plivo.L16, 16000)).start("a=b;From=+1"), plivo.PlivoStream().start()],
    "exotel": [exotel.ExotelStream(fmt=f).start({"k": "v"}, "+1", "+2") for f in exotel.FORMATS.values()],
    "vonage": [vonage.VonageStream(vonage.Format(r), {"uuid": "u1", "from": "+1"}).connected() for r in vonage.RATES],
    "native": [native.NativeStream(16000, {"a": "b"}, marks="echo", events=True).start()],
}
digits = st.text(st.sampled_from("0123456789" + UNICODE_DIGITS), min_size=1, max_size=7)


def _bounded(params: dict[str, str] | None) -> None:
    if params is not None:
        assert len(params) <= MAX_PARAMS
        assert all(type(k) is str and 0 < len(k) <= MAX_PARAM_NAME and type(v) is str and len(v) <= MAX_PARAM_VALUE
                   for k, v in params.items())


def parse(kind: str, msg: Any, path: str = "/exotel") -> Any:
    """The start parser of ``kind`` on a decoded message: its value, or None for its typed refusal."""
    if type(msg) is not dict:
        return None
    try:
        if kind == "native":
            s = native.parse_start(msg)
            assert s.rate in native.RATES
        elif kind == "vonage":
            s = vonage.parse_connected(msg)
            assert s.fmt.rate in vonage.RATES
        elif kind == "twilio":
            s = twilio.parse_start(msg)
            assert 0 < len(s.stream_sid) <= twilio.MAX_SID
        elif kind == "telnyx":
            s = telnyx.parse_start(msg)
            assert s.format in telnyx.FORMATS.values() and 0 < len(s.stream_id) <= telnyx.MAX_ID
        elif kind == "plivo":
            s = plivo.parse_start(msg)
            assert s.fmt.rate in plivo.RATES[s.fmt.encoding]
        else:
            s = exotel.parse_start(msg, exotel.rate_from_path(path))
            assert s.format in exotel.FORMATS.values()
    except StreamError as e:
        assert e.kind in CLOSE_CODES and e.code == CLOSE_CODES[e.kind] and e.reason
        return None
    except native.NativeError as e:
        assert kind == "native" and e.code and e.close in (0, 1003)
        return None
    _bounded(s.params)
    assert all(type(v) is str for v in s.ids.values()) if hasattr(s, "ids") else True
    return s


def _decoded(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


@PROPS
@given(st.sampled_from(sorted(STARTS)), st.data())
def test_every_start_parser_returns_or_raises_its_typed_error(kind: str, data: st.DataObject) -> None:
    valid = STARTS[kind]
    raw = data.draw(st.one_of(json_mutated(valid), byte_mutated(valid)))
    path = "/exotel?" + data.draw(st.sampled_from(["", "sample-rate=", "sample-rate=16000&sample-rate=8000"]))
    parse(kind, _decoded(raw), path + data.draw(digits))


# where each carrier's start carries its numbers (rate, channels, bit rate)
NUMBER_FIELDS: dict[str, list[tuple[str, ...]]] = {
    "telnyx": [("start", "media_format", "sample_rate"), ("start", "media_format", "channels")],
    "plivo": [("start", "mediaFormat", "sampleRate")],
    "exotel": [("start", "media_format", "sample_rate"), ("start", "media_format", "bit_rate"),
               ("start", "media_format", "channels")],
    "twilio": [("start", "mediaFormat", "sampleRate"), ("start", "mediaFormat", "channels")],
    "native": [("rate",)],
}


@PROPS
@given(st.sampled_from(sorted(NUMBER_FIELDS)), st.data(), digits)
def test_numbers_as_strings_of_any_digits_are_read_only_from_ascii_digits(kind: str, data: st.DataObject,
                                                                          value: str) -> None:
    msg = orjson.loads(data.draw(st.sampled_from(STARTS[kind])))
    *where, key = data.draw(st.sampled_from(NUMBER_FIELDS[kind]))
    obj = msg
    for k in where:
        obj = obj[k]
    obj[key] = value
    s = parse(kind, msg)
    if ascii_int(value) is None and kind in ("telnyx", "plivo", "exotel"):
        assert s is None  # "²", "١٦": refused, typed (bad_start, 1007)


@PROPS
@given(digits)
def test_the_exotel_urls_sample_rate(value: str) -> None:
    try:
        rate = exotel.rate_from_path(f"/exotel?sample-rate={value}")
    except StreamError as e:
        assert (e.kind, e.code) == ("bad_start", 1007) and ascii_int(value, 6) is None  # at most 6 digits
        return
    assert rate == int(value) and ascii_int(value, 6) == rate


# -- the webhook's request head ---------------------------------------------------------------

HEAD = ("POST /twiml HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 36\r\n\r\nFrom=%2B1&CallSid=CA1&AccountSid=AC1")
HEADER_NAMES = ["Host", "Content-Type", "Content-Length", "X-Twilio-Signature", "Transfer-Encoding",
                "X-Forwarded-For", "X-Other"]
header_value = st.one_of(digits, st.sampled_from(["application/x-www-form-urlencoded", "127.0.0.1", "36", ""]),
                         st.text(max_size=12))


def webhook() -> tuple[twiml.Webhook, SimpleNamespace]:
    cfg = WebSocketConfig.from_section({"twiml_path": "/twiml", "twiml_requests_per_s": 0, "trust_loopback": True})
    server = SimpleNamespace(cfg=cfg, counters={}, bad=LogLimiter(logging.getLogger("test.twiml")),
                             resolve_source=lambda conn, req: None)
    server.count = lambda name, n=1: server.counters.__setitem__(name, server.counters.get(name, 0) + n)
    return twiml.Webhook(server), server  # type: ignore[arg-type]


class Conn:
    def __init__(self) -> None:
        self.source = "127.0.0.1"
        self.out = bytearray()
        self.closed = False
        self.transport = self

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True


def answer(raw: bytes) -> tuple[int, bytes]:
    hook, _ = webhook()
    conn = Conn()
    req = hook.request(conn)  # type: ignore[arg-type]
    req.feed(raw)
    if not conn.out:
        return 0, b""
    head = bytes(conn.out).split(b"\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 ") and conn.closed, head
    return int(head.split()[1]), bytes(conn.out)


@PROPS
@given(st.one_of(byte_mutated([HEAD]), st.binary(max_size=300).map(lambda b: b"POST " + b)))
def test_the_webhook_answers_any_head_with_one_status(raw: bytes) -> None:
    status, _ = answer(raw)
    assert status == 0 or 200 <= status < 500  # 0: incomplete (the handshake timeout drops it); never a 500


@PROPS
@given(st.lists(st.tuples(st.sampled_from(HEADER_NAMES), header_value), max_size=5))
def test_repeated_or_malformed_headers_get_400_never_an_exception(extra: list[tuple[str, str]]) -> None:
    head, _, body = HEAD.partition("\r\n\r\n")
    raw = (head + "".join(f"\r\n{k}: {v}" for k, v in extra) + "\r\n\r\n" + body).encode("utf-8")
    status, out = answer(raw)
    names = ["Host", "Content-Type", "Content-Length"] + [k for k, _ in extra]
    if any(names.count(k) > 1 for k in ("Host", "Content-Type", "Content-Length", "X-Twilio-Signature")):
        assert status == 400, out  # repeated: which one was signed?
    assert status == 0 or 200 <= status < 500, out


def test_the_attackers_heads_get_400() -> None:
    for raw in (HEAD.replace("Content-Length: 36", "Content-Length: \u00b2"),
                HEAD.replace("Content-Length: 36", "Content-Length: \u0663\u0666"),
                HEAD.replace("Host:", "Content-Type: text/plain\r\nHost:"),
                HEAD.replace("Host:", "Host: evil.example\r\nHost:"),
                HEAD.replace("Content-Length: 36", "Content-Length: 36\r\nContent-Length: 36"),
                HEAD.replace("\r\nHost", "\r\n Host")):
        status, out = answer(raw.encode())
        assert status == 400, (raw, out)
    assert answer(HEAD.encode())[0] == 200
