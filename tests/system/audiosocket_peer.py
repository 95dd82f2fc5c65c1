"""A test peer speaking AudioSocket as Asterisk does, written from the protocol's text, not from brisvox.wire.

The references: the protocol definition of the Go reference implementation
(github.com/CyCoreSystems/audiosocket, README "Protocol definition") and docs.asterisk.org
(Configuration/Channel-Drivers/AudioSocket; API_Documentation/Dialplan_Applications/AudioSocket).
Section by section, what this peer does:

* "Protocol definition": every message is a 3-byte header (1-byte type, 2-byte length) and
  the payload; the minimum message is 3 bytes (:func:`message` packs ``>BH`` by hand, so a
  mistake in :mod:`brisvox.wire.audiosocket` is not shared by its test).
* "Payload length": a 16-bit unsigned integer, big endian.
* "Types": ``0x01`` the UUID, 16-byte binary, sent first (as ``AudioSocket(uuid,host:port)``
  does on connect); ``0x10`` signed linear 16-bit 8 kHz mono little-endian audio, which the
  AudioSocket() application sends ("Description": 16-bit, 8 kHz mono PCM), here 20 ms (320
  bytes) a message; ``0x03`` one ASCII DTMF digit (Asterisk 20.x+ forwards the caller's DTMF
  frames); ``0x00`` terminate, sent when the caller hangs up (and socket closure "is also
  sufficient"); ``0xff`` an error with an optional code.
* "Types", the higher-rate kinds (``0x11``..``0x16`` here: 12 to 48 kHz): a peer made with
  another ``rate`` sends and expects that kind instead of ``0x10``.
* What the server sends back: audio of the same kind, played to the caller as it arrives
  (Asterisk queues nothing of its own: there is no flush message, so a peer never sees a
  "clear"), and ``0x00`` when the server ends the call.

:class:`AudioSocketPeer` satisfies :class:`brisvox.client.transport.CallTransport` (open,
send one frame, press digits, hang up) so the conformance suite drives it like the others;
:meth:`AudioSocketPeer.send_raw` writes any bytes (the hostile cases).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid

import numpy as np

from brisvox.client.transport import BotEvents

HANGUP, UUID, DTMF, SLIN8, ERROR = 0x00, 0x01, 0x03, 0x10, 0xFF
# "Types": the audio kinds of the higher-rate patch (newer Asterisk versions), by rate
SLIN_KINDS = {8000: 0x10, 12000: 0x11, 16000: 0x12, 24000: 0x13, 32000: 0x14, 44100: 0x15, 48000: 0x16}


def message(kind: int, payload: bytes = b"") -> bytes:
    """One AudioSocket message: type, big-endian length, payload."""
    return struct.pack(">BH", kind, len(payload)) + payload


class AudioSocketPeer(asyncio.Protocol):
    """Asterisk's side of one AudioSocket call (see the module docstring).

    What the server sends is parsed in ``data_received``, so audio that reached the socket
    before an event the test waits for is counted before the test goes on."""

    def __init__(self, host: str, port: int, call_uuid: str | None = None, *, send_uuid: bool = True,
                 rate: int = 8000) -> None:
        self.rate = rate
        self.kind = SLIN_KINDS[rate]  # the audio kind this peer sends and expects back
        self.host = host
        self.port = port
        self.uuid = call_uuid or str(uuid.uuid4())
        self.send_uuid = send_uuid
        self.call_id = ""
        self.ids = {"uuid": self.uuid}
        self.transport: asyncio.Transport | None = None
        self.kinds: list[int] = []  # every message kind the server sent, in order
        self.eof = asyncio.Event()  # the server closed the connection
        self._buf = bytearray()
        self._events = BotEvents()
        self._ended = False

    async def open(self, events: BotEvents | None = None) -> None:
        self._events = events or BotEvents()
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.create_connection(lambda: self, self.host, self.port), 5.0)
        if self.send_uuid:
            await self.send_raw(message(UUID, uuid.UUID(self.uuid).bytes))

    # -- asyncio.Protocol: what the server sends ------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= 3:
            kind, length = struct.unpack(">BH", self._buf[:3])
            if len(self._buf) < 3 + length:
                return
            payload = bytes(self._buf[3:3 + length])
            del self._buf[:3 + length]
            now = time.monotonic()
            self.kinds.append(kind)
            if kind == self.kind:
                if not self._ended:
                    self._events.on_audio(np.frombuffer(payload, dtype="<i2"), now)
            elif kind == HANGUP:
                self._end("hangup", now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof.set()
        self._end("closed", time.monotonic())

    def _end(self, why: str, now: float) -> None:
        if not self._ended:
            self._ended = True
            self._events.on_end(why, now)

    # -- what the caller's side sends ----------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def send_audio(self, pcm: np.ndarray) -> None:
        await self.send_raw(message(self.kind, pcm.astype("<i2").tobytes()))

    async def send_dtmf(self, digits: str) -> None:
        for d in digits:
            await self.send_raw(message(DTMF, d.encode("ascii")))

    async def closed_by_server(self, timeout: float = 3.0) -> bool:
        """Whether the server closes the connection within ``timeout``."""
        try:
            await asyncio.wait_for(self.eof.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """The caller hangs up: a terminate message, then the socket closes."""
        self._ended = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(message(HANGUP))
            self.transport.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.eof.wait(), 2.0)
