"""Where the real gateway process sends SIP and RTP, over UDP loopback, and which calls end:

* with ``[sip] allow = ["127.0.0.1/32"]``, INVITEs from 127.0.0.1 whose Contact or
  Record-Route names 127.0.0.5 are refused 403, one whose SDP does 488, and nothing ever
  reaches 127.0.0.5 (it listens: before, the call was answered and its BYE went there);
* ``rtp_latch = "first"``: a host that races the caller with RTP right after the 200 OK
  (127.0.0.2, inside allow) gets no audio, the caller does;
* a call held from its INVITE (``a=inactive``) is ended at ``hold_timeout_s`` with a BYE whose
  Reason says "hold timeout" (the RTP timeout spares held calls);
* a Request-URI user that ``[sip] users`` does not name gets 404 (``default_agent`` is "",
  its default).

Checked against the tree before (ed5766b): every test fails there (reflection to 127.0.0.5,
the attacker latched and got the audio, ``hold_timeout_s`` unknown, 200 for every user).
"""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

from brisvox.wire import rtp, sdp
from brisvox.wire.sip_message import SipMessage, parse
from tests.system.gateway_harness import GatewayProc
from tests.system.test_sip_hostile import drain, offer, request, udp

pytestmark = pytest.mark.system

OUTSIDE = "127.0.0.5"  # outside [sip] allow, listening: nothing may arrive
ATTACKER = "127.0.0.2"  # inside the default allow, not the caller


def final(sock: socket.socket, timeout: float = 3.0) -> SipMessage:
    """The first final response on ``sock``."""
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    while time.monotonic() < deadline:
        msg = parse(sock.recv(65535))
        if msg.status >= 200:
            return msg
    raise AssertionError("no final response")


def invite(sock: socket.socket, port: int, tag: str, media_port: int, **kw: object) -> tuple[str, SipMessage]:
    """Send an INVITE from ``sock`` (a sendrecv PCMU offer on ``media_port`` unless ``body``); (Call-ID, its final)."""
    cid = f"{tag}{time.monotonic_ns()}@127.0.0.1"
    body = kw.pop("body", offer("127.0.0.1", media_port))
    sock.sendto(request("INVITE", port, sock.getsockname(), body=body, call_id=cid,  # type: ignore[arg-type]
                        frm=f"<sip:peer@127.0.0.1>;tag={tag}", **kw), ("127.0.0.1", port))  # type: ignore[arg-type]
    return cid, final(sock)


def ack(sock: socket.socket, port: int, tag: str, cid: str, resp: SipMessage) -> None:
    sock.sendto(request("ACK", port, sock.getsockname(), call_id=cid, frm=f"<sip:peer@127.0.0.1>;tag={tag}",
                        to=resp.get("to"), cseq="1 ACK"), ("127.0.0.1", port))


def test_a_contact_record_route_or_sdp_outside_allow_is_refused_and_gets_nothing(short_tmp):
    with contextlib.ExitStack() as stack, \
            GatewayProc(short_tmp, inbox=True, sip={"allow": ["127.0.0.1/32"], "invite_rate": ["100/second"],
                                                    "t1_ms": 50, "rtp_timeout_s": 0.5}) as gw:
        port = gw.sip_port
        target = stack.enter_context(udp(OUTSIDE))  # the reflection target
        tport = target.getsockname()[1]
        sig = stack.enter_context(udp())
        cases = [("contact", {"contact": f"<sip:victim@{OUTSIDE}:{tport}>"}, 403),
                 ("rroute", {"extra": f"Record-Route: <sip:{OUTSIDE}:{tport};lr>\r\n"}, 403),
                 ("media", {"body": offer(OUTSIDE, tport)}, 488)]
        got: list[tuple[str, int, int]] = []
        for tag, kw, want in cases:
            cid, resp = invite(sig, port, tag, 4000, **kw)
            got.append((tag, resp.status, want))
            if resp.status == 200:  # (the old gateway) confirm the call: its RTP timeout then sends BYE
                ack(sig, port, tag, cid, resp)
        time.sleep(2.0)  # longer than the RTP timeout (and than 64*T1 for an unACKed 200)
        reached = drain(target)
        assert reached == [], f"{len(reached)} datagrams reached {OUTSIDE}: {reached[:1]}"
        assert [(t, s) for t, s, _ in got] == [(t, w) for t, _, w in got]
        st = gw.stats()
        assert st["sip_refused_destination"] == 2 and st["sip_refused_media_address"] == 1
        assert st["calls_admitted"] == 0 and gw.segments() == []
    assert gw.leaked == []


