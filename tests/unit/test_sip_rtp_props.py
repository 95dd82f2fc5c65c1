"""Property: the RTP header parser and the RFC 4733 event parser (and the receiver that
de-duplicates events) return a value or raise their typed error for any bytes --
arbitrary ones and mutations of valid packets -- and what they return is in range."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import dtmf, rtp
from tests.unit.sip_mutations import mutated

AUDIO = rtp.build(0, True, 65535, 2**32 - 160, 0x1234, b"\xff" * 160)
EXT = bytes([0x90 | 0x20 | 2]) + AUDIO[1:12] + b"\x00" * 8 + b"\xbe\xde\x00\x01abcd" + b"\x7f" * 20 + b"\x00\x00\x03"
EVENT = rtp.build(101, True, 7, 800, 0x55, dtmf.encode_event(5, True, 10, 800))
PROPS = settings(max_examples=800, deadline=None)


def check(data: bytes) -> None:
    try:
        p = rtp.parse(data)
    except rtp.RtpError:
        return
    assert 0 <= p.payload_type <= 127 and 0 <= p.seq <= 0xFFFF and 0 <= p.timestamp <= 0xFFFFFFFF
    assert len(p.payload) <= rtp.MAX_PAYLOAD and len(p.payload) <= len(data) - 12


def check_event(payload: bytes) -> None:
    try:
        code, end, volume, duration = dtmf.decode_event(payload)
    except dtmf.DtmfError:
        assert len(payload) < 4
        return
    assert 0 <= code <= 255 and isinstance(end, bool) and 0 <= volume <= 63 and 0 <= duration <= 0xFFFF
    ev = dtmf.EventReceiver().on_packet(0, payload)
    assert ev is None or (ev.digit in dtmf.DIGITS and ev.duration_ms >= 0)


@PROPS
@given(st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)
    check_event(data)


@PROPS
@given(st.one_of(mutated(AUDIO), mutated(EXT), mutated(EVENT)))
def test_mutated_packets(data: bytes) -> None:
    check(data)
    try:
        check_event(rtp.parse(data).payload)
    except rtp.RtpError:
        pass
