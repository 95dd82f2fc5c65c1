"""Session timers (RFC 4028) against the real gateway process, on loopback, in real time.

RFC 4028 puts the shortest session interval at 90 s and brisvox has no lower setting
(``[sip] min_se_s`` starts at 90), so these calls last what the RFC makes them last: every
scenario below runs at once against one gateway (``session_expires_s = 90``, no RTP timeout),
started by the module's fixture, and the whole file takes about 100 s of wall time, mostly
waiting; each test joins its own scenario. The timing rules themselves are tested on virtual
time in ``tests/unit/test_sip_session_timer.py`` and ``tests/unit/test_sip_session_refresh.py``.

* SIPp asks for ``Session-Expires: 90;refresher=uac`` and refreshes by re-INVITE every 30 s:
  the call lives past 90 s and ends with SIPp's own BYE;
* SIPp asks the same and never refreshes: the gateway's BYE comes 90 - 30 = 60 s after the
  answer, its Reason and the agent's ``CallEnd`` say ``session timer expired``;
* a caller that leaves the refresher to us and allows UPDATE gets our UPDATE (no body) at
  45 s and again at 90 s, answered 200;
* a caller without UPDATE gets our re-INVITE at 45 s with the SDP of our 200, unchanged; it
  sends its own re-INVITE at that moment (glare): both sides answer 491, the gateway retries
  within 0-2 s (the caller owns the Call-ID), its 200 is ACKed, the caller's retry after
  2.1-4 s is answered 200;
* 422 both ways: an INVITE asking for 60 s is answered 422 ``Min-SE: 90`` and its retry with
  90 s is answered; a dial the callee answers 422 ``Min-SE: 120`` is sent again with 120 s;
* a refresh storm (30 UPDATEs at once) gets three 200s and 491s, is counted, and the call
  still answers the next UPDATE and the BYE.

``[gateway] max_call_s`` ending a SIP call is ``tests/system/test_ws_calls.py``'s.
"""

from __future__ import annotations

import itertools
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.harness import sipp as S
from brisvox.wire.sip_dialog import make_response
from brisvox.wire.sip_message import SipMessage, parse
from ipc import frames as F
from ipc.bus import request_sync
from tests.system.gateway_harness import (
    FakeAgent,
    GatewayProc,
    free_port,
    free_port_pair_base,
    have,
)

pytestmark = [pytest.mark.system, pytest.mark.skipif(not have("sipp"), reason="needs sipp (sip-tester)")]

_seq = itertools.count(1)
TIMER_90 = "Supported: timer\r\nSession-Expires: 90\r\n"


