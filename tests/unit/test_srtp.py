"""SRTP with SDES keys (brisvox/wire/srtp.py): the a=crypto attribute and a call's two contexts.

libsrtp's published validation vector comes out of our sending context byte for byte; a stream
of G.711 packets (fixed fixture) goes through protect and unprotect bit-exact, across the
sequence wrap too (the ROC is libsrtp's); a wrong key, a replay, a truncated or forged packet
are refused with their reason and change no state; a re-key with the same key keeps the replay
window, another key replaces it; the attribute parser takes exactly the lines RFC 4568 lets us
take and refuses the rest with SrtpError only.
"""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import g711, srtp

# libsrtp's own validation vector (test/srtp_driver.c, srtp_validate): AES_CM_128_HMAC_SHA1_80
VECTOR_KEY = bytes.fromhex("e1f97a0d3e018be0d64fa32c06de41390ec675ad498afeebb6960b3aabe6")
VECTOR_PLAIN = bytes.fromhex("800f1234decafbadcafebabe" + "ab" * 16)
VECTOR_SRTP = bytes.fromhex("800f1234decafbadcafebabe4e55dc4ce79978d88ca4d215949d2402b78d6acc99ea179b8dbb")
SUITE80, SUITE32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"


def packet(seq: int, payload: bytes, ssrc: int = 0x11223344, pt: int = 0) -> bytes:
    return struct.pack("!BBHII", 0x80, pt, seq & 0xFFFF, (seq * 160) & 0xFFFFFFFF, ssrc) + payload


def fixture_payloads(n: int = 50) -> list[bytes]:
    """One second of a 440 Hz tone in mu-law, 160 bytes a packet (a fixed, reproducible fixture)."""
    t = np.arange(160 * n) / 8000.0
    pcm = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    enc = g711.CODECS["PCMU"].encode(pcm)
    return [bytes(enc[i * 160:(i + 1) * 160]) for i in range(n)]


def pair(suite: str = SUITE80) -> tuple[srtp.SrtpSession, srtp.SrtpSession]:
    """Two ends of one call: a's key is b's remote and back."""
    ka, kb = srtp.new_crypto(1, suite), srtp.new_crypto(1, suite)
    return srtp.SrtpSession(ka, kb), srtp.SrtpSession(kb, ka)


def test_the_sending_context_reproduces_libsrtps_validation_vector():
    sess = srtp.SrtpSession(srtp.Crypto(1, SUITE80, VECTOR_KEY), srtp.Crypto(1, SUITE80, VECTOR_KEY))
    assert sess.protect(VECTOR_PLAIN) == VECTOR_SRTP
    rx = srtp.SrtpSession(srtp.Crypto(1, SUITE80, VECTOR_KEY), srtp.Crypto(1, SUITE80, VECTOR_KEY))
    assert rx.unprotect(VECTOR_SRTP) == VECTOR_PLAIN
    short = srtp.SrtpSession(srtp.Crypto(1, SUITE32, VECTOR_KEY), srtp.Crypto(1, SUITE32, VECTOR_KEY))
    assert short.protect(VECTOR_PLAIN) == VECTOR_SRTP[:-6]  # same keystream, a 4-byte tag


@pytest.mark.parametrize("suite", [SUITE80, SUITE32])
def test_a_stream_round_trips_bit_exact_and_is_encrypted(suite):
    a, b = pair(suite)
    for i, pl in enumerate(fixture_payloads()):
        plain = packet(1000 + i, pl)
        wire = a.protect(plain)
        assert len(wire) == len(plain) + srtp.TAG_BYTES[suite]
        assert wire[:12] == plain[:12] and wire[12:172] != pl  # header in clear, payload encrypted
        assert b.unprotect(wire) == plain


def test_the_sequence_wrap_decrypts_bit_exact_in_order_and_reordered():
    a, b = pair()
    pls = fixture_payloads(40)
    wires = [(s, a.protect(packet(s, pl))) for s, pl in zip(range(65520, 65560), pls, strict=True)]
    order = wires[:10] + [wires[12], wires[10], wires[11]] + wires[13:]  # 65532..65534 swapped around
    for s, w in order:
        assert b.unprotect(w) == packet(s, pls[s - 65520])
    # past the wrap (ROC 1) a packet from before it is old, not a new index
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(wires[5][1])
    assert e.value.reason == "replayed"


