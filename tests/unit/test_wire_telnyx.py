"""Telnyx Media Streaming messages (brisvox.wire.telnyx), against the vendor's documented examples.

The fixtures are the examples of Telnyx's developer documentation (the
AsyncAPI page "Stream call media over WebSocket",
developers.telnyx.com/api-reference/websockets/stream-call-media-over-websocket,
and the ``streaming_start`` command's description of the WebSocket events,
which the Telnyx SDKs carry), copied as data:

* ``start`` reads as documented (ids, ``from``/``to``, custom parameters,
  the media format); the older example (``audio/x-mulaw``, no numbers) too;
* every format brisvox takes (PCMU, PCMA 8 kHz, L16 8/16 kHz big-endian)
  decodes, every other one is refused with 1003, a bad ``start`` with 1007;
* malformed ids, numbers and parameters are dropped and counted, never refused;
* the bot's messages are the documented shapes, byte for byte what orjson
  writes, and the client's reader reads them back;
* what the client sends as Telnyx parses as the gateway parses Telnyx.
"""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from brisvox.wire import mediastream, telnyx
from brisvox.wire.g711 import PCMA, PCMU
from brisvox.wire.mediastream import StreamError

STREAM = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
CALL = "v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"

# the AsyncAPI page's start frame example
DOC_START = {
    "event": "start",
    "sequence_number": "1",
    "stream_id": STREAM,
    "start": {
        "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
        "call_control_id": CALL,
        "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
        "from": "+13122010094",
        "to": "+13122123456",
        "tags": ["TAG1", "TAG2"],
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "custom_parameters": {"customer_id": "customer_123"},
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
    },
}
# the streaming_start description's (older) start example
DOC_START_OLD = {
    "event": "start",
    "sequence_number": "1",
    "start": {
        "user_id": "3e6f995f-85f7-4705-9741-53b116d28237",
        "call_control_id": "v3:MdI91X4lWFEs7IgbBEOT9M4AigoY08M0WWZFISt1Yw2axZ_IiE4pqg",
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "media_format": {"encoding": "audio/x-mulaw", "sample_rate": 8000, "channels": 1},
    },
    "stream_id": "32de0dea-53cb-4b21-89a4-9e1819c043bc",
}
ULAW = PCMU.encode(np.full(160, 1000, np.int16)).tobytes()
# the documented media frame, with a whole payload (the example's is elided with "...")
DOC_MEDIA = {"event": "media", "sequence_number": "4",
             "media": {"track": "inbound", "chunk": "2", "timestamp": "5",
                       "payload": base64.b64encode(ULAW).decode()},
             "stream_id": STREAM}
DOC_STOP = {"event": "stop", "sequence_number": "5",
            "stop": {"user_id": "3E6F995F-85F7-4705-9741-53B116D28237", "call_control_id": CALL},
            "stream_id": STREAM}
# the documented error frame (streaming_start description: "Stream Errors")
DOC_ERROR = {"stream_id": STREAM, "event": "error", "sequence_number": "6",
             "error": {"title": "rate_limit_reached", "code": "100005", "detail": "Too many requests"}}


def refusal(fn, *args) -> tuple[str, int]:
    with pytest.raises(StreamError) as e:
        fn(*args)
    return e.value.kind, e.value.code


def with_format(fmt: object) -> dict:
    return {**DOC_START, "start": {**DOC_START["start"], "media_format": fmt}}


# -- Telnyx -> bot ------------------------------------------------------------------------


def test_the_documented_start_reads_as_documented() -> None:
    s = telnyx.parse_start(DOC_START)
    assert s.stream_id == STREAM and s.format is telnyx.FORMATS["PCMU", 8000]
    assert s.ids == {"stream_id": STREAM, "call_control_id": CALL,
                     "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
                     "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
                     "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d"}
    assert s.numbers == ("+13122010094", "+13122123456")
    assert s.params == {"customer_id": "customer_123"} and s.dropped == 0


def test_the_older_start_example_and_numbers_from_parameters() -> None:
    s = telnyx.parse_start(DOC_START_OLD)
    assert s.format.encoding == "PCMU" and s.stream_id == "32de0dea-53cb-4b21-89a4-9e1819c043bc"
    assert s.numbers == ("", "") and s.params is None
    params = {**DOC_START_OLD, "start": {**DOC_START_OLD["start"], "custom_parameters": {"From": "+1555", "to": "+1666"}}}
    assert telnyx.parse_start(params).numbers == ("+1555", "+1666")
    no_fmt = {**DOC_START_OLD, "start": {k: v for k, v in DOC_START_OLD["start"].items() if k != "media_format"}}
    assert telnyx.parse_start(no_fmt).format is telnyx.DEFAULT_FORMAT


