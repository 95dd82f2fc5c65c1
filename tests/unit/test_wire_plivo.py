"""brisvox/wire/plivo.py: Plivo Audio Streams messages both ways.

The vendor's documented example messages parse as documented (each fixture
names its page); what Plivo sends (``PlivoStream``) parses back with the
gateway's parsers; the parsers refuse what the gateway refuses, with its
counter labels and close codes; what a bot sends (``BotStream``) is the
documented shape, the same bytes ``orjson.dumps`` makes, valid JSON whatever
a name holds; the three documented formats round-trip and no other is
accepted; the V3 signature signs the URL as Plivo's SDK canonicalizes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import numpy as np
import orjson
import pytest

from brisvox.wire import plivo
from brisvox.wire.g711 import PCMU
from brisvox.wire.plivo import L16, MULAW, Format, PlivoError

# plivo.com/docs/voice-agents/audio-streaming/concepts/audio-streaming-reference ("start")
DOC_START = """{
  "event": "start",
  "sequenceNumber": 1,
  "start": {
    "callId": "12345678-1234-1234-1234-123456789abc",
    "streamId": "87654321-4321-4321-4321-cba987654321",
    "accountId": "MAXXXXXXXXXXXXXXXXXX",
    "tracks": ["inbound"],
    "mediaFormat": {
      "encoding": "audio/x-mulaw",
      "sampleRate": 8000
    }
  },
  "extra_headers": "userId=12345;sessionId=abc-xyz"
}"""
# the same page ("media"); the page's payload is cut with "...": here its first 32 characters
DOC_MEDIA = """{
  "event": "media",
  "sequenceNumber": 42,
  "streamId": "87654321-4321-4321-4321-cba987654321",
  "media": {
    "track": "inbound",
    "timestamp": "1705312200000",
    "chunk": 41,
    "payload": "//uQxAAAAAANIAAAAAExBTUUzLjEwMFV"
  },
  "extra_headers": "userId=12345;sessionId=abc-xyz"
}"""
# plivo.com/docs/voice/xml/the-stream-element/checkpoint-event (request, response)
DOC_CHECKPOINT = '{"event": "checkpoint", "streamId": "20170ada-f610-433b-8758-c02a2aab3662", "name": "customer greeting audio"}'
DOC_PLAYED = '{"event": "playedStream", "streamId": "20170ada-f610-433b-8758-c02a2aab3662", "name": "customer greeting audio"}'
# support.plivo.com "Can I interrupt and clear buffered audio?" (request, response)
DOC_CLEAR = '{"event": "clearAudio", "streamId": "b77e037d-4119-44b5-902d-25826b654539"}'
DOC_CLEARED = '{"sequenceNumber": 0, "event": "clearedAudio", "streamId": "20170ada-f610-433b-8758-c02a2aab3662"}'
# support.plivo.com "What is the expected payload format to send audio to Plivo?"
DOC_PLAY_KEYS = {"event": "playAudio", "media": {"contentType", "sampleRate", "payload"}}
SID = "87654321-4321-4321-4321-cba987654321"


def loads(text: str | bytes) -> dict:
    msg = orjson.loads(text)
    assert type(msg) is dict
    return msg


def refusal(fn, *args) -> tuple[str, int]:
    with pytest.raises(PlivoError) as e:
        fn(*args)
    return e.value.kind, e.value.code


# -- the documented examples ----------------------------------------------------------------


def test_the_documented_start_parses_with_its_ids_format_and_extra_headers() -> None:
    st = plivo.parse_start(loads(DOC_START))
    assert st.stream_id == SID and st.fmt == Format(MULAW, 8000)
    assert st.ids == {"streamId": SID, "callId": "12345678-1234-1234-1234-123456789abc",
                      "accountId": "MAXXXXXXXXXXXXXXXXXX"}
    assert st.params == {"userId": "12345", "sessionId": "abc-xyz"} and st.dropped == 0
    assert st.numbers == ("", "")


def test_the_documented_media_checkpoint_and_clear_messages() -> None:
    raw = plivo.media_payload(loads(DOC_MEDIA), Format())
    assert raw == base64.b64decode("//uQxAAAAAANIAAAAAExBTUUzLjEwMFV") and len(raw) == 24
    assert plivo.played_name(loads(DOC_PLAYED)) == "customer greeting audio"
    out = plivo.BotStream("20170ada-f610-433b-8758-c02a2aab3662")
    assert loads(out.checkpoint("customer greeting audio")) == loads(DOC_CHECKPOINT)
    assert loads(plivo.BotStream("b77e037d-4119-44b5-902d-25826b654539").clear) == loads(DOC_CLEAR)
    assert plivo.bot_event(loads(DOC_CLEAR)) == ("clearAudio", None)
    assert plivo.bot_event(loads(DOC_CHECKPOINT)) == ("checkpoint", "customer greeting audio")
    assert loads(DOC_CLEARED)["event"] == "clearedAudio"  # read and ignored by the gateway
    play = loads(out.media(b"\xff" * 160))
    assert play["event"] == DOC_PLAY_KEYS["event"] and set(play["media"]) == DOC_PLAY_KEYS["media"]
    assert play["media"]["contentType"] == "audio/x-mulaw" and play["media"]["sampleRate"] == 8000


# -- Plivo -> bot ---------------------------------------------------------------------------


def test_plivo_messages_count_like_plivo_and_parse_back() -> None:
    s = plivo.PlivoStream(7, tag="t", fmt=Format(L16, 16000))
    start = json.loads(s.start({"from": "15550100", "to": "15550199"}))
    assert start["sequenceNumber"] == 1 and start["start"]["mediaFormat"] == {"encoding": L16, "sampleRate": 16000}
    assert start["extra_headers"] == "from=15550100;to=15550199"
    st = plivo.parse_start(start)
    assert st.fmt == Format(L16, 16000) and st.numbers == ("15550100", "15550199")
    m1, m2 = json.loads(s.media("AAEC")), json.loads(s.media("AAEC"))
    assert (m1["sequenceNumber"], m1["media"]["chunk"], m2["media"]["chunk"]) == (2, 1, 2)
    assert int(m2["media"]["timestamp"]) - int(m1["media"]["timestamp"]) == 20
    assert m1["streamId"] == s.stream_id and m1["media"]["track"] == "inbound"
    assert plivo.dtmf_digit(loads(s.dtmf("5"))) == "5" and plivo.dtmf_digit(loads(s.dtmf("a"))) == "A"
    assert plivo.played_name(loads(s.played("m1"))) == "m1"
    assert loads(s.cleared())["event"] == "clearedAudio" and loads(s.stop())["event"] == "stop"


def test_start_bounds_what_it_keeps() -> None:
    fmt = {"encoding": MULAW, "sampleRate": 8000}
    # the XML's comma-separated spelling, a JSON object, pairs without "=" (dropped, counted)
    st = plivo.parse_start({"start": {"streamId": SID, "mediaFormat": fmt}, "extra_headers": "a=1,b=2"})
    assert st.params == {"a": "1", "b": "2"} and st.ids == {"streamId": SID}
    st = plivo.parse_start({"start": {"streamId": SID, "mediaFormat": fmt}, "extra_headers": {"caller": "ada"}})
    assert st.numbers == ("ada", "")
    st = plivo.parse_start({"start": {"streamId": SID, "mediaFormat": fmt}, "extra_headers": "x;=y;k=v;;"})
    assert st.params == {"k": "v"} and st.dropped == 2
    st = plivo.parse_start({"start": {"streamId": SID, "mediaFormat": fmt, "callId": "C" * 300, "accountId": 5},
                            "extra_headers": 7})
    assert st.call_id is None and st.account_id is None and st.params is None and st.dropped == 3
    many = ";".join(f"k{i}=v" for i in range(40))
    st = plivo.parse_start({"start": {"streamId": SID, "mediaFormat": fmt}, "extra_headers": many})
    assert st.params is not None and len(st.params) == 32 and st.dropped == 8


@pytest.mark.parametrize("fmt, want", [
    ({"encoding": "audio/x-mulaw", "sampleRate": 8000}, Format(MULAW, 8000)),
    ({"encoding": "audio/x-l16", "sampleRate": 8000}, Format(L16, 8000)),
    ({"encoding": "audio/x-l16", "sampleRate": 16000}, Format(L16, 16000)),
    ({"encoding": "audio/x-l16;rate=16000"}, Format(L16, 16000)),  # the XML's contentType spelling
    ({"encoding": "Audio/X-L16", "sampleRate": "16000"}, Format(L16, 16000)),
])
def test_the_three_documented_formats_are_accepted(fmt: dict, want: Format) -> None:
    assert plivo.parse_start({"start": {"streamId": SID, "mediaFormat": fmt}}).fmt == want


@pytest.mark.parametrize("msg, kind, code", [
    ({"event": "start"}, "bad_start", 1007),
    ({"start": []}, "bad_start", 1007),
    ({"start": {}}, "bad_start", 1007),
    ({"start": {"streamId": 5}}, "bad_start", 1007),
    ({"start": {"streamId": 'a"b'}}, "bad_start", 1007),
    ({"start": {"streamId": "a\\b"}}, "bad_start", 1007),
    ({"start": {"streamId": "a\nb"}}, "bad_start", 1007),
    ({"start": {"streamId": "s" * 129}}, "bad_start", 1007),
    ({"start": {"streamId": SID}}, "bad_media_format", 1003),  # the default is ambiguous: refused
    ({"start": {"streamId": SID, "mediaFormat": "mulaw"}}, "bad_media_format", 1003),
    ({"start": {"streamId": SID, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 16000}}},
     "bad_media_format", 1003),
    ({"start": {"streamId": SID, "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 44100}}},
     "bad_media_format", 1003),
    ({"start": {"streamId": SID, "mediaFormat": {"encoding": "audio/x-alaw", "sampleRate": 8000}}},
     "bad_media_format", 1003),
    ({"start": {"streamId": SID, "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 8000.0}}},
     "bad_media_format", 1003),
])
def test_a_bad_start_is_refused(msg: dict, kind: str, code: int) -> None:
    assert refusal(plivo.parse_start, msg) == (kind, code)


def test_media_payload_round_trip_and_refusals() -> None:
    s = plivo.PlivoStream(stream_id=SID)
    ulaw = bytes(range(160))
    assert plivo.media_payload(loads(s.media(base64.b64encode(ulaw).decode())), Format()) == ulaw
    assert plivo.media_payload({"media": {"track": "outbound", "payload": "AAEC"}}, Format()) is None
    l16 = Format(L16, 16000)
    assert refusal(plivo.media_payload, {"media": {"payload": "AAEC"}}, l16) == ("bad_media", 1007)  # 3 bytes
    assert plivo.media_payload({"media": {"payload": "AAECAw=="}}, l16) == b"\x00\x01\x02\x03"
    assert refusal(plivo.media_payload, {"media": {}}, Format()) == ("bad_media", 1007)
    assert refusal(plivo.media_payload, {"media": "AAEC"}, Format()) == ("bad_media", 1007)
    assert refusal(plivo.media_payload, {"media": {"payload": "@@@"}}, Format()) == ("bad_base64", 1007)
    assert refusal(plivo.media_payload, {"media": {"payload": "AAE"}}, Format()) == ("bad_base64", 1007)
    for fmt in (Format(), Format(L16, 8000), l16):  # over 1 s of the stream's own format
        big = base64.b64encode(b"\x00" * (fmt.max_bytes + 2)).decode()
        assert refusal(plivo.media_payload, {"media": {"payload": big}}, fmt) == ("media_too_large", 1009)
        ok = base64.b64encode(b"\x00" * fmt.max_bytes).decode()
        assert len(plivo.media_payload({"media": {"payload": ok}}, fmt) or b"") == fmt.max_bytes
    assert (Format().max_bytes, Format(L16, 8000).max_bytes, l16.max_bytes) == (8000, 16000, 32000)


def test_played_and_dtmf_refusals() -> None:
    assert plivo.played_name({"event": "played", "name": "x"}) == "x"
    for bad in ({}, {"name": 3}, {"name": None}):
        assert refusal(plivo.played_name, bad) == ("bad_mark", 1007)
    for bad in ({"dtmf": {"digit": "Z"}}, {"dtmf": {"digit": "12"}}, {"dtmf": {}}, {"dtmf": "5"}):
        assert refusal(plivo.dtmf_digit, bad) == ("bad_dtmf", 1007)


def test_the_formats_decode_and_encode_without_loss() -> None:
    pcm = np.array([0, 1, -1, 1000, -32768, 32767], np.int16)
    for fmt in (Format(L16, 8000), Format(L16, 16000)):
        wire = fmt.encode(pcm)
        assert wire == pcm.astype("<i2").tobytes() and np.array_equal(fmt.decode(wire), pcm)
    levels = PCMU.decode(np.arange(256, dtype=np.uint8))
    assert np.array_equal(Format().decode(Format().encode(levels)), levels)
    assert Format().width == 1 and Format(L16, 16000).width == 2


# -- bot -> Plivo ---------------------------------------------------------------------------


def test_bot_messages_are_orjson_bytes_in_the_streams_format() -> None:
    audio = bytes(range(160))
    for fmt in (Format(), Format(L16, 8000), Format(L16, 16000)):
        out = plivo.BotStream(SID, fmt)
        assert out.media(audio) == orjson.dumps({"event": "playAudio", "media": {
            "contentType": fmt.encoding, "sampleRate": fmt.rate, "payload": base64.b64encode(audio).decode()}})
        assert out.media(audio) == out.media_prefix + base64.b64encode(audio) + plivo.MEDIA_SUFFIX
        assert plivo.bot_event(loads(out.media(audio))) == ("playAudio", audio)
    out = plivo.BotStream(SID)
    for name in ("m1", 'q"uote\\', "snow\u2603\n"):
        assert loads(out.checkpoint(name)) == {"event": "checkpoint", "streamId": SID, "name": name}
    assert loads(out.clear) == {"event": "clearAudio", "streamId": SID}
    assert loads(plivo.BotStream.send_dtmf("12#")) == {"event": "sendDTMF", "dtmf": "12#"}
    assert plivo.bot_event(loads(plivo.BotStream.send_dtmf("7"))) == ("sendDTMF", "7")
    for bad in ([], {"event": "playAudio"}, {"event": "playAudio", "media": {"payload": "@"}},
                {"event": "checkpoint"}, {"event": "sendDTMF"}):
        assert plivo.bot_event(bad) == ("invalid", None)
    assert plivo.bot_event({"event": "future"}) == ("future", None)


# -- the signature ----------------------------------------------------------------------------


def test_the_v3_signature_signs_the_url_as_the_sdk_canonicalizes_it() -> None:
    """plivo-python utils/signature_v3.py, GET: scheme://host/path, ``?`` and the query sorted
    by name then value, ``.`` and the nonce; HMAC-SHA256 keyed with the auth token, base64."""
    token, nonce = "MY_AUTH_TOKEN", "05429567804466091622"
    text = "wss://voice.example.com/plivo/echo?a=1&b=2&b=3.05429567804466091622"
    want = base64.b64encode(hmac.new(token.encode(), text.encode(), hashlib.sha256).digest()).decode()
    assert plivo.signature(token, "wss://voice.example.com/plivo/echo?b=3&a=1&b=2", nonce) == want
    plain = "wss://voice.example.com/plivo.05429567804466091622"
    assert plivo.signature(token, "wss://voice.example.com/plivo", nonce) == base64.b64encode(
        hmac.new(token.encode(), plain.encode(), hashlib.sha256).digest()).decode()
    url = "wss://voice.example.com/plivo"
    sig = plivo.signature(token, url, nonce)
    assert plivo.signature_matches(token, url, nonce, sig)
    assert plivo.signature_matches(token, url, nonce, f"bm90IGl0, {sig}")  # comma-separated list
    assert not plivo.signature_matches(token, url, "1", sig)
    assert not plivo.signature_matches("other", url, nonce, sig)
    assert not plivo.signature_matches(token, url + "/x", nonce, sig)
