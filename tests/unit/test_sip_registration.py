"""Trunk registration (brisvox/gateway/sip/registration.py) and answering challenges (client_auth.py)."""

from __future__ import annotations

import pytest

from brisvox.gateway.config import SipConfig
from brisvox.gateway.sip.client_auth import MAX_RETRIES, ClientAuth, trunk_credentials
from brisvox.gateway.sip.registration import Registration, SendRegister, Wait, granted_expires
from brisvox.wire import sip_digest as d
from brisvox.wire.sip_message import SipMessage, parse


def test_register_refresh_between_half_and_four_fifths_of_the_grant():
    for r in (0.0, 0.5, 0.999):
        reg = Registration(600, rand=lambda r=r: r)
        assert reg.start(0.0) == [SendRegister(600)] and reg.state == "registering"
        [w] = reg.on_ok(300, 10.0)  # the registrar grants less than we asked
        assert isinstance(w, Wait) and 10.0 + 150 <= w.at <= 10.0 + 240 and reg.state == "registered"
        assert reg.on_timer(w.at - 1) == [Wait(w.at)]
        assert reg.on_timer(w.at) == [SendRegister(600)] and reg.state == "registering"
        assert reg.registered_until == 310.0  # still bound while the refresh is under way


def test_failures_back_off_honour_retry_after_and_never_give_up():
    reg = Registration(600, rand=lambda: 1.0)
    reg.start(0.0)
    waits = []
    now = 0.0
    for _ in range(12):
        [w] = reg.on_failure("503 Service Unavailable", None, now)
        assert reg.state == "failed" and reg.error == "503 Service Unavailable"
        waits.append(w.at - now)
        now = w.at
        assert reg.on_timer(now) == [SendRegister(600)]
    assert waits[:4] == [2.0, 4.0, 8.0, 16.0] and max(waits) == 300.0
    [w] = reg.on_failure("500", 900.0, now)  # Retry-After: never less
    assert w.at - now == 900.0
    reg.on_timer(w.at)
    assert reg.on_ok(None, w.at + 1) and reg.state == "registered" and reg.error == "" and reg.failures == 13
    t = reg.next_at
    reg.on_timer(t)
    [w] = reg.on_failure("timeout", None, t)  # the backoff starts afresh after a success
    assert w.at - t == 2.0 and reg.state == "failed"


def test_interval_too_brief_asks_again_with_min_expires_once():
    reg = Registration(60, rand=lambda: 0.5)
    reg.start(0.0)
    assert reg.on_too_brief(120, 0.0) == [SendRegister(120)] and reg.asked == 120
    assert isinstance(reg.on_too_brief(3600, 0.1)[0], Wait) and reg.state == "failed"  # twice: a failure
    reg2 = Registration(60)
    reg2.start(0.0)
    assert isinstance(reg2.on_too_brief(None, 0.0)[0], Wait)  # no Min-Expires


def test_a_reload_registers_again_now_and_skips_a_failed_trunks_backoff():
    reg = Registration(600, rand=lambda: 0.5)
    reg.start(0.0)
    assert reg.refresh_now(0.1) == []  # a REGISTER is out: no second one
    reg.on_ok(600, 1.0)
    assert reg.refresh_now(2.0) == [SendRegister(600)] and reg.state == "registering"
    [w] = reg.on_failure("503", None, 3.0)
    assert reg.state == "failed" and w.at > 3.0
    assert reg.refresh_now(3.5) == [SendRegister(600)]  # not waiting the backoff out
    reg.stop(4.0)
    assert reg.refresh_now(5.0) == []  # a trunk being removed is not registered again


def test_stop_removes_a_binding_the_registrar_holds():
    reg = Registration(600, rand=lambda: 0.5)
    assert reg.stop(0.0) == [] and reg.state == "stopped"  # never registered: nothing to remove
    reg = Registration(600, rand=lambda: 0.5)
    reg.start(0.0)
    reg.on_ok(600, 1.0)
    assert reg.stop(2.0) == [SendRegister(0)] and reg.state == "unregistering"
    assert reg.stop(2.0) == [] and reg.on_timer(500.0) == []
    assert reg.on_ok(0, 2.1) == [] and reg.state == "stopped" and reg.registered_until == 0.0
    reg = Registration(600)
    reg.start(0.0)
    reg.on_ok(600, 1.0)
    reg.stop(2.0)
    assert reg.on_failure("timeout", None, 34.0) == [] and reg.state == "stopped"


def test_granted_expires_reads_our_contact_then_the_header():
    r = parse(b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKx\r\nFrom: <sip:a@b>;tag=1\r\n"
              b"To: <sip:a@b>;tag=2\r\nCall-ID: c\r\nCSeq: 1 REGISTER\r\n"
              b"Contact: <sip:other@10.0.0.9>;expires=30, <sip:1001@127.0.0.1:5060>;expires=120\r\n"
              b"Expires: 600\r\nContent-Length: 0\r\n\r\n")
    assert granted_expires(r, "1001") == 120 and granted_expires(r, "nobody") == 600


