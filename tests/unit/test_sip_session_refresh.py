"""Session timers (RFC 4028) and UPDATE (RFC 3311) in the SIP user agent, on a real gateway core
(rings in /dev/shm, the echo agent, real RTP sockets; the SIP socket's sends are captured, the
peer's messages fed in, the session timer ticked at a chosen ``now`` instead of waiting):

* the INVITE's answer: the timer headers of section 9 in the 200, ``Require: timer`` no longer
  refused, 422 with ``Min-SE`` (nothing admitted) and 400 for a malformed value;
* a peer that stops refreshing gets our BYE at ``SE - min(32, SE/3)``, reason
  ``session timer expired`` (the call record's too); its UPDATE or re-INVITE restarts the clock;
* an UPDATE with an offer is answered in its 200; one beyond ``refresh_rate`` is 491
  (``sip_refresh_storm``) and the call goes on;
* as the refresher we send UPDATE (the peer allows it) or a re-INVITE with the very SDP we last
  sent (its 2xx ACKed, again when retransmitted); a 422 is retried with its Min-SE, a
  481 ends the call ``session refresh failed``; glare: the peer's re-INVITE while ours is
  pending is 491, our own 491 is retried after 0-2 s (the peer owns the Call-ID);
* a dial answered 422 is sent again once with the larger interval, its 2xx runs the timer;
  the dialog's largest Min-SE (the peer's, a 422's) bounds every later answer in it;
* ``session_expires_s = 0`` asks for nothing and still honours a peer's timer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import pytest

from brisvox.config.schema import ConfigError
from brisvox.gateway.config import SipConfig
from brisvox.wire import sdp
from brisvox.wire.sip_dialog import make_response
from brisvox.wire.sip_message import SipMessage, parse
from tests.unit.test_sip_admission_props import PEER, invite, sdp_body, segments, settle, started
from tests.unit.test_sip_dial import Result, answer, sent
from tests.unit.test_sip_dial import started as dial_started

_seq = itertools.count(1)
TIMER = "Supported: timer\r\n"


class Peer:
    """The caller's side of one inbound call: its INVITE, its ACK and in-dialog requests, its
    answers to ours."""

    def __init__(self, ua: Any, wire: Any, extra: str = "", body: bytes | None = None) -> None:
        self.ua, self.wire = ua, wire
        self.call_id = f"st{next(_seq)}x{os.getpid()}@t"
        self.data = invite(call_id=self.call_id, extra=extra, body=body)
        self.inv = parse(self.data)
        self.cseq = 1
        self.ok: SipMessage | None = None
        ua.transactions.datagram_received(self.data, PEER)

    def responses(self, method: str = "", cseq: int | None = None) -> list[SipMessage]:
        out = []
        for d, _ in self.wire.sent:
            if d.startswith(b"SIP/2.0 "):
                m = parse(d)
                if m.call_id == self.call_id and (not method or m.cseq[1] == method) and \
                        (cseq is None or m.cseq[0] == cseq):
                    out.append(m)
        return out

    def ours(self, method: str) -> list[SipMessage]:
        return [m for m, _ in sent(self.wire, method) if m.call_id == self.call_id]

    async def final(self, method: str = "INVITE", cseq: int | None = None) -> SipMessage:
        assert await settle(lambda: any(r.status >= 200 for r in self.responses(method, cseq))), \
            [r.status for r in self.responses()]
        return [r for r in self.responses(method, cseq) if r.status >= 200][-1]

    async def answered(self) -> SipMessage:
        self.ok = await self.final()
        assert self.ok.status == 200, self.ok.status
        self.ack(1)
        return self.ok

    def head(self, method: str, cseq: int, extra: str = "", body: bytes = b"") -> bytes:
        assert self.ok is not None
        h = (f"{method} sip:brisvox@127.0.0.1:{self.ua.transactions.port} SIP/2.0\r\n"
             f"Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bK{method}{cseq}x{next(_seq)};rport\r\n"
             f"From: {self.inv.get('from')}\r\nTo: {self.ok.get('to')}\r\nCall-ID: {self.call_id}\r\n"
             f"CSeq: {cseq} {method}\r\nContact: <sip:a@127.0.0.1:5099>\r\nMax-Forwards: 70\r\n{extra}")
        if body:
            h += "Content-Type: application/sdp\r\n"
        return (h + f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    def send(self, method: str, extra: str = "", body: bytes = b"") -> int:
        self.cseq += 1
        self.ua.transactions.datagram_received(self.head(method, self.cseq, extra, body), PEER)
        return self.cseq

    def ack(self, cseq: int) -> None:
        self.ua.transactions.datagram_received(self.head("ACK", cseq), PEER)

    def reply(self, req: SipMessage, status: int, extra: list[tuple[str, str]] | None = None,
              body: bytes = b"") -> None:
        resp = make_response(req, status, contact="<sip:a@127.0.0.1:5099>", extra=extra, body=body,
                             content_type="application/sdp")
        self.ua.transactions.datagram_received(resp.serialize(), PEER)

    @property
    def leg(self) -> Any:
        return self.ua.dialogs.by_call_id.get(self.call_id)

    def tick(self, after: float) -> None:
        """Run the call's session timer ``after`` s from now."""
        leg = self.leg
        self.ua.dialogs.timers.tick(leg, asyncio.get_running_loop().time() + after)


