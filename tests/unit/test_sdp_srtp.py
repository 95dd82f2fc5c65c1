"""SDP offer/answer with SRTP (brisvox/wire/sdp.py with brisvox/wire/srtp.py): every rule of
``[sip] srtp`` and of keys over signalling that is not TLS, the tag and suite chosen, the answer
(its profile, our own key with the chosen tag, never the offerer's) and the answers to our offers.
"""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.wire import sdp, srtp

S80, S32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"
K1 = base64.b64encode(bytes(range(30))).decode()
K2 = base64.b64encode(bytes(range(100, 130))).decode()
OFF, OPT, REQ = sdp.SrtpPolicy("off"), sdp.SrtpPolicy("optional"), sdp.SrtpPolicy("required")


def offer(proto: str = "RTP/SAVP", crypto: tuple[str, ...] = (f"1 {S80} inline:{K1}",), extra_m: str = "") -> bytes:
    lines = ["v=0", "o=- 1 1 IN IP4 10.0.0.1", "s=-", "c=IN IP4 10.0.0.1", "t=0 0"]
    if extra_m:
        lines += extra_m.split("\n")
    lines += [f"m=audio 4000 {proto} 0 101", "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000",
              "a=sendrecv"] + [f"a=crypto:{c}" for c in crypto]
    return ("\r\n".join(lines) + "\r\n").encode()


def neg(body: bytes, policy: sdp.SrtpPolicy, tls: bool = True, offered=None) -> sdp.Negotiated:
    return sdp.negotiate(sdp.parse(body), policy=policy, secure_signalling=tls, offered=offered)


def refused(body: bytes, policy: sdp.SrtpPolicy, tls: bool = True, offered=None) -> str:
    with pytest.raises(sdp.SrtpRefused) as e:
        neg(body, policy, tls, offered)
    assert K1 not in str(e.value) and K2 not in str(e.value)  # a Warning header never carries a key
    return e.value.reason


def answer(body: bytes, n: sdp.Negotiated, mine: tuple[srtp.Crypto, ...]) -> sdp.SessionDescription:
    return sdp.parse(sdp.build(host="127.0.0.1", port=20000, session_id=1, version=1, neg=n,
                               offer=sdp.parse(body), crypto=mine))


def test_the_first_usable_line_of_the_offer_is_chosen_and_answered_with_our_own_key():
    body = offer(crypto=(f"1 AES_256_CM_HMAC_SHA1_80 inline:{K1}{K1}", f"2 {S32} inline:{K1}|2^31",
                         f"3 {S80} inline:{K2}"))
    n = neg(body, OPT)
    assert n.secure and n.crypto is not None
    assert (n.crypto.tag, n.crypto.suite, n.crypto.key) == (2, S32, bytes(range(30))) and n.proto == "RTP/SAVP"
    mine = srtp.new_crypto(n.crypto.tag, n.crypto.suite)
    ans = answer(body, n, (mine,))
    [m] = ans.media
    assert m.proto == "RTP/SAVP" and len(m.crypto) == 1
    ours = srtp.parse_crypto(m.crypto[0])
    assert (ours.tag, ours.suite) == (2, S32) and ours.key == mine.key
    assert ours.key not in (bytes(range(30)), bytes(range(100, 130)))  # never the offerer's key
    swapped = offer(crypto=(f"5 {S80} inline:{K2}", f"6 {S32} inline:{K1}"))
    assert neg(swapped, OPT).crypto.tag == 5  # the offerer's order, not ours


def test_srtp_off_refuses_savp_and_ignores_crypto_on_avp():
    assert refused(offer("RTP/SAVP"), OFF) == "srtp_off"
    assert refused(offer("RTP/SAVPF"), OFF) == "srtp_off"
    n = neg(offer("RTP/AVP"), OFF)
    assert not n.secure and n.proto == "RTP/AVP"
    ans = answer(offer("RTP/AVP"), n, ())
    assert ans.media[0].crypto == [] and ans.media[0].proto == "RTP/AVP"


def test_srtp_optional_takes_srtp_best_effort_srtp_and_plain():
    assert neg(offer("RTP/SAVP"), OPT).secure
    best_effort = neg(offer("RTP/AVP"), OPT)  # baresip's mediaenc srtp: RTP/AVP with a=crypto
    assert best_effort.secure and best_effort.proto == "RTP/AVP"
    ans = answer(offer("RTP/AVP"), best_effort, (srtp.new_crypto(1, S80),))
    assert ans.media[0].proto == "RTP/AVP" and len(ans.media[0].crypto) == 1
    assert not neg(offer("RTP/AVP", crypto=()), OPT).secure
    assert not neg(offer("RTP/AVP", crypto=(f"1 {S80} inline:{K1}|1:4",)), OPT).secure  # no usable line: plain
    assert refused(offer("RTP/SAVP", crypto=()), OPT) == "srtp_required"
    assert refused(offer("RTP/SAVP", crypto=(f"1 {S80} inline:{K1} UNENCRYPTED_SRTP",)), OPT) == "srtp_no_suite"


