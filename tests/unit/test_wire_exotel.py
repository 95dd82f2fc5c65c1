"""Exotel Voicebot stream messages (brisvox.wire.exotel), against the vendor's documented examples.

The fixtures are the examples of Exotel's developer documentation, copied as
data: the "WebSocket protocol" page
(developer.exotel.com/docs/agentstream/websocket-protocol: ``connected``,
``start``, ``media``, ``dtmf``, ``mark``) and Exotel's own protocol notes
(github.com/exotel/Agent-Stream, docs/reference/WEBSOCKET_PROTOCOL.md: the
older ``start`` with numbers as numbers and no ``stream_sid``, ``stop``, the
bot's ``mark`` and ``clear``); the chunk rules are the "Working with the
Stream and Voicebot Applet" page's:

* ``start`` reads as documented (ids, ``from``/``to``, custom parameters, the
  format), the older example too, and the URL's ``sample-rate`` stands in
  for a start that does not say;
* 16-bit linear PCM at 8, 16 and 24 kHz (little-endian) decodes under each
  documented name; mu-law, another rate, bit rate or channel count is
  refused with 1003, a bad ``start`` with 1007;
* malformed ids, numbers and parameters are dropped and counted, never
  refused; the URL's ``token`` and ``sample-rate`` never become parameters;
* the bot's messages are the documented shapes, byte for byte what orjson
  writes; its audio is cut into chunks of at least 3.2 KB, multiples of 320
  bytes; the Basic credential reads as Exotel sends it;
* what the client sends as Exotel parses as the gateway parses Exotel.
"""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from brisvox.wire import exotel, mediastream
from brisvox.wire.mediastream import L16LE
from tests.unit.test_wire_telnyx import refusal

SID = "MZxxxxxxxxxxxxxxxxxxxxxxxx"
CALL = "CAxxxxxxxxxxxxxxxxxxxxxxxx"

# the WebSocket protocol page's start example
DOC_START = {
    "event": "start",
    "sequence_number": "1",
    "stream_sid": SID,
    "start": {
        "stream_sid": SID,
        "call_sid": CALL,
        "account_sid": "ACxxxxxxxxxxxxxxxxxxxxxxxx",
        "from": "+919876543210",
        "to": "+918047491899",
        "custom_parameters": {"key1": "value1"},
        "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"},
    },
}
# Exotel's protocol notes (Agent-Stream, docs/reference/WEBSOCKET_PROTOCOL.md): no stream_sid, numbers as numbers
DOC_START_NOTES = {
    "event": "start",
    "sequence_number": "1",
    "start": {
        "call_sid": "abc123",
        "account_sid": "xyz789",
        "from": "+1234567890",
        "to": "+0987654321",
        "media_format": {"encoding": "linear16", "sample_rate": 8000, "bit_rate": 16},
        "custom_parameters": {"campaign_id": "12345"},
    },
}
PCM = np.array([0, 1, -2, 1000, -32768, 32767] * 60, np.int16)[:320]
# the protocol page's media example, with a whole payload (the page's is "<base64-encoded PCM>")
DOC_MEDIA = {"event": "media", "sequence_number": "3", "stream_sid": SID,
             "media": {"chunk": "2", "timestamp": "200", "payload": base64.b64encode(PCM.astype("<i2").tobytes()).decode()}}
DOC_DTMF = {"event": "dtmf", "sequence_number": "7", "stream_sid": SID, "dtmf": {"digit": "5", "duration": "100"}}
DOC_MARK = {"event": "mark", "sequence_number": "15", "stream_sid": SID, "mark": {"name": "greeting-complete"}}
DOC_STOP = {"event": "stop", "sequence_number": "100",
            "stop": {"call_sid": "abc123", "account_sid": "xyz789", "reason": "caller_hangup"}}


def with_format(fmt: object) -> dict:
    return {**DOC_START, "start": {**DOC_START["start"], "media_format": fmt}}


# -- Exotel -> bot ------------------------------------------------------------------------


def test_the_documented_start_reads_as_documented() -> None:
    s = exotel.parse_start(DOC_START)
    assert s.stream_id == SID and s.format is exotel.FORMATS[8000] and s.format.codec is L16LE
    assert s.ids == {"stream_sid": SID, "call_sid": CALL, "account_sid": "ACxxxxxxxxxxxxxxxxxxxxxxxx"}
    assert s.numbers == ("+919876543210", "+918047491899")
    assert s.params == {"key1": "value1"} and s.dropped == 0


