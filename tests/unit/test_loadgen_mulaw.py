"""bench/loadgen/mulaw.py: G.711 mu-law tables (load generator only)."""

from __future__ import annotations

import numpy as np

from bench.loadgen import mulaw


def test_reference_values() -> None:
    assert mulaw.encode(np.array([0], np.int16)) == b"\xff"
    assert mulaw.DECODE[0x00] == -32124 and mulaw.DECODE[0x80] == 32124
    assert mulaw.DECODE[0xFF] == 0 and mulaw.DECODE[0x7F] == 0
    assert mulaw.encode(np.array([32767, -32768], np.int16)) == b"\x80\x00"


def test_every_code_round_trips_except_negative_zero() -> None:
    codes = bytes(range(256))
    back = mulaw.encode(mulaw.decode(codes))
    assert [i for i in range(256) if back[i] != i] == [0x7F]


def test_decode_of_encode_is_within_one_step() -> None:
    x = np.arange(-32768, 32768, 7, dtype=np.int16)
    y = mulaw.decode(mulaw.encode(x)).astype(np.int32)
    err = np.abs(y - x.astype(np.int32))
    step = np.maximum(8, np.abs(x.astype(np.int32)) // 16)  # segment step ~ |x|/16
    assert np.all(err <= step + 132)


def test_loud_fraction_tells_speech_from_silence() -> None:
    assert mulaw.loud_fraction(b"\xff" * 160) == 0.0
    assert mulaw.loud_fraction(b"") == 0.0
    loud = mulaw.encode(np.full(160, 4000, np.int16))
    assert mulaw.loud_fraction(loud) == 1.0
