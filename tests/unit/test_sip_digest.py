"""SIP digest maths (brisvox/wire/sip_digest.py): RFC vectors, both directions, nonces, replay."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import sip_digest as d

KEY = b"k" * 32
URI = "sip:agent@127.0.0.1:5060"


def test_rfc2617_md5_vector():
    a = d.Authorization(username="Mufasa", realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
                        uri="/dir/index.html", response="", qop="auth", nc=1, cnonce="0a4f113b")
    assert d.response_for(a, "Circle Of Life", "GET") == "6629fae49393a05397450978507c4ef1"


@pytest.mark.parametrize("alg,want", [
    ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
    ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
])
def test_rfc7616_vectors(alg, want):
    ch = d.Challenge(realm="http-auth@example.org", nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
                     algorithm=alg, qop=("auth", "auth-int"), opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS")
    value = d.authorization(ch, d.DigestCredentials("Mufasa", "Circle of Life"), "GET", "/dir/index.html", 1,
                            "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ")
    a = d.parse_authorization(value)
    assert a.response == want and a.nc == 1 and a.qop == "auth" and a.opaque == ch.opaque


def test_parse_and_pick_challenge_prefers_sha256_and_skips_unusable():
    md5 = 'Digest realm="r", nonce="n1", algorithm=MD5, qop="auth"'
    sha = 'Digest realm="r", nonce="n2", algorithm=SHA-256, qop="auth,auth-int", stale=TRUE'
    intonly = 'Digest realm="r", nonce="n3", algorithm=SHA-256, qop="auth-int"'
    assert d.pick_challenge([md5, sha]) == d.Challenge("r", "n2", "SHA-256", ("auth", "auth-int"), "", True)
    assert d.pick_challenge([intonly, md5]).nonce == "n1"
    assert d.pick_challenge([intonly, 'Basic realm="x"', "Digest nonce=x"]) is None
    assert d.parse_challenge('Digest realm="a\\"b", nonce=abc').realm == 'a"b'
    with pytest.raises(d.DigestError):
        d.parse_challenge('Digest realm="r", nonce="n", algorithm=SHA-512-256')


def test_rfc2069_challenge_without_qop():
    ch = d.parse_challenge('Digest realm="r", nonce="n"')
    value = d.authorization(ch, d.DigestCredentials("u", "s"), "INVITE", URI, 1, "c")
    assert "qop" not in value and "nc=" not in value
    a = d.parse_authorization(value)
    assert a.response == d.response_for(a, "s", "INVITE")


def test_credentials_never_show_their_secret():
    assert "hunter2" not in repr(d.DigestCredentials("u", "hunter2"))


def _server(**kw) -> d.DigestServer:
    return d.DigestServer("brisvox", KEY, **kw)


def _answer(srv, source, now, alg="SHA-256", secret="s3cret", user="alice", nc=1, method="INVITE", uri=URI,
            stale_ok=False) -> str:
    ch = next(c for c in map(d.parse_challenge, srv.challenges(source, now)) if c.algorithm == alg)
    return d.authorization(ch, d.DigestCredentials(user, secret), method, uri, nc, "cn")


def secrets_of(name: str) -> str | None:
    return {"alice": "s3cret"}.get(name)


@pytest.mark.parametrize("alg", ["SHA-256", "MD5"])
def test_round_trip_and_every_refusal(alg):
    srv = _server(lifetime_s=30)
    src = "192.0.2.1"
    ok = _answer(srv, src, 100.0, alg)
    assert srv.verify(ok, "INVITE", URI, src, 101.0, secrets_of) == d.Verdict(True, "alice")
    assert srv.verify(ok, "INVITE", URI, src, 101.0, secrets_of).reason == "replay"  # same nc again
    v = lambda value, **kw: srv.verify(value, kw.get("method", "INVITE"), kw.get("uri", URI),  # noqa: E731
                                       kw.get("src", src), kw.get("now", 101.0), secrets_of).reason
    assert v(None) == "no_credentials"
    assert v("Digest garbage") == "bad_header"
    assert v(ok.replace('realm="brisvox"', 'realm="other"')) == "wrong_realm"
    assert v(_answer(srv, src, 100.0, alg, uri="tel:+15550100")) == "uri_mismatch"
    # a SIP digest-uri other than the Request-URI (SIPp omits the user; a proxy may rewrite it)
    assert v(_answer(srv, src, 100.0, alg, uri="sip:127.0.0.1:5060")) == "ok"
    assert v(_answer(srv, src, 100.0, alg), src="192.0.2.2") == "bad_nonce"  # bound to its source
    assert v(_answer(srv, src, 100.0, alg), now=140.0) == "stale"
    assert v(_answer(srv, src, 100.0, alg, user="mallory")) == "unknown_user"
    assert v(_answer(srv, src, 100.0, alg, secret="guess")) == "wrong_response"
    assert v(_answer(srv, src, 100.0, alg), method="BYE") == "wrong_response"
    assert v(_answer(srv, src, 200.0, alg), now=150.0) == "bad_nonce"  # from the future


def test_nonce_counts_must_increase_and_wrong_responses_burn_nothing():
    srv = _server()
    src = "192.0.2.1"
    ch = d.parse_challenge(srv.challenges(src, 10.0)[0])
    creds = d.DigestCredentials("alice", "s3cret")
    at = lambda nc, c=creds: srv.verify(d.authorization(ch, c, "INVITE", URI, nc, "x"),  # noqa: E731
                                        "INVITE", URI, src, 11.0, secrets_of)
    assert at(5, d.DigestCredentials("alice", "nope")).reason == "wrong_response"
    assert at(1).ok and at(2).ok and at(7).ok
    assert [at(n).reason for n in (7, 3, 0)] == ["replay"] * 3


def test_a_modified_or_forged_nonce_is_bad():
    mint = d.NonceMint(KEY, 30)
    n = mint.mint("192.0.2.1", 5.0)
    assert mint.check(n, "192.0.2.1", 6.0) == "ok"
    flipped = n[:-2] + ("A" if n[-2] != "A" else "B") + n[-1]
    assert mint.check(flipped, "192.0.2.1", 6.0) == "bad"
    assert d.NonceMint(b"x" * 32).check(n, "192.0.2.1", 6.0) == "bad"
    assert mint.check("short", "192.0.2.1", 6.0) == "bad"
    assert mint.check("!" * len(n), "192.0.2.1", 6.0) == "bad"
    assert mint.mint("192.0.2.1", 5.0) != n  # two nonces of one millisecond differ


def test_evicted_nonces_are_never_accepted_again():
    counts = d.NonceCounts(capacity=2)
    assert counts.accept("a", 1, 1.0) and counts.accept("b", 1, 2.0) and counts.accept("c", 1, 3.0)
    assert len(counts) == 2
    assert not counts.accept("a", 1, 1.0) and not counts.accept("a", 2, 1.0)  # evicted: refused
    assert counts.accept("b", 2, 2.0) and counts.accept("d", 1, 4.0)


def test_bounds():
    with pytest.raises(d.DigestError):
        d.parse_challenge("Digest " + ", ".join(f"p{i}=x" for i in range(40)) + ', realm="r", nonce=n')
    with pytest.raises(d.DigestError):
        d.parse_challenge('Digest realm="' + "r" * 2000 + '", nonce=n')
    with pytest.raises(d.DigestError):
        d.parse_authorization("Digest " + "x" * 5000)
    with pytest.raises(d.DigestError):
        d.parse_authorization('Digest username="u", realm="r", nonce="n", uri="u", response="r", qop=auth, nc=1')


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parsers_raise_only_digest_errors(s):
    for parse in (d.parse_challenge, d.parse_authorization):
        for value in (s, "Digest " + s):
            try:
                parse(value)
            except d.DigestError:
                pass
