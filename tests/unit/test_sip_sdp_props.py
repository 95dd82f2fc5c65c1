"""Property: the SDP parser and offer/answer return a description or raise SdpError for any
bytes (arbitrary, and mutations of a valid offer), and what they return is in range: IP
literal addresses, ports 0..65535 (1..65535 negotiated), payload types 0..127, at most
MAX_MEDIA streams; the answer built from it mirrors every m= line."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import sdp
from tests.unit.sip_mutations import mutated

OFFER = (b"v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
         b"m=audio 4000 RTP/AVP 8 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\n"
         b"a=ptime:20\r\na=sendrecv\r\nm=video 4002 RTP/AVP 96\r\nc=IN IP6 ::1\r\na=rtpmap:96 VP8/90000\r\n")
PROPS = settings(max_examples=800, deadline=None)


def check(data: bytes) -> None:
    try:
        sd = sdp.parse(data)
    except sdp.SdpError:
        return
    assert 1 <= len(sd.media) <= sdp.MAX_MEDIA
    for addr in [sd.connection] + [m.connection for m in sd.media]:
        if addr:
            assert str(ipaddress.ip_address(addr)) == addr
    for m in sd.media:
        assert 0 <= m.port <= 65535
        assert all(0 <= pt <= 127 for pt in list(m.rtpmap) + list(m.fmtp))
    try:
        neg = sdp.negotiate(sd)
    except sdp.SdpError:
        return
    assert 1 <= neg.remote_port <= 65535 and 0 <= neg.payload_type <= 127
    ipaddress.ip_address(neg.remote_host)
    answer = sdp.build(host="127.0.0.1", port=20000, session_id=1, version=1, neg=neg, offer=sd)
    assert answer.count(b"\r\nm=") == len(sd.media)


@PROPS
@given(st.binary(max_size=400))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)


@PROPS
@given(mutated(OFFER, max_ops=5))
def test_mutated_offers(data: bytes) -> None:
    check(data)
