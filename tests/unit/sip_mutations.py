"""Hypothesis strategies shared by the SIP/SDP/RTP parser property tests: arbitrary bytes,
and mutations of a valid message (flip, insert, delete bytes; a header value replaced by
random text; ASCII digits replaced by Unicode digits such as '²' or Arabic-Indic ones)."""

from __future__ import annotations

from hypothesis import strategies as st

UNICODE_DIGITS = "\u00b2\u00b3\u00b9\u0660\u0661\u0669\u06f1\u0966\u2460\uff11\U0001d7ce"
NASTY = ["\r", "\n", "\r\n", "\x00", "\t", " ", ":", ";", ",", "<", ">", '"', "\\", "/", "=", "@",
         "[", "]", "-1", "99999", "4294967296", "0", "", "\u2028", "\x85"] + list(UNICODE_DIGITS)

text = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=8)), max_size=8).map("".join)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes, max_ops: int = 4) -> bytes:
    """``valid`` with 1..max_ops random edits."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "value", "digit", "truncate"]))
        n = len(data)
        if op == "flip" and n:
            i = draw(st.integers(0, n - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            i = draw(st.integers(0, n))
            data[i:i] = draw(st.one_of(st.binary(max_size=8), text.map(lambda t: t.encode("utf-8"))))
        elif op == "delete" and n:
            i = draw(st.integers(0, n - 1))
            del data[i:i + draw(st.integers(1, 16))]
        elif op == "value":
            lines = bytes(data).split(b"\r\n")
            i = draw(st.integers(0, len(lines) - 1))
            key, sep, _ = lines[i].partition(b":" if b":" in lines[i] else b"=")
            lines[i] = key + (sep or b":") + draw(text).encode("utf-8")
            data = bytearray(b"\r\n".join(lines))
        elif op == "digit":
            s = bytes(data).decode("utf-8", "replace")
            idx = [j for j, c in enumerate(s) if c in "0123456789"]
            if idx:
                j = draw(st.sampled_from(idx))
                s = s[:j] + draw(st.sampled_from(UNICODE_DIGITS)) + s[j + 1:]
                data = bytearray(s.encode("utf-8"))
        elif op == "truncate" and n:
            data = data[: draw(st.integers(0, n - 1))]
    return bytes(data)
