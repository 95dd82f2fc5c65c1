"""Asterisk AudioSocket messages (``app_audiosocket`` / ``chan_audiosocket``), pure parse and build.

The protocol, as its references define it (the Go reference implementation's README,
github.com/CyCoreSystems/audiosocket, "Protocol definition"; docs.asterisk.org,
Configuration/Channel-Drivers/AudioSocket, "Protocol definition", "Types", "Payload length",
"Asterisk error codes"; the AudioSocket() dialplan application page, "Description"):

* a message is a 3-byte header, a 1-byte kind and a 2-byte **big-endian** payload length,
  then that many payload bytes; the shortest message is 3 bytes (a hangup is ``00 00 00``);
* kinds: ``0x00`` terminate (socket closure is also sufficient), ``0x01`` the stream's UUID
  (16 bytes, binary; the first message Asterisk sends), ``0x03`` one DTMF digit (1 ASCII
  byte; Asterisk 20.x/21.x/22.x onwards, the DTMF patch), ``0x10`` signed linear 16-bit
  little-endian mono PCM at 8 kHz, ``0x11``..``0x18`` the same at 12, 16, 24, 32, 44.1, 48,
  96 and 192 kHz (the higher-rate patch, Asterisk 20.x-23.x onwards; :data:`KIND_RATES`),
  ``0xff`` an error, its payload an optional application-specific code (Asterisk's: one
  bit-packed byte, ``0x01`` hangup of the calling party, ``0x02`` frame forwarding error,
  ``0x04`` memory allocation error);
* the AudioSocket() application sends 8 kHz slin (kind ``0x10``) in 20 ms frames (320
  bytes); the protocol has no clear/flush, mark, or transfer message.

Owns :class:`Message`, :class:`AudioSocketError`, the builders (:func:`encode`,
:func:`hangup`, :func:`uuid_message`, :func:`audio`, :func:`dtmf`, :func:`error`) and
:class:`Decoder`, the streaming reader.

Invariants:

* :class:`Decoder` buffers at most one header plus ``max_payload`` bytes: a header whose
  length exceeds ``max_payload`` is ``AudioSocketError("oversized")`` before a byte of its
  payload is waited for; a kind outside :data:`KINDS` is ``"unknown_kind"``, also at its
  header. A UUID payload that is not 16 bytes is ``"bad_uuid"``, a DTMF payload that is not
  one digit of ``0-9*#A-D`` is ``"bad_dtmf"``, an audio payload of an odd byte count is
  ``"odd_audio"``.
* After an :class:`AudioSocketError` the stream is out of step: the caller closes it.
* Split anywhere (one byte at a time) or pipelined (several in one read), the same
  messages come out in the same order; ``encode`` then ``feed`` is the identity.
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass

__all__ = [
    "AUDIO_8K", "DTMF", "DTMF_DIGITS", "ERROR", "HANGUP", "HEADER", "KINDS", "KIND_RATES", "MAX_LENGTH", "UUID",
    "AudioSocketError", "Decoder", "Message", "audio", "audio_kind", "dtmf", "encode", "error", "hangup",
    "uuid_message",
]

HANGUP = 0x00
UUID = 0x01
DTMF = 0x03
AUDIO_8K = 0x10
ERROR = 0xFF
KIND_RATES: dict[int, int] = {  # audio kind -> its sample rate (slin, 16-bit little-endian, mono)
    0x10: 8000, 0x11: 12000, 0x12: 16000, 0x13: 24000, 0x14: 32000, 0x15: 44100, 0x16: 48000,
    0x17: 96000, 0x18: 192000,
}
RATE_KINDS = {rate: kind for kind, rate in KIND_RATES.items()}
KINDS = frozenset({HANGUP, UUID, DTMF, ERROR, *KIND_RATES})
HEADER = 3
MAX_LENGTH = 0xFFFF  # the length field is 16 bits
DTMF_DIGITS = frozenset("0123456789*#ABCD")


class AudioSocketError(ValueError):
    """The stream cannot be read further: ``kind`` names why (the counter label)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Message:
    """One AudioSocket message: its kind byte and its payload."""

    kind: int
    payload: bytes

    @property
    def rate(self) -> int:
        """The sample rate of an audio message (0 for any other kind)."""
        return KIND_RATES.get(self.kind, 0)

    @property
    def uuid(self) -> str:
        """A UUID message's id in its canonical string form."""
        return str(_uuid.UUID(bytes=self.payload))

    @property
    def digit(self) -> str:
        """A DTMF message's digit."""
        return self.payload.decode("ascii")