@pytest.mark.parametrize(("fmt", "key"), [
    ({"encoding": "PCMU", "sample_rate": 8000, "channels": 1}, ("PCMU", 8000)),
    ({"encoding": "PCMA", "sample_rate": 8000, "channels": 1}, ("PCMA", 8000)),
    ({"encoding": "audio/x-alaw", "sample_rate": 8000}, ("PCMA", 8000)),
    ({"encoding": "L16", "sample_rate": 16000, "channels": 1}, ("L16", 16000)),
    ({"encoding": "L16", "sample_rate": "8000", "channels": "1"}, ("L16", 8000)),
])
def test_the_formats_brisvox_takes(fmt, key) -> None:
    assert telnyx.parse_start(with_format(fmt)).format is telnyx.FORMATS[key]


@pytest.mark.parametrize("fmt", [
    {"encoding": "G722", "sample_rate": 16000}, {"encoding": "OPUS", "sample_rate": 48000},
    {"encoding": "AMR-WB", "sample_rate": 16000}, {"encoding": "PCMU", "sample_rate": 16000},
    {"encoding": "L16", "sample_rate": 24000}, {"encoding": "L16", "sample_rate": 16000, "channels": 2},
    {"encoding": 5}, "PCMU", [1],
])
def test_every_other_format_is_refused_with_1003(fmt) -> None:
    kind, code = refusal(telnyx.parse_start, with_format(fmt))
    assert (kind, code) == ("bad_media_format", 1003)


@pytest.mark.parametrize("msg", [
    {"event": "start"}, {"event": "start", "start": "x", "stream_id": STREAM},
    {**DOC_START, "stream_id": None}, {**DOC_START, "stream_id": ""}, {**DOC_START, "stream_id": 'a"b'},
    {**DOC_START, "stream_id": "a\\b"}, {**DOC_START, "stream_id": "a\nb"}, {**DOC_START, "stream_id": "x" * 129},
])
def test_a_start_without_a_usable_stream_id_is_refused_with_1007(msg) -> None:
    assert refusal(telnyx.parse_start, msg) == ("bad_start", 1007)


def test_malformed_ids_numbers_and_parameters_are_dropped_and_counted() -> None:
    start = {**DOC_START["start"], "call_control_id": "v3:" + "x" * 200, "call_session_id": 7,
             "from": "+1\r\nX-Evil: 1", "to": "", "client_state": "c" * 300,
             "custom_parameters": {"ok": "1", "bad\n": "2", "n": {"nested": 1}}}
    s = telnyx.parse_start({**DOC_START, "start": start})
    assert s.ids == {"stream_id": STREAM, "user_id": "3E6F995F-85F7-4705-9741-53B116D28237"}
    assert s.caller is None and s.called is None and s.params == {"ok": "1"}
    assert s.dropped == 7  # call_control_id, call_session_id, from, to, client_state, two parameters


def test_media_of_each_format_decodes_and_the_outbound_track_is_not_caller_audio() -> None:
    fmt = telnyx.FORMATS["PCMU", 8000]
    raw = mediastream.media_payload(DOC_MEDIA, fmt.max_media_bytes)
    assert raw == ULAW and np.array_equal(fmt.codec.decode(raw), PCMU.decode(ULAW))
    outbound = {**DOC_MEDIA, "media": {**DOC_MEDIA["media"], "track": "outbound"}}
    assert mediastream.media_payload(outbound, fmt.max_media_bytes) is None
    alaw = telnyx.FORMATS["PCMA", 8000]
    assert np.array_equal(alaw.codec.decode(PCMA.encode(np.full(160, 1000, np.int16)).tobytes()),
                          PCMA.decode(PCMA.encode(np.full(160, 1000, np.int16))))


def test_l16_is_big_endian_both_ways_and_an_odd_payload_is_malformed() -> None:
    pcm = np.array([0, 1, -2, 1000, -32768, 32767], np.int16)
    assert telnyx.L16.encode(pcm).tobytes() == pcm.astype(">i2").tobytes()
    assert np.array_equal(telnyx.L16.decode(pcm.astype(">i2").tobytes()), pcm)
    out = np.empty(len(pcm), ">i2")
    assert telnyx.L16.encode(pcm, out=out) is out and out.tobytes() == b"\x00\x00\x00\x01\xff\xfe\x03\xe8\x80\x00\x7f\xff"
    assert refusal(telnyx.L16.decode, b"\x00\x01\x02") == ("bad_media", 1007)


