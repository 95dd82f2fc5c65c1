"""The mod_audio_stream wire (brisvox.wire.audio_stream): metadata, the handler's events, the bot's messages.

* the metadata the test peer sends parses back to its parameters, its
  ``uuid`` as the id and its numbers; a malformed parameter is dropped and counted;
* :func:`parse_metadata` / :func:`parse_event` of any bytes answer a value
  or a typed refusal of a known kind, never another exception;
* the bot's ``streamAudio`` template (prefix + base64 + suffix) is exactly
  the documented object, read back by :func:`bot_event` to the same bytes;
* the URL's ``sample-rate`` picks 8 or 16 kHz, anything else is 1003.
"""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from brisvox.wire import audio_stream as fs
from brisvox.wire.jsontext import CALLED_KEYS, CALLER_KEYS, caller_called
from brisvox.wire.mediastream import CLOSE_CODES, MEDIA_SUFFIX, StreamError

PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), PRINTABLE, max_size=5), PRINTABLE)
def test_metadata_parses_back_to_its_parameters(params: dict, uuid: str) -> None:
    params.pop("uuid", None)
    meta = fs.parse_metadata(fs.FreeSwitchStream(uuid or "u", params).metadata().encode())
    assert meta.params == {"uuid": uuid or "u", **params} and meta.dropped == 0
    assert meta.ids == {"uuid": uuid or "u"}
    # the numbers are what the shared rule (caller/from, called/to, first spelling wins) reads
    assert meta.numbers == caller_called(params)
    assert meta.numbers == (next((params[k] for k in CALLER_KEYS if params.get(k)), ""),
                            next((params[k] for k in CALLED_KEYS if params.get(k)), ""))


def test_the_numbers_take_from_and_to_as_caller_and_called() -> None:
    meta = fs.parse_metadata(fs.FreeSwitchStream("u", {"to": "0"}).metadata().encode())  # hypothesis found it
    assert meta.numbers == ("", "0")
    meta = fs.parse_metadata(b'{"uuid":"a","from":"+331","to":"+332"}')
    assert meta.numbers == ("+331", "+332")


def test_a_nested_metadata_value_is_dropped_and_counted() -> None:
    meta = fs.parse_metadata(b'{"uuid":"a","nested":{"x":1},"caller":"+331"}')
    assert meta.params == {"uuid": "a", "caller": "+331"} and meta.dropped == 1 and meta.numbers == ("+331", "")


@given(st.binary(max_size=100))
def test_any_bytes_are_a_value_or_a_typed_refusal(raw: bytes) -> None:
    for parse in (fs.parse_metadata, fs.parse_event):
        try:
            parse(raw)
        except StreamError as e:
            assert e.kind in ("bad_json", "bad_message", "bad_dtmf") and e.code == CLOSE_CODES[e.kind]


@pytest.mark.parametrize(("raw", "kind"), [(b"{x", "bad_json"), (b"[1]", "bad_message"), (b'{"type":3}', "bad_message"),
                                           (b'{"type":"dtmf","digit":"Z"}', "bad_dtmf"), (b'{"type":"dtmf"}', "bad_dtmf")])
def test_malformed_events_are_refused_with_their_kind(raw: bytes, kind: str) -> None:
    with pytest.raises(StreamError) as e:
        fs.parse_event(raw)
    assert e.value.kind == kind


@given(st.sampled_from("0123456789*#abcd"))
def test_the_handlers_dtmf_gives_its_digit(digit: str) -> None:
    assert fs.parse_event(fs.FreeSwitchStream.dtmf(digit).encode()) == ("dtmf", digit.upper())


@given(st.binary(max_size=400), st.sampled_from(fs.RATES))
def test_stream_audio_is_the_documented_object(audio: bytes, rate: int) -> None:
    raw = fs.BotStream(rate).media_prefix + base64.b64encode(audio) + MEDIA_SUFFIX
    msg = orjson.loads(raw)
    assert msg == {"type": "streamAudio", "data": {"audioDataType": "raw", "sampleRate": rate,
                                                   "audioData": base64.b64encode(audio).decode()}}
    assert fs.bot_event(msg) == ("media", audio)
    assert fs.bot_event(orjson.loads(fs.CLEAR)) == ("clear", None)
    assert fs.bot_event(orjson.loads(fs.HANGUP)) == ("hangup", None)
    assert fs.bot_event({"type": "streamAudio", "data": {"audioDataType": "mp3"}}) == ("invalid", None)
    assert fs.bot_event([]) == ("invalid", None)


@pytest.mark.parametrize(("path", "rate", "kind"), [("/freeswitch", 8000, None), ("/fs?sample-rate=16000", 16000, None),
                                                    ("/fs?sample-rate=24000", 0, "bad_media_format"),
                                                    ("/fs?sample-rate=16000&sample-rate=8000", 0, "bad_start")])
def test_the_urls_sample_rate(path: str, rate: int, kind: str | None) -> None:
    if kind is None:
        assert fs.stream_format(path).rate == rate
    else:
        with pytest.raises(StreamError) as e:
            fs.stream_format(path)
        assert e.value.kind == kind