def test_a_wrong_key_is_an_auth_failure_and_the_right_key_still_works():
    a, b = pair()
    stranger = srtp.SrtpSession(srtp.new_crypto(1, SUITE80), srtp.new_crypto(1, SUITE80))
    forged = stranger.protect(packet(7, b"\x55" * 160))
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(forged)
    assert e.value.reason == "auth_failed"
    genuine = packet(7, b"\x66" * 160)  # the same index: the forgery did not take it
    assert b.unprotect(a.protect(genuine)) == genuine


def test_a_replayed_packet_is_refused_and_an_old_one_too():
    a, b = pair()
    first = a.protect(packet(1, b"\x01" * 160))
    assert b.unprotect(first) == packet(1, b"\x01" * 160)
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(first)
    assert e.value.reason == "replayed"
    for s in range(2, 400):
        b.unprotect(a.protect(packet(s, b"\x02" * 160)))
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(first)  # far behind the 128-packet window
    assert e.value.reason == "replayed"


def test_truncated_damaged_and_oversized_packets_are_refused():
    a, b = pair()
    good = a.protect(packet(10, b"\x33" * 160))
    cases = {
        "empty": b"",
        "header only": good[:12],
        "no full tag": good[:12 + 9],
        "not version 2": bytes([0x40]) + good[1:],
        "too long": b"\x80" + b"\0" * srtp.MAX_PACKET,
    }
    for name, data in cases.items():
        with pytest.raises(srtp.SrtpDrop) as e:
            b.unprotect(data)
        assert e.value.reason == "malformed", name
    flipped = bytearray(a.protect(packet(11, b"\x33" * 160)))
    flipped[40] ^= 0x01  # one payload bit: the tag no longer verifies
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(bytes(flipped))
    assert e.value.reason == "auth_failed"
    cut = a.protect(packet(12, b"\x33" * 160))[:-3]  # the tag cut short
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(cut)
    assert e.value.reason == "auth_failed"
    assert b.unprotect(good) == packet(10, b"\x33" * 160)  # none of them cost the stream anything


def test_new_ssrcs_beyond_the_limit_are_refused_before_libsrtp():
    a, b = pair()
    for ssrc in range(srtp.MAX_SSRCS):
        assert b.unprotect(a.protect(packet(1, b"\0" * 160, ssrc=ssrc)))
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(a.protect(packet(1, b"\0" * 160, ssrc=999)))
    assert e.value.reason == "ssrc_limit"
    assert b.unprotect(a.protect(packet(2, b"\0" * 160, ssrc=0)))  # a known stream goes on
    forged = srtp.SrtpSession(srtp.new_crypto(1, SUITE80), srtp.new_crypto(1, SUITE80))
    c, d = pair()
    for ssrc in range(100):  # forged packets on new SSRCs do not take stream slots
        with pytest.raises(srtp.SrtpDrop):
            d.unprotect(forged.protect(packet(1, b"\0" * 160, ssrc=ssrc)))
    assert d.unprotect(c.protect(packet(1, b"\0" * 160, ssrc=5)))


def test_rekey_with_the_same_key_keeps_state_and_a_new_key_replaces_it():
    a, b = pair()
    p1 = a.protect(packet(1, b"\x01" * 160))
    b.unprotect(p1)
    same = srtp.Crypto(7, a.local.suite, a.local.key)  # a new tag, the same key
    assert b.rekey_inbound(same) is False and b.remote.tag == 7
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(p1)  # the replay window survived
    assert e.value.reason == "replayed"
    new = srtp.new_crypto(1, SUITE80)
    a2 = srtp.SrtpSession(new, b.local)
    assert b.rekey_inbound(new) is True
    with pytest.raises(srtp.SrtpDrop) as e:
        b.unprotect(a.protect(packet(2, b"\x02" * 160)))  # the old key no longer verifies
    assert e.value.reason == "auth_failed"
    assert b.unprotect(a2.protect(packet(1, b"\x03" * 160))) == packet(1, b"\x03" * 160)


def test_a_closed_session_refuses_both_ways():
    a, b = pair()
    wire = a.protect(packet(1, b"\0" * 160))
    b.close()
    assert b.closed
    with pytest.raises(srtp.SrtpDrop):
        b.unprotect(wire)
    with pytest.raises(srtp.SrtpDrop) as e:
        b.protect(packet(1, b"\0" * 160))
    assert e.value.reason == "protect_failed"