def test_more_than_a_second_of_audio_in_one_message_is_refused() -> None:
    fmt = telnyx.FORMATS["L16", 16000]
    assert fmt.max_media_bytes == 32000 and fmt.frame == 320
    msg = {"event": "media", "media": {"track": "inbound", "payload": base64.b64encode(b"\0" * 32002).decode()}}
    assert refusal(mediastream.media_payload, msg, fmt.max_media_bytes) == ("media_too_large", 1009)
    msg["media"]["payload"] = base64.b64encode(b"\0" * 32000).decode()
    assert len(mediastream.media_payload(msg, fmt.max_media_bytes) or b"") == 32000


def test_marks_digits_stop_and_errors() -> None:
    assert mediastream.mark_name({"event": "mark", "stream_id": STREAM, "mark": {"name": "m1"}}) == "m1"
    assert mediastream.dtmf_digit({"event": "dtmf", "stream_id": STREAM, "occurred_at": "2025-06-05T08:54:19Z",
                                   "dtmf": {"digit": "#"}}) == "#"
    assert telnyx.error_info(DOC_ERROR) == ("100005", "rate_limit_reached")
    assert telnyx.error_info({"event": "error", "payload": {"code": 100003, "title": "malformed_frame"}}) == \
        ("100003", "malformed_frame")
    assert telnyx.error_info({"event": "error", "error": {"code": "x" * 99, "title": None}}) == ("", "")
    assert telnyx.error_info({"event": "error"}) == ("", "")


# -- what the client sends as Telnyx --------------------------------------------------------


def test_the_client_stream_parses_as_telnyx_does() -> None:
    s = telnyx.TelnyxStream(3, fmt=telnyx.FORMATS["L16", 16000])
    assert orjson.loads(s.connected()) == {"event": "connected", "version": "1.0.0"}
    assert orjson.loads(s.connected("tok")) == {"event": "connected", "version": "1.0.0",
                                                "connected": {telnyx.AUTH_HEADER: "tok"}}
    start = orjson.loads(s.start({"lang": "en"}, caller="+1555", called="+1666"))
    st = telnyx.parse_start(start)
    assert (st.stream_id, st.format.rate, st.numbers, st.params) == (s.stream_id, 16000, ("+1555", "+1666"),
                                                                     {"lang": "en"})
    assert start["sequence_number"] == "1"
    m1, m2 = orjson.loads(s.media("AAAA")), orjson.loads(s.media("AAAA"))
    assert m1 == {"event": "media", "sequence_number": "2", "stream_id": s.stream_id,
                  "media": {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": "AAAA"}}
    assert (m2["sequence_number"], m2["media"]["chunk"], m2["media"]["timestamp"]) == ("3", "2", "20")
    assert mediastream.mark_name(orjson.loads(s.mark("m"))) == "m"
    assert mediastream.dtmf_digit(orjson.loads(s.dtmf("5"))) == "5"
    assert telnyx.error_info(orjson.loads(s.error("100002", "unknown_error"))) == ("100002", "unknown_error")
    stop = orjson.loads(s.stop())
    assert stop["event"] == "stop" and stop["stop"]["call_control_id"] == s.call_control_id


# -- bot -> Telnyx --------------------------------------------------------------------------


def test_the_bots_messages_are_the_documented_shapes() -> None:
    out = telnyx.BotStream()
    audio = bytes(range(160))
    assert out.media(audio) == orjson.dumps({"event": "media", "media": {"payload": base64.b64encode(audio).decode()}})
    assert out.media(audio) == telnyx.BotStream.media_prefix + base64.b64encode(audio) + mediastream.MEDIA_SUFFIX
    assert out.clear == orjson.dumps({"event": "clear"})
    for name in ("brisvox-end-3-1", 'a "quoted" \\ name\n\t\x01', "é✓"):
        assert out.mark(name) == orjson.dumps({"event": "mark", "mark": {"name": name}})
    assert mediastream.bot_event(orjson.loads(out.media(audio))) == ("media", audio)
    assert mediastream.bot_event(orjson.loads(out.mark("a"))) == ("mark", "a")
    assert mediastream.bot_event(orjson.loads(out.clear)) == ("clear", None)
