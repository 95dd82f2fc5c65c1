"""SIP framing on TCP/TLS (brisvox/wire/sip_stream.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire.sip_stream import PING, FramingError, StreamFramer


def msg(body: bytes = b"", cl: str | None = None) -> bytes:
    length = str(len(body)) if cl is None else cl
    return (b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/TCP 1.2.3.4;branch=z9hG4bK1\r\nCall-ID: x\r\n"
            b"CSeq: 1 OPTIONS\r\nl: " + length.encode() + b"\r\n\r\n" + body)


def test_pipelined_messages_pings_and_crlfs():
    a, b = msg(b"hello"), msg()
    f = StreamFramer(4096)
    assert f.feed(b"\r\n" + a + PING + b + b"\r\n") == [a, PING, b]
    assert f.buffered == 0 and f.crlfs_seen == 4
    g = StreamFramer(4096)
    assert g.feed(a + b"\r\n") == [a] and g.crlfs_seen == 1  # the pong to a ping we sent: one CRLF


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=40))
def test_split_anywhere_gives_the_same_messages(cuts):
    stream = msg(b"x" * 30) + PING + msg() + msg(b"yz")
    f = StreamFramer(4096)
    out: list[bytes] = []
    pos = 0
    for c in cuts * 10:
        out += f.feed(stream[pos:pos + c])
        pos += c
        if pos >= len(stream):
            break
    out += f.feed(stream[pos:])
    assert out == [msg(b"x" * 30), PING, msg(), msg(b"yz")]


@pytest.mark.parametrize("data,kind", [
    (msg(cl="10000000"), "oversized"),
    (msg(body=b"", cl="1x"), "no_length"),
    (msg().replace(b"l: 0\r\n", b""), "no_length"),
    (b"INVITE sip:a@b SIP/2.0\r\n" + b"X: y\r\n" * 1000, "head_too_long"),
])
def test_bad_streams_are_typed_before_the_body_is_awaited(data, kind):
    with pytest.raises(FramingError) as e:
        StreamFramer(4096).feed(data)
    assert e.value.kind == kind
    if kind != "head_too_long":
        assert e.value.head.startswith(b"INVITE" if kind == "head_too_long" else b"OPTIONS")


def test_reliable_transports_retransmit_nothing_and_end_at_once():
    from brisvox.wire.sip_message import SipMessage
    from brisvox.wire.sip_transaction import (
        ClientInvite,
        ClientNonInvite,
        Send,
        ServerInvite,
        ServerNonInvite,
        Timers,
    )

    t = Timers(reliable=True)
    req = SipMessage(method="BYE", uri="sip:a@b")
    req.headers += [("via", "SIP/2.0/TCP h;branch=z9hG4bK1"), ("cseq", "1 BYE"), ("call-id", "c")]
    nict = ClientNonInvite(("k",), ("h", 1), t, req)
    assert [type(a) for a in nict.start(0.0)] == [Send] and nict.deadline == 64 * t.t1  # F only, no E
    assert nict.on_timer(1.0) == []
    inv = SipMessage(method="INVITE", uri="sip:a@b")
    inv.headers += [("via", "SIP/2.0/TCP h;branch=z9hG4bK2"), ("cseq", "1 INVITE"), ("call-id", "c")]
    ict = ClientInvite(("k2",), ("h", 1), t, inv)
    ict.start(0.0)
    assert ict.deadline == 64 * t.t1 and ict.on_timer(0.6) == []  # B only, no A
    sit = ServerInvite(("k3",), ("h", 1), t)
    final = SipMessage(status=486, reason="Busy")
    final.headers += [("via", "SIP/2.0/TCP h;branch=z9hG4bK3"), ("cseq", "1 INVITE"), ("call-id", "c")]
    sit.respond(final, 0.0)
    assert sit.deadline == 64 * t.t1 and sit.on_timer(0.6) == []  # H only, no G
    sit.on_ack(1.0)
    assert sit.deadline == 1.0  # Timer I = 0
    snit = ServerNonInvite(("k4",), ("h", 1), t)
    ok = SipMessage(status=200, reason="OK")
    ok.headers += [("via", "SIP/2.0/TCP h;branch=z9hG4bK4"), ("cseq", "1 BYE"), ("call-id", "c")]
    snit.respond(ok, 2.0)
    assert snit.deadline == 2.0  # Timer J = 0
    udp = ServerNonInvite(("k5",), ("h", 1), Timers())
    udp.respond(ok, 2.0)
    assert udp.deadline == 2.0 + 32.0
