"""Property: the SIP message parser (and the dtmf-relay and dtmf INFO body parsers) returns a message or
raises ITS typed error for any bytes -- arbitrary ones and mutations of valid messages --
and a message it returns can be used: CSeq, Via, tags, a response to it, its serialization."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brisvox.wire import dtmf
from brisvox.wire.sip_dialog import Dialog, make_response
from brisvox.wire.sip_message import SipParseError, parse, quoted_string
from tests.unit.sip_mutations import mutated, text

SDP = (b"v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
       b"m=audio 4000 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\n")
INVITE = (b"INVITE sip:echo@127.0.0.1:5060 SIP/2.0\r\n"
          b"Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bKabc;rport\r\n"
          b"From: \"Alice\" <sip:alice@10.0.0.1>;tag=a1\r\nTo: <sip:echo@127.0.0.1>\r\n"
          b"Call-ID: call-1@10.0.0.1\r\nCSeq: 7 INVITE\r\nContact: <sip:alice@10.0.0.1:5070>\r\n"
          b"Max-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n" % len(SDP)) + SDP
RESPONSE = (b"SIP/2.0 202 Accepted\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKx\r\n"
            b"From: <sip:brisvox@127.0.0.1>;tag=b\r\nTo: <sip:a@10.0.0.1>;tag=a\r\nCall-ID: x@y\r\n"
            b"CSeq: 3 REFER\r\nContent-Length: 0\r\n\r\n")
RELAY = b"Signal=5\r\nDuration=160\r\n"
PROPS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(data: bytes) -> None:
    try:
        msg = parse(data, 4096)
    except SipParseError as e:
        assert e.kind
        if e.can_reply:  # the 400/513 must be buildable and must not carry a raw CR/LF
            assert e.msg is not None
            make_response(e.msg, 400, e.detail[:60]).serialize()
        return
    msg.cseq, msg.top_via, msg.from_tag, msg.to_tag  # noqa: B018 - must not raise
    out = make_response(msg, 200, to_tag="t").serialize() if msg.is_request else msg.serialize()
    head = out.split(b"\r\n\r\n", 1)[0]
    assert b"\r" not in head.replace(b"\r\n", b"") and b"\n" not in head.replace(b"\r\n", b"")
    if msg.method == "INVITE":
        try:
            Dialog.from_invite(msg, "x", "<sip:gw@127.0.0.1>", ("127.0.0.1", 5060))
        except ValueError:
            pass


@PROPS
@given(st.binary(max_size=600))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)


@PROPS
@given(mutated(INVITE))
def test_mutated_invites(data: bytes) -> None:
    check(data)


@PROPS
@given(mutated(RESPONSE))
def test_mutated_responses(data: bytes) -> None:
    check(data)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=80), mutated(RELAY)))
def test_dtmf_relay_bodies(data: bytes) -> None:
    try:
        digit, dur = dtmf.parse_dtmf_relay(data)
    except dtmf.DtmfError:
        return
    assert digit in dtmf.DIGITS and len(digit) == 1 and 0 <= dur <= dtmf.MAX_RELAY_MS


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=12), st.sampled_from([b"5", b"#\r\n", b" a ", b"11", b"16", b"55"])))
def test_dtmf_info_bodies(data: bytes) -> None:
    try:
        digit = dtmf.parse_dtmf_body(data)
    except dtmf.DtmfError:
        return
    assert digit in dtmf.DIGITS and len(digit) == 1


def test_dtmf_info_body_examples() -> None:
    assert [dtmf.parse_dtmf_body(b) for b in (b"5", b"#\r\n", b" a ", b"10", b"11", b"15")] == \
        ["5", "#", "A", "*", "#", "D"]
    for bad in (b"", b"55", b"16", b"x", b"Signal=5", b"\xff"):
        with pytest.raises(dtmf.DtmfError):
            dtmf.parse_dtmf_body(bad)


@settings(max_examples=400, deadline=None)
@given(text, st.integers(1, 200))
def test_quoted_string_is_closed_and_bounded(s: str, limit: int) -> None:
    q = quoted_string(s, limit)
    assert len(q.encode("utf-8")) <= limit
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in q)
    i = 0
    while i < len(q):  # every quote and backslash is part of a quoted-pair
        if q[i] == "\\":
            assert i + 1 < len(q) and q[i + 1] in '"\\'
            i += 2
            continue
        assert q[i] != '"'
        i += 1