class UdpPeer:
    """A SIP peer on its own UDP socket: sends requests and responses, waits for messages
    (retransmissions and anything not waited for are dropped)."""

    def __init__(self, gw_port: int) -> None:
        self.gw = ("127.0.0.1", gw_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind(("127.0.0.1", 0))
        self.call_id = f"stt{next(_seq)}x{time.monotonic_ns()}@127.0.0.1"
        self.tag = f"p{next(_seq)}"
        self.cseq = 0
        self.to = ""
        self.seen: list[tuple[float, SipMessage]] = []
        self.branches: dict[int, str] = {}

    def close(self) -> None:
        self.sock.close()
        self.rtp.close()

    def sdp(self, version: int = 1) -> bytes:
        return (f"v=0\r\no=peer 7 {version} IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                f"m=audio {self.rtp.getsockname()[1]} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
                "a=sendrecv\r\n").encode()

    def request(self, method: str, extra: str = "", body: bytes = b"", cseq: int | None = None,
                branch: str = "") -> int:
        if cseq is None:
            self.cseq += 1
            cseq = self.cseq
        to = self.to or "<sip:default@127.0.0.1>"
        branch = branch or f"z9hG4bK{method[:3]}{cseq}x{next(_seq)}"
        if method == "INVITE":
            self.branches[cseq] = branch
        head = (f"{method} sip:default@127.0.0.1:{self.gw[1]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch={branch};rport\r\n"
                f"From: <sip:peer@127.0.0.1>;tag={self.tag}\r\nTo: {to}\r\nCall-ID: {self.call_id}\r\n"
                f"CSeq: {cseq} {method}\r\nContact: <sip:peer@127.0.0.1:{self.port}>\r\nMax-Forwards: 70\r\n"
                f"{extra}" + ("Content-Type: application/sdp\r\n" if body else "")
                + f"Content-Length: {len(body)}\r\n\r\n")
        self.sock.sendto(head.encode() + body, self.gw)
        return cseq

    def reply(self, req: SipMessage, status: int, extra: list[tuple[str, str]] | None = None,
              body: bytes = b"") -> None:
        resp = make_response(req, status, contact=f"<sip:peer@127.0.0.1:{self.port}>", extra=extra, body=body,
                             content_type="application/sdp")
        self.sock.sendto(resp.serialize(), self.gw)

    def expect(self, pred: Callable[[SipMessage], bool], timeout: float) -> SipMessage:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"nothing expected within {timeout}s; saw "
                                     f"{[(m.method or m.status, m.cseq) for _, m in self.seen[-8:]]}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            m = parse(data)
            self.seen.append((time.monotonic(), m))
            if pred(m):
                return m

    def final(self, method: str, cseq: int, timeout: float = 5.0) -> SipMessage:
        return self.expect(lambda m: m.status >= 200 and m.cseq == (cseq, method), timeout)

    def call(self, extra: str) -> SipMessage:
        """INVITE, its 200, our ACK: the 200."""
        cseq = self.request("INVITE", extra, self.sdp())
        ok = self.final("INVITE", cseq)
        assert ok.status == 200, ok.status
        self.to = ok.get("to")
        self.request("ACK", cseq=cseq)
        return ok

    def ack(self, cseq: int) -> None:
        """The ACK of a 2xx (a new transaction)."""
        self.request("ACK", cseq=cseq)

    def ack_failure(self, cseq: int) -> None:
        """The ACK of a non-2xx final (in the INVITE's transaction: its branch)."""
        self.request("ACK", cseq=cseq, branch=self.branches[cseq])


class Scenarios:
    """Every scenario, each on its own thread: its result or its exception, by name."""

    def __init__(self) -> None:
        self.threads: dict[str, threading.Thread] = {}
        self.results: dict[str, Any] = {}

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.results[name] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised by the test that asks
                self.results[name] = e

        th = threading.Thread(target=run, name=name, daemon=True)
        self.threads[name] = th
        th.start()

    def result(self, name: str, timeout: float = 150.0) -> Any:
        self.threads[name].join(timeout)
        assert not self.threads[name].is_alive(), f"{name} still running"
        got = self.results[name]
        if isinstance(got, BaseException):
            raise got
        return got


def refreshing_sipp(tmp: Any, gw: GatewayProc) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = S.run_sipp(tmp, S.session_refresh_call(30_000, 3, 8_000), f"127.0.0.1:{gw.sip_port}",
                   service="default", media_port=free_port_pair_base(4), local_port=free_port(), timeout=130)
    return r, time.monotonic() - t0


def expiring_sipp(tmp: Any, gw: GatewayProc) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = S.run_sipp(tmp, S.session_expiry_call(75_000), f"127.0.0.1:{gw.sip_port}", service="default",
                   media_port=free_port_pair_base(4), local_port=free_port(), timeout=100)
    return r, time.monotonic() - t0


def update_refresher(gw: GatewayProc) -> dict[str, Any]:
    p = UdpPeer(gw.sip_port)
    try:
        ok = p.call(TIMER_90 + "Allow: INVITE, ACK, BYE, CANCEL, UPDATE\r\n")
        t0 = time.monotonic()
        times, updates = [], []
        for _ in range(2):
            upd = p.expect(lambda m: m.method == "UPDATE", 60)
            times.append(time.monotonic() - t0)
            updates.append(upd)
            p.reply(upd, 200, extra=[("session-expires", "90;refresher=uac"), ("require", "timer")])
        n = p.request("BYE")
        bye_ok = p.final("BYE", n)
        return {"ok": ok, "times": times, "updates": updates, "bye": bye_ok.status, "call_id": p.call_id}
    finally:
        p.close()


def glare(gw: GatewayProc) -> dict[str, Any]:
    p = UdpPeer(gw.sip_port)
    try:
        ok = p.call(TIMER_90)  # no Allow: we refresh by re-INVITE
        t0 = time.monotonic()
        ours = p.expect(lambda m: m.method == "INVITE", 60)
        at = time.monotonic() - t0
        mine = p.request("INVITE", TIMER_90, p.sdp())  # glare: ours is pending at the gateway
        mine_answer = p.final("INVITE", mine)
        p.reply(ours, 491)
        t491 = time.monotonic()
        again = p.expect(lambda m: m.method == "INVITE" and m.cseq[0] > ours.cseq[0], 6)
        retry_after = time.monotonic() - t491
        p.reply(again, 200, extra=[("session-expires", "90;refresher=uac")], body=p.sdp())
        ack = p.expect(lambda m: m.method == "ACK" and m.cseq[0] == again.cseq[0], 3)
        time.sleep(random.uniform(2.1, 4.0))  # RFC 3261 14.1: we own the Call-ID
        mine2 = p.request("INVITE", TIMER_90, p.sdp())
        mine2_answer = p.final("INVITE", mine2)
        p.ack(mine2)
        n = p.request("BYE")
        return {"ok": ok, "ours": ours, "at": at, "mine": mine_answer.status, "retry_after": retry_after,
                "again": again, "ack": ack, "mine2": mine2_answer.status, "bye": p.final("BYE", n).status}
    finally:
        p.close()


def inbound_422(gw: GatewayProc) -> dict[str, Any]:
    p = UdpPeer(gw.sip_port)
    try:
        first = p.request("INVITE", "Supported: timer\r\nSession-Expires: 60\r\n", p.sdp())
        r422 = p.final("INVITE", first)
        p.ack_failure(first)
        ok = p.call("Supported: timer\r\nSession-Expires: 90\r\nMin-SE: 90\r\n")
        n = p.request("BYE")
        return {"422": r422, "ok": ok, "bye": p.final("BYE", n).status}
    finally:
        p.close()


def outbound_422(gw: GatewayProc) -> dict[str, Any]:
    callee = UdpPeer(gw.sip_port)
    reply: dict[str, Any] = {}
    try:
        th = threading.Thread(target=lambda: reply.setdefault("r", request_sync(gw.inbox, F.Command(
            name="dial", args={"target": f"sip:callee@127.0.0.1:{callee.port}", "agent": "default",
                               "ring_timeout_s": 10}), 20)))
        th.start()
        inv1 = callee.expect(lambda m: m.method == "INVITE", 10)
        callee.reply(inv1, 422, extra=[("min-se", "120")])
        callee.expect(lambda m: m.method == "ACK", 3)
        inv2 = callee.expect(lambda m: m.method == "INVITE", 5)
        resp = make_response(inv2, 200, to_tag="callee1", contact=f"<sip:callee@127.0.0.1:{callee.port}>",
                             body=callee.sdp(), content_type="application/sdp",
                             extra=[("session-expires", "120;refresher=uas"), ("require", "timer")])
        callee.sock.sendto(resp.serialize(), callee.gw)
        ack = callee.expect(lambda m: m.method == "ACK", 3)
        th.join(15)
        # the callee is the refresher: its UPDATE is answered with the timer headers
        callee.call_id, callee.tag, callee.to = inv2.call_id, "callee1", inv2.get("from")
        n = callee.request("UPDATE", "Supported: timer\r\nSession-Expires: 120;refresher=uac\r\n")
        upd_ok = callee.final("UPDATE", n)
        n = callee.request("BYE")
        return {"inv1": inv1, "inv2": inv2, "ack": ack, "reply": reply.get("r"), "update": upd_ok,
                "bye": callee.final("BYE", n).status}
    finally:
        callee.close()


def storm(gw: GatewayProc) -> dict[str, Any]:
    p = UdpPeer(gw.sip_port)
    try:
        p.call(TIMER_90)
        sent = [p.request("UPDATE", TIMER_90) for _ in range(30)]
        finals: dict[int, int] = {}
        while len(finals) < len(sent):
            m = p.expect(lambda m: m.status >= 200 and m.cseq[1] == "UPDATE", 5)
            finals[m.cseq[0]] = m.status
        answers = [finals[n] for n in sent]
        time.sleep(1.1)
        later = p.final("UPDATE", p.request("UPDATE", TIMER_90)).status
        n = p.request("BYE")
        return {"answers": answers, "later": later, "bye": p.final("BYE", n).status}
    finally:
        p.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProc, FakeAgent, Scenarios]]:
    tmp = tmp_path_factory.mktemp("stimer")
    with FakeAgent(tmp) as agent, GatewayProc(tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                               sip={"rtp_timeout_s": 0, "session_expires_s": 90,
                                                    "min_se_s": 90}) as gw:
        sc = Scenarios()
        sc.start("refreshing_sipp", lambda: refreshing_sipp(tmp, gw))
        sc.start("expiring_sipp", lambda: expiring_sipp(tmp, gw))
        sc.start("update_refresher", lambda: update_refresher(gw))
        sc.start("glare", lambda: glare(gw))
        sc.start("inbound_422", lambda: inbound_422(gw))
        sc.start("outbound_422", lambda: outbound_422(gw))
        sc.start("storm", lambda: storm(gw))
        try:
            yield gw, agent, sc
        finally:
            for th in sc.threads.values():
                th.join(150)
    assert gw.leaked == []


