"""RFC 4028 session timers, pure (brisvox/wire/sip_session_timer.py), on virtual time: the
header grammar (sections 4, 5), the requester's headers and its reading of a 2xx and a 422
(7.1-7.4), what proxies do to both (8), the answerer's negotiation and refresher choice (9),
and one dialog's timer: refresh at half the interval, BYE at ``interval - min(32, interval/3)``
without a refresh, a refresh's failures (10), the RFC 3261 14.1 glare delay."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import sip_session_timer as T
from brisvox.wire.sip_message import SipMessage, parse

POLICY = T.TimerPolicy(session_expires=1800, min_se=90)


def msg(*headers: tuple[str, str], status: int = 0) -> SipMessage:
    return SipMessage(method="" if status else "INVITE", uri="" if status else "sip:x@127.0.0.1",
                      status=status, reason="OK" if status else "", headers=list(headers))


def req(supported: bool = True, se: str = "", min_se: str = "") -> T.TimerRequest:
    h = [("supported", "timer")] if supported else []
    if se:
        h.append(("session-expires", se))
    if min_se:
        h.append(("min-se", min_se))
    return T.TimerRequest.of(msg(*h))


def hdr(answer: T.Accept | T.Reject422, name: str) -> str:
    headers = answer.headers
    return next((v for k, v in headers if k == name), "")


# -- sections 4 and 5: the grammar ------------------------------------------------------------------


@pytest.mark.parametrize(("value", "want"), [
    ("1800", T.SessionExpires(1800)),
    ("1800;refresher=uac", T.SessionExpires(1800, "uac")),
    (" 90 ; refresher = UAS ;x=y", T.SessionExpires(90, "uas")),
    ("4000;foo;refresher=uac", T.SessionExpires(4000, "uac")),
])
def test_session_expires_parses_delta_seconds_and_the_refresher(value: str, want: T.SessionExpires) -> None:
    assert T.parse_session_expires(value) == want
    assert T.parse_session_expires(want.format()) == want


@pytest.mark.parametrize("value", ["", "abc", "-5", "1e3", "9\u00b2", "90;refresher=both", "99999999999",
                                   "90;refresher=", "0x10"])
def test_a_malformed_session_expires_or_min_se_is_refused(value: str) -> None:
    with pytest.raises(ValueError):
        T.parse_session_expires(value)
    if ";" not in value:
        with pytest.raises(ValueError):
            T.parse_min_se(value)


def test_min_se_and_the_compact_form_read_from_a_message() -> None:
    data = (b"INVITE sip:a@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bK1\r\n"
            b"From: <sip:b@127.0.0.1>;tag=1\r\nTo: <sip:a@127.0.0.1>\r\nCall-ID: c@t\r\nCSeq: 1 INVITE\r\n"
            b"k: 100rel, timer\r\nx: 1200;refresher=uac\r\nMin-SE: 600;p=1\r\nContent-Length: 0\r\n\r\n")
    r = T.TimerRequest.of(parse(data))
    assert r == T.TimerRequest(True, T.SessionExpires(1200, "uac"), 600)
    assert T.TimerRequest.of(parse(data.replace(b"k: 100rel, timer\r\n", b"Require: TIMER\r\n"))).supported
    assert not T.TimerRequest.of(parse(data.replace(b"k: 100rel, timer\r\n", b""))).supported
    out = SipMessage(status=200, reason="OK", headers=[("session-expires", "90"), ("min-se", "90")]).serialize()
    assert b"\r\nSession-Expires: 90\r\n" in out and b"\r\nMin-SE: 90\r\n" in out


# -- section 7: the requester ---------------------------------------------------------------------


def test_7_1_an_initial_request_supports_timers_and_asks_without_naming_the_refresher() -> None:
    assert T.uac_headers(1800, 90) == [("supported", "timer"), ("session-expires", "1800"), ("min-se", "90")]
    assert T.uac_headers(0, 90) == [("supported", "timer")]  # support stated even when asking nothing
    assert T.uac_headers(0, 300) == [("supported", "timer"), ("min-se", "300")]


def test_7_2_the_2xx_decides_the_interval_and_the_refresher() -> None:
    se = "session-expires"
    assert T.uac_result(msg((se, "1200;refresher=uac"), status=200), 1800) == (1200, True)
    assert T.uac_result(msg((se, "1200;refresher=uas"), status=200), 1800) == (1200, False)
    assert T.uac_result(msg((se, "1200"), status=200), 1800) == (1200, True)
    # a UAS without timer support: the requester may still run what it asked for, refreshing itself
    assert T.uac_result(msg(status=200), 1800) == (1800, True)
    assert T.uac_result(msg(status=200), 0) == (0, False)
    assert T.uac_result(msg((se, "bogus"), status=200), 0) == (0, False)  # malformed: absent
    assert T.uac_result(msg((se, "30;refresher=uas"), status=200), 1800) == (90, False)  # never below 90


def test_7_3_a_422_is_asked_again_with_the_largest_min_se_seen() -> None:
    assert T.uac_after_422(msg(("min-se", "3600"), status=422), 1800, 90) == (3600, 3600)
    assert T.uac_after_422(msg(("min-se", "1000"), status=422), 4000, 4000) == (4000, 4000)
    assert T.uac_after_422(msg(("min-se", "1000"), status=422), 1800, 90) == (1800, 1000)
    assert T.uac_after_422(msg(status=422), 1800, 90) is None
    assert T.uac_after_422(msg(("min-se", "soon"), status=422), 1800, 90) is None


def test_7_4_a_refresh_names_the_interval_us_as_refresher_and_the_min_se() -> None:
    m = T.SessionTimer(90, owner=False, update=True)
    m.handle(T.Negotiated(0.0, 600, True))
    assert m.handle(T.Tick(300.0)) == [T.SendRefresh("UPDATE", 600, 90)]
    assert T.uac_headers(600, 90, refreshing=True) == [
        ("supported", "timer"), ("session-expires", "600;refresher=uac"), ("min-se", "90")]
    # a 422 to the refresh: sent again at once with its Min-SE, once
    assert m.handle(T.RefreshFailed(300.1, 422, min_se=900)) == [
        T.Count("sip_session_422_received"), T.SendRefresh("UPDATE", 900, 900)]
    assert m.handle(T.RefreshFailed(300.2, 422, min_se=1200)) == [T.Count("sip_session_refresh_rejected")]
    assert not m.done


def test_7_4_update_when_the_peer_allows_it_else_re_invite_and_a_refused_update_falls_back() -> None:
    m = T.SessionTimer(90, owner=True)
    m.handle(T.Negotiated(0.0, 90, True))
    assert m.handle(T.Tick(45.0)) == [T.SendRefresh("INVITE", 90, 90)]
    m = T.SessionTimer(90, owner=True)
    m.handle(T.PeerAllows(update=True))
    m.handle(T.Negotiated(0.0, 90, True))
    assert m.handle(T.Tick(45.0)) == [T.SendRefresh("UPDATE", 90, 90)]
    assert m.handle(T.RefreshFailed(45.1, 501)) == [T.Count("sip_session_update_refused"),
                                                     T.SendRefresh("INVITE", 90, 90)]
    assert m.handle(T.RefreshFailed(45.2, 405)) == [T.Count("sip_session_refresh_rejected")]


# -- section 8: what a proxy does to both sides ------------------------------------------------------


def test_8_a_proxy_inserted_interval_for_a_requester_without_timer_support() -> None:
    # the requester cannot refresh nor read a Require: we refresh, and a too small value is raised, not refused
    a = T.uas_answer(req(supported=False, se="1800;refresher=uac"), POLICY)
    assert isinstance(a, T.Accept) and (a.interval, a.we_refresh) == (1800, True)
    assert hdr(a, "session-expires") == "1800;refresher=uas" and hdr(a, "require") == ""
    a = T.uas_answer(req(supported=False, se="60", min_se="60"), T.TimerPolicy(1800, 120))
    assert isinstance(a, T.Accept) and a.interval == 120 and hdr(a, "session-expires") == "120;refresher=uas"


def test_8_the_requester_honours_what_proxies_said() -> None:
    # a proxy asked for a timer we did not ask for: the 2xx's Session-Expires runs
    assert T.uac_result(msg(("session-expires", "900;refresher=uac"), ("require", "timer"), status=200), 0) == (900, True)
    # a proxy lowered the interval on the way back
    assert T.uac_result(msg(("session-expires", "600;refresher=uas"), status=200), 1800) == (600, False)
    # two proxies answered 422 in turn: the largest Min-SE stays
    first = T.uac_after_422(msg(("min-se", "1200"), status=422), 1800, 90)
    assert first == (1800, 1200)
    assert T.uac_after_422(msg(("min-se", "600"), status=422), *first) == (1800, 1200)


# -- section 9: the answerer --------------------------------------------------------------------------


@pytest.mark.parametrize(("supported", "se", "min_se", "policy", "want"), [
    # the refresher the request names is kept; the Require comes with it
    (True, "1800;refresher=uac", "", POLICY, (1800, False, "1800;refresher=uac", "timer")),
    (True, "1800;refresher=uas", "", POLICY, (1800, True, "1800;refresher=uas", "timer")),
    # free to choose: we take the refreshes (our timer is known to run)
    (True, "1800", "", POLICY, (1800, True, "1800;refresher=uas", "timer")),
    # shorter than asked when ours is shorter, never below the request's Min-SE, never longer than asked
    (True, "7200;refresher=uac", "", POLICY, (1800, False, "1800;refresher=uac", "timer")),
    (True, "7200;refresher=uac", "3600", POLICY, (3600, False, "3600;refresher=uac", "timer")),
    (True, "100;refresher=uac", "200", T.TimerPolicy(90, 90), (100, False, "100;refresher=uac", "timer")),
    (True, "600", "", POLICY, (600, True, "600;refresher=uas", "timer")),
    # not asked: we ask (the requester supports timers: Require; it does not: no Require, we refresh)
    (True, "", "", POLICY, (1800, True, "1800;refresher=uas", "timer")),
    (True, "", "2400", POLICY, (2400, True, "2400;refresher=uas", "timer")),
    (False, "", "", POLICY, (1800, True, "1800;refresher=uas", "")),
    # we ask for nothing (session_expires_s = 0) but honour the request's
    (True, "", "", T.TimerPolicy(0, 90), (0, False, "", "")),
    (False, "", "", T.TimerPolicy(0, 90), (0, False, "", "")),
    (True, "1800;refresher=uac", "", T.TimerPolicy(0, 90), (1800, False, "1800;refresher=uac", "timer")),
])
def test_9_the_answer_interval_refresher_and_require(supported: bool, se: str, min_se: str,
                                                     policy: T.TimerPolicy, want: tuple) -> None:
    a = T.uas_answer(req(supported, se, min_se), policy)
    assert isinstance(a, T.Accept)
    assert (a.interval, a.we_refresh, hdr(a, "session-expires"), hdr(a, "require")) == want
    assert hdr(a, "supported") == "timer"


def test_9_too_small_for_a_requester_that_supports_timers_is_422_with_our_min_se() -> None:
    assert T.uas_answer(req(se="60"), POLICY) == T.Reject422(90)
    assert T.uas_answer(req(se="89;refresher=uac"), POLICY) == T.Reject422(90)
    assert T.uas_answer(req(se="100"), T.TimerPolicy(1800, 120)) == T.Reject422(120)
    assert T.Reject422(120).headers == [("min-se", "120")]
    assert isinstance(T.uas_answer(req(se="120"), T.TimerPolicy(1800, 120)), T.Accept)
    # only Require lists it: still a requester that supports timers
    r = T.TimerRequest.of(msg(("require", "timer"), ("session-expires", "30")))
    assert T.uas_answer(r, POLICY) == T.Reject422(90)


# -- section 10: one dialog's timer -------------------------------------------------------------------


def test_10_the_side_that_does_not_refresh_ends_the_session_before_it_expires() -> None:
    for interval, at in ((90, 60.0), (1800, 1768.0), (120, 88.0), (96, 64.0)):
        m = T.SessionTimer(90, owner=False)
        m.handle(T.Negotiated(0.0, interval, False))
        assert m.deadline == at
        assert m.handle(T.Tick(at - 0.01)) == []
        assert m.handle(T.Tick(at)) == [T.Count("sip_session_expired"), T.SendBye(T.EXPIRED)]
        assert m.done and m.deadline is None
        assert m.handle(T.Negotiated(at + 1, interval, False)) == [] and m.handle(T.Tick(at + 999)) == []


def test_10_every_refresh_seen_restarts_the_clock() -> None:
    m = T.SessionTimer(90, owner=False)
    m.handle(T.Negotiated(0.0, 90, False))
    for t in (20.0, 50.0, 100.0, 150.0):
        assert m.handle(T.Tick(t)) == []
        m.handle(T.Negotiated(t, 90, False))
    assert m.deadline == 210.0


def test_10_the_refresher_refreshes_at_half_and_ends_at_the_expiry_without_an_answer() -> None:
    m = T.SessionTimer(90, owner=True)
    m.handle(T.Negotiated(0.0, 90, True))
    assert m.deadline == 45.0
    assert m.handle(T.Tick(44.9)) == []
    assert m.handle(T.Tick(45.0)) == [T.SendRefresh("INVITE", 90, 90)]
    assert m.pending and m.deadline == 90.0  # one in flight at most: no second refresh, the expiry stands
    assert m.handle(T.Tick(60.0)) == []
    m.handle(T.RefreshAnswered(46.0, 90, True))
    assert m.deadline == 91.0 and not m.pending
    assert m.handle(T.Tick(91.0)) == [T.SendRefresh("INVITE", 90, 90)]
    assert m.handle(T.Tick(136.0)) == [T.Count("sip_session_expired"), T.SendBye(T.EXPIRED)]


def test_10_a_refresh_that_times_out_or_gets_408_or_481_ends_the_session() -> None:
    for status in (0, 408, 481):
        m = T.SessionTimer(90, owner=False)
        m.handle(T.Negotiated(0.0, 90, True))
        m.handle(T.Tick(45.0))
        assert m.handle(T.RefreshFailed(50.0, status)) == [T.Count("sip_session_refresh_failed"),
                                                           T.SendBye(T.REFRESH_FAILED)]
        assert m.done


def test_10_another_refusal_answers_for_a_live_peer_the_session_goes_on_unchanged() -> None:
    m = T.SessionTimer(90, owner=False)
    m.handle(T.Negotiated(0.0, 120, True))
    m.handle(T.Tick(60.0))
    assert m.handle(T.RefreshFailed(61.0, 500)) == [T.Count("sip_session_refresh_rejected")]
    assert (m.deadline, m.expire_at, m.interval, m.we_refresh) == (121.0, 181.0, 120, True)
    assert m.handle(T.Tick(121.0)) == [T.SendRefresh("INVITE", 120, 90)]
    assert m.handle(T.RefreshFailed(122.0, 488)) == [T.Count("sip_session_refresh_rejected")]
    assert not m.done and m.deadline == 182.0
    # no answer at all is another thing: the dialog is gone
    m.handle(T.Tick(182.0))
    assert m.handle(T.RefreshFailed(214.0, 0))[-1] == T.SendBye(T.REFRESH_FAILED)


def test_10_the_answer_to_our_refresh_may_hand_the_refreshes_to_the_peer_or_turn_the_timer_off() -> None:
    m = T.SessionTimer(90, owner=False)
    m.handle(T.Negotiated(0.0, 90, True))
    m.handle(T.Tick(45.0))
    m.handle(T.RefreshAnswered(45.5, 120, False))
    assert not m.we_refresh and m.deadline == 45.5 + 88.0
    m.handle(T.Negotiated(60.0, 0, False))  # a 2xx without Session-Expires: no timer from now on
    assert m.deadline is None and m.handle(T.Tick(1e9)) == []


def test_10_an_interval_below_90_is_run_as_90() -> None:
    m = T.SessionTimer(90, owner=False)
    m.handle(T.Negotiated(0.0, 30, False))
    assert m.interval == 90 and m.deadline == 60.0


def test_491_waits_the_rfc_3261_delay_of_the_call_id_owner_or_not() -> None:
    assert T.glare_delay(0.0, True) == 2.1 and T.glare_delay(0.999999, True) == 4.0
    assert T.glare_delay(0.0, False) == 0.0 and T.glare_delay(0.999999, False) == 2.0
    assert T.glare_delay(0.123456, False) == 0.25  # 10 ms steps
    for owner, lo, hi in ((True, 2.1, 4.0), (False, 0.0, 2.0)):
        m = T.SessionTimer(90, owner=owner)
        m.handle(T.Negotiated(0.0, 90, True))
        m.handle(T.Tick(45.0))
        assert m.handle(T.RefreshFailed(45.2, 491, draw=0.5)) == [T.Count("sip_session_refresh_glare")]
        assert m.deadline is not None and lo <= m.deadline - 45.2 <= hi
        assert m.handle(T.Tick(m.deadline)) == [T.SendRefresh("INVITE", 90, 90)]


EVENTS = st.one_of(
    st.builds(T.Tick, st.floats(0, 400)),
    st.builds(T.Negotiated, st.floats(0, 400), st.sampled_from([0, 90, 120, 1800]), st.booleans()),
    st.builds(T.RefreshAnswered, st.floats(0, 400), st.sampled_from([0, 90, 600]), st.booleans()),
    st.builds(T.RefreshFailed, st.floats(0, 400), st.sampled_from([0, 405, 408, 422, 481, 488, 491, 500, 501]),
              st.sampled_from([0, 120, 3600]), st.floats(0, 1)),
    st.builds(T.PeerAllows, st.booleans()),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(EVENTS, max_size=40), st.booleans())
def test_any_event_order_sends_at_most_one_bye_nothing_after_it_and_one_refresh_in_flight(events, owner) -> None:
    m = T.SessionTimer(90, owner=owner)
    now = 0.0
    byes = 0
    in_flight = False
    for e in events:
        if hasattr(e, "now"):  # time only moves forward
            now = max(now, e.now)
            e = dataclasses.replace(e, now=now)
        if isinstance(e, T.RefreshAnswered | T.RefreshFailed):
            if not in_flight:
                continue  # the executor reports only a refresh it sent
            in_flight = False
        acts = m.handle(e)
        assert byes == 0 or acts == []
        sends = [a for a in acts if isinstance(a, T.SendRefresh)]
        assert len(sends) <= 1 and not (sends and in_flight)
        in_flight = in_flight or bool(sends)
        assert all(a.interval >= 90 and a.min_se >= 90 for a in sends)
        byes += sum(isinstance(a, T.SendBye) for a in acts)
        assert m.deadline is None if m.done else True
    assert byes <= 1


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40), st.text(max_size=20))
def test_any_header_text_parses_to_a_valid_value_or_raises_value_error(se: str, mse: str) -> None:
    m = msg(("supported", "timer"), ("session-expires", se), ("min-se", mse))
    try:
        r = T.TimerRequest.of(m)
    except ValueError:
        return
    if r.session_expires is not None:
        assert 0 <= r.session_expires.interval <= T.MAX_DELTA and r.session_expires.refresher in ("", "uac", "uas")
        a = T.uas_answer(r, POLICY)
        assert isinstance(a, T.Reject422) or a.interval >= 90