def test_srtp_required_takes_only_srtp():
    assert refused(offer("RTP/AVP", crypto=()), REQ) == "srtp_required"
    assert refused(offer("RTP/AVP", crypto=(f"1 F8_128_HMAC_SHA1_80 inline:{K1}",)), REQ) == "srtp_no_suite"
    assert neg(offer("RTP/AVP"), REQ).secure
    assert neg(offer("RTP/SAVPF"), REQ).proto == "RTP/SAVPF"


def test_keys_over_clear_signalling_are_refused_unless_the_override_is_set():
    assert refused(offer("RTP/SAVP"), OPT, tls=False) == "srtp_insecure_signalling"
    assert refused(offer("RTP/SAVP"), REQ, tls=False) == "srtp_insecure_signalling"
    assert refused(offer("RTP/AVP"), REQ, tls=False) == "srtp_insecure_signalling"
    plain = neg(offer("RTP/AVP"), OPT, tls=False)  # best effort: taken plain, its keys never used
    assert not plain.secure
    override = sdp.SrtpPolicy("required", allow_insecure_signalling=True)
    assert neg(offer("RTP/SAVP"), override, tls=False).secure
    assert sdp.SrtpPolicy("optional").keys_allowed(True) and not sdp.SrtpPolicy("optional").keys_allowed(False)


def test_a_refused_srtp_stream_leaves_room_for_a_usable_one():
    second = "m=audio 5000 RTP/SAVP 0\r\na=rtpmap:0 PCMU/8000"
    body = offer("RTP/AVP", crypto=(), extra_m=second)  # an SRTP stream first, a plain one after it
    n = neg(body, OFF)
    assert n.audio_index == 1 and not n.secure
    ans = answer(body, n, ())
    assert ans.media[0].port == 0 and ans.media[0].proto == "RTP/SAVP" and ans.media[1].port == 20000


def test_answers_to_our_offer_must_name_a_line_we_offered():
    mine = srtp.offer_cryptos()  # tag 1: _80, tag 2: _32
    assert neg(offer("RTP/AVP", crypto=(f"2 {S32} inline:{K2}",)), OPT, offered=mine).crypto.tag == 2
    assert refused(offer("RTP/AVP", crypto=(f"3 {S80} inline:{K2}",)), OPT, offered=mine) == "srtp_bad_answer"
    assert refused(offer("RTP/AVP", crypto=(f"1 {S32} inline:{K2}",)), OPT, offered=mine) == "srtp_bad_answer"
    assert not neg(offer("RTP/AVP", crypto=()), OPT, offered=mine).secure  # a plain answer to "optional"
    assert refused(offer("RTP/AVP", crypto=()), REQ, offered=mine) == "srtp_required"
    assert refused(offer("RTP/SAVP", crypto=()), OPT, offered=mine) == "srtp_required"
    # we offered no crypto: an RTP/SAVP answer is wrong, crypto on RTP/AVP is ignored
    assert refused(offer("RTP/SAVP"), OPT, offered=()) == "srtp_bad_answer"
    assert not neg(offer("RTP/AVP"), OPT, offered=()).secure


def test_our_offers_carry_a_line_per_suite_in_the_profile_asked():
    mine = srtp.offer_cryptos()
    for proto in ("RTP/SAVP", "RTP/AVP"):
        o = sdp.parse(sdp.build(host="127.0.0.1", port=20000, session_id=1, version=1, neg=None,
                                crypto=mine, proto=proto))
        [m] = o.media
        assert m.proto == proto
        assert [srtp.parse_crypto(c) for c in m.crypto] == list(mine)
    plain = sdp.parse(sdp.build(host="127.0.0.1", port=20000, session_id=1, version=1, neg=None))
    assert plain.media[0].proto == "RTP/AVP" and plain.media[0].crypto == []


def test_an_srtp_answer_without_our_line_is_never_built():
    body = offer("RTP/SAVP")
    n = neg(body, OPT)
    with pytest.raises(ValueError):
        sdp.build(host="127.0.0.1", port=20000, session_id=1, version=1, neg=n, offer=sdp.parse(body))


def test_crypto_lines_beyond_the_bound_are_ignored():
    junk = tuple(f"{i} AES_256_CM_HMAC_SHA1_80 inline:{K1}" for i in range(1, 40)) + (f"99 {S80} inline:{K1}",)
    m = sdp.parse(offer(crypto=junk)).media[0]
    assert len(m.crypto) == sdp.MAX_CRYPTO
    assert refused(offer(crypto=junk), OPT) == "srtp_no_suite"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
                                max_size=80), max_size=4),
       st.sampled_from(["RTP/AVP", "RTP/SAVP", "RTP/SAVPF", "RTP/AVPF"]),
       st.sampled_from([OFF, OPT, REQ]), st.booleans())
def test_hostile_crypto_lines_raise_only_sdp_error(lines, proto, policy, tls):
    try:
        n = neg(offer(proto, crypto=tuple(lines)), policy, tls)
    except sdp.SdpError:
        return
    if n.secure:
        assert policy.mode != "off" and tls
    elif policy.mode == "required":
        raise AssertionError("a plain stream under srtp = required")
