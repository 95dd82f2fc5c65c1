"""The call timers of the pure CallMachine (max_call_s, the media timeout), the spent-token
table, and the per-source share of the call table."""

from __future__ import annotations

import pytest

from brisvox.gateway.core import call_machine as M
from brisvox.gateway.core.calls import AdmissionError, CallTable
from brisvox.gateway.ws.spent_tokens import FULL, REPLAYED, SPENT, SpentTokens


def _active(max_call_s: float = 0.0, media_timeout_s: float = 0.0) -> M.CallMachine:
    m = M.CallMachine()
    m.handle(M.Admit("native", process=True, now=100.0, max_call_s=max_call_s, media_timeout_s=media_timeout_s))
    m.handle(M.TransportStarted())
    m.handle(M.AgentStarted(True, now=100.0))
    return m


def test_max_call_s_hangs_up_once_and_names_the_reason() -> None:
    m = _active(max_call_s=10.0)
    assert m.timer(109.9, 5) == ""
    assert m.timer(110.0, 6) == M.MAX_CALL_REASON
    out = m.handle(M.TimerFired(M.MAX_CALL_REASON, True, 110.0))
    assert out == (M.Count("calls_max_duration"), M.HangupLeg(M.MAX_CALL_REASON))
    assert m.end_reason == M.MAX_CALL_REASON
    m.handle(M.TransportEnded("closed 1000", 110.1))
    assert m.timer(200.0, 6) == ""  # the transport is done: no timer fires again


def test_the_media_timeout_restarts_with_every_packet_and_is_off_at_zero() -> None:
    m = _active(media_timeout_s=2.0)
    assert m.timer(101.0, 0) == ""
    assert m.timer(102.5, 1) == ""  # a packet: the watch restarts
    assert m.timer(104.4, 1) == ""
    assert m.timer(104.6, 1) == M.MEDIA_TIMEOUT_REASON
    assert _active().timer(10_000.0, 0) == ""  # no timers: never


def test_spent_tokens_refuse_a_replay_forget_expired_ones_and_are_bounded() -> None:
    t = SpentTokens()
    assert t.spend("a" * 16, 110, 100.0, 2) == SPENT
    assert t.spend("a" * 16, 110, 101.0, 2) == REPLAYED
    assert t.spend("b" * 16, 120, 101.0, 2) == SPENT
    assert t.spend("c" * 16, 130, 102.0, 2) == FULL  # never forgets a live one to make room
    assert t.spend("c" * 16, 130, 110.0, 2) == SPENT and len(t) == 2  # "a" expired at 110


def test_one_source_holds_at_most_its_share(tmp_path: object) -> None:
    table = CallTable(f"tt{id(tmp_path) % 10_000}", 8, 0.1)
    calls = [table.admit("native", "echo", 8000, 16000, source="192.0.2.1", per_source=2) for _ in range(2)]
    with pytest.raises(AdmissionError) as e:
        table.admit("native", "echo", 8000, 16000, source="192.0.2.1", per_source=2)
    assert e.value.reason == "source" and table.refused == {"source": 1}
    other = table.admit("native", "echo", 8000, 16000, source="192.0.2.2", per_source=2)
    unsourced = table.admit("sip", "echo", 8000, 16000)  # a transport that passes no source is not counted
    for c in (*calls, other, unsourced):
        table.release(c)
    assert table.by_source == {} and len(table) == 0
