"""DTMF both ways: RFC 4733 telephone-events over RTP, and in-band tones.

Owns the event payload format, the receiver's de-duplication (an event is
reported once, however many times its packets and its three end packets are
repeated), the sender's packet schedule, and the dual-tone generator used
where no event channel exists (Twilio media streams).

Invariants:

* :class:`EventReceiver` reports a digit exactly once per event, identified
  by the RTP timestamp of its start; end packets and retransmissions of an
  already reported event are ignored.
* :class:`EventSender` produces one packet per 20 ms frame for a digit: the
  first with the marker bit, the duration growing by 160 samples per packet,
  then three identical end packets (E bit); every packet of an event shares
  its start timestamp. A 40 ms gap separates digits.
* The parsers (:func:`decode_event`, :func:`parse_dtmf_relay`,
  :func:`parse_dtmf_body`) raise only :class:`DtmfError` (a ``ValueError``),
  whatever the bytes; the fields they return are in range (event 0..255,
  volume 0..63, duration 0..65535 samples; an INFO digit of ``DIGITS`` and a
  duration 0..MAX_RELAY_MS, ASCII digits only).
"""

from __future__ import annotations

import re
import struct
from collections import deque
from dataclasses import dataclass

import numpy as np

DIGITS = "0123456789*#ABCD"
EVENT = struct.Struct("!BBH")
MAX_RELAY_MS = 60_000  # a dtmf-relay Duration beyond a minute is malformed
_DIGITS_RE = re.compile(r"^[0-9]{1,6}$")
FREQS = {
    "1": (697, 1209), "2": (697, 1336), "3": (697, 1477), "A": (697, 1633),
    "4": (770, 1209), "5": (770, 1336), "6": (770, 1477), "B": (770, 1633),
    "7": (852, 1209), "8": (852, 1336), "9": (852, 1477), "C": (852, 1633),
    "*": (941, 1209), "0": (941, 1336), "#": (941, 1477), "D": (941, 1633),
}


class DtmfError(ValueError):
    """A malformed telephone-event payload or dtmf-relay body."""


def event_code(digit: str) -> int:
    i = DIGITS.find(digit.upper())
    if i < 0 or len(digit) != 1:
        raise ValueError(f"not a DTMF digit: {digit!r}")
    return i


def encode_event(code: int, end: bool, volume: int, duration: int) -> bytes:
    return EVENT.pack(code, (0x80 if end else 0) | (volume & 0x3F), min(duration, 0xFFFF))


def decode_event(payload: bytes) -> tuple[int, bool, int, int]:
    """-> (event code, end flag, volume, duration in samples). Raises :class:`DtmfError`."""
    if len(payload) < 4:
        raise DtmfError("short telephone-event payload")
    code, flags, duration = EVENT.unpack_from(payload)
    return code, bool(flags & 0x80), flags & 0x3F, duration


def parse_dtmf_relay(body: bytes) -> tuple[str, int]:
    """An ``application/dtmf-relay`` INFO body (``Signal=5``, ``Duration=160``) ->
    (digit, duration in ms; 0 when absent). Raises :class:`DtmfError`."""
    digit, dur = "", 0
    for line in body.decode("utf-8", "replace").splitlines():
        k, _, v = line.partition("=")
        k, v = k.strip().lower(), v.strip()
        if k == "signal":
            digit = v.upper()
        elif k == "duration":
            if _DIGITS_RE.match(v) is None or int(v) > MAX_RELAY_MS:
                raise DtmfError(f"bad Duration {v[:20]!r}")
            dur = int(v)
    if len(digit) != 1 or digit not in DIGITS:
        raise DtmfError(f"bad Signal {digit[:20]!r}")
    return digit, dur


def parse_dtmf_body(body: bytes) -> str:
    """An ``application/dtmf`` INFO body: the key alone (``5``, ``#``; an event code as
    RFC 4733 numbers them is taken too: 10 is ``*``, 11 ``#``, 12-15 ``A``-``D``) -> the
    digit. Raises :class:`DtmfError`."""
    v = body.decode("utf-8", "replace").strip().upper()
    if len(v) == 2 and _DIGITS_RE.match(v) is not None and 10 <= int(v) <= 15:
        return DIGITS[int(v)]
    if len(v) != 1 or v not in DIGITS:
        raise DtmfError(f"bad application/dtmf body {v[:20]!r}")
    return v


