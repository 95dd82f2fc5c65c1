"""RTP packets (RFC 3550): the header codec and the send-side rules of one stream.

Owns the RTP header format (parse and build, CSRC list, header extension and
padding skipped), sequence and timestamp arithmetic modulo 2^16 and 2^32, and
:class:`RtpSender`, the sequence/timestamp/marker bookkeeping of a sent
stream, which both ends use (the gateway's SIP legs and the ``brisvox call``
SIP client). The receive side's jitter buffer is the gateway's
(:mod:`brisvox.gateway.sip.jitter`).

Invariants (codec): :func:`parse` raises only :class:`RtpError`, whatever the
bytes; a payload over ``MAX_PAYLOAD`` is refused; :func:`build` masks the
sequence number and timestamp to their field widths.

Invariants (send, :class:`RtpSender`): the sequence number increments by one
per packet, the timestamp advances by the samples of each packet and by the
elapsed time across a pause, and the marker bit is set on the first packet of
each talkspurt (RFC 3551 4.1).
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass

HEADER = struct.Struct("!BBHII")
RTP_VERSION = 2
MAX_PAYLOAD = 8000  # 1 s of G.711; anything bigger is refused


class RtpError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class RtpPacket:
    payload_type: int
    marker: bool
    seq: int
    timestamp: int
    ssrc: int
    payload: bytes


def parse(data: bytes) -> RtpPacket:
    n = len(data)
    if n < 12:
        raise RtpError("short packet")
    b0, b1, seq, ts, ssrc = HEADER.unpack_from(data)
    if b0 >> 6 != RTP_VERSION:
        raise RtpError("not RTP version 2")
    off = 12 + 4 * (b0 & 0x0F)
    if b0 & 0x10:  # header extension
        if n < off + 4:
            raise RtpError("truncated extension")
        ext_len = struct.unpack_from("!H", data, off + 2)[0]
        off += 4 + 4 * ext_len
    end = n
    if b0 & 0x20:  # padding
        pad = data[-1]
        if pad == 0 or pad > n - off:
            raise RtpError("bad padding")
        end -= pad
    if off > end:
        raise RtpError("truncated packet")
    if end - off > MAX_PAYLOAD:
        raise RtpError("payload too large")
    return RtpPacket(b1 & 0x7F, bool(b1 & 0x80), seq, ts, ssrc, bytes(data[off:end]))


def build(payload_type: int, marker: bool, seq: int, timestamp: int, ssrc: int, payload: bytes) -> bytes:
    return HEADER.pack(0x80, (0x80 if marker else 0) | payload_type, seq & 0xFFFF,
                       timestamp & 0xFFFFFFFF, ssrc) + payload


def seq_delta(a: int, b: int) -> int:
    """Signed distance from sequence ``b`` to ``a`` modulo 2^16."""
    d = (a - b) & 0xFFFF
    return d - 0x10000 if d >= 0x8000 else d


def ts_delta(a: int, b: int) -> int:
    d = (a - b) & 0xFFFFFFFF
    return d - 0x100000000 if d >= 0x80000000 else d


class RtpSender:
    """Sequence, timestamp, SSRC and marker state of one sent stream."""

    __slots__ = ("ssrc", "seq", "ts", "clock_rate", "_last_send", "_in_spurt", "sent")

    def __init__(self, clock_rate: int = 8000) -> None:
        self.ssrc = secrets.randbits(32)
        self.seq = secrets.randbits(16)
        self.ts = secrets.randbits(32)
        self.clock_rate = clock_rate
        self._last_send = -1.0
        self._in_spurt = False
        self.sent = 0

    def next_header(self, payload_type: int, samples: int, now: float, marker: bool = False) -> bytes:
        """Header for the next packet of ``samples`` samples sent at ``now``."""
        if not self._in_spurt:
            marker = True
            if self._last_send >= 0:  # advance the timestamp by the pause
                pause = int(round((now - self._last_send) * self.clock_rate))
                self.ts = (self.ts + max(0, pause - samples)) & 0xFFFFFFFF
            self._in_spurt = True
        hdr = HEADER.pack(0x80, (0x80 if marker else 0) | payload_type, self.seq, self.ts, self.ssrc)
        self.seq = (self.seq + 1) & 0xFFFF
        self.ts = (self.ts + samples) & 0xFFFFFFFF
        self._last_send = now
        self.sent += 1
        return hdr

    def timestamp_at(self, now: float) -> int:
        """The timestamp a packet sent at ``now`` would carry."""
        if self._in_spurt or self._last_send < 0:
            return self.ts
        return (self.ts + max(0, int(round((now - self._last_send) * self.clock_rate)) - 160)) & 0xFFFFFFFF

    def event_header(self, payload_type: int, marker: bool, event_ts: int) -> bytes:
        """Header for an RFC 4733 event packet (timestamp fixed at the event start).

        Audio pauses during an event; the next audio packet starts a new
        talkspurt whose timestamp covers the time the event took.
        """
        hdr = HEADER.pack(0x80, (0x80 if marker else 0) | payload_type, self.seq, event_ts & 0xFFFFFFFF, self.ssrc)
        self.seq = (self.seq + 1) & 0xFFFF
        self.sent += 1
        self._in_spurt = False
        return hdr

    def end_spurt(self) -> None:
        """The stream paused (nothing to send this tick): the next packet starts a talkspurt."""
        self._in_spurt = False

    @property
    def in_spurt(self) -> bool:
        return self._in_spurt
