"""The chan_websocket wire (brisvox.wire.asterisk_ws): events and commands in both control formats.

* every command and correlation id round-trips through :func:`command` /
  :func:`parse_command`, plain text and JSON, within chan_websocket's 128 bytes;
* the events the test peer builds (as Asterisk's ``chan_websocket.c`` prints
  them) parse back to the same values: ``MEDIA_START``'s connection, channel,
  format and frame size, ``DTMF_END``'s digit, a positional correlation id,
  ``ERROR``'s text with spaces;
* :func:`parse_event` of any bytes answers an Event or a typed refusal
  (``StreamError``) of a known kind, never another exception;
* a format outside ``ulaw``/``alaw``/``slin``/``slin16`` is ``bad_media_format`` (1003).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brisvox.wire import asterisk_ws as aw
from brisvox.wire.mediastream import CLOSE_CODES, StreamError

IDS = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=':'), min_size=1, max_size=36)
KINDS = {"bad_json", "bad_message", "bad_dtmf"}


@given(st.sampled_from(aw.COMMANDS), st.one_of(st.just(""), IDS), st.sampled_from([aw.PLAIN, aw.JSON]))
def test_every_command_round_trips_in_both_formats(name: str, cid: str, fmt: str) -> None:
    if name not in ("STOP_MEDIA_BUFFERING", "MARK_MEDIA"):
        cid = ""
    raw = aw.command(name, fmt, cid)
    assert len(raw) <= aw.MAX_TEXT
    assert aw.parse_command(raw) == (name, cid, fmt)
    assert (raw[:1] == b"{") == (fmt == aw.JSON)


@given(st.sampled_from(list(aw.FORMATS)), st.sampled_from([aw.PLAIN, aw.JSON]), IDS,
       st.dictionaries(st.from_regex(r"[A-Z_]{1,12}", fullmatch=True),
                       st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20), max_size=4))
def test_media_start_as_asterisk_prints_it_parses_back(codec: str, fmt: str, cid: str, variables: dict) -> None:
    tx = aw.AsteriskStream(codec, fmt, connection_id=cid, variables=variables)
    ev = aw.parse_event(tx.media_start().encode())
    start = aw.media_start(ev)
    assert (start.connection_id, start.channel, start.channel_id) == (tx.connection_id, tx.channel, tx.channel_id)
    assert start.media == aw.FORMATS[codec] and start.fmt == fmt and start.ptime == 20
    assert start.optimal_frame_size == start.media.frame * start.media.width  # 160 bytes of ulaw, 640 of slin16
    assert start.variables == (variables if fmt == aw.JSON else None) and start.dropped == 0


def test_a_malformed_channel_variable_is_dropped_and_counted() -> None:
    tx = aw.AsteriskStream(fmt=aw.JSON, variables={"OK": "yes", "BAD": "a\x1fb"})
    start = aw.media_start(aw.parse_event(tx.media_start().encode()))
    assert start.variables == {"OK": "yes"} and start.dropped == 1


@given(st.sampled_from("0123456789*#ABCDabcd"), st.sampled_from([aw.PLAIN, aw.JSON]))
def test_dtmf_end_gives_its_digit(digit: str, fmt: str) -> None:
    ev = aw.parse_event(aw.AsteriskStream(fmt=fmt).dtmf(digit).encode())
    assert ev.name == "DTMF_END" and aw.dtmf_digit(ev) == digit.upper()


def test_plain_text_positional_ids_and_error_text_with_spaces() -> None:
    ev = aw.parse_event(b"MEDIA_BUFFERING_COMPLETED 61ea9311-d501")
    assert ev.params == {"correlation_id": "61ea9311-d501"}
    ev = aw.parse_event(b"ERROR channel_id:pbx-1.2 error_text:Unknown command FOO here")
    assert ev.params == {"channel_id": "pbx-1.2", "error_text": "Unknown command FOO here"}
    ev = aw.parse_event(b"STATUS channel_id:x queue_length:43 xon_level:800 queue_full:false")
    assert ev.params["queue_length"] == "43" and ev.fmt == aw.PLAIN


@given(st.binary(max_size=200))
def test_any_bytes_are_an_event_or_a_typed_refusal(raw: bytes) -> None:
    try:
        ev = aw.parse_event(raw)
    except StreamError as e:
        assert e.kind in KINDS and e.code == CLOSE_CODES[e.kind]
    else:
        assert ev.name and ev.fmt in (aw.PLAIN, aw.JSON)


@given(st.text(max_size=60))
def test_any_text_is_an_event_or_a_typed_refusal(text: str) -> None:
    for raw in (text.encode(), ("{" + text).encode(), ("DTMF_END " + text).encode()):
        try:
            aw.parse_event(raw)
        except StreamError as e:
            assert e.kind in KINDS


@pytest.mark.parametrize(("raw", "kind"), [
    (b"{not json", "bad_json"),
    (b"[1]", "bad_message"),
    (b'{"event":5}', "bad_message"),
    (b"DTMF_END digit", "bad_message"),
    (b"DTMF_END digit:Z", "bad_dtmf"),
    (b"media_start x", "bad_message"),
    (b"DTMF_END digit:1\x00", "bad_message"),
    (b"\xff\xfe", "bad_message"),
])
def test_malformed_events_are_refused_with_their_kind(raw: bytes, kind: str) -> None:
    with pytest.raises(StreamError) as e:
        aw.parse_event(raw)
    assert e.value.kind == kind


@pytest.mark.parametrize(("line", "kind"), [
    ("MEDIA_START connection_id:a format:opus optimal_frame_size:160", "bad_media_format"),
    ("MEDIA_START channel:x format:ulaw", "bad_start"),
    ("MEDIA_START connection_id:a format:ulaw optimal_frame_size:0", "bad_start"),
    ("MEDIA_START connection_id:a format:ulaw optimal_frame_size:16O", "bad_start"),
])
def test_a_media_start_asterisk_would_not_send_us_is_refused(line: str, kind: str) -> None:
    with pytest.raises(StreamError) as e:
        aw.media_start(aw.parse_event(line.encode()))
    assert e.value.kind == kind and e.value.code == CLOSE_CODES[kind]


def test_commands_refused_by_the_peer_side_parser() -> None:
    for raw in (b"FLUSH", b'{"command":"NOPE"}', b'{"command":"MARK_MEDIA","correlation_id":3}', b"A" * 129):
        with pytest.raises(StreamError):
            aw.parse_command(raw)
    with pytest.raises(ValueError):
        aw.command("STOP_MEDIA_BUFFERING", aw.PLAIN, "x" * 130)
    with pytest.raises(ValueError):
        aw.command("FLUSH_MEDIA", aw.PLAIN, "abc")  # FLUSH_MEDIA takes no id
