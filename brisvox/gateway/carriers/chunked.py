"""The bot's audio for a peer that plays it in chunks of base64 text messages (Exotel, FreeSWITCH).

Owns :class:`ChunkedAudio`, one leg's outbound chunking: the wire bytes the
pacer releases (20 ms frames) are kept by a :class:`brisvox.wire.exotel.Chunker`
until a chunk is full, then sent as ``prefix + base64 + MEDIA_SUFFIX`` on the
leg's connection (the prefix is the leg's own message template, read at each
send: a stream learns it at its start).

Invariants: ``packets_out`` of the leg's call counts the messages sent;
:meth:`ChunkedAudio.flush` sends what is kept, padded to the chunk multiple;
:meth:`ChunkedAudio.end_spurt` flushes unless the call's playout is held by a
Pause (the kept chunk plays first on Resume); :meth:`ChunkedAudio.tick_dtmf`
flushes once the last in-band DTMF tone is sent; :meth:`ChunkedAudio.drop`
forgets what is kept (a Clear).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any

from brisvox.gateway.core.leg import InbandTones
from brisvox.wire.exotel import Chunker
from brisvox.wire.mediastream import MEDIA_SUFFIX


class ChunkedAudio:
    """One leg's outbound audio in chunks (see the module docstring)."""

    __slots__ = ("_chunks", "_leg", "_prefix")

    def __init__(self, leg: Any, prefix: Callable[[], bytes]) -> None:
        self._leg = leg  # a StreamSession: its ``conn`` and ``call``
        self._prefix = prefix
        self._chunks = Chunker()

    @property
    def pending(self) -> int:
        """Bytes kept, not yet sent."""
        return self._chunks.pending

    def add(self, wire: bytes | bytearray | memoryview) -> bool:
        """Keep ``wire``; send a chunk when one is full. False once the connection is closed."""
        chunk = self._chunks.add(wire)
        return self.send(chunk) if chunk is not None else not self._leg.conn.closed

    def send(self, chunk: bytes) -> bool:
        leg = self._leg
        ok = bool(leg.conn.send_text(self._prefix() + binascii.b2a_base64(chunk, newline=False) + MEDIA_SUFFIX))
        if ok and leg.call is not None:
            leg.call.stats.packets_out += 1
        return ok

    def flush(self) -> None:
        """Send what is kept (padded to the chunk multiple)."""
        chunk = self._chunks.flush()
        if chunk is not None:
            self.send(chunk)

    def end_spurt(self) -> None:
        gate = getattr(self._leg.call, "gate", None)
        if gate is None or gate.held is None:  # a Pause keeps the chunk: it plays first on Resume
            self.flush()

    def tick_dtmf(self, tick: Callable[[float], bool], now: float) -> bool:
        """The leg's DTMF tick (``tick``, its in-band tones), then a flush once the last tone
        is out (nothing follows it in this chunk); ``tick``'s answer."""
        tones: InbandTones = self._leg.tones
        was_playing = tones.playing
        busy = tick(now)
        if was_playing and not tones.playing:
            self.flush()
        return busy

    def drop(self) -> int:
        return self._chunks.drop()