def test_the_notes_start_without_a_stream_sid_is_the_calls() -> None:
    s = exotel.parse_start(DOC_START_NOTES)
    assert s.stream_id == "abc123" and s.format is exotel.FORMATS[8000]
    assert s.ids == {"stream_sid": "abc123", "call_sid": "abc123", "account_sid": "xyz789"}
    assert s.numbers == ("+1234567890", "+0987654321") and s.params == {"campaign_id": "12345"}


@pytest.mark.parametrize(("fmt", "rate"), [
    ({"encoding": "audio/x-raw", "sample_rate": "16000", "bit_rate": "16"}, 16000),
    ({"encoding": "raw/slin", "sample_rate": 24000}, 24000),
    ({"encoding": "linear16", "sample_rate": 8000, "bit_rate": 16}, 8000),
    ({"encoding": "audio/L16;rate=16000"}, 16000),  # the Beta guide's MediaFormat names
    ({"encoding": "RAW/SLIN", "sampleRate": "24000", "bitRate": "16"}, 24000),
    ({"sample_rate": "16000"}, 16000),
    (None, 8000),
])
def test_the_formats_brisvox_takes(fmt, rate) -> None:
    msg = with_format(fmt) if fmt is not None else {**DOC_START, "start": {
        k: v for k, v in DOC_START["start"].items() if k != "media_format"}}
    assert exotel.parse_start(msg).format is exotel.FORMATS[rate]


def test_the_urls_sample_rate_stands_in_for_a_start_that_does_not_say() -> None:
    assert exotel.rate_from_path("/exotel?sample-rate=16000&key1=v") == 16000
    assert exotel.rate_from_path("/exotel") is None
    # not ASCII digits ("²" passes str.isdigit), or named twice: a malformed start (1007), never a ValueError
    for bad in ("hd", "%C2%B2", "%D9%A1%D9%A6000", "8000&sample-rate=16000", "-8000", ""):
        with pytest.raises(exotel.StreamError) as e:
            exotel.rate_from_path(f"/exotel?sample-rate={bad}")
        assert (e.value.kind, e.value.code) == ("bad_start", 1007), bad
    no_rate = with_format({"encoding": "audio/x-raw", "bit_rate": "16"})
    assert exotel.parse_start(no_rate, 24000).format.rate == 24000
    assert exotel.parse_start(no_rate).format.rate == 8000
    assert exotel.parse_start(DOC_START, 24000).format.rate == 8000  # the start says: it wins
    assert refusal(exotel.parse_start, no_rate, 44100) == ("bad_media_format", 1003)


@pytest.mark.parametrize("fmt", [
    {"encoding": "audio/x-mulaw", "sample_rate": "8000"}, {"encoding": "audio/x-mulaw;rate=8000"},
    {"encoding": "audio/x-raw", "sample_rate": "22050"}, {"encoding": "audio/x-raw", "sample_rate": "44100"},
    {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "8"},
    {"encoding": "audio/x-raw", "sample_rate": "8000", "channels": 2},
    {"encoding": 5}, {"encoding": "audio/x-raw", "sample_rate": 8000.0}, "raw/slin", [1],
])
def test_every_other_format_is_refused_with_1003(fmt) -> None:
    kind, code = refusal(exotel.parse_start, with_format(fmt))
    assert (kind, code) == ("bad_media_format", 1003)


@pytest.mark.parametrize("msg", [
    {"event": "start"}, {"event": "start", "start": "x", "stream_sid": SID},
    {"event": "start", "start": {"media_format": None}},
    {**DOC_START, "stream_sid": "a\nb", "start": {**DOC_START["start"], "stream_sid": None}},
    {**DOC_START, "stream_sid": "x" * 129}, {**DOC_START, "stream_sid": 7},
])
def test_a_start_without_a_usable_stream_sid_is_refused_with_1007(msg) -> None:
    assert refusal(exotel.parse_start, msg) == ("bad_start", 1007)


