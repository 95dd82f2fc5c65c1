"""RFC 6455 framing for the hot path: classify received frames, build frame headers.

Owns the byte layout of WebSocket frames for code that handles the common
case itself and leaves every other case to the ``websockets`` library's
Sans-I/O protocol: the gateway's WebSocket server (client frames, masked) and
the load generator's client (server frames, unmasked). At 50 messages a
second each way per call, the library's generator-based parser costs about
3.5 us per frame; :func:`scan` plus one ``apply_mask`` costs about 0.4 us.
The masking itself is the library's C ``websockets.frames.apply_mask``, which
the callers import (this package imports only the standard library and
numpy); :func:`header` only appends the key.

:func:`scan` looks at the frame starting at ``buf[pos]`` and says what it is:

* ``DATA``: a complete, unfragmented text or binary frame (FIN set, no
  reserved bits, the expected masking, a 7- or 16-bit length within
  ``max_size``): the caller delivers its payload itself;
* ``CONTROL``: a complete close, ping or pong frame (FIN set, no reserved
  bits, the expected masking, at most 125 bytes): the caller hands exactly
  these bytes to the library, which answers it (pong, close echo);
* ``FRAGMENT``: a complete frame of a fragmented message (RFC 6455 5.4): a
  text or binary frame without FIN (``buf[pos] & 0x0F`` is its opcode) or a
  continuation frame (opcode 0, FIN in ``buf[pos] & 0x80``), no reserved
  bits, the expected masking, within ``max_size``: the caller reassembles
  it (and bounds the whole message by ``max_size`` itself);
* ``MORE``: not complete yet (wait for more bytes);
* ``OTHER``: anything else (reserved bits, a frame larger than ``max_size``,
  wrong masking, an unknown opcode, a control frame over 125 bytes or
  without FIN): the caller hands the rest of the stream to the library,
  which fails the connection with its own code (1002, 1009, ...).

A 7-, 16- or 64-bit length is read (a 64-bit one larger than ``max_size`` is
``OTHER``, so nothing larger is ever waited for).

:func:`close_reason` bounds the reason of a close frame: RFC 6455 allows
at most 123 bytes of UTF-8 after the 2-byte code (a control frame carries at
most 125), and the library raises on a longer one, so every close any side
sends goes through it.

Invariants: ``scan`` never reads beyond ``end`` and reports ``DATA``,
``CONTROL`` or ``FRAGMENT`` only for a frame whose every byte is in ``buf[pos:end]``; a caller
that gives the library only whole frames (``CONTROL``) or the whole rest of
the stream (``OTHER``) keeps the library's parser at a frame boundary, so the
two never disagree about where a frame starts. ``close_reason`` returns a
string that encodes to at most ``MAX_CLOSE_REASON`` bytes of valid UTF-8 (cut
at a character boundary; a lone surrogate becomes ``?``) and never raises.
"""

from __future__ import annotations

import struct

__all__ = ["BINARY", "CONTROL", "DATA", "FRAGMENT", "MAX_CLOSE_REASON", "MORE", "OTHER", "TEXT",
           "close_reason", "header", "scan"]

DATA = 0
CONTROL = 1
MORE = 2
OTHER = 3
FRAGMENT = 4

TEXT = 0x81  # FIN + opcode 1
BINARY = 0x82  # FIN + opcode 2
_CONTROL = (0x88, 0x89, 0x8A)  # FIN + close, ping, pong
_FRAGMENT = (0x01, 0x02, 0x00, 0x80)  # text, binary without FIN; continuation without, with FIN

_MORE = (MORE, 0, 0)
_OTHER = (OTHER, 0, 0)
_H16 = struct.Struct("!BBH")
_H64 = struct.Struct("!BBQ")
_U64 = struct.Struct("!Q")
MAX_CLOSE_REASON = 123  # bytes of UTF-8 in a close frame after its 2-byte code


def scan(buf: bytes | bytearray | memoryview, pos: int, end: int, masked: bool,
         max_size: int) -> tuple[int, int, int]:
    """``(kind, header_len, payload_len)`` of the frame at ``buf[pos:end]`` (see module doc).

    For a masked frame the 4 mask bytes are the last 4 bytes of the header."""
    left = end - pos
    if left < 2:
        return _MORE
    b0 = buf[pos]
    b1 = buf[pos + 1]
    if masked:
        if not b1 & 0x80:
            return _OTHER
        ln = b1 & 0x7F
        h = 6
    else:
        if b1 & 0x80:
            return _OTHER
        ln = b1
        h = 2
    if ln == 126:
        if left < 4:
            return _MORE
        ln = (buf[pos + 2] << 8) | buf[pos + 3]
        h += 2
    elif ln == 127:
        if left < 10:
            return _MORE
        ln = _U64.unpack_from(buf, pos + 2)[0]
        h += 8
    if b0 == TEXT or b0 == BINARY:
        if ln > max_size:
            return _OTHER
        kind = DATA
    elif b0 in _CONTROL and ln <= 125:
        kind = CONTROL
    elif b0 in _FRAGMENT and ln <= max_size:
        kind = FRAGMENT
    else:
        return _OTHER
    if left < h + ln:
        return _MORE
    return kind, h, ln


def header(length: int, first: int = TEXT, mask: bytes | None = None) -> bytes:
    """The header of a frame with ``length`` payload bytes (``first``: FIN + opcode);
    with ``mask`` (4 bytes) the mask bit is set and the key appended."""
    m = 0x80 if mask is not None else 0
    if length < 126:
        h = bytes((first, m | length))
    elif length < 65536:
        h = _H16.pack(first, m | 126, length)
    else:
        h = _H64.pack(first, m | 127, length)
    return h + mask if mask is not None else h


def close_reason(reason: str, limit: int = MAX_CLOSE_REASON) -> str:
    """``reason`` cut to at most ``limit`` bytes of UTF-8, at a character boundary."""
    raw = reason.encode("utf-8", "replace")  # a lone surrogate (not encodable) becomes "?"
    if len(raw) <= limit:
        return raw.decode("utf-8")
    # a cut inside a multi-byte character leaves an incomplete tail: "ignore" drops exactly it
    return raw[:max(0, limit)].decode("utf-8", "ignore")
