"""brisvox.wire.audiosocket: AudioSocket frames built and read back, split anywhere, refused when hostile."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import audiosocket as A

CALL = "40325ec2-5efd-4bd3-805f-53576e581d13"  # the references' example UUID


def test_header_layout_is_kind_then_big_endian_length():
    assert A.hangup() == b"\x00\x00\x00"
    assert A.audio(b"\x01\x02" * 160)[:3] == b"\x10\x01\x40"  # 320 bytes: 0x0140, big-endian
    assert A.uuid_message(CALL) == b"\x01\x00\x10" + uuid.UUID(CALL).bytes
    assert A.dtmf("#") == b"\x03\x00\x01#"
    assert A.error(0x02) == b"\xff\x00\x01\x02"
    assert A.audio(b"\x00\x00", 16000)[0] == 0x12 and A.audio(b"\x00\x00", 48000)[0] == 0x16


def test_messages_read_back():
    d = A.Decoder(4096)
    msgs = d.feed(A.uuid_message(CALL) + A.audio(b"\x10\x00" * 160) + A.dtmf("5") + A.error(1) + A.hangup())
    assert [m.kind for m in msgs] == [A.UUID, A.AUDIO_8K, A.DTMF, A.ERROR, A.HANGUP]
    assert msgs[0].uuid == CALL and msgs[1].rate == 8000 and msgs[2].digit == "5" and msgs[3].payload == b"\x01"
    assert d.buffered == 0


@pytest.mark.parametrize(("data", "kind"), [
    (b"\x42\x00\x00", "unknown_kind"),
    (b"\x10\xff\xff", "oversized"),  # a 64 KiB length: refused at its header, nothing waited for
    (b"\x01\x00\x04abcd", "bad_uuid"),
    (b"\x03\x00\x01Z", "bad_dtmf"),
    (b"\x03\x00\x0212", "bad_dtmf"),
    (b"\x10\x00\x03abc", "odd_audio"),
])
def test_hostile_input_is_a_typed_error(data, kind):
    with pytest.raises(A.AudioSocketError) as e:
        A.Decoder(4096).feed(data)
    assert e.value.kind == kind


def test_a_length_just_over_the_maximum_is_refused_before_the_payload():
    d = A.Decoder(320)
    assert d.feed(A.audio(b"\x00" * 320)) and d.buffered == 0
    with pytest.raises(A.AudioSocketError, match="oversized"):
        d.feed(b"\x10\x01\x42")  # 322 > 320: no payload sent at all


def test_builders_refuse_what_the_protocol_cannot_say():
    with pytest.raises(ValueError):
        A.encode(0x42)
    with pytest.raises(ValueError):
        A.encode(A.AUDIO_8K, b"\x00" * 65536)
    with pytest.raises(ValueError):
        A.dtmf("Z")
    with pytest.raises(KeyError):
        A.audio(b"", 22050)
    with pytest.raises(ValueError):
        A.Decoder(0)


_digits = st.sampled_from(sorted(A.DTMF_DIGITS))
_message = st.one_of(
    st.uuids().map(A.uuid_message),
    st.tuples(st.sampled_from(sorted(A.KIND_RATES.values())), st.integers(0, 400)).map(
        lambda t: A.audio(bytes(range(256))[: t[1] % 128 * 2] * 3, t[0])),
    _digits.map(A.dtmf),
    st.one_of(st.none(), st.integers(0, 255)).map(A.error),
    st.just(A.hangup()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, max_size=12), st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_split_anywhere_the_same_messages_come_out(msgs, cuts):
    stream = b"".join(msgs)
    whole = A.Decoder(A.MAX_LENGTH).feed(stream)
    assert [A.encode(m.kind, m.payload) for m in whole] == msgs
    d = A.Decoder(A.MAX_LENGTH)
    got: list[A.Message] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        got += d.feed(stream[pos:pos + n])
        pos, i = pos + n, i + 1
    assert got == whole and d.buffered == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(16, 1024))
def test_garbage_never_buffers_past_the_bound(data, max_payload):
    """Whatever arrives, the decoder yields messages or a typed error, and never holds more
    than one header and ``max_payload`` bytes."""
    d = A.Decoder(max_payload)
    try:
        for i in range(0, len(data), 7):
            for m in d.feed(data[i:i + 7]):
                assert m.kind in A.KINDS and len(m.payload) <= max_payload
            assert d.buffered < A.HEADER + max_payload
    except A.AudioSocketError as e:
        assert e.kind in {"unknown_kind", "oversized", "bad_uuid", "bad_dtmf", "odd_audio"}