def _register() -> SipMessage:
    m = SipMessage(method="REGISTER", uri="sip:127.0.0.1")
    m.headers += [("via", "SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKfirst;rport"), ("from", "<sip:u@h>;tag=t"),
                  ("to", "<sip:u@h>"), ("call-id", "cid"), ("cseq", "7 REGISTER")]
    return m


def _challenge(status: int, realm: str = "r", stale: bool = False, nonce: str = "n1") -> SipMessage:
    srv = d.challenge_value(realm, nonce, "MD5", stale)
    hdr = "www-authenticate" if status == 401 else "proxy-authenticate"
    m = SipMessage(status=status, reason="x")
    m.headers += [(hdr, srv)]
    return m


def test_client_auth_answers_once_per_realm_and_advances_cseq():
    auth = ClientAuth(d.DigestCredentials("u", "pw"))
    req = _register()
    again, why = auth.retry(req, _challenge(401))
    assert why == "" and again is not None
    assert again.cseq == (8, "REGISTER") and again.call_id == "cid" and again.from_tag == "t"
    assert "branch=z9hG4bKfirst" not in again.get("via") and again.get("via").endswith(";rport")
    a = d.parse_authorization(again.get("authorization"))
    assert a.username == "u" and a.uri == "sip:127.0.0.1" and a.response == d.response_for(a, "pw", "REGISTER")
    # the same realm challenges again: wrong credentials, no loop
    none, why = auth.retry(again, _challenge(401, nonce="n2"))
    assert none is None and why == "auth failed: wrong credentials (realm 'r')"
    # a stale nonce is answered once more; a 407 gets Proxy-Authorization
    auth = ClientAuth(d.DigestCredentials("u", "pw"))
    first, _ = auth.retry(req, _challenge(407))
    assert first is not None and first.get("proxy-authorization") and not first.get("authorization")
    second, _ = auth.retry(first, _challenge(407, stale=True, nonce="n2"))
    assert second is not None and second.cseq[0] == 9 and len(second.get_all("proxy-authorization")) == 1
    assert auth.retry(second, _challenge(407, stale=True, nonce="n3"))[0] is None


def test_client_auth_refuses_what_it_cannot_answer():
    req = _register()
    assert ClientAuth(None).retry(req, _challenge(401))[1] == "auth required: no credentials for realm 'r'"
    scoped = ClientAuth(d.DigestCredentials("u", "pw", realm="carrier"))
    assert scoped.retry(req, _challenge(401, realm="evil"))[1].startswith("auth required")
    cancel = _register()
    cancel.method = "CANCEL"
    assert ClientAuth(d.DigestCredentials("u", "pw")).retry(cancel, _challenge(401))[0] is None
    many = ClientAuth(d.DigestCredentials("u", "pw"))
    msg = req
    for i in range(MAX_RETRIES):
        msg, why = many.retry(msg, _challenge(401, realm=f"realm{i}"))
        assert msg is not None, why
    assert many.retry(msg, _challenge(401, realm="another"))[0] is None


@pytest.mark.parametrize("table", [{"name": "t", "registrar": "127.0.0.1", "username": "u", "register": False}])
def test_an_ip_trunk_without_a_secret_answers_nothing(table):
    t = SipConfig.from_section({"trunks": [table]}).trunks[0]
    assert trunk_credentials(t) is None and t.networks == ("127.0.0.1",) and t.next_hop == ("127.0.0.1", 5060)


def test_the_transport_a_dial_goes_over():
    from brisvox.gateway.sip.outbound import resolve_target, target_transport

    assert target_transport("sip:bob@192.0.2.1") == "UDP"
    assert target_transport("sip:bob@192.0.2.1;transport=tcp") == "TCP"
    assert target_transport("sips:bob@192.0.2.1") == "TLS"
    assert target_transport("sip:bob@192.0.2.1;transport=sctp") == "UDP"
    assert resolve_target("sips:bob@192.0.2.1", "") == ("sips:bob@192.0.2.1", ("192.0.2.1", 5061))
    t = SipConfig.from_section({"trunks": [{"name": "t", "registrar": "127.0.0.1:5070", "username": "u",
                                            "register": False}]}).trunks[0]
    assert target_transport(t) == "UDP" and resolve_target("123", t) == ("sip:123@127.0.0.1:5070", ("127.0.0.1", 5070))
    with pytest.raises(Exception, match="listeners"):
        SipConfig.from_section({"trunks": [{"name": "t", "registrar": "127.0.0.1", "username": "u",
                                            "register": False, "transport": "tls"}]})
