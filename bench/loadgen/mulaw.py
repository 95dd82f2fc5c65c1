"""G.711 mu-law tables for the load generator only (numpy; no ``audioop``).

Owns: PCM16 -> mu-law encoding of the caller's speech, mu-law -> PCM16
decoding, and the per-byte "loud" table the client uses to tell bot speech
from silence without decoding a frame.

Why here: ``brisvox/gateway/g711.py`` (the product's codec) did not exist when
the load generator was written; the load generator must also stay usable
against servers other than brisvox. Swap to the gateway's module once it is
verified bit-exact (issue 5) if sharing is wanted; the algorithm is the same
ITU-T G.711 segment coding (bias 0x84, clip 32635, inverted bits).

Invariants: ``encode(decode(b)) == b`` for every byte except 0x7F (negative
zero, which encodes back as 0xFF); ``decode(encode(x))`` is within one
quantization step of ``x``.
"""

from __future__ import annotations

import numpy as np

BIAS = 0x84
CLIP = 32635
SILENCE_BYTE = 0xFF  # mu-law of 0


def _build_encode_table() -> np.ndarray:
    x = np.arange(-32768, 32768, dtype=np.int32)
    sign = np.where(x < 0, 0x80, 0x00)
    mag = np.minimum(np.abs(x), CLIP) + BIAS
    v = mag >> 7
    exponent = np.zeros_like(mag)
    for i in range(1, 8):
        exponent += v >= (1 << i)
    mantissa = (mag >> (exponent + 3)) & 0x0F
    code = ~(sign | (exponent << 4) | mantissa) & 0xFF
    # index by the int16 value's bit pattern viewed as uint16
    table = np.empty(65536, dtype=np.uint8)
    table[x.astype(np.int16).view(np.uint16)] = code.astype(np.uint8)
    return table


def _build_decode_table() -> np.ndarray:
    b = ~np.arange(256, dtype=np.int32) & 0xFF
    sign = b & 0x80
    exponent = (b >> 4) & 0x07
    mantissa = b & 0x0F
    mag = (((mantissa << 3) + BIAS) << exponent) - BIAS
    return np.where(sign != 0, -mag, mag).astype(np.int16)


ENCODE = _build_encode_table()
DECODE = _build_decode_table()
# A byte is "loud" when it decodes to more than about -40 dBFS.
LOUD = bytes(1 if abs(int(v)) > 330 else 0 for v in DECODE)


def encode(pcm: np.ndarray) -> bytes:
    """int16 samples -> mu-law bytes."""
    return ENCODE[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def decode(data: bytes) -> np.ndarray:
    """mu-law bytes -> int16 samples."""
    return DECODE[np.frombuffer(data, dtype=np.uint8)]


def loud_fraction(data: bytes) -> float:
    """Fraction of samples louder than about -40 dBFS (C-speed, no decode)."""
    if not data:
        return 0.0
    return data.translate(LOUD).count(1) / len(data)
