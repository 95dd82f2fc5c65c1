"""brisvox/wire: SIP parser/serializer, SDP offer/answer and SIP transaction timers (pure logic)."""

from __future__ import annotations

import pytest

from brisvox.wire import sdp
from brisvox.wire.sip_dialog import Dialog, make_response
from brisvox.wire.sip_message import SipParseError, parse, parse_name_addr, parse_uri, parse_via
from brisvox.wire.sip_transaction import (
    ClientNonInvite,
    Deliver,
    Retransmit2xx,
    Send,
    ServerInvite,
    ServerNonInvite,
    TimedOut,
    Timers,
)

INVITE = (
    "INVITE sip:echo@127.0.0.1:5060 SIP/2.0\r\n"
    "v: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bKabc;rport\r\n"
    "Via: SIP/2.0/UDP proxy.example:5060;branch=z9hG4bKp1, SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKp0\r\n"
    "f: \"Alice, A\" <sip:alice@10.0.0.1>;tag=a1\r\n"
    "t: <sip:echo@127.0.0.1>\r\n"
    "i: call-1@10.0.0.1\r\n"
    "CSeq: 7 INVITE\r\n"
    "m: <sip:alice@10.0.0.1:5070>\r\n"
    "Record-Route: <sip:p1.example;lr>, <sip:p2.example;lr>\r\n"
    "Subject: folded\r\n  header line\r\n"
    "c: application/sdp\r\n"
    "l: {n}\r\n\r\n"
)
SDP = ("v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n"
       "m=audio 4000 RTP/AVP 8 0 101\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
       "m=video 4002 RTP/AVP 96\r\n")


def invite(body: str = SDP) -> bytes:
    return (INVITE.format(n=len(body)) + body).encode()


def test_parse_compact_folded_multi_valued():
    m = parse(invite())
    assert m.method == "INVITE" and m.uri == "sip:echo@127.0.0.1:5060"
    assert len(m.get_all("via")) == 3 and m.top_via.branch == "z9hG4bKabc"
    assert m.call_id == "call-1@10.0.0.1" and m.cseq == (7, "INVITE")
    assert m.from_tag == "a1" and m.to_tag == ""
    assert m.get_all("record-route") == ["<sip:p1.example;lr>", "<sip:p2.example;lr>"]
    assert m.get("subject") == "folded header line"
    assert m.body == SDP.encode()
    again = parse(m.serialize())
    assert again.headers == m.headers and again.body == m.body


@pytest.mark.parametrize("data,kind,can_reply", [
    (b"", "truncated", False),
    (b"\x00\x01\x02 garbage", "truncated", False),
    (b"hello world\r\n\r\n", "garbage", False),
    (b"INVITE sip:x SIP/2.0\r\nVia: SIP/2.0/UDP h\r\n", "truncated", False),
    (b"SIP/2.0 99999 Bad\r\n\r\n", "garbage", False),
    (b"\xff\xfe\r\n\r\n", "bad_encoding", False),
])
def test_garbage_raises_typed_errors(data, kind, can_reply):
    with pytest.raises(SipParseError) as e:
        parse(data)
    assert e.value.kind == kind and e.value.can_reply == can_reply


def test_huge_content_length_is_answerable_400():
    data = invite().replace(f"l: {len(SDP)}".encode(), b"l: 99999999")
    with pytest.raises(SipParseError) as e:
        parse(data)
    assert e.value.kind == "bad_content_length" and e.value.can_reply


def test_missing_call_id_cannot_be_answered_and_oversized_is_refused():
    data = invite().replace(b"i: call-1@10.0.0.1\r\n", b"")
    with pytest.raises(SipParseError) as e:
        parse(data)
    assert e.value.kind == "missing_header" and not e.value.can_reply
    with pytest.raises(SipParseError) as e2:
        parse(invite(), max_bytes=100)
    assert e2.value.kind == "oversized"


def test_grammars():
    v = parse_via("SIP/2.0/UDP [::1]:5070;branch=z9hG4bKx;received=1.2.3.4")
    assert (v.host, v.port, v.branch, v.params["received"]) == ("::1", 5070, "z9hG4bKx", "1.2.3.4")
    na = parse_name_addr('"Bob" <sip:bob@h:5062;transport=udp>;tag=99')
    assert na.uri == "sip:bob@h:5062;transport=udp" and na.params == {"tag": "99"}
    u = parse_uri("sip:bob@h:5062;transport=udp")
    assert (u.user, u.host, u.port, u.params) == ("bob", "h", 5062, {"transport": "udp"})