def end_reason(agent: FakeAgent, sip_call_id: str) -> str:
    start = agent.wait_for(F.CallStart, lambda f: (f.transport_ids or {}).get("sip_call_id") == sip_call_id, 5)
    return agent.wait_for(F.CallEnd, lambda f: f.call_id == start.call_id, 5).reason


def test_a_peer_that_refreshes_by_re_invite_keeps_its_call_past_90_s(running):
    gw, agent, sc = running
    r, took = sc.result("refreshing_sipp")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    print(f"refreshing peer: call lasted {took:.1f} s")
    assert took >= 95, took  # 3 refreshes 30 s apart and 8 s more: past the 90 s interval
    assert gw.stats()["sip_session_refreshes_received"] >= 3


def test_a_peer_that_stops_refreshing_gets_our_bye_with_the_reason(running):
    gw, agent, sc = running
    r, took = sc.result("expiring_sipp")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]  # the BYE's Reason matched
    print(f"silent peer: the gateway's BYE {took:.1f} s after the INVITE")
    assert 58 <= took <= 70, took  # 90 - min(32, 90 / 3) = 60 s after the answer
    ends = [f.reason for f in agent.of(F.CallEnd)]
    assert "session timer expired" in ends, ends
    assert gw.stats()["sip_session_expired"] >= 1