def test_the_first_latch_race_from_another_host_gets_no_audio(short_tmp):
    with contextlib.ExitStack() as stack, \
            GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 60},
                        sip={"rtp_latch": "first", "invite_rate": ["100/second"]}) as gw:
        port = gw.sip_port
        sig, media = stack.enter_context(udp()), stack.enter_context(udp())
        attacker = stack.enter_context(udp(ATTACKER))
        cid, resp = invite(sig, port, "race", media.getsockname()[1])
        assert resp.status == 200, resp.status
        gw_rtp = ("127.0.0.1", sdp.negotiate(sdp.parse(resp.body)).remote_port)
        evil, good = rtp.RtpSender(), rtp.RtpSender()
        for _ in range(5):  # the race: the attacker's packets land before the caller's first one
            attacker.sendto(bytes(evil.next_header(0, 160, time.monotonic())) + b"\x10" * 160, gw_rtp)
        ack(sig, port, "race", cid, resp)
        t0 = time.monotonic()
        for k in range(75):  # 1.5 s of caller audio (a loud square wave), the attacker keeps sending
            tone = (b"\x10" * 20 + b"\x90" * 20) * 4
            media.sendto(bytes(good.next_header(0, 160, time.monotonic())) + tone, gw_rtp)
            attacker.sendto(bytes(evil.next_header(0, 160, time.monotonic())) + tone, gw_rtp)
            delay = t0 + (k + 1) * 0.02 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        time.sleep(0.3)
        to_attacker, to_caller = drain(attacker), drain(media)
        assert to_attacker == [], f"the attacker received {len(to_attacker)} RTP packets of the call"
        assert len(to_caller) > 20, "the caller got no audio"
        st = gw.stats()
        assert st["rtp_foreign_dropped"] == 80 and st["rtp_latch_refused"] >= 5  # 5: before the caller latched
    assert gw.leaked == []


def test_a_held_call_ends_at_hold_timeout(short_tmp):
    with contextlib.ExitStack() as stack, \
            GatewayProc(short_tmp, inbox=True, sip={"hold_timeout_s": 1.0, "rtp_timeout_s": 0.5,
                                                    "invite_rate": ["100/second"]}) as gw:
        port = gw.sip_port
        sig = stack.enter_context(udp())
        held = offer("127.0.0.1", 4000).replace(b"a=sendrecv", b"a=inactive")
        cid, resp = invite(sig, port, "held", 4000, body=held)
        assert resp.status == 200, resp.status
        ack(sig, port, "held", cid, resp)
        t0 = time.monotonic()
        bye = None
        sig.settimeout(0.2)
        while bye is None and time.monotonic() - t0 < 4.0:
            with contextlib.suppress(TimeoutError):
                msg = parse(sig.recv(65535))
                if msg.method == "BYE":
                    bye = msg
        assert bye is not None, "the held call was never ended"
        assert 0.9 <= time.monotonic() - t0 <= 3.0
        assert 'text="hold timeout"' in bye.get("reason"), bye.get("reason")
        st = gw.stats()
        assert st["sip_hold_timeouts"] == 1 and st.get("rtp_timeouts", 0) == 0
    assert gw.leaked == []


def test_an_unknown_user_gets_404(short_tmp):
    # SipConfig's default (the harness names "default" for the other tests' many users)
    with contextlib.ExitStack() as stack, GatewayProc(short_tmp, inbox=True, sip={"default_agent": ""}) as gw:
        port = gw.sip_port
        sig = stack.enter_context(udp())
        statuses = []
        for name in ("svwar4711", "admin", "1000"):
            data = request("INVITE", port, sig.getsockname(), body=offer("127.0.0.1", 4000),
                           to=f"<sip:{name}@127.0.0.1>").replace(b"INVITE sip:echo@", f"INVITE sip:{name}@".encode())
            sig.sendto(data, ("127.0.0.1", port))
            statuses.append(final(sig).status)
        assert statuses == [404] * 3
        st = gw.stats()
        assert st["sip_invite_404"] == 3 and st["calls_admitted"] == 0
    assert gw.leaked == []
