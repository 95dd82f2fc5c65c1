"""G.711 mu-law and A-law codecs as precomputed numpy lookup tables.

Owns the conversion between PCM16 and G.711 bytes wherever brisvox speaks
G.711 (the gateway's SIP/RTP PCMU/PCMA and Twilio media, the ``brisvox call``
client, the load generator, the tests), and the cheap loudness test of a
mu-law payload. No ``audioop`` (removed in 3.13).

Invariants:

* The tables reproduce the ITU-T G.191 reference routines (``ulaw_compress``,
  ``ulaw_expand``, ``alaw_compress``, ``alaw_expand``) bit for bit on all
  65,536 linear inputs and all 256 codes (``tests/unit/test_wire_g711.py``
  checks them against a scalar transcription of those routines).
* Encoding is one fancy-index into a 65,536-entry uint8 table (the int16
  sample reinterpreted as uint16 is the index); decoding one index into a
  256-entry int16 table. Both accept an ``out=`` buffer so the hot path can
  run without allocating.
* :func:`ulaw_loud_fraction` decodes nothing: one ``bytes.translate`` through
  a 256-entry table (C speed), as the load generator reads every bot frame.
"""

from __future__ import annotations

import numpy as np


def _ulaw_encode_table() -> np.ndarray:
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)
    # 14-bit magnitude with the 1's complement for negatives, plus the bias 33
    absno = np.where(x < 0, (~x) >> 2, x >> 2) + 33
    absno = np.minimum(absno, 0x1FFF)
    # segment: 1 + number of significant bits of (absno >> 6)
    i = absno >> 6
    segno = np.ones_like(absno)
    for _ in range(8):
        nz = i != 0
        segno += nz
        i = i >> 1
    high = 8 - segno
    low = 15 - ((absno >> segno) & 0x0F)
    code = (high << 4) | low
    code = np.where(x >= 0, code | 0x80, code)
    return code.astype(np.uint8)


def _ulaw_decode_table() -> np.ndarray:
    b = np.arange(256, dtype=np.int32)
    sign = np.where(b < 0x80, -1, 1)
    mant = ~b
    exponent = (mant >> 4) & 0x07
    segment = exponent + 1
    mant = mant & 0x0F
    step = 4 << segment
    val = sign * ((0x80 << exponent) + step * mant + step // 2 - 4 * 33)
    return val.astype(np.int16)


def _alaw_encode_table() -> np.ndarray:
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)
    ix = np.where(x < 0, (~x) >> 4, x >> 4)  # 0 <= ix < 2048
    out = ix.copy()
    big = ix > 15
    # exponent = 1 + number of halvings needed to bring ix to <= 31
    iexp = np.ones_like(ix)
    v = ix.copy()
    for _ in range(8):
        shift = v > 31
        v = np.where(shift, v >> 1, v)
        iexp += shift
    out = np.where(big, (v - 16) + (iexp << 4), ix)
    out = np.where(x >= 0, out | 0x80, out)
    return (out ^ 0x55).astype(np.uint8)


def _alaw_decode_table() -> np.ndarray:
    b = np.arange(256, dtype=np.int32)
    ix = (b ^ 0x55) & 0x7F
    iexp = ix >> 4
    mant = ix & 0x0F
    mant = np.where(iexp > 0, mant + 16, mant)
    mant = (mant << 4) + 8
    mant = np.where(iexp > 1, mant << np.maximum(iexp - 1, 0), mant)
    val = np.where(b > 127, mant, -mant)
    return val.astype(np.int16)


ULAW_ENCODE: np.ndarray = _ulaw_encode_table()
ULAW_DECODE: np.ndarray = _ulaw_decode_table()
ALAW_ENCODE: np.ndarray = _alaw_encode_table()
ALAW_DECODE: np.ndarray = _alaw_decode_table()
for _t in (ULAW_ENCODE, ULAW_DECODE, ALAW_ENCODE, ALAW_DECODE):
    _t.flags.writeable = False

ULAW_SILENCE = int(ULAW_ENCODE[0])  # 0xFF
ALAW_SILENCE = int(ALAW_ENCODE[0])  # 0xD5


class G711:
    """One law's tables plus its RTP payload type and silence byte."""

    __slots__ = ("name", "payload_type", "encode_table", "decode_table", "silence")

    def __init__(self, name: str, payload_type: int, enc: np.ndarray, dec: np.ndarray) -> None:
        self.name = name
        self.payload_type = payload_type
        self.encode_table = enc
        self.decode_table = dec
        self.silence = int(enc[0])

    def encode(self, pcm: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """int16 samples -> uint8 codes (``out`` must be uint8 of the same length)."""
        idx = pcm.view(np.uint16)
        if out is None:
            return self.encode_table.take(idx)
        return self.encode_table.take(idx, out=out)  # the method: np.take's wrapper costs 0.5 us

    def decode(self, data: bytes | bytearray | memoryview | np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """G.711 bytes -> int16 samples (``out`` must be int16 of the same length)."""
        codes = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        if out is None:
            return self.decode_table.take(codes)
        return self.decode_table.take(codes, out=out)


PCMU = G711("PCMU", 0, ULAW_ENCODE, ULAW_DECODE)
PCMA = G711("PCMA", 8, ALAW_ENCODE, ALAW_DECODE)
CODECS: dict[str, G711] = {"PCMU": PCMU, "PCMA": PCMA}
BY_PT: dict[int, G711] = {0: PCMU, 8: PCMA}


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples (any int16-convertible array) -> mu-law bytes."""
    return PCMU.encode(np.ascontiguousarray(pcm, dtype=np.int16)).tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    return PCMU.decode(data)


def alaw_encode(pcm: np.ndarray) -> bytes:
    return PCMA.encode(pcm).tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    return PCMA.decode(data)


# A mu-law byte is "loud" when it decodes to more than about -40 dBFS.
ULAW_LOUD = bytes(1 if abs(int(v)) > 330 else 0 for v in ULAW_DECODE)


def ulaw_loud_fraction(data: bytes) -> float:
    """Fraction of mu-law samples louder than about -40 dBFS (C-speed, no decode)."""
    if not data:
        return 0.0
    return data.translate(ULAW_LOUD).count(1) / len(data)