def test_as_refresher_the_gateway_sends_update_every_half_interval(running):
    gw, agent, sc = running
    got = sc.result("update_refresher")
    assert got["ok"].get("session-expires") == "90;refresher=uas"
    first, second = got["times"]
    print(f"UPDATE refreshes at {first:.2f} s and {second:.2f} s after the 200")
    assert 43 <= first <= 49 and 43 <= second - first <= 49, got["times"]
    for upd in got["updates"]:
        assert upd.body == b"" and upd.get("session-expires") == "90;refresher=uac"
        assert upd.get("min-se") == "90" and "timer" in upd.get_all("supported")
    assert got["bye"] == 200
    assert end_reason(agent, got["call_id"]) == "bye"
    assert gw.stats()["sip_session_refreshes_sent_update"] >= 2


def test_glare_both_sides_answer_491_and_retry_as_rfc_3261_says(running):
    gw, agent, sc = running
    got = sc.result("glare")
    ours, again = got["ours"], got["again"]
    assert 43 <= got["at"] <= 49, got["at"]
    assert ours.body == got["ok"].body  # the SDP of our 200, unchanged (the same o= version)
    assert ours.get("session-expires") == "90;refresher=uac"
    assert got["mine"] == 491  # the gateway's re-INVITE was pending
    print(f"glare: our re-INVITE {got['at']:.2f} s after the 200, retried {got['retry_after']:.2f} s after its 491")
    assert got["retry_after"] <= 2.5, got["retry_after"]  # 0-2 s: the gateway does not own the Call-ID
    assert again.body == ours.body
    assert got["ack"].cseq == (again.cseq[0], "ACK")
    assert got["mine2"] == 200 and got["bye"] == 200
    st = gw.stats()
    assert st["sip_reinvite_491"] >= 1 and st["sip_session_refresh_glare"] >= 1


def test_422_both_ways(running):
    gw, agent, sc = running
    got = sc.result("inbound_422")
    assert (got["422"].status, got["422"].get("min-se")) == (422, "90")
    assert got["ok"].get("session-expires") == "90;refresher=uas" and got["bye"] == 200
    got = sc.result("outbound_422")
    inv1, inv2 = got["inv1"], got["inv2"]
    assert (inv1.get("session-expires"), inv1.get("min-se")) == ("90", "90")
    assert (inv2.get("session-expires"), inv2.get("min-se")) == ("120", "120")
    assert inv2.call_id == inv1.call_id and inv2.cseq[0] == inv1.cseq[0] + 1
    assert got["ack"].cseq == (inv2.cseq[0], "ACK")
    reply = got["reply"]
    assert isinstance(reply, F.CommandReply) and reply.ok, reply
    upd = got["update"]
    assert upd.status == 200 and upd.get("session-expires") == "120;refresher=uac"
    assert got["bye"] == 200
    assert gw.stats()["sip_session_422_received"] >= 1


def test_a_refresh_storm_is_refused_491_counted_and_the_call_goes_on(running):
    gw, agent, sc = running
    got = sc.result("storm")
    assert got["answers"].count(200) == 3 and got["answers"].count(491) == 27, got["answers"]
    assert got["later"] == 200 and got["bye"] == 200
    assert gw.stats()["sip_refresh_storm"] >= 27