def test_malformed_ids_numbers_and_parameters_are_dropped_and_counted() -> None:
    start = {**DOC_START["start"], "call_sid": "CA" + "x" * 200, "account_sid": 7,
             "from": "+91\r\nX-Evil: 1", "to": "",
             "custom_parameters": {"ok": "1", "bad\n": "2", "n": {"nested": 1}}}
    s = exotel.parse_start({**DOC_START, "start": start})
    assert s.ids == {"stream_sid": SID}
    assert s.caller is None and s.called is None and s.params == {"ok": "1"}
    assert s.dropped == 6  # call_sid, account_sid, from, to, two parameters


def test_the_urls_settings_never_become_call_parameters() -> None:
    custom = {"key1": "v", "token": "the-secret", "sample-rate": "16000", "From": "+9111"}
    s = exotel.parse_start({**DOC_START, "start": {**DOC_START["start"], "from": None, "custom_parameters": custom}})
    assert s.params == {"key1": "v", "From": "+9111"} and s.dropped == 0
    assert s.numbers == ("+9111", "+918047491899")


def test_camel_case_names_are_read_too() -> None:
    msg = {"event": "start", "streamSid": "MZ1", "start": {"callSid": "CA1", "accountSid": "AC1",
                                                           "customParameters": {"a": "b"},
                                                           "mediaFormat": {"encoding": "raw/slin", "sampleRate": 16000}}}
    s = exotel.parse_start(msg)
    assert (s.stream_id, s.call_sid, s.account_sid, s.params, s.format.rate) == ("MZ1", "CA1", "AC1", {"a": "b"}, 16000)


def test_media_is_little_endian_l16_and_malformed_media_is_refused() -> None:
    fmt = exotel.FORMATS[8000]
    raw = mediastream.media_payload(DOC_MEDIA, fmt.max_media_bytes)
    assert raw == PCM.astype("<i2").tobytes() and np.array_equal(fmt.codec.decode(raw), PCM)
    assert fmt.codec.encode(PCM).tobytes() == PCM.astype("<i2").tobytes() and fmt.wire_dtype == "<i2"
    assert refusal(fmt.codec.decode, b"\x00\x01\x02") == ("bad_media", 1007)
    outbound = {**DOC_MEDIA, "media": {**DOC_MEDIA["media"], "track": "outbound"}}  # the Beta guide's both tracks
    assert mediastream.media_payload(outbound, fmt.max_media_bytes) is None
    hd = exotel.FORMATS[24000]
    assert hd.max_media_bytes == 48000 and hd.frame == 480
    big = {"event": "media", "media": {"payload": base64.b64encode(b"\0" * 48002).decode()}}
    assert refusal(mediastream.media_payload, big, hd.max_media_bytes) == ("media_too_large", 1009)
    for bad, kind in (({"event": "media", "media": {}}, "bad_media"),
                      ({"event": "media", "media": {"payload": "@@@"}}, "bad_base64")):
        assert refusal(mediastream.media_payload, bad, hd.max_media_bytes) == (kind, 1007)


def test_marks_digits_and_stop() -> None:
    assert mediastream.mark_name(DOC_MARK) == "greeting-complete"
    assert mediastream.dtmf_digit(DOC_DTMF) == "5"
    assert refusal(mediastream.dtmf_digit, {**DOC_DTMF, "dtmf": {"digit": "55"}}) == ("bad_dtmf", 1007)
    assert refusal(mediastream.mark_name, {**DOC_MARK, "mark": {}}) == ("bad_mark", 1007)
    assert DOC_STOP["event"] == "stop"  # the leg ends on the event; the reason is not read


# -- the Basic credential ---------------------------------------------------------------------


def test_the_basic_credential_is_its_password() -> None:
    assert exotel.basic_password(exotel.basic_header("API_KEY", "API_TOKEN")) == "API_TOKEN"
    assert exotel.basic_password("basic " + base64.b64encode(b"u:p:with:colons").decode()) == "p:with:colons"
    for bad in ("Bearer abc", "Basic", "Basic @@@", "Basic " + base64.b64encode(b"no-colon").decode(),
                "Basic " + base64.b64encode(b"\xff\xfe:x").decode(), ""):
        assert exotel.basic_password(bad) == "", bad


# -- the bot's audio in Exotel's chunk sizes ------------------------------------------------------


