"""Hostile SIP and RTP against the real gateway process on loopback: a few hundred INVITEs
that must be refused (malformed Contact or From, an SDP port of 99999, a hostname as the
SDP address, Unicode digits in CSeq or Content-Length, CR-laden headers, oversized
datagrams) admit no call and leak no ring; a valid call right after is answered and its
audio flows while another port sprays spoofed RTP at it: the spoofed packets are dropped
and counted and the call's ``in`` ring is bit-exact to what the real peer sent; a source
over its rate limit gets 503 with Retry-After."""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
import time

import numpy as np
import pytest

from brisvox.wire import rtp, sdp
from brisvox.wire.sip_message import parse
from tests.system.gateway_harness import GatewayProc, attached_ring, have, make_fixture

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(not (have("espeak-ng") and have("sox")), reason="needs espeak-ng and sox")]

_n = itertools.count(1)
HOSTILE_SRC = "127.0.0.2"  # the attacker: allowed by the default [sip] allow, not the real peer


def udp(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.settimeout(2.0)
    return s


def offer(host: str, port: int | str) -> bytes:
    return (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n").encode()


def request(method: str, gw_port: int, local: tuple[str, int], *, body: bytes = b"", call_id: str = "",
            contact: str = "", frm: str = "", cseq: str = "", to: str = "<sip:echo@127.0.0.1>",
            extra: str = "", cl: str = "") -> bytes:
    n = next(_n)
    host, port = local
    head = (f"{method} sip:echo@127.0.0.1:{gw_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {host}:{port};branch=z9hG4bK{n}h{time.monotonic_ns()};rport\r\n"
            f"From: {frm or f'<sip:peer@{host}>;tag=p{n}'}\r\nTo: {to}\r\n"
            f"Call-ID: {call_id or f'h{n}@{host}'}\r\nCSeq: {cseq or f'1 {method}'}\r\n"
            f"Contact: {contact or f'<sip:peer@{host}:{port}>'}\r\nMax-Forwards: 70\r\n{extra}"
            + ("Content-Type: application/sdp\r\n" if body else "")
            + f"Content-Length: {cl or len(body)}\r\n\r\n")
    return head.encode("utf-8") + body


def hostile(gw_port: int, local: tuple[str, int]) -> list[bytes]:
    good = offer("127.0.0.1", 4000)
    return [
        request("INVITE", gw_port, local, body=good, contact="<sip:broken"),
        request("INVITE", gw_port, local, body=good, frm="<sip:x@127.0.0.2;tag=1"),
        request("INVITE", gw_port, local, body=offer("127.0.0.1", 99999)),
        request("INVITE", gw_port, local, body=offer("pbx.example.com", 4000)),
        request("INVITE", gw_port, local, body=good, cseq="1\u00b2 INVITE"),
        request("INVITE", gw_port, local, body=good, cl="1\u0661\u0662"),
        request("INVITE", gw_port, local, body=good, extra="Subject: hi\rX-Injected: yes\r\n"),
        request("INVITE", gw_port, local, body=good, extra="X-Nul: a\x00b\r\n"),
        request("INVITE", gw_port, local, body=good + b"a=x:" + b"y" * 20000 + b"\r\n"),  # 513
        request("INVITE", gw_port, local, body=b"z" * 64000),  # near a UDP datagram's limit
    ]


def drain(s: socket.socket) -> list[bytes]:
    got = []
    s.settimeout(0.05)
    with contextlib.suppress(TimeoutError, BlockingIOError):
        while True:
            got.append(s.recv(65535))
    return got


def finals(datagrams: list[bytes]) -> list[int]:
    codes = [int(d[8:11]) for d in datagrams if d.startswith(b"SIP/2.0 ")]
    return [c for c in codes if c >= 200]


def test_hostile_invites_admit_nothing_and_spoofed_rtp_is_dropped(short_tmp):
    fx = make_fixture(short_tmp, "Hostile input test. One two three.")
    ulaw = fx["ulaw"].read_bytes()
    ref = np.fromfile(fx["ref"], dtype="<i2")
    with contextlib.ExitStack() as stack, \
            GatewayProc(short_tmp, inbox=True, sip={"invite_rate": ["1000/second"],
                                                    "options_rate": ["5/second"]}) as gw:
        port = gw.sip_port
        bad = stack.enter_context(udp(HOSTILE_SRC))
        bad_local = bad.getsockname()
        kinds = hostile(port, bad_local)
        # 1. a few hundred hostile INVITEs: every one refused, nothing admitted, nothing leaked
        sent = 0
        replies: list[bytes] = []
        for i in range(30):
            for data in hostile(port, bad_local) if i else kinds:
                bad.sendto(data, ("127.0.0.1", port))
                sent += 1
            replies += drain(bad)
        time.sleep(0.3)
        replies += drain(bad)
        codes = finals(replies)
        assert 200 not in codes and set(codes) <= {400, 488, 513}, sorted(set(codes))
        answered = {re.search(rb"\r\nCall-ID: ([^\r]*)", d).group(1)  # type: ignore[union-attr]
                    for d in replies if d.startswith(b"SIP/2.0 ") and int(d[8:11]) >= 200}
        assert len(answered) == sent, (len(answered), sent)  # each one (the 488s are retransmitted)
        st = gw.stats()
        assert st["calls_admitted"] == 0 and st["calls_active"] == 0 and gw.segments() == []
        assert st["sip_refused_malformed"] > 0 and st["sip_refused_sdp"] > 0 and st["sip_refused_too_large"] > 0
        assert st.get("sip_internal_errors", 0) == 0
        # 2. a valid call right after is answered 200, its audio flows
        sig = stack.enter_context(udp())
        media = stack.enter_context(udp())
        spoof = stack.enter_context(udp())
        sig_local, media_port = sig.getsockname(), media.getsockname()[1]
        cid = f"good{time.monotonic_ns()}@127.0.0.1"
        sig.sendto(request("INVITE", port, sig_local, body=offer("127.0.0.1", media_port), call_id=cid,
                           frm="<sip:peer@127.0.0.1>;tag=good"), ("127.0.0.1", port))
        resp = None
        while resp is None or resp.status < 200:
            resp = parse(sig.recv(65535))
        assert resp.status == 200, resp.status
        ans = sdp.negotiate(sdp.parse(resp.body))
        gw_rtp = ("127.0.0.1", ans.remote_port)
        sig.sendto(request("ACK", port, sig_local, call_id=cid, frm="<sip:peer@127.0.0.1>;tag=good",
                           to=resp.get("to"), cseq="1 ACK"), ("127.0.0.1", port))
        got: dict[str, np.ndarray] = {}

        def reader() -> None:
            with attached_ring(gw.instance, "in") as ring:
                deadline = time.monotonic() + len(ref) / 8000 + 5
                while ring.write_pos < len(ref) and time.monotonic() < deadline:
                    time.sleep(0.02)
                time.sleep(0.2)  # anything extra (a spoofed packet played) would land now
                got["in"] = ring.read_range(0, ring.write_pos).samples.copy()

        th = threading.Thread(target=reader)
        th.start()
        # 3. the real peer streams the fixture; another port sprays spoofed RTP one packet ahead
        sender = rtp.RtpSender()
        spoofed = 0
        t0 = time.monotonic()
        for k in range(len(ulaw) // 160):
            hdr = sender.next_header(0, 160, time.monotonic())
            if k % 4 == 0:  # the next packet's sequence, in silence: it would replace the real one
                nxt = bytearray(rtp.build(0, False, sender.seq, sender.ts, sender.ssrc, b"\xff" * 160))
                spoof.sendto(bytes(nxt), gw_rtp)
                spoof.sendto(bytes(hdr) + b"\x00" * 160, gw_rtp)
                spoofed += 2
            media.sendto(bytes(hdr) + ulaw[k * 160:(k + 1) * 160], gw_rtp)
            if k % 50 == 0:  # more hostile SIP during the call
                for data in kinds[:5]:
                    bad.sendto(data, ("127.0.0.1", port))
            delay = t0 + (k + 1) * 0.02 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        th.join(15)
        echoed = drain(media)
        assert np.array_equal(got["in"][: len(ref)], ref), "in-ring samples differ from what the peer sent"
        assert len(got["in"]) == len(ref)
        assert len(echoed) > 20, "no RTP from the gateway (the echo agent's audio)"
        st = gw.stats()
        assert st["rtp_foreign_dropped"] == spoofed and st["calls_admitted"] == 1
        # 4. a source over its OPTIONS rate: 503 with Retry-After, no transaction
        flood = stack.enter_context(udp("127.0.0.3"))
        for _ in range(8):
            flood.sendto(request("OPTIONS", port, flood.getsockname()), ("127.0.0.1", port))
        limited = [parse(d) for d in drain(flood) + drain(flood)]
        assert sorted(m.status for m in limited) == [200] * 5 + [503] * 3
        assert all(int(m.get("retry-after")) >= 1 for m in limited if m.status == 503)
        # 5. the caller hangs up: everything released
        sig.sendto(request("BYE", port, sig_local, call_id=cid, frm="<sip:peer@127.0.0.1>;tag=good",
                           to=resp.get("to"), cseq="2 BYE"), ("127.0.0.1", port))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (gw.stats()["calls_active"] or gw.segments()):
            time.sleep(0.05)
        st = gw.stats()
        assert st["calls_active"] == 0 and gw.segments() == []
        assert st["call_rtp_foreign_dropped_total"] == spoofed
        assert st["sip_refused_rate_limit"] == 3
    assert gw.leaked == []
