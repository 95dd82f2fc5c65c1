"""brisvox/wire/g711.py: the tables vs a scalar transcription of the ITU-T G.191 reference
routines, on every one of the 65,536 linear inputs and 256 codes, plus sox as an
independent decoder; the bytes helpers and the mu-law loudness test."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from brisvox.wire import g711


def _s16(v: int) -> int:
    v &= 0xFFFF
    return v - 0x10000 if v & 0x8000 else v


def ref_ulaw_compress(x: int) -> int:
    absno = ((~x) >> 2) + 33 if x < 0 else (x >> 2) + 33
    if absno > 0x1FFF:
        absno = 0x1FFF
    i = absno >> 6
    segno = 1
    while i != 0:
        segno += 1
        i >>= 1
    high = 0x0008 - segno
    low = 0x000F - ((absno >> segno) & 0x000F)
    out = (high << 4) | low
    if x >= 0:
        out |= 0x0080
    return out & 0xFF


def ref_ulaw_expand(b: int) -> int:
    sign = -1 if b < 0x80 else 1
    mantissa = ~b
    exponent = (mantissa >> 4) & 0x7
    segment = exponent + 1
    mantissa &= 0xF
    step = 4 << segment
    return sign * ((0x80 << exponent) + step * mantissa + step // 2 - 4 * 33)


def ref_alaw_compress(x: int) -> int:
    ix = (~x) >> 4 if x < 0 else x >> 4
    if ix > 15:
        iexp = 1
        while ix > 16 + 15:
            ix >>= 1
            iexp += 1
        ix -= 16
        ix += iexp << 4
    if x >= 0:
        ix |= 0x80
    return (ix ^ 0x55) & 0xFF


def ref_alaw_expand(b: int) -> int:
    ix = (b ^ 0x55) & 0x7F
    iexp = ix >> 4
    mant = ix & 0xF
    if iexp > 0:
        mant += 16
    mant = (mant << 4) + 8
    if iexp > 1:
        mant <<= iexp - 1
    return mant if b > 127 else -mant


ALL = np.arange(-32768, 32768, dtype=np.int32)


def test_ulaw_encode_all_65536():
    ref = np.array([ref_ulaw_compress(int(x)) for x in ALL], dtype=np.uint8)
    assert np.array_equal(g711.PCMU.encode(ALL.astype(np.int16)), ref)


def test_alaw_encode_all_65536():
    ref = np.array([ref_alaw_compress(int(x)) for x in ALL], dtype=np.uint8)
    assert np.array_equal(g711.PCMA.encode(ALL.astype(np.int16)), ref)


def test_decode_all_256():
    codes = np.arange(256, dtype=np.uint8)
    assert g711.PCMU.decode(codes).tolist() == [ref_ulaw_expand(b) for b in range(256)]
    assert g711.PCMA.decode(codes).tolist() == [ref_alaw_expand(b) for b in range(256)]


def test_known_values_and_round_trip():
    assert g711.ULAW_SILENCE == 0xFF and g711.ALAW_SILENCE == 0xD5
    assert g711.ULAW_DECODE[0] == -32124 and g711.ULAW_DECODE[0x80] == 32124
    assert g711.ALAW_DECODE[0x55] == -8 and g711.ALAW_DECODE[0xD5] == 8
    assert g711.ALAW_DECODE[0xAA] == 32256
    # decode -> encode is the identity on every code (except mu-law's two zeros)
    for law in (g711.PCMU, g711.PCMA):
        codes = np.arange(256, dtype=np.uint8)
        again = law.encode(law.decode(codes))
        same = again == codes
        if law is g711.PCMU:
            assert not same[0x7F] and again[0x7F] == 0xFF  # -0 encodes as +0
            same[0x7F] = True
        assert same.all()


def test_out_buffers_do_not_allocate_new_results():
    pcm = np.array([0, 1000, -1000, 32767, -32768] * 32, dtype=np.int16)
    enc = np.empty(len(pcm), dtype=np.uint8)
    dec = np.empty(len(pcm), dtype=np.int16)
    r = g711.PCMU.encode(pcm, out=enc)
    assert r is enc
    r2 = g711.PCMU.decode(enc, out=dec)
    assert r2 is dec
    assert np.array_equal(dec, g711.PCMU.decode(enc.tobytes()))


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox not installed")
@pytest.mark.parametrize("enc", ["mu-law", "a-law"])
def test_decode_matches_sox(enc):
    codes = np.arange(256, dtype=np.uint8).tobytes()
    out = subprocess.run(
        ["sox", "-t", "raw", "-r", "8000", "-c", "1", "-e", enc, "-b", "8", "-", "-t", "raw", "-e", "signed", "-b", "16", "-L", "-"],
        input=codes, capture_output=True, check=True,
    ).stdout
    ours = (g711.PCMU if enc == "mu-law" else g711.PCMA).decode(codes)
    assert np.array_equal(np.frombuffer(out, dtype="<i2"), ours)


def test_ulaw_helpers_and_loudness_tells_speech_from_silence() -> None:
    assert g711.ulaw_encode(np.array([0], np.int16)) == b"\xff"
    assert g711.ulaw_encode([0, 0]) == b"\xff\xff"  # any int16-convertible samples
    assert g711.ULAW_SILENCE == 0xFF and g711.ALAW_SILENCE == 0xD5
    codes = bytes(range(256))
    back = g711.ulaw_encode(g711.ulaw_decode(codes))
    assert [i for i in range(256) if back[i] != i] == [0x7F]  # negative zero encodes as 0xFF
    assert g711.alaw_decode(g711.alaw_encode(np.array([0, 4000], np.int16))).tolist() == [8, 4032]
    assert g711.ulaw_loud_fraction(b"\xff" * 160) == 0.0
    assert g711.ulaw_loud_fraction(b"") == 0.0
    assert g711.ulaw_loud_fraction(g711.ulaw_encode(np.full(160, 4000, np.int16))) == 1.0
    assert g711.ulaw_loud_fraction(g711.ulaw_encode(np.array([4000, 0] * 80, np.int16))) == 0.5