@dataclass(frozen=True, slots=True)
class DigitEvent:
    digit: str
    duration_ms: int


class EventReceiver:
    """De-duplicates RFC 4733 packets into digits (see module invariants)."""

    __slots__ = ("clock_rate", "_current_ts", "_reported", "_last_duration", "bad")

    def __init__(self, clock_rate: int = 8000) -> None:
        self.clock_rate = clock_rate
        self._current_ts = -1
        self._reported = False
        self._last_duration = 0
        self.bad = 0

    def on_packet(self, timestamp: int, payload: bytes) -> DigitEvent | None:
        try:
            code, end, _vol, duration = decode_event(payload)
        except ValueError:
            self.bad += 1
            return None
        if code >= len(DIGITS):
            return None  # other events (flash, tones): ignored
        if timestamp != self._current_ts:
            self._current_ts = timestamp
            self._reported = False
        self._last_duration = max(self._last_duration, duration)
        if end and not self._reported:
            self._reported = True
            return DigitEvent(DIGITS[code], duration * 1000 // self.clock_rate)
        return None


class EventSender:
    """Schedules outbound digits as RFC 4733 packets, one frame at a time."""

    __slots__ = ("queue", "frame", "digit_frames", "gap_frames", "volume", "_code", "_step", "_start_ts", "max_queue")

    def __init__(self, frame: int = 160, digit_ms: int = 100, gap_ms: int = 40, volume: int = 10,
                 max_queue: int = 32) -> None:
        self.queue: deque[str] = deque()
        self.frame = frame
        self.digit_frames = max(1, digit_ms * 8 // frame)
        self.gap_frames = max(1, gap_ms * 8 // frame)
        self.volume = volume
        self._code = -1
        self._step = 0
        self._start_ts = 0
        self.max_queue = max_queue

    def add(self, digits: str) -> int:
        """Queue digits; returns how many were refused (invalid or over the bound)."""
        refused = 0
        for d in digits:
            if d.upper() not in DIGITS or len(self.queue) >= self.max_queue:
                refused += 1
            else:
                self.queue.append(d.upper())
        return refused

    @property
    def active(self) -> bool:
        return self._code >= 0 or bool(self.queue)

    def next_packet(self, ts_now: int) -> tuple[bytes, bool, int] | None:
        """Payload, marker and timestamp for this frame; None while in a gap or idle.

        ``ts_now`` is the stream timestamp the frame would carry; it becomes
        the event timestamp at the start of a digit.
        """
        if self._code < 0:
            if not self.queue:
                return None
            self._code = event_code(self.queue.popleft())
            self._step = 0
            self._start_ts = ts_now
        step = self._step
        self._step += 1
        n = self.digit_frames
        if step < n:
            return encode_event(self._code, False, self.volume, (step + 1) * self.frame), step == 0, self._start_ts
        if step < n + 3:
            return encode_event(self._code, True, self.volume, n * self.frame), False, self._start_ts
        if step < n + 3 + self.gap_frames:
            return None
        self._code = -1
        return self.next_packet(ts_now) if self.queue else None


def tone(digit: str, ms: int = 100, rate: int = 8000, amplitude: float = 0.25) -> np.ndarray:
    """In-band DTMF: the digit's two sines for ``ms``, int16."""
    lo, hi = FREQS[digit.upper()]
    t = np.arange(int(rate * ms / 1000)) / rate
    sig = amplitude * (np.sin(2 * np.pi * lo * t) + np.sin(2 * np.pi * hi * t))
    return (sig * 32767 / 2).astype(np.int16)


def tone_sequence(digits: str, rate: int = 8000, digit_ms: int = 100, gap_ms: int = 60) -> np.ndarray:
    parts = []
    gap = np.zeros(int(rate * gap_ms / 1000), dtype=np.int16)
    for d in digits:
        if d.upper() in FREQS:
            parts += [tone(d, digit_ms, rate), gap]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
