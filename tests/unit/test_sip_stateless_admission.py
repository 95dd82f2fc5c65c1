"""SIP admission for every method, without sockets: the RFC 3261 stateless answers
(:func:`~brisvox.gateway.sip.guard.stateless_refusal`), the per-source rate limit of every
request kind, the per-source share of the server transaction table
(:class:`~brisvox.gateway.sip.guard.TransactionShares`) and the refusal budget past which
a flooding source's 503s are dropped -- on the real transaction layer with a recording
transport and a stand-in transaction user (no gateway core, no socket)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from brisvox.gateway.config import SipConfig
from brisvox.gateway.sip.counters import SipCounters
from brisvox.gateway.sip.guard import (
    Refusal,
    SipGuard,
    TransactionShares,
    rate_kind,
    stateless_refusal,
)
from brisvox.gateway.sip.transactions import SipTransactions
from brisvox.wire.sip_message import SipMessage, parse

_n = itertools.count(1)


def source() -> str:
    """A source address no other test of this process used (the rate-limit storage is per process)."""
    n = next(_n)
    return f"127.{200 + os.getpid() % 50}.{n // 250}.{n % 250 + 1}"


def request(method: str, *, to_tag: str = "", call_id: str = "", mf: str = "70", branch: str = "",
            src: str = "127.0.0.1") -> bytes:
    n = next(_n)
    to = "<sip:echo@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    return (f"{method} sip:echo@127.0.0.1 SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {src}:5099;branch={branch or f'z9hG4bKsa{n}'};rport\r\n"
            f"From: <sip:a@127.0.0.1>;tag=f{n}\r\nTo: {to}\r\nCall-ID: {call_id or f'sa{n}@t'}\r\n"
            f"CSeq: 1 {method}\r\nMax-Forwards: {mf}\r\nContent-Length: 0\r\n\r\n").encode()


class Wire:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append(bytes(data))

    def close(self) -> None:
        pass

    def statuses(self) -> list[int]:
        return [int(d[8:11]) for d in self.sent if d.startswith(b"SIP/2.0 ")]


class User:
    """The transaction user: one dialog it knows (Call-ID ``known@t``, To tag ``ours``)."""

    def __init__(self) -> None:
        self.got: list[str] = []

    def on_invite(self, req: SipMessage, addr: Any, tx: Any) -> None:
        self.got.append(req.method)

    def on_request(self, req: SipMessage, tx: Any) -> None:
        self.got.append(req.method)

    def on_ack(self, req: SipMessage, addr: Any) -> bool:
        return False

    def in_dialog(self, req: SipMessage) -> bool:
        return (req.call_id, req.to_tag) == ("known@t", "ours")


@pytest.fixture
def layer() -> Iterator[Any]:
    loop = asyncio.new_event_loop()

    def make(**sip: Any) -> tuple[SipTransactions, Wire, User]:
        cfg = SipConfig(port=0, **sip)
        guard = SipGuard(cfg.allow, cfg.invite_rate, cfg.options_rate, cfg.other_rate, cfg.refusal_rate)
        user = User()
        tl = SipTransactions(cfg, guard, SipCounters(logging.getLogger("test.sip")), user, loop)
        wire = Wire()
        tl.transport = wire  # type: ignore[assignment]
        return tl, wire, user

    yield make
    loop.close()


@pytest.mark.parametrize(("method", "to_tag", "in_dialog", "invite_live", "mf0", "want"), [
    ("FOOBAR", "", False, False, False, (501, "unknown_method")),
    ("FOOBAR", "x", True, False, True, (501, "unknown_method")),
    ("REGISTER", "", False, False, False, (405, "method")),
    ("MESSAGE", "", False, False, False, (405, "method")),
    ("SUBSCRIBE", "", False, False, False, (405, "method")),
    ("PUBLISH", "", False, False, False, (405, "method")),
    ("REFER", "", False, False, False, (405, "method")),
    ("REFER", "x", True, False, False, (405, "method")),  # an incoming REFER in our dialog: not served
    ("UPDATE", "x", False, False, False, (481, "no_dialog")),
    ("UPDATE", "x", True, False, False, None),  # RFC 3311: served inside our dialogs (a session refresh)
    ("UPDATE", "", False, False, False, (481, "no_dialog")),
    ("BYE", "", False, False, False, (481, "no_dialog")),
    ("INFO", "", False, False, False, (481, "no_dialog")),
    ("NOTIFY", "", False, False, False, (481, "no_dialog")),
    ("BYE", "x", False, False, False, (481, "no_dialog")),
    ("INVITE", "x", False, False, False, (481, "no_dialog")),  # a re-INVITE to no dialog of ours
    ("CANCEL", "", False, False, False, (481, "no_transaction")),
    ("BYE", "", False, False, True, (483, "too_many_hops")),
    ("INVITE", "", False, False, False, None),
    ("OPTIONS", "", False, False, True, None),  # OPTIONS with Max-Forwards 0 is answered
    ("CANCEL", "", False, True, False, None),
    ("BYE", "x", True, False, False, None),
    ("INVITE", "x", True, False, False, None),
    ("NOTIFY", "x", True, False, False, None),
])
def test_stateless_refusal_follows_rfc_3261(method, to_tag, in_dialog, invite_live, mf0, want):
    got = stateless_refusal(method, to_tag, in_dialog, invite_live, mf0)
    assert (None if got is None else (got.status, got.reason)) == want
    if got is not None and got.status == 501:
        assert dict(got.extra)["allow"].startswith("INVITE, ACK")


def test_rate_kinds():
    assert rate_kind("INVITE", "") == "INVITE" and rate_kind("INVITE", "t") == "OTHER"
    assert rate_kind("OPTIONS", "") == "OPTIONS"
    assert {rate_kind(m, "") for m in ("BYE", "CANCEL", "REGISTER", "FOOBAR", "INFO")} == {"OTHER"}


def test_transaction_shares_count_per_source_and_forget_empty_sources():
    sh = TransactionShares(2)
    sh.take(("a",), "s1")
    sh.take(("b",), "s1")
    sh.take(("c",), "s2")
    assert sh.full("s1") and not sh.full("s2") and sh.held("s1") == 2 and sh.sources() == 2
    sh.release(("a",))
    sh.release(("a",))  # twice: nothing more
    sh.release(("zz",))  # never taken
    assert sh.held("s1") == 1 and not sh.full("s1")
    sh.release(("b",))
    sh.release(("c",))
    assert sh.sources() == 0 and sh._owner == {} and sh._held == {}


def test_out_of_dialog_requests_are_answered_statelessly_and_retransmissions_again(layer):
    tl, wire, user = layer()
    src = (source(), 5099)
    cases = {"REGISTER": 405, "MESSAGE": 405, "SUBSCRIBE": 405, "PUBLISH": 405, "REFER": 405, "PRACK": 405,
             "FOOBAR": 501, "BYE": 481, "INFO": 481, "NOTIFY": 481, "UPDATE": 481, "CANCEL": 481}
    for method, status in cases.items():
        data = request(method)
        for _ in range(3):  # the request and two retransmissions: the same answer, no transaction
            tl.datagram_received(data, src)
        assert wire.statuses()[-3:] == [status] * 3, method
        answer = parse(wire.sent[-1])
        if status in (405, 501):
            assert {"INVITE", "OPTIONS", "BYE"} <= set(answer.get_all("allow")), method
        assert answer.get("call-id") == parse(data).call_id
    for data in (request("BYE", to_tag="nope"), request("UPDATE", to_tag="nope"),
                 request("INVITE", to_tag="nope"), request("BYE", call_id="known@t", to_tag="other")):
        tl.datagram_received(data, src)
        assert wire.statuses()[-1] == 481
    assert tl.server_tx == {} and tl.shares.sources() == 0 and user.got == []
    st = tl.counters.snapshot()
    assert st["sip_refused_method"] == 18 and st["sip_refused_unknown_method"] == 3
    assert st["sip_refused_no_dialog"] == 12 + 4 and st["sip_refused_no_transaction"] == 3
    assert tl.counters.log_limit.lines == 4  # one line per reason


def test_requests_in_a_dialog_and_a_cancel_of_a_live_invite_get_their_transaction(layer):
    tl, wire, user = layer()
    src = (source(), 5099)
    tl.datagram_received(request("BYE", call_id="known@t", to_tag="ours"), src)
    tl.datagram_received(request("INFO", call_id="known@t", to_tag="ours"), src)
    tl.datagram_received(request("INVITE", branch="z9hG4bKlive"), src)
    tl.datagram_received(request("CANCEL", branch="z9hG4bKlive"), src)
    tl.datagram_received(request("OPTIONS", mf="0"), src)
    tl.datagram_received(request("BYE", mf="0"), src)
    assert user.got == ["BYE", "INFO", "INVITE", "CANCEL", "OPTIONS"]
    assert len(tl.server_tx) == 5 and tl.shares.held(src[0]) == 5
    assert wire.statuses() == [483] and tl.counters.snapshot()["sip_refused_too_many_hops"] == 1


def test_a_source_holds_at_most_its_share_of_the_table_and_gets_it_back(layer):
    tl, wire, user = layer(max_transactions=64, max_transactions_per_source=4, options_rate=(),
                           t1_ms=1, t4_ms=1)
    a, b = (source(), 5099), (source(), 5099)
    for _ in range(10):
        tl.datagram_received(request("OPTIONS"), a)
    assert user.got == ["OPTIONS"] * 4 and len(tl.server_tx) == 4
    assert wire.statuses() == [503] * 6
    assert parse(wire.sent[-1]).get("retry-after") == "5"
    assert tl.counters.snapshot()["sip_refused_tx_source_full"] == 6
    tl.datagram_received(request("OPTIONS"), b)  # another source is served
    assert user.got.count("OPTIONS") == 5 and tl.shares.held(b[0]) == 1
    for tx in list(tl.server_tx.values()):
        tl.respond(tx, parse(request("OPTIONS")), 200)  # Timer J: 64 * T1 = 64 ms
    tl.loop.run_until_complete(asyncio.sleep(0.15))
    assert tl.server_tx == {} and tl.shares.sources() == 0
    tl.datagram_received(request("OPTIONS"), a)
    assert tl.shares.held(a[0]) == 1


def test_the_default_share_is_an_eighth_of_the_table():
    assert SipConfig().transactions_per_source == 512
    assert SipConfig(max_transactions=16).transactions_per_source == 2
    assert SipConfig(max_transactions_per_source=7).transactions_per_source == 7
    from brisvox.config.errors import ConfigError
    with pytest.raises(ConfigError, match="sip.max_transactions_per_source"):
        SipConfig.from_section({"max_transactions": 100, "max_transactions_per_source": 101})
    with pytest.raises(ConfigError, match=r"sip.other_rate\[0\]"):
        SipConfig.from_section({"other_rate": ["often"]})
    with pytest.raises(ConfigError, match=r"sip.refusal_rate\[0\]"):
        SipConfig.from_section({"refusal_rate": ["x"]})


def test_other_requests_are_rate_limited_and_a_flood_past_the_refusal_budget_is_dropped(layer):
    tl, wire, user = layer(other_rate=("5/second",), refusal_rate=("3/second",))
    src = (source(), 5099)
    for _ in range(20):
        tl.datagram_received(request("REGISTER"), src)
    assert wire.statuses() == [405] * 5 + [503] * 3  # 12 dropped unanswered
    limited = parse(wire.sent[-1])
    assert limited.reason == "Rate Limited" and int(limited.get("retry-after")) >= 1
    st = tl.counters.snapshot()
    assert st["sip_refused_method"] == 5 and st["sip_refused_rate_limit"] == 3 and st["sip_refused_flood"] == 12
    assert tl.server_tx == {}
    assert tl.counters.log_limit.lines == 3  # method, rate_limit, flood: one line each
    other = (source(), 5099)  # another source has its own windows
    tl.datagram_received(request("REGISTER"), other)
    assert wire.statuses()[-1] == 405


def test_the_rate_limit_comes_before_the_stateless_answer():
    guard = SipGuard(("127.0.0.0/8",), (), (), ("2/second",))
    src = source()
    assert [guard.admit("OTHER", src) for _ in range(3)][:2] == [0, 0]
    assert guard.admit("OTHER", src) >= 1 and guard.admit("INVITE", src) == 0  # no INVITE limit set
    assert isinstance(stateless_refusal("REGISTER", "", False, False, False), Refusal)