def test_response_copies_via_and_tags_to():
    req = parse(invite())
    r = make_response(req, 200, to_tag="t1", contact="<sip:gw@127.0.0.1>", body=b"v=0\r\n")
    assert r.get_all("via") == req.get_all("via")
    assert r.to_tag == "t1" and r.get_all("record-route") == req.get_all("record-route")
    assert parse(r.serialize()).status == 200
    assert make_response(req, 100, to_tag="t1").to_tag == ""  # 100 creates no dialog


def test_dialog_requests_use_target_and_route_set():
    req = parse(invite())
    d = Dialog.from_invite(req, "mine", "<sip:gw@127.0.0.1:5060>", ("10.0.0.1", 5070))
    bye = d.request("BYE", "127.0.0.1:5060")
    assert bye.uri == "sip:alice@10.0.0.1:5070"
    assert bye.get_all("route") == ["<sip:p1.example;lr>", "<sip:p2.example;lr>"]
    assert bye.from_tag == "mine" and bye.to_tag == "a1" and bye.cseq[1] == "BYE"
    assert d.next_hop() == ("10.0.0.1", 5070)  # first route is not an IP: the INVITE's source


def test_sdp_negotiation_prefers_the_offer_order_and_answers_every_stream():
    offer = sdp.parse(SDP.encode())
    neg = sdp.negotiate(offer)
    assert (neg.codec, neg.payload_type, neg.dtmf_pt) == ("PCMA", 8, 101)
    assert (neg.remote_host, neg.remote_port, neg.direction) == ("10.0.0.1", 4000, "sendrecv")
    ans = sdp.parse(sdp.build(host="127.0.0.1", port=20000, session_id=1, version=1, neg=neg, offer=offer))
    assert [m.port for m in ans.media] == [20000, 0]
    assert ans.media[0].formats == ["8", "101"]
    assert sdp.negotiate(offer, ("PCMU",)).codec == "PCMU"


@pytest.mark.parametrize("direction,answer,hold", [
    ("sendonly", "recvonly", True), ("inactive", "inactive", True), ("recvonly", "sendonly", False)])
def test_hold_directions(direction, answer, hold):
    neg = sdp.negotiate(sdp.parse(SDP.replace("a=sendrecv", f"a={direction}").encode()))
    assert neg.direction == answer and neg.on_hold == hold
    old_hold = sdp.negotiate(sdp.parse(SDP.replace("c=IN IP4 10.0.0.1", "c=IN IP4 0.0.0.0").encode()))
    assert old_hold.on_hold


def test_sdp_without_g711_is_refused():
    with pytest.raises(sdp.SdpError):
        sdp.negotiate(sdp.parse(SDP.replace("RTP/AVP 8 0 101", "RTP/AVP 18 101").encode()))
    with pytest.raises(sdp.SdpError):
        sdp.negotiate(sdp.parse(SDP.replace("RTP/AVP 8 0 101", "RTP/SAVP 0").encode()))


T = Timers(0.5, 4.0, 5.0)
ADDR = ("10.0.0.1", 5070)


def test_invite_server_non_2xx_retransmits_with_timer_g_until_ack_or_h():
    req = parse(invite())
    tx = ServerInvite(("k",), ADDR, T)
    tx.respond(make_response(req, 100), 0.0)
    assert tx.on_retransmit(0.1) and tx.state == "proceeding"
    out = tx.respond(make_response(req, 486, to_tag="x"), 1.0)
    assert isinstance(out[0], Send) and tx.state == "completed"
    sends = []
    now = 1.0
    while not tx.done and now < 100:
        now = tx.deadline
        for a in tx.on_timer(now):
            sends.append((now, a))
    times = [round(t - 1.0, 3) for t, a in sends if isinstance(a, Send)]
    assert times[:5] == [0.5, 1.5, 3.5, 7.5, 11.5]  # T1, 2T1, 4T1, then T2 steps
    assert isinstance(sends[-1][1], TimedOut) and round(sends[-1][0] - 1.0, 3) == 32.0  # Timer H


def test_invite_server_ack_stops_retransmissions_then_timer_i():
    req = parse(invite())
    tx = ServerInvite(("k",), ADDR, T)
    tx.respond(make_response(req, 503), 0.0)
    tx.on_ack(0.2)
    assert tx.state == "confirmed" and tx.deadline == pytest.approx(5.2)
    assert tx.on_timer(5.2) == [] and tx.done