def audio_kind(rate: int) -> int:
    """The audio kind of ``rate`` (KeyError for a rate the protocol has no kind for)."""
    return RATE_KINDS[rate]


def encode(kind: int, payload: bytes = b"") -> bytes:
    """One message; ValueError for a kind outside :data:`KINDS` or a payload over 65535 bytes."""
    if kind not in KINDS:
        raise ValueError(f"unknown AudioSocket kind 0x{kind:02x}")
    if len(payload) > MAX_LENGTH:
        raise ValueError(f"payload of {len(payload)} bytes > {MAX_LENGTH}")
    return bytes((kind, len(payload) >> 8, len(payload) & 0xFF)) + payload


def hangup() -> bytes:
    return b"\x00\x00\x00"


def uuid_message(call_uuid: str | _uuid.UUID) -> bytes:
    u = call_uuid if isinstance(call_uuid, _uuid.UUID) else _uuid.UUID(call_uuid)
    return encode(UUID, u.bytes)


def audio(pcm16le: bytes, rate: int = 8000) -> bytes:
    """An audio message of ``pcm16le`` (16-bit little-endian samples) at ``rate``."""
    return encode(audio_kind(rate), pcm16le)


def dtmf(digit: str) -> bytes:
    if len(digit) != 1 or digit not in DTMF_DIGITS:
        raise ValueError(f"not a DTMF digit: {digit!r}")
    return encode(DTMF, digit.encode("ascii"))


def error(code: int | None = None) -> bytes:
    return encode(ERROR, b"" if code is None else bytes((code,)))


def _check(kind: int, payload: bytes) -> None:
    if kind == UUID and len(payload) != 16:
        raise AudioSocketError("bad_uuid", f"a UUID is 16 bytes, got {len(payload)}")
    if kind == DTMF and (len(payload) != 1 or chr(payload[0]) not in DTMF_DIGITS):
        raise AudioSocketError("bad_dtmf", f"a DTMF payload is one digit, got {payload[:8]!r}")
    if kind in KIND_RATES and len(payload) % 2:
        raise AudioSocketError("odd_audio", f"{len(payload)} bytes of 16-bit audio")


class Decoder:
    """Whole AudioSocket messages out of a byte stream (see the module docstring)."""

    __slots__ = ("max_payload", "_buf")

    def __init__(self, max_payload: int) -> None:
        if not 0 < max_payload <= MAX_LENGTH:
            raise ValueError(f"max_payload must be within 1..{MAX_LENGTH}")
        self.max_payload = max_payload
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Message]:
        """The messages ``data`` completes; AudioSocketError when the stream is bad."""
        buf = self._buf
        buf += data
        out: list[Message] = []
        while len(buf) >= HEADER:
            kind = buf[0]
            length = (buf[1] << 8) | buf[2]
            if kind not in KINDS:
                raise AudioSocketError("unknown_kind", f"kind byte 0x{kind:02x}")
            if length > self.max_payload:
                raise AudioSocketError("oversized", f"a payload of {length} bytes > {self.max_payload}")
            if len(buf) < HEADER + length:
                break
            payload = bytes(buf[HEADER:HEADER + length])
            del buf[:HEADER + length]
            _check(kind, payload)
            out.append(Message(kind, payload))
        return out