def run(test: Any, sip: dict[str, Any] | None = None) -> None:
    async def main() -> None:
        core, ua, wire = await started({"invite_rate": (), "rtp_timeout_s": 0, **(sip or {})})
        try:
            await test(core, ua, wire)
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(main())


def test_the_invite_answer_negotiates_the_timer_and_refuses_what_it_must():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER + "Session-Expires: 1800;refresher=uac\r\n")
        ok = await p.answered()
        assert ok.get("session-expires") == "1800;refresher=uac" and "timer" in ok.get_all("require")
        assert "timer" in ok.get_all("supported") and "UPDATE" in ok.get_all("allow")
        # Require: timer is ours to support (it used to be 420); a requester without timer support
        # gets refresher=uas and no Require
        p = Peer(ua, wire, "Require: timer\r\nSession-Expires: 900\r\n")
        assert (await p.final()).status == 200
        p = Peer(ua, wire)
        ok = await p.answered()
        assert ok.get("session-expires") == "1800;refresher=uas" and ok.get_all("require") == []
        calls = len(core.table)
        # refused before admission: 422 with our Min-SE, 400 for a malformed value, 420 for an extension
        p = Peer(ua, wire, TIMER + "Session-Expires: 60\r\n")
        r = await p.final()
        assert (r.status, r.get("min-se")) == (422, "90") and p.leg is None
        r = await Peer(ua, wire, TIMER + "Session-Expires: soon\r\n").final()
        assert r.status == 400
        r = await Peer(ua, wire, "Require: timer, 100rel\r\n").final()
        assert (r.status, r.get("unsupported")) == (420, "100rel")
        await asyncio.sleep(0.1)
        assert len(core.table) == calls
        st = ua.stats()
        assert st["sip_session_422_sent"] == 1 and st["sip_refused_session_interval"] == 1

    run(test)


def test_a_peer_that_stops_refreshing_gets_our_bye_and_its_refreshes_restart_the_clock():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER + "Session-Expires: 90;refresher=uac\r\n")
        await p.answered()
        call = p.leg.call
        p.tick(59.0)
        assert p.ours("BYE") == []
        # the peer refreshes: by UPDATE (no body), then by re-INVITE (its SDP unchanged)
        n = p.send("UPDATE", TIMER + "Session-Expires: 90;refresher=uac\r\n")
        r = await p.final("UPDATE", n)
        assert r.status == 200 and r.get("session-expires") == "90;refresher=uac" and r.body == b""
        assert r.get("contact") and "timer" in r.get_all("require")
        p.tick(59.0)
        n = p.send("INVITE", TIMER + "Session-Expires: 90;refresher=uac\r\n", sdp_body())
        r = await p.final("INVITE", n)
        assert r.status == 200 and r.get("session-expires") == "90;refresher=uac" and sdp.parse(r.body)
        p.ack(n)
        p.tick(59.0)
        assert p.ours("BYE") == [] and ua.stats()["sip_session_refreshes_received"] == 2
        p.tick(60.5)
        (bye,) = p.ours("BYE")
        assert 'text="session timer expired"' in bye.get("reason")
        p.reply(bye, 200)
        assert await settle(lambda: len(core.table) == 0)
        assert call.end_reason == "session timer expired"
        st = ua.stats()
        assert st["sip_session_expired"] == 1 and st["sip_dialogs"] == 0 and ua.dialogs.timers.sessions == {}

    run(test)


