"""The load generator's Twilio messages as masked WebSocket frames, pre-encoded where they repeat.

Owns the bytes a simulated caller puts on the wire for its media (50 a
second per call). The messages are :mod:`brisvox.wire.twilio`'s (the bot's
replies are read with its ``bot_event``); what is here is the WebSocket
side: the masking, with the ``websockets`` library's C ``apply_mask`` (the
wire package imports no third-party library but numpy).

A media message is exactly the text :meth:`TwilioStream.media` builds::

    {"event":"media","sequenceNumber":"<seq>","media":{"track":"inbound",
    "chunk":"<chunk>","timestamp":"<ts>","payload":"<base64>"},"streamSid":"<sid>"}

split in three as the wire module builds it: a head that changes every frame
(``MEDIA_HEAD``, three counters), the payload that is the same for every
caller speaking that line (encoded once per line frame,
:class:`MediaPayload`, and shared by all callers), and a tail fixed per call
(``TwilioStream.media_tail``). A client frame must be masked (RFC 6455 5.3); masking is a
XOR with the 4-byte key repeating from the payload's first byte, so a piece
at offset ``o`` is masked with the key rotated by ``o % 4``: each shared
payload and each call's tail are kept masked under all four rotations of one
key per run, and only the ~110-byte head is masked per frame (one C call).
The server unmasks the same bytes as for any other key.

Invariants: :meth:`WireStream.media_frame` returns one complete masked text
frame whose payload, unmasked, is byte for byte what
:meth:`TwilioStream.media` returns for the same call state, and it advances
the same counters (``sequenceNumber`` over every message, ``chunk`` over
media).
"""

from __future__ import annotations

import os

from websockets.frames import apply_mask

from brisvox.wire import ws_framing
from brisvox.wire.twilio import MEDIA_HEAD, TwilioStream


def new_key() -> bytes:
    """One masking key for a run (non-zero bytes are not required; any key is valid)."""
    return os.urandom(4)


def _rotations(data: bytes, key: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """``data`` masked as if it started at an offset ``o`` of the frame, for ``o % 4`` = 0..3."""
    return tuple(apply_mask(data, key[r:] + key[:r]) for r in range(4))  # type: ignore[return-value]


class MediaPayload:
    """One 20 ms frame of caller audio (base64 mu-law), masked under the four key rotations."""

    __slots__ = ("b64", "masked", "size")

    def __init__(self, b64: str, key: bytes) -> None:
        raw = b64.encode("ascii")
        self.b64 = b64
        self.size = len(raw)
        self.masked = _rotations(raw, key)

    def __repr__(self) -> str:
        return f"<MediaPayload {self.b64[:12]}...>"


def encode_payloads(frames_b64: list[str], key: bytes) -> list[MediaPayload]:
    return [MediaPayload(f, key) for f in frames_b64]


class WireStream(TwilioStream):
    """A :class:`TwilioStream` that also emits its media as pre-encoded masked frames."""

    def __init__(self, index: int, key: bytes, tag: str = "bench") -> None:
        super().__init__(index, tag)
        self.key = key
        self._tail = _rotations(self.media_tail.encode(), key)
        self._tail_size = len(self._tail[0])

    def media_frame(self, payload: MediaPayload) -> bytes:
        """The masked WebSocket text frame of ``self.media(payload.b64)`` (same counters)."""
        self._chunk += 1
        chunk = self._chunk
        head = MEDIA_HEAD.format(self._next_seq(), chunk, (chunk - 1) * 20).encode()
        key = self.key
        o1 = len(head)
        o2 = o1 + payload.size
        return (ws_framing.header(o2 + self._tail_size, ws_framing.TEXT, key)
                + apply_mask(head, key) + payload.masked[o1 & 3] + self._tail[o2 & 3])
