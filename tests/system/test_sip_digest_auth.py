"""``[sip] auth = "digest"`` on the real gateway process, tried as a caller and as an attacker would.

SIPp answers the 401 with its own digest code and gets 200; with a wrong password it does not.
A raw UAC (the digest maths of brisvox/wire/sip_digest.py as the client) proves the rest: the
authenticated user's agent serves the call and the call names the user; a replayed
Authorization, a nonce minted for another source and a stale nonce are refused (the stale one
with ``stale=true``, and its fresh answer passes); wrong guesses from one source end in 403
(then not even a challenge) while another source's good call still gets 200; a user guessed at
from several sources is locked out too, even with the right password. Nothing is admitted for a refused INVITE.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from typing import Any

import pytest

from bench.harness import sipp as S
from brisvox.wire import sip_digest as d
from brisvox.wire.sip_message import SipMessage, parse
from tests.system.gateway_harness import GatewayProc, free_port, free_port_pair_base, have

pytestmark = pytest.mark.system

_n = itertools.count(1)
SECRET = "correct horse"


def users(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setenv("BRISVOX_TEST_ALICE", SECRET)
    monkeypatch.setenv("BRISVOX_TEST_BOB", "bob's secret")
    return [{"name": "alice", "agent": "echo", "secret_env": "BRISVOX_TEST_ALICE"},
            {"name": "bob", "agent": "echo", "secret_env": "BRISVOX_TEST_BOB"}]


class Uac:
    """A SIP caller on one loopback address: INVITE, answer the challenge, ACK, BYE."""

    def __init__(self, gw_port: int, host: str = "127.0.0.1") -> None:
        self.gw = ("127.0.0.1", gw_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(3.0)
        self.host, self.port = self.sock.getsockname()
        self.uri = f"sip:echo@127.0.0.1:{gw_port}"

    def close(self) -> None:
        self.sock.close()

    def invite(self, call_id: str, cseq: int = 1, authorization: str = "") -> tuple[SipMessage, str]:
        """Send an INVITE; its final response and the branch it went in (for the ACK)."""
        n = next(_n)
        branch = f"z9hG4bKa{n}x{time.monotonic_ns()}"
        body = (f"v=0\r\no=- 1 1 IN IP4 {self.host}\r\ns=-\r\nc=IN IP4 {self.host}\r\nt=0 0\r\n"
                f"m=audio {self.port + 2} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n").encode()
        auth = f"Authorization: {authorization}\r\n" if authorization else ""
        head = (f"INVITE {self.uri} SIP/2.0\r\nVia: SIP/2.0/UDP {self.host}:{self.port};branch={branch};rport\r\n"
                f"From: <sip:caller@{self.host}>;tag=f{call_id}\r\nTo: <{self.uri}>\r\nCall-ID: {call_id}\r\n"
                f"CSeq: {cseq} INVITE\r\nContact: <sip:caller@{self.host}:{self.port}>\r\nMax-Forwards: 70\r\n"
                f"{auth}Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n")
        self.sock.sendto(head.encode() + body, self.gw)
        while True:
            resp = parse(self.sock.recv(65535))
            if resp.status >= 200 and resp.cseq[0] == cseq:
                return resp, branch

    def ack(self, resp: SipMessage, branch: str, cseq: int) -> None:
        """ACK a final response (a non-2xx in its INVITE's branch, a 2xx in a new one)."""
        if resp.status < 300:
            branch = f"z9hG4bKk{next(_n)}"
        msg = (f"ACK {self.uri} SIP/2.0\r\nVia: SIP/2.0/UDP {self.host}:{self.port};branch={branch};rport\r\n"
               f"From: {resp.get('from')}\r\nTo: {resp.get('to')}\r\nCall-ID: {resp.call_id}\r\n"
               f"CSeq: {cseq} ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
        self.sock.sendto(msg.encode(), self.gw)

    def bye(self, resp: SipMessage, cseq: int) -> int:
        msg = (f"BYE {self.uri} SIP/2.0\r\nVia: SIP/2.0/UDP {self.host}:{self.port};branch=z9hG4bKb{next(_n)};rport\r\n"
               f"From: {resp.get('from')}\r\nTo: {resp.get('to')}\r\nCall-ID: {resp.call_id}\r\n"
               f"CSeq: {cseq} BYE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
        self.sock.sendto(msg.encode(), self.gw)
        while True:
            r = parse(self.sock.recv(65535))
            if r.cseq[1] == "BYE":
                return r.status

    def challenged(self, call_id: str) -> tuple[d.Challenge, list[str]]:
        """INVITE without credentials: the 401's best challenge, and its WWW-Authenticate values."""
        resp, branch = self.invite(call_id)
        assert resp.status == 401, resp.status
        self.ack(resp, branch, 1)
        values = resp.get_all("www-authenticate")
        ch = d.pick_challenge(values)
        assert ch is not None, values
        return ch, values

    def answer(self, ch: d.Challenge, user: str = "alice", secret: str = SECRET, nc: int = 1) -> str:
        return d.authorization(ch, d.DigestCredentials(user, secret), "INVITE", self.uri, nc, f"c{next(_n)}")

    def call(self, call_id: str, authorization: str, cseq: int = 2) -> SipMessage:
        resp, branch = self.invite(call_id, cseq, authorization)
        self.ack(resp, branch, cseq)
        return resp


@pytest.mark.skipif(not have("sipp"), reason="needs sipp (sip-tester)")
def test_sipp_answers_the_challenge_and_a_wrong_password_gets_no_call(short_tmp, monkeypatch):
    sip = {"auth": "digest", "users": users(monkeypatch), "allow": ["0.0.0.0/0"],
           "auth_algorithms": ["MD5", "SHA-256"]}  # SIPp 3.6 answers only the first challenge, MD5 only
    with GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
        target = f"127.0.0.1:{gw.sip_port}"
        good = S.run_sipp(short_tmp, S.authenticated_call(300), target, media_port=free_port_pair_base(4),
                          local_port=free_port(), timeout=15, extra=["-au", "alice", "-ap", SECRET])
        assert good.returncode == 0, good.stderr[-1500:]
        bad = S.run_sipp(short_tmp, S.authenticated_call(300), target, media_port=free_port_pair_base(4),
                         local_port=free_port(), timeout=3, extra=["-au", "alice", "-ap", "guess"])
        assert bad.returncode != 0
        st = gw.stats()
        assert st["calls_admitted"] == 1 and st["sip_auth_ok"] == 1 and st["sip_auth_wrong_response"] >= 1
        assert st["sip_auth_no_credentials"] == 2


def test_digest_callers_and_attackers(short_tmp, monkeypatch):
    sip = {"auth": "digest", "users": users(monkeypatch), "auth_nonce_s": 1.0, "auth_failures": ["4/minute"],
           "invite_rate": ["1000/second"]}
    with contextlib.ExitStack() as stack, GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
        good = Uac(gw.sip_port)
        stack.callback(good.close)
        # the 401 offers SHA-256 first, then MD5 (RFC 8760), each with qop=auth
        ch, values = good.challenged("c-ok")
        assert [d.parse_challenge(v).algorithm for v in values] == ["SHA-256", "MD5"]
        assert ch.algorithm == "SHA-256" and ch.qop == ("auth",) and ch.realm == "brisvox"
        assert gw.stats()["calls_admitted"] == 0  # a challenge costs no call
        creds = good.answer(ch)
        ok = good.call("c-ok", creds)
        assert ok.status == 200, ok.status
        calls = gw.command("calls")
        assert [c["ids"].get("sip_user") for c in calls.values()] == ["alice"]
        assert [c["agent"] for c in calls.values()] == ["echo"]
        assert good.bye(ok, 3) == 200

        # a replay of that Authorization (same nonce, same nc) in a new INVITE: refused, re-challenged
        replay, branch = good.invite("c-replay", 2, creds)
        good.ack(replay, branch, 2)
        assert replay.status == 401 and d.pick_challenge(replay.get_all("www-authenticate")) is not None
        # the nonce was minted for 127.0.0.1: from another address it is worthless
        other = Uac(gw.sip_port, "127.0.0.4")
        stack.callback(other.close)
        stolen = d.authorization(ch, d.DigestCredentials("alice", SECRET), "INVITE", other.uri, 2, "c")
        assert other.call("c-stolen", stolen).status == 401
        # a stale nonce: 401 with stale=true; the answer to the fresh one passes
        ch2, _ = good.challenged("c-stale")
        time.sleep(1.3)
        stale = good.call("c-stale", good.answer(ch2))
        assert stale.status == 401
        ch3 = d.pick_challenge(stale.get_all("www-authenticate"))
        assert ch3 is not None and ch3.stale
        fresh = good.call("c-stale", good.answer(ch3), cseq=3)
        assert fresh.status == 200
        assert good.bye(fresh, 4) == 200

        # wrong passwords from 127.0.0.2: 401 until the limit (4 a minute), then 403 without a challenge
        bad = Uac(gw.sip_port, "127.0.0.2")
        stack.callback(bad.close)
        codes = []
        for i in range(7):
            first, branch = bad.invite(f"c-bad{i}")
            bad.ack(first, branch, 1)
            chb = d.pick_challenge(first.get_all("www-authenticate"))
            if first.status != 401 or chb is None:  # past the limit: 403, not even a challenge
                codes.append(first.status)
                continue
            codes.append(bad.call(f"c-bad{i}", bad.answer(chb, user="carol", secret=f"guess{i}")).status)
        assert codes == [401] * 4 + [403] * 3, codes
        # ... while another source's good call goes through (bob; alice's own counter is spent)
        other_ch, _ = other.challenged("c-bystander")
        by = other.call("c-bystander", other.answer(other_ch, "bob", "bob's secret"))
        assert by.status == 200
        assert other.bye(by, 3) == 200
        # alice guessed at from other addresses: two failures above (the replay, the stolen nonce),
        # two from .5, and the fifth, from .6, is past her own limit; then even her right password,
        # from a fresh address, gets 403
        for host, want in (("127.0.0.5", 401), ("127.0.0.5", 401), ("127.0.0.6", 403)):
            u = Uac(gw.sip_port, host)
            stack.callback(u.close)
            chg, _ = u.challenged(f"c-guess-{host}-{want}-{next(_n)}")
            assert u.call(f"c-guess-{host}-{next(_n)}", u.answer(chg, secret="guess")).status == want
        locked = Uac(gw.sip_port, "127.0.0.7")
        stack.callback(locked.close)
        chx, _ = locked.challenged("c-alice-locked")
        assert locked.call("c-alice-locked", locked.answer(chx)).status == 403

        st = gw.stats()
        assert st["calls_admitted"] == 3, st["calls_admitted"]
        assert st["sip_auth_ok"] == 3 and st["sip_auth_replay"] == 1 and st["sip_auth_bad_nonce"] == 1
        assert st["sip_auth_stale"] == 1 and st["sip_auth_too_many_failures"] >= 3
        deadline = time.monotonic() + 5
        while gw.command("calls") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gw.command("calls") == {}
    assert gw.leaked == []