def test_an_update_with_an_offer_is_answered_in_its_200_and_a_storm_is_refused_491():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER)
        await p.answered()
        n = p.send("UPDATE", TIMER, sdp_body(extra="a=sendonly\r\n"))
        r = await p.final("UPDATE", n)
        assert r.status == 200 and b"a=recvonly" in r.body and p.leg.neg.on_hold
        assert ua.stats()["sip_hold"] == 1
        for _ in range(40):  # [sip] refresh_rate: 3/second
            p.send("UPDATE", TIMER)
        await asyncio.sleep(0.05)
        statuses = [r.status for r in p.responses("UPDATE") if r.status >= 200]
        assert statuses.count(200) == 3 and statuses.count(491) == 38, statuses
        assert ua.stats()["sip_refresh_storm"] == 38
        assert p.leg is not None and not p.leg.ended  # the call goes on
        n = p.send("BYE")
        assert (await p.final("BYE", n)).status == 200
        assert await settle(lambda: len(core.table) == 0)

    run(test)


def test_as_refresher_we_send_update_when_the_peer_allows_it_and_retry_a_422():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER + "Allow: INVITE, ACK, BYE, UPDATE\r\nSession-Expires: 90\r\n")
        ok = await p.answered()
        assert ok.get("session-expires") == "90;refresher=uas"  # free to choose: we refresh
        p.tick(44.0)
        assert p.ours("UPDATE") == []
        p.tick(45.0)
        (upd,) = p.ours("UPDATE")
        assert upd.get("session-expires") == "90;refresher=uac" and upd.get("min-se") == "90"
        assert upd.body == b"" and "timer" in upd.get_all("supported")
        p.reply(upd, 422, extra=[("min-se", "180")])
        upd2 = p.ours("UPDATE")[-1]
        assert upd2.cseq[0] > upd.cseq[0] and (upd2.get("session-expires"), upd2.get("min-se")) == \
            ("180;refresher=uac", "180")
        p.reply(upd2, 200, extra=[("session-expires", "180;refresher=uac"), ("require", "timer")])
        leg = p.leg
        s = ua.dialogs.timers.sessions[(leg.dialog.call_id, leg.dialog.local_tag)]
        assert s.machine.we_refresh and s.machine.interval == 180
        assert 89 <= s.machine.deadline - asyncio.get_running_loop().time() <= 90
        st = ua.stats()
        assert st["sip_session_refreshes_sent_update"] == 2 and st["sip_session_422_received"] == 1
        # a 481 to a refresh: the dialog is gone at the peer, the call ends
        p.tick(90.0)
        p.reply(p.ours("UPDATE")[-1], 481)
        (bye,) = p.ours("BYE")
        assert 'text="session refresh failed"' in bye.get("reason")
        assert await settle(lambda: len(core.table) == 0)

    run(test)


def test_as_refresher_without_update_we_re_invite_with_our_sdp_unchanged_and_ack_its_2xx():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER + "Session-Expires: 90;refresher=uas\r\n")
        ok = await p.answered()
        p.tick(45.0)
        (inv,) = [m for m in p.ours("INVITE")]
        assert inv.body == ok.body  # the same SDP, the same o= version: no change
        assert inv.get("session-expires") == "90;refresher=uac" and inv.to_tag == "abc"
        answer_sdp = sdp_body()
        p.reply(inv, 200, extra=[("session-expires", "90;refresher=uac")], body=answer_sdp)
        (ack,) = p.ours("ACK")
        assert ack.cseq == (inv.cseq[0], "ACK") and ack.top_via.branch != inv.top_via.branch
        p.reply(inv, 200, extra=[("session-expires", "90;refresher=uac")], body=answer_sdp)
        assert len(p.ours("ACK")) == 2  # a retransmitted 2xx: the same ACK again
        assert ua.stats()["sip_session_refreshes_sent_invite"] == 1
        assert not ua.dialogs.timers.invite_pending(p.leg)

    run(test)


