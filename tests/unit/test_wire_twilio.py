"""brisvox/wire/twilio.py: Twilio Media Streams messages both ways.

What Twilio sends (``TwilioStream``) counts like Twilio and parses back with
the gateway's parsers; the parsers refuse what the gateway refuses, with its
counter labels and close codes; what a bot sends (``BotStream``) is the same
bytes ``orjson.dumps`` makes, valid JSON whatever a name holds; a bot message
is read the same by the message parser and the load generator's fast one;
the request signature matches Twilio's documented example.
"""

from __future__ import annotations

import base64
import json

import orjson
import pytest

from brisvox.wire import twilio
from brisvox.wire.twilio import TwilioError

SID = "MZ00000000000000000000000000000001"


def loads(text: str | bytes) -> dict:
    msg = orjson.loads(text)
    assert type(msg) is dict
    return msg


def refusal(fn, msg) -> tuple[str, int]:
    with pytest.raises(TwilioError) as e:
        fn(msg)
    return e.value.kind, e.value.code


# -- Twilio -> bot ---------------------------------------------------------------------------


def test_twilio_messages_count_like_twilio() -> None:
    s = twilio.TwilioStream(7, tag="t")
    assert json.loads(s.connected())["event"] == "connected"
    start = json.loads(s.start({"user": "u1"}))
    assert start["sequenceNumber"] == "1" and start["start"]["streamSid"] == "MZt000007"
    assert start["start"]["customParameters"] == {"user": "u1"}
    assert start["start"]["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
    m1 = json.loads(s.media("AAA="))
    m2 = json.loads(s.media("AAA="))
    assert (m1["sequenceNumber"], m1["media"]["chunk"], m1["media"]["timestamp"]) == ("2", "1", "0")
    assert (m2["sequenceNumber"], m2["media"]["chunk"], m2["media"]["timestamp"]) == ("3", "2", "20")
    assert m1["media"]["track"] == "inbound" and m1["streamSid"] == "MZt000007"
    d = json.loads(s.dtmf("5"))
    assert d["event"] == "dtmf" and d["dtmf"]["digit"] == "5" and d["sequenceNumber"] == "4"
    mk = json.loads(s.mark("m1"))
    assert mk["mark"]["name"] == "m1" and mk["streamSid"] == "MZt000007"
    stop = json.loads(s.stop())
    assert stop["event"] == "stop" and stop["stop"]["callSid"] == "CAt000007"


def test_media_text_is_head_payload_tail() -> None:
    """The pieces the load generator pre-encodes, in the exact text Twilio's media has."""
    s = twilio.TwilioStream(3, stream_sid=SID)
    s.start()
    text = s.media("AAEC")
    assert text == ('{"event":"media","sequenceNumber":"2","media":{"track":"inbound","chunk":"1",'
                    f'"timestamp":"0","payload":"AAEC"}},"streamSid":"{SID}"}}')
    assert text == twilio.MEDIA_HEAD.format(2, 1, 0) + "AAEC" + s.media_tail


def test_start_parses_back_with_ids_and_bounded_parameters() -> None:
    s = twilio.TwilioStream(stream_sid=SID, call_sid="CA1", account_sid="AC1")
    st = twilio.parse_start(loads(s.start({"lang": "en"})))
    assert st == twilio.Start(SID, "CA1", "AC1", {"lang": "en"})
    assert st.ids == {"streamSid": SID, "callSid": "CA1", "accountSid": "AC1"}
    # the minimal shape: the sid outside start, no ids, no parameters
    st = twilio.parse_start({"event": "start", "streamSid": SID, "start": {}})
    assert st.ids == {"streamSid": SID} and st.params is None
    # a malformed or oversized id or parameter is dropped whole and counted, never refused
    many = {f"k{i}" + "x" * (60 if i % 2 else 70): i for i in range(80)}
    st = twilio.parse_start({"start": {"streamSid": SID, "callSid": "C" * 300, "accountSid": 5,
                                       "customParameters": many}})
    assert st.call_sid is None and st.account_sid is None and st.ids == {"streamSid": SID}
    assert st.params is not None and len(st.params) == 32
    assert all(len(k) <= 64 and type(v) is str for k, v in st.params.items())
    assert st.dropped == 2 + 48
    # TwiML's <Parameter name="From" value="{{From}}"/>: the caller and the called number
    st = twilio.parse_start(loads(s.start({"From": "+15550100", "To": "+15550199", "lang": "en"})))
    assert st.numbers == ("+15550100", "+15550199") and st.dropped == 0
    assert twilio.parse_start(loads(s.start({"caller": "ada"}))).numbers == ("ada", "")


@pytest.mark.parametrize("msg, kind, code", [
    ({"event": "start"}, "bad_start", 1007),
    ({"start": []}, "bad_start", 1007),
    ({"start": {}}, "bad_start", 1007),
    ({"start": {"streamSid": 5}}, "bad_start", 1007),
    ({"start": {"streamSid": 'MZ"x'}}, "bad_start", 1007),
    ({"start": {"streamSid": "MZ\\x"}}, "bad_start", 1007),
    ({"start": {"streamSid": "M" * 129}}, "bad_start", 1007),
    ({"start": {"streamSid": SID, "mediaFormat": {"encoding": "audio/l16"}}}, "bad_media_format", 1003),
    ({"start": {"streamSid": SID, "mediaFormat": {"sampleRate": 16000}}}, "bad_media_format", 1003),
    ({"start": {"streamSid": SID, "mediaFormat": {"channels": 2}}}, "bad_media_format", 1003),
    ({"start": {"streamSid": SID, "mediaFormat": "mulaw"}}, "bad_media_format", 1003),
])
def test_a_bad_start_is_refused(msg: dict, kind: str, code: int) -> None:
    assert refusal(twilio.parse_start, msg) == (kind, code)


def test_media_payload_round_trip_and_refusals() -> None:
    s = twilio.TwilioStream(stream_sid=SID)
    ulaw = bytes(range(160))
    assert twilio.media_payload(loads(s.media(base64.b64encode(ulaw).decode()))) == ulaw
    assert twilio.media_payload({"media": {"payload": ""}}) == b""
    assert twilio.media_payload({"media": {"track": "inbound_track", "payload": "AAEC"}}) == b"\x00\x01\x02"
    assert twilio.media_payload({"media": {"track": "outbound", "payload": "AAEC"}}) is None
    assert refusal(twilio.media_payload, {"media": {}}) == ("bad_media", 1007)
    assert refusal(twilio.media_payload, {"media": "AAEC"}) == ("bad_media", 1007)
    assert refusal(twilio.media_payload, {"media": {"payload": "@@@not base64"}}) == ("bad_base64", 1007)
    assert refusal(twilio.media_payload, {"media": {"payload": "AAE"}}) == ("bad_base64", 1007)  # strict
    big = base64.b64encode(b"\xff" * (twilio.MAX_MEDIA_BYTES + 1)).decode()
    assert refusal(twilio.media_payload, {"media": {"payload": big}}) == ("media_too_large", 1009)


def test_mark_and_dtmf_parse_back_and_refusals() -> None:
    s = twilio.TwilioStream(stream_sid=SID)
    assert twilio.mark_name(loads(s.mark("brisvox-end-3-1"))) == "brisvox-end-3-1"
    assert twilio.dtmf_digit(loads(s.dtmf("5"))) == "5"
    assert twilio.dtmf_digit(loads(s.dtmf("a"))) == "A"
    assert refusal(twilio.mark_name, {"mark": {}}) == ("bad_mark", 1007)
    assert refusal(twilio.mark_name, {"mark": {"name": 3}}) == ("bad_mark", 1007)
    for bad in ({"dtmf": {"digit": "Z"}}, {"dtmf": {"digit": "12"}}, {"dtmf": {}}, {"dtmf": "5"}):
        assert refusal(twilio.dtmf_digit, bad) == ("bad_dtmf", 1007)


def test_every_refusal_kind_has_a_close_code() -> None:
    assert TwilioError("no_start", "x").code == 1008 and TwilioError("binary_frame", "x").code == 1003
    with pytest.raises(KeyError):
        TwilioError("not_a_kind", "x")


# -- bot -> Twilio ---------------------------------------------------------------------------


def test_bot_messages_are_orjson_bytes() -> None:
    out = twilio.BotStream(SID)
    ulaw = bytes(range(160))
    assert out.media(ulaw) == orjson.dumps(
        {"event": "media", "streamSid": SID, "media": {"payload": base64.b64encode(ulaw).decode()}})
    assert out.media(ulaw) == out.media_prefix + base64.b64encode(ulaw) + twilio.MEDIA_SUFFIX
    assert out.clear == orjson.dumps({"event": "clear", "streamSid": SID})
    for name in ("brisvox-end-3-1", 'a "quoted" \\ name\n\t\x01', "é✓"):
        assert out.mark(name) == orjson.dumps({"event": "mark", "streamSid": SID, "mark": {"name": name}})
    odd = twilio.BotStream("MZ\nx")  # never accepted by parse_start, still valid JSON
    assert orjson.loads(odd.clear)["streamSid"] == "MZ\nx"


BOT_MESSAGES = [
    b'{"event":"media","streamSid":"MZ1","media":{"payload":"' + base64.b64encode(b"\xff" * 160) + b'"}}',
    b'{"event": "media", "streamSid": "MZ1", "media": {"payload": "AAEC"}}',
    b'{"event":"mark","streamSid":"MZ1","mark":{"name":"brisvox-end-1-1"}}',
    b'{"event":"mark","streamSid":"MZ1"}',
    b'{"event":"clear","streamSid":"MZ1"}',
    b'{"event":"stop"}',
    b'{"streamSid":"MZ1"}',
    b'{"event":"media","media":{}}',
    b'{"event":"media","media":{"payload":"%%%"}}',
    b'{"event":"media","media":{"payload":"\xc3\xa9"}}',
    b'{"event":"media","media":{"payload":5}}',
    b'{"event":"mark","mark":"x"}',
    b'[1, 2]',
    b'"media"',
    b'null',
]


@pytest.mark.parametrize("data", BOT_MESSAGES)
def test_the_fast_reader_reads_as_the_message_parser(data: bytes) -> None:
    msg = orjson.loads(data)
    event, value = twilio.bot_event(msg)
    ref = twilio.bot_message(msg)
    assert event == ref.event
    if event == "media":
        assert value == ref.payload
    elif event == "mark":
        assert value == ref.name
    else:
        assert value is None


def test_bot_messages_parse_back() -> None:
    out = twilio.BotStream(SID)
    m = twilio.bot_message(loads(out.media(b"\xff" * 160)))
    assert (m.event, m.payload, m.stream_sid) == ("media", b"\xff" * 160, SID)
    assert twilio.bot_message(loads(out.mark("a"))) == twilio.BotMessage("mark", name="a", stream_sid=SID)
    assert twilio.bot_message(loads(out.clear)).event == "clear"
    assert twilio.bot_event(loads(out.mark("a"))) == ("mark", "a")
    assert twilio.bot_event(loads(b'{"event":"stop"}')) == ("stop", None)
    assert twilio.bot_event(loads(b'{"event":""}')) == ("other", None)
    assert twilio.bot_message(loads(b'{"event":"media"}')).event == "invalid"
    assert twilio.bot_message(None).event == "invalid"


def test_signature_matches_twilios_example() -> None:
    """The example of Twilio's "Webhooks security" page."""
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
              "From": "+12349013030", "To": "+18005551212"}
    assert twilio.signature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", params) \
        == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
