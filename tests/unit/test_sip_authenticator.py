"""``[sip] auth`` (brisvox/gateway/sip/authenticator.py), its config and its exposure rule."""

from __future__ import annotations

import pytest

from brisvox.config.daemon import parse_config
from brisvox.config.errors import ConfigError
from brisvox.config.exposure import check_open_sip
from brisvox.gateway.config import SipConfig
from brisvox.gateway.sip.authenticator import SipAuthenticator
from brisvox.wire import sip_digest as d

URI = "sip:echo@192.0.2.10"


def _cfg(monkeypatch, **kw) -> SipConfig:
    monkeypatch.setenv("T_ALICE", "pw")
    return SipConfig.from_section({"users": [{"name": "alice", "agent": "echo", "secret_env": "T_ALICE"},
                                             {"name": "nosecret", "agent": "echo"}], **kw})


def test_users_array_form_reads_secrets_from_the_environment_never_inline(monkeypatch):
    c = _cfg(monkeypatch, auth="digest")
    assert c.user_agents == {"alice": "echo", "nosecret": "echo"}
    assert (c.user_secret("alice"), c.user_secret("nosecret"), c.user_secret("eve")) == ("pw", None, None)
    assert "pw" not in repr(c)
    with pytest.raises(ConfigError, match="never inline") as e:
        SipConfig.from_section({"users": [{"name": "a", "agent": "echo", "secret": "pw"}]})
    assert e.value.key == "sip.users[0].secret"
    with pytest.raises(ConfigError, match="needs"):
        SipConfig.from_section({"auth": "digest"})  # nobody could authenticate
    with pytest.raises(ConfigError, match="auth_networks"):
        _cfg(monkeypatch, auth="ip_or_digest")


def _answer(a: SipAuthenticator, source: str, user: str = "alice", secret: str = "pw", nc: int = 1) -> str:
    ch = d.pick_challenge(a.server.challenges(source, 10.0))
    assert ch is not None
    return d.authorization(ch, d.DigestCredentials(user, secret), "INVITE", URI, nc, "cn")


def test_decisions_by_mode(monkeypatch):
    ip = SipAuthenticator(SipConfig())
    assert not ip.enabled and ip.judge(None, URI, "192.0.2.1", "192.0.2.1", 1.0).action == "pass"
    mixed = SipAuthenticator(_cfg(monkeypatch, auth="ip_or_digest", auth_networks=["198.51.100.0/24"]))
    assert mixed.judge(None, URI, "198.51.100.7", "198.51.100.7", 1.0).reason == "by_address"
    first = mixed.judge(None, URI, "192.0.2.1", "192.0.2.1", 10.0)
    assert first.action == "challenge" and first.reason == "no_credentials" and len(first.challenges) == 2
    ok = mixed.judge(_answer(mixed, "192.0.2.1"), URI, "192.0.2.1", "192.0.2.1", 11.0)
    assert (ok.action, ok.user) == ("pass", "alice") and mixed.agent_of("alice") == "echo"


def test_failures_are_limited_per_source_and_per_user_stale_is_no_failure(monkeypatch):
    a = SipAuthenticator(_cfg(monkeypatch, auth="digest", auth_failures=["2/minute"], auth_nonce_s=5))
    judge = lambda value, src, now=11.0: a.judge(value, URI, src, src, now)  # noqa: E731
    for _ in range(5):  # stale nonces and missing credentials cost nothing
        assert judge(_answer(a, "192.0.2.1"), "192.0.2.1", 30.0).reason == "stale"
        assert judge(None, "192.0.2.1").action == "challenge"
    assert [judge(_answer(a, "192.0.2.2", "mallory", "x"), "192.0.2.2").action for _ in range(4)] == \
        ["challenge", "challenge", "forbid", "forbid"]
    assert judge(None, "192.0.2.2").action == "forbid"  # no new challenge for that source
    assert judge(_answer(a, "192.0.2.1"), "192.0.2.1").action == "pass"  # others are served
    # a known user guessed at from two sources: locked out everywhere, even with the right secret
    assert judge(_answer(a, "192.0.2.3", secret="x"), "192.0.2.3").action == "challenge"
    assert judge(_answer(a, "192.0.2.4", secret="x"), "192.0.2.4").action == "challenge"
    assert judge(_answer(a, "192.0.2.5", secret="x"), "192.0.2.5").reason == "too_many_failures"
    assert judge(_answer(a, "192.0.2.6"), "192.0.2.6").reason == "too_many_failures"


def test_an_open_allow_list_is_accepted_only_behind_digest(monkeypatch):
    monkeypatch.setenv("T_ALICE", "pw")
    users = [{"name": "alice", "agent": "echo", "secret_env": "T_ALICE"}]
    assert check_open_sip(parse_config({"sip": {"host": "0.0.0.0", "allow": ["0.0.0.0/0"], "auth": "digest",
                                                "users": users}})) == []
    with pytest.raises(ConfigError):  # by address from the whole Internet: refused as without auth
        check_open_sip(parse_config({"sip": {"host": "0.0.0.0", "allow": ["0.0.0.0/0"], "auth": "ip_or_digest",
                                             "auth_networks": ["0.0.0.0/0"], "users": users}}))
    assert check_open_sip(parse_config({"sip": {"host": "0.0.0.0", "allow": ["0.0.0.0/0"], "auth": "ip_or_digest",
                                                "auth_networks": ["203.0.113.0/24"], "users": users}})) == []