def test_glare_the_peers_re_invite_meets_ours_both_get_491_and_we_retry_within_two_seconds():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER + "Session-Expires: 90;refresher=uas\r\n")
        await p.answered()
        p.tick(45.0)
        (ours,) = p.ours("INVITE")
        assert ua.dialogs.timers.invite_pending(p.leg)
        n = p.send("INVITE", TIMER + "Session-Expires: 90\r\n", sdp_body())
        assert (await p.final("INVITE", n)).status == 491
        p.reply(ours, 491)
        loop = asyncio.get_running_loop()
        leg = p.leg
        m = ua.dialogs.timers.sessions[(leg.dialog.call_id, leg.dialog.local_tag)].machine
        assert not m.pending and 0.0 <= m.deadline - loop.time() <= 2.0  # not the Call-ID's owner
        p.tick(2.0)
        again = p.ours("INVITE")[-1]
        assert again.cseq[0] > ours.cseq[0] and again.body == ours.body
        p.reply(again, 200, extra=[("session-expires", "90;refresher=uac")], body=sdp_body())
        assert p.ours("ACK")[-1].cseq == (again.cseq[0], "ACK")
        # the peer tries its re-INVITE again after its own delay: answered now
        n = p.send("INVITE", TIMER + "Session-Expires: 90\r\n", sdp_body())
        assert (await p.final("INVITE", n)).status == 200
        p.ack(n)
        st = ua.stats()
        assert st["sip_reinvite_491"] == 1 and st["sip_session_refresh_glare"] == 1

    run(test)


def test_without_a_timer_asked_the_peers_is_still_honoured():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        ok = await Peer(ua, wire, TIMER).answered()
        assert ok.get("session-expires") == "" and "timer" in ok.get_all("supported")
        p = Peer(ua, wire, "Require: timer\r\nSession-Expires: 1800;refresher=uac\r\n")
        ok = await p.answered()
        assert ok.get("session-expires") == "1800;refresher=uac"
        p.tick(1768.0)
        assert len(p.ours("BYE")) == 1

    run(test, {"session_expires_s": 0})


def test_a_dial_answered_422_asks_again_once_and_its_2xx_runs_the_timer():
    async def run_dial() -> None:
        core, ua, wire = await dial_started(session_expires_s=90)
        res = Result()
        try:
            ua.dial("sip:bob@127.0.0.1:5099", "echo", res)
            assert await settle(lambda: bool(sent(wire, "INVITE")))
            (inv, _), = sent(wire, "INVITE")
            assert (inv.get("session-expires"), inv.get("min-se")) == ("90", "90")
            assert "timer" in inv.get_all("supported") and "UPDATE" in inv.get_all("allow")
            answer(ua, inv, 422, extra=[("min-se", "300")])
            invs = sent(wire, "INVITE")
            assert len(invs) == 2
            inv2 = invs[1][0]
            assert (inv2.get("session-expires"), inv2.get("min-se")) == ("300", "300")
            assert inv2.call_id == inv.call_id and inv2.from_tag == inv.from_tag and inv2.cseq[0] == inv.cseq[0] + 1
            assert inv2.body == inv.body
            answer(ua, inv2, 200, contact="<sip:bob@127.0.0.1:5099>", body=sdp_body(port="4002"),
                   content_type="application/sdp", extra=[("session-expires", "300;refresher=uac"),
                                                          ("require", "timer"), ("allow", "INVITE, UPDATE")])
            assert await settle(lambda: bool(res.got))
            assert res.got[0][1] == ""
            leg = ua.dialogs.by_call_id[inv.call_id]
            m = ua.dialogs.timers.sessions[(leg.dialog.call_id, leg.dialog.local_tag)].machine
            assert m.we_refresh and m.interval == 300 and m.update and m.owner
            ua.dialogs.timers.tick(leg, asyncio.get_running_loop().time() + 150)
            (upd, to), = sent(wire, "UPDATE")
            assert to == ("127.0.0.1", 5099) and upd.get("session-expires") == "300;refresher=uac"
            assert upd.get("min-se") == "300"
            # the callee's own refresh is never answered shorter than the Min-SE its 422 named
            req = (f"UPDATE sip:brisvox@127.0.0.1:{ua.transactions.port} SIP/2.0\r\n"
                   "Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bKcu1\r\n"
                   f"From: <sip:bob@127.0.0.1:5099>;tag=callee1\r\nTo: {inv.get('from')}\r\n"
                   f"Call-ID: {inv.call_id}\r\nCSeq: 5 UPDATE\r\nSupported: timer\r\n"
                   "Session-Expires: 600;refresher=uac\r\nContent-Length: 0\r\n\r\n").encode()
            ua.transactions.datagram_received(req, ("127.0.0.1", 5099))
            ok = parse(wire.sent[-1][0])
            assert (ok.status, ok.get("session-expires")) == (200, "300;refresher=uac")
            # a second 422 is not retried: the dial fails with it
            res2 = Result()
            ua.dial("sip:carol@127.0.0.1:5099", "echo", res2)
            assert await settle(lambda: len(sent(wire, "INVITE")) == 3)
            inv3 = sent(wire, "INVITE")[2][0]
            answer(ua, inv3, 422, extra=[("min-se", "300")])
            answer(ua, sent(wire, "INVITE")[3][0], 422, extra=[("min-se", "600")])
            assert await settle(lambda: bool(res2.got))
            assert res2.got[0] == (None, "422 Session Interval Too Small")
        finally:
            await core.stop()
        assert segments(core) == []

    asyncio.run(run_dial())


