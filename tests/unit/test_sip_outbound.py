"""Outbound SIP: the INVITE client transaction, the UAC dialog, dial targets and ``[sip] trunk``."""

from __future__ import annotations

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import SipConfig
from brisvox.gateway.sip.outbound import failure_reason, resolve_target
from brisvox.wire.sip_dialog import Dialog
from brisvox.wire.sip_message import SipMessage, parse
from brisvox.wire.sip_transaction import ClientInvite, Deliver, Send, TimedOut, Timers

T = Timers(0.5, 4.0, 5.0)
DEST = ("127.0.0.1", 5070)


def invite() -> SipMessage:
    m = SipMessage(method="INVITE", uri="sip:bob@127.0.0.1:5070")
    m.headers += [("via", "SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKabc;rport"), ("max-forwards", "70"),
                  ("from", "<sip:brisvox@127.0.0.1:5060>;tag=ours"), ("to", "<sip:bob@127.0.0.1:5070>"),
                  ("call-id", "c1@127.0.0.1"), ("cseq", "7 INVITE"), ("contact", "<sip:brisvox@127.0.0.1:5060>")]
    return m


def response(status: int, reason: str = "", *, tag: str = "theirs", extra: str = "") -> SipMessage:
    raw = (f"SIP/2.0 {status} {reason or 'X'}\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKabc;rport\r\n"
           f"From: <sip:brisvox@127.0.0.1:5060>;tag=ours\r\nTo: <sip:bob@127.0.0.1:5070>;tag={tag}\r\n"
           f"Call-ID: c1@127.0.0.1\r\nCSeq: 7 INVITE\r\n{extra}Content-Length: 0\r\n\r\n")
    return parse(raw.encode())


def test_client_invite_retransmits_until_a_provisional_then_waits():
    tx = ClientInvite(("z9hG4bKabc", "INVITE"), DEST, T, invite())
    assert [type(a) for a in tx.start(0.0)] == [Send]
    assert [type(a) for a in tx.on_timer(0.5)] == [Send]  # Timer A
    assert [type(a) for a in tx.on_timer(1.5)] == [Send]  # doubled
    acts = tx.on_response(response(180, "Ringing"), 1.6)
    assert [type(a) for a in acts] == [Deliver] and tx.deadline is None  # no more retransmissions
    assert tx.on_timer(100.0) == []


def test_client_invite_times_out_without_any_response():
    tx = ClientInvite(("b", "INVITE"), DEST, T, invite())
    tx.start(0.0)
    t, out = 0.0, []
    while not tx.done and t < 40:
        t = tx.deadline or t + 1
        out += tx.on_timer(t)
    assert isinstance(out[-1], TimedOut) and t <= 32.0


def test_client_invite_acks_a_non_2xx_itself_and_delivers_it_once():
    tx = ClientInvite(("b", "INVITE"), DEST, T, invite())
    tx.start(0.0)
    acts = tx.on_response(response(486, "Busy Here"), 0.1)
    assert isinstance(acts[0], Send) and isinstance(acts[1], Deliver)
    ack = parse(acts[0].data)
    assert ack.method == "ACK" and ack.cseq == (7, "ACK") and ack.to_tag == "theirs"
    assert ack.top_via.branch == "z9hG4bKabc"
    again = tx.on_response(response(486, "Busy Here"), 0.2)
    assert [type(a) for a in again] == [Send]  # the same ACK, nothing new for the TU
    tx.on_timer(tx.deadline or 0)
    assert tx.done


def test_client_invite_delivers_every_2xx_for_the_tu_to_ack():
    tx = ClientInvite(("b", "INVITE"), DEST, T, invite())
    tx.start(0.0)
    assert [type(a) for a in tx.on_response(response(200, "OK"), 0.1)] == [Deliver]
    assert [type(a) for a in tx.on_response(response(200, "OK"), 0.6)] == [Deliver]
    assert tx.on_response(response(486), 0.7) == []


def test_uac_dialog_takes_tag_target_and_reversed_record_route_from_the_2xx():
    d = Dialog.for_outgoing(invite(), "<sip:brisvox@127.0.0.1:5060>", DEST)
    assert d.local_tag == "ours" and d.remote_tag == "" and d.local_cseq == 7
    d.answered(response(200, "OK", extra="Contact: <sip:bob@127.0.0.2:5090>\r\n"
                        "Record-Route: <sip:p1@127.0.0.9;lr>\r\nRecord-Route: <sip:p2@127.0.0.8;lr>\r\n"))
    assert d.remote_tag == "theirs" and d.remote_target == "sip:bob@127.0.0.2:5090"
    assert [r.split("@")[0] for r in d.route_set] == ["<sip:p2", "<sip:p1"]
    bye = d.request("BYE", "127.0.0.1:5060")
    assert bye.cseq == (8, "BYE") and bye.to_tag == "theirs" and bye.from_tag == "ours"
    assert d.next_hop() == ("127.0.0.8", 5060)


def test_dial_targets():
    assert resolve_target("sip:bob@127.0.0.1:5070", "") == ("sip:bob@127.0.0.1:5070", ("127.0.0.1", 5070))
    assert resolve_target("sip:bob@127.0.0.1", "") == ("sip:bob@127.0.0.1", ("127.0.0.1", 5060))
    assert resolve_target("+15550100", "10.0.0.5:5080") == ("sip:+15550100@10.0.0.5:5080", ("10.0.0.5", 5080))
    assert resolve_target("sip:bob@carrier.example", "10.0.0.5:5080")[1] == ("10.0.0.5", 5080)
    for bad in ("", "sip:bob@carrier.example", "bob", "sip:a@1.2.3.4>;x", "sip:a b@1.2.3.4", "1234", "x" * 300):
        with pytest.raises(ValueError):
            resolve_target(bad, "")
    assert failure_reason(486, "Busy Here") == "busy" and failure_reason(503, "Unavailable") == "503 Unavailable"


def test_trunk_config():
    assert SipConfig.from_section({"trunk": "192.0.2.10:5060"}).trunk == "192.0.2.10:5060"
    for bad in ("carrier.example:5060", "192.0.2.10", "192.0.2.10:0"):
        with pytest.raises(ConfigError):
            SipConfig.from_section({"trunk": bad})