@pytest.mark.parametrize(("rate", "frames", "size"), [(8000, 10, 3200), (16000, 5, 3200), (24000, 4, 3840)])
def test_the_bots_audio_goes_in_chunks_of_at_least_3200_bytes_multiples_of_320(rate, frames, size) -> None:
    fmt = exotel.FORMATS[rate]
    c = exotel.Chunker()
    frame = fmt.codec.encode(np.full(fmt.frame, 7, np.int16)).tobytes()
    out = [c.add(frame) for _ in range(3 * frames)]
    chunks = [x for x in out if x is not None]
    assert [i for i, x in enumerate(out) if x is not None] == [frames - 1, 2 * frames - 1, 3 * frames - 1]
    assert all(len(x) == size and len(x) % exotel.CHUNK_MULTIPLE == 0 for x in chunks)
    assert c.pending == 0 and c.flush() is None


def test_a_partial_frame_is_carried_over_and_the_tail_padded_with_silence() -> None:
    c = exotel.Chunker()
    assert c.add(b"\x01" * 3000) is None
    chunk = c.add(b"\x02" * 300)  # 3300 bytes kept: 3200 go, 100 stay
    assert chunk is not None and len(chunk) == 3200 and c.pending == 100
    tail = c.flush()
    assert tail == b"\x02" * 100 + b"\x00" * 220 and c.pending == 0
    c.add(b"\x03" * 640)
    assert c.drop() == 640 and c.flush() is None
    assert exotel.MIN_CHUNK_BYTES + 960 < exotel.MAX_CHUNK_BYTES  # a chunk never nears the maximum


# -- what the client sends as Exotel --------------------------------------------------------------


def test_the_client_stream_parses_as_exotel_does() -> None:
    s = exotel.ExotelStream(3, fmt=exotel.FORMATS[16000])
    assert orjson.loads(s.connected()) == {"event": "connected"}
    start = orjson.loads(s.start({"lang": "en"}, caller="+9111", called="+9122"))
    st = exotel.parse_start(start)
    assert (st.stream_id, st.format.rate, st.numbers, st.params) == (s.stream_sid, 16000, ("+9111", "+9122"),
                                                                     {"lang": "en"})
    assert start["sequence_number"] == "1" and start["start"]["media_format"] == {
        "encoding": "audio/x-raw", "sample_rate": "16000", "bit_rate": "16"}
    m1, m2 = orjson.loads(s.media("AAAA")), orjson.loads(s.media("AAAA"))
    assert m1 == {"event": "media", "sequence_number": "2", "stream_sid": s.stream_sid,
                  "media": {"chunk": "1", "timestamp": "0", "payload": "AAAA"}}
    assert (m2["sequence_number"], m2["media"]["chunk"], m2["media"]["timestamp"]) == ("3", "2", "20")
    assert mediastream.mark_name(orjson.loads(s.mark("m"))) == "m"
    assert mediastream.dtmf_digit(orjson.loads(s.dtmf("#"))) == "#"
    stop = orjson.loads(s.stop())
    assert stop["event"] == "stop" and stop["stop"]["call_sid"] == s.call_sid


# -- bot -> Exotel ----------------------------------------------------------------------------


@pytest.mark.parametrize("sid", ["stream-uuid", 'odd"sid\\'])
def test_the_bots_messages_are_the_documented_shapes(sid) -> None:
    out = exotel.BotStream(sid)
    audio = bytes(range(256)) * 13
    assert out.media(audio) == orjson.dumps({"event": "media", "stream_sid": sid,
                                             "media": {"payload": base64.b64encode(audio).decode()}})
    assert out.media(audio) == out.media_prefix + base64.b64encode(audio) + mediastream.MEDIA_SUFFIX
    assert out.clear == orjson.dumps({"event": "clear", "stream_sid": sid})
    for name in ("greeting-complete", 'a "quoted" \\ name\n\t\x01', "é✓"):
        assert out.mark(name) == orjson.dumps({"event": "mark", "stream_sid": sid, "mark": {"name": name}})
    assert mediastream.bot_event(orjson.loads(out.media(audio))) == ("media", audio)
    assert mediastream.bot_event(orjson.loads(out.mark("a"))) == ("mark", "a")
    assert mediastream.bot_event(orjson.loads(out.clear)) == ("clear", None)