def test_2xx_retransmission_and_give_up():
    r = Retransmit2xx(("2xx",), ADDR, T, b"200", 0.0)
    got = []
    while not r.done:
        now = r.deadline
        got += [(now, a) for a in r.on_timer(now)]
    sends = [t for t, a in got if isinstance(a, Send)]
    assert sends[:4] == [0.5, 1.5, 3.5, 7.5] and isinstance(got[-1][1], TimedOut) and got[-1][0] == 32.0
    r2 = Retransmit2xx(("2xx",), ADDR, T, b"200", 0.0)
    r2.acked()
    assert r2.on_timer(1.0) == [] and r2.done


def test_non_invite_server_absorbs_retransmissions_for_timer_j():
    req = parse(invite().replace(b"INVITE", b"OPTIONS", 1).replace(b"7 INVITE", b"7 OPTIONS"))
    tx = ServerNonInvite(("k",), ADDR, T)
    first = tx.respond(make_response(req, 200), 0.0)
    assert tx.on_retransmit(1.0) == first and tx.deadline == 32.0
    tx.on_timer(32.0)
    assert tx.done


def test_non_invite_client_timer_e_f_and_response():
    req = parse(invite().replace(b"INVITE sip", b"BYE sip", 1).replace(b"7 INVITE", b"7 BYE"))
    tx = ClientNonInvite(("b", "BYE"), ADDR, T, req)
    assert isinstance(tx.start(0.0)[0], Send)
    times = []
    while not tx.done:
        now = tx.deadline
        acts = tx.on_timer(now)
        times += [(now, a) for a in acts]
    assert [t for t, a in times if isinstance(a, Send)][:5] == [0.5, 1.5, 3.5, 7.5, 11.5]
    assert isinstance(times[-1][1], TimedOut) and times[-1][0] == 32.0
    tx2 = ClientNonInvite(("b2", "BYE"), ADDR, T, req)
    tx2.start(0.0)
    resp = make_response(req, 200)
    assert isinstance(tx2.on_response(resp, 0.1)[0], Deliver)
    assert tx2.on_response(resp, 0.2) == []  # retransmitted final absorbed
    assert tx2.on_timer(5.1) == [] and tx2.done


@pytest.mark.parametrize("data", [
    b"SIP/2.0 \xc2\xb2\xc2\xb2\xc2\xb2 OK\r\nVia: SIP/2.0/UDP h\r\n\r\n",  # Unicode digits as the status
    invite().replace(b"CSeq: 7", "CSeq: 7\u00b2".encode()),
    invite().replace(f"l: {len(SDP)}".encode(), "l: 1\u00b2".encode()),
    invite().replace(b"m: <sip:alice@10.0.0.1:5070>", b"m: <sip:alice@10.0.0.1:5070"),
    invite().replace(b"10.0.0.1:5070;branch", "10.0.0.1:5\u00b2;branch".encode()),
    invite().replace(b"v: SIP/2.0/UDP 10.0.0.1:5070", b"v: SIP/2.0/UDP [::1:5070"),
    invite().replace(b"Subject: folded", b"Subject: a\rInjected: b"),
])
def test_old_crashers_raise_the_typed_error(data):
    with pytest.raises(SipParseError):
        parse(data)


@pytest.mark.parametrize("body", [
    SDP.replace("m=audio 4000", "m=audio 99999"),
    SDP.replace("m=audio 4000", "m=audio 4\u00b2"),
    SDP.replace("c=IN IP4 10.0.0.1", "c=IN IP4 pbx.example.com"),
    SDP.replace("c=IN IP4 10.0.0.1", "c=IN IP6 10.0.0.1"),
    SDP.replace("RTP/AVP 8 0 101", "RTP/AVP 8 0 128"),
    SDP + "m=audio 5000 RTP/AVP 0\r\n" * 8,
])
def test_unusable_sdp_is_an_sdp_error(body):
    with pytest.raises(sdp.SdpError):
        sdp.parse(body.encode())


def test_a_declined_audio_stream_is_not_negotiated():
    offer = sdp.parse(SDP.replace("m=audio 4000", "m=audio 0").encode())
    with pytest.raises(sdp.SdpError):
        sdp.negotiate(offer)