def test_the_session_timer_keys_are_checked():
    assert (SipConfig().session_expires_s, SipConfig().min_se_s) == (1800, 90)
    assert SipConfig(session_expires_s=0).session_expires_s == 0
    for bad in ({"min_se_s": 89}, {"session_expires_s": 60}, {"session_expires_s": 100, "min_se_s": 120},
                {"refresh_rate": ("often",)}):
        with pytest.raises((ConfigError, ValueError)):
            SipConfig.from_section(bad)


def test_the_peers_min_se_bounds_every_later_answer_in_its_dialog():
    async def test(core: Any, ua: Any, wire: Any) -> None:
        p = Peer(ua, wire, TIMER + "Session-Expires: 1800;refresher=uac\r\nMin-SE: 300\r\n")
        ok = await p.answered()
        assert ok.get("session-expires") == "300;refresher=uac"  # ours is 90: shortened to its Min-SE
        n = p.send("UPDATE", TIMER + "Session-Expires: 600;refresher=uac\r\n")  # no Min-SE this time
        assert (await p.final("UPDATE", n)).get("session-expires") == "300;refresher=uac"

    run(test, {"session_expires_s": 90})


def test_an_srtp_calls_re_invite_refresh_offers_its_key_and_takes_the_answer_keeping_the_session():
    from brisvox.wire import srtp
    from tests.unit.test_sip_srtp_leg import LAB, savp_body

    async def test(core: Any, ua: Any, wire: Any) -> None:
        theirs = srtp.new_crypto(1, "AES_CM_128_HMAC_SHA1_80")
        p = Peer(ua, wire, TIMER + "Session-Expires: 90;refresher=uas\r\n", body=savp_body(theirs))
        ok = await p.answered()
        session = p.leg.srtp
        assert session is not None
        p.tick(45.0)
        (inv,) = p.ours("INVITE")
        assert inv.body == ok.body and b"a=crypto:1 AES_CM_128_HMAC_SHA1_80" in inv.body  # our key, offered again
        p.reply(inv, 200, extra=[("session-expires", "90;refresher=uac")], body=savp_body(theirs))
        assert await settle(lambda: len(p.ours("ACK")) == 1)
        st = ua.stats()
        assert st.get("sip_session_bad_answer", 0) == 0 and st["sip_session_refreshes_sent_invite"] == 1
        assert p.leg.srtp is session  # the same keys both ways: the replay window and ROC are kept

    run(test, LAB)