# -- the attribute ---------------------------------------------------------------------------------

KEY = base64.b64encode(bytes(range(30))).decode()


def test_an_attribute_round_trips_and_never_shows_its_key():
    c = srtp.parse_crypto(f"1 {SUITE80} inline:{KEY}")
    assert (c.tag, c.suite, c.key) == (1, SUITE80, bytes(range(30)))
    assert srtp.parse_crypto(c.value()) == c
    assert KEY not in repr(c) and str(bytes(range(30))) not in repr(c)
    mine = srtp.offer_cryptos()
    assert [(m.tag, m.suite) for m in mine] == [(1, SUITE80), (2, SUITE32)]
    assert len({m.key for m in mine}) == 2 and all(len(m.key) == 30 for m in mine)


@pytest.mark.parametrize("value", [
    f"1 {SUITE80} inline:{KEY}|2^31",
    f"1 {SUITE80} inline:{KEY}|2^48",
    f"1 {SUITE80} inline:{KEY}|2147483648",
    f"999999999 {SUITE32} inline:{KEY}",
    f"3 {SUITE80} inline:{KEY} WSH=64",
])
def test_lifetimes_of_2_31_and_more_and_a_window_hint_are_ignored(value):
    c = srtp.parse_crypto(value)
    assert c.key == bytes(range(30))


@pytest.mark.parametrize("value,why", [
    (f"0 {SUITE80} inline:{KEY}", "tag"),
    (f"1234567890 {SUITE80} inline:{KEY}", "tag"),
    (f"x {SUITE80} inline:{KEY}", "tag"),
    (f"1 AES_256_CM_HMAC_SHA1_80 inline:{KEY}", "suite"),
    (f"1 F8_128_HMAC_SHA1_80 inline:{KEY}", "suite"),
    (f"1 AEAD_AES_128_GCM inline:{KEY}", "suite"),
    (f"1 aes_cm_128_hmac_sha1_80 inline:{KEY}", "suite"),
    (f"1 {SUITE80} inline:{base64.b64encode(bytes(29)).decode()}", "bytes"),
    (f"1 {SUITE80} inline:{base64.b64encode(bytes(31)).decode()}", "bytes"),
    (f"1 {SUITE80} inline:{KEY[:-1]}!", "base64"),
    (f"1 {SUITE80} inline:{KEY[:20]}", "15 bytes"),
    (f"1 {SUITE80} inline:{KEY[:39]}", "base64"),
    (f"1 {SUITE80} uri:https://example.com/k", "inline"),
    (f"1 {SUITE80} inline:{KEY}|2^20", "lifetime"),
    (f"1 {SUITE80} inline:{KEY}|1000", "lifetime"),
    (f"1 {SUITE80} inline:{KEY}|2^x", "lifetime"),
    (f"1 {SUITE80} inline:{KEY}|1:4", "MKI"),
    (f"1 {SUITE80} inline:{KEY}|2^31|1:4", "MKI"),
    (f"1 {SUITE80} inline:{KEY}|2^31|1:4;inline:{KEY}|2^31|2:4", "key parameter"),
    (f"1 {SUITE80} inline:{KEY} UNENCRYPTED_SRTP", "UNENCRYPTED_SRTP"),
    (f"1 {SUITE80} inline:{KEY} UNAUTHENTICATED_SRTP", "UNAUTHENTICATED_SRTP"),
    (f"1 {SUITE80} inline:{KEY} KDR=1", "KDR"),
    (f"1 {SUITE80}", "needs"),
    ("", "needs"),
])
def test_attributes_we_cannot_honour_are_refused_with_the_reason(value, why):
    with pytest.raises(srtp.SrtpError) as e:
        srtp.parse_crypto(value)
    assert why.lower() in str(e.value).lower()
    assert KEY not in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_the_parser_raises_only_srtp_error(text):
    try:
        c = srtp.parse_crypto(text)
    except srtp.SrtpError:
        return
    assert c.suite in srtp.SUITES and len(c.key) == 30 and 0 < c.tag <= 999_999_999


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_unprotect_raises_only_srtp_drop_whatever_the_bytes(data):
    _, b = pair()
    try:
        b.unprotect(data)
    except srtp.SrtpDrop as e:
        assert e.reason in srtp.DROP_REASONS
    else:
        raise AssertionError("random bytes authenticated")
