"""What one WebSocket connection may send: its per-second budget and its fragmented message.

Owns :class:`FrameBudget` and :class:`Reassembly`, two collaborators each
:class:`~brisvox.gateway.ws.server.WsConnection` holds once its handshake is
done (split out of the server for size; both are pure: no I/O, the
connection acts on what they return).

A media stream sends 50 messages a second (20 ms frames: Twilio, Plivo,
Telnyx, Vonage, Exotel, the native protocol, the browser playground) of at
most a few KiB (native PCM16 at 48 kHz: 1,920 bytes a frame, 96 KB/s; a
Twilio ``media`` message is about 330 bytes, 17 KB/s), and pings rarely if at
all (a websockets client every 20 s). The defaults of ``[websocket]
max_frames_per_s`` (1,000), ``max_bytes_per_s`` (1 MiB) and
``max_control_frames_per_s`` (20) are ten times that or more; a peer beyond
them is flooding, and the connection is closed 1008.
"""

from __future__ import annotations

WINDOW_S = 1.0  # the budget's window: counts start again when it is over
UNLIMITED = 1 << 62

# the verdicts of Reassembly.check: (close code, reason)
UNEXPECTED_CONTINUATION = (1002, "unexpected continuation frame")
EXPECTED_CONTINUATION = (1002, "expected a continuation frame")
TOO_BIG = (1009, "message too big")


class FrameBudget:
    """Frames, bytes and control frames one connection may send per :data:`WINDOW_S`.

    Invariants: within one window the connection is granted at most
    ``max_frames`` frames (data, fragments and control frames alike),
    ``max_bytes`` bytes as read from the socket and ``max_control`` control
    frames; a limit of 0 is no limit. A window starts at the first read after
    the previous one ended (a fixed window: at most twice a limit passes
    across a window boundary, never more). The caller spends frames in bulk
    (:meth:`spend`) after it granted them one by one from :meth:`frames_left`,
    so the per-frame cost is one integer decrement in its loop."""

    __slots__ = ("max_frames", "max_bytes", "max_control", "start", "frames", "bytes", "control")

    def __init__(self, max_frames: int, max_bytes: int, max_control: int) -> None:
        self.max_frames = max_frames or UNLIMITED
        self.max_bytes = max_bytes or UNLIMITED
        self.max_control = max_control or UNLIMITED
        self.start = -1e18
        self.frames = 0
        self.bytes = 0
        self.control = 0

    def read(self, nbytes: int, now: float) -> bool:
        """``nbytes`` more were read at ``now`` (loop seconds); False once over ``max_bytes``."""
        if now - self.start >= WINDOW_S:
            self.start = now
            self.frames = self.bytes = self.control = 0
        self.bytes += nbytes
        return self.bytes <= self.max_bytes

    def frames_left(self) -> int:
        """Frames the current window still grants (>= 0)."""
        return max(0, self.max_frames - self.frames)

    def spend(self, frames: int) -> None:
        self.frames += frames

    def control_frame(self) -> bool:
        """One more control frame in this window; False once over ``max_control``."""
        self.control += 1
        return self.control <= self.max_control


class Reassembly:
    """The fragmented message a connection is receiving (RFC 6455 5.4), if any.

    Invariants: at most one message at a time (``opcode`` 1 text or 2
    binary while one is open, else 0); its parts never total more than
    ``max_size`` bytes (:meth:`check` refuses the frame that would pass it,
    before its payload is unmasked or kept); the parts are dropped when the
    message completes or on :meth:`reset`. Control frames may come between
    fragments and never touch it."""

    __slots__ = ("max_size", "opcode", "parts", "size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.opcode = 0
        self.parts: list[bytes] = []
        self.size = 0

    def check(self, first: int, n: int) -> tuple[int, str] | None:
        """The refusal (close code, reason) of a frame whose first byte is ``first`` and whose payload
        is ``n`` bytes, or None when it may be added: a continuation needs an open message, a text or
        binary frame (fragment or whole) needs none, and the message stays within ``max_size``."""
        if first & 0x0F == 0:
            if not self.opcode:
                return UNEXPECTED_CONTINUATION
            if self.size + n > self.max_size:
                return TOO_BIG
            return None
        if self.opcode:
            return EXPECTED_CONTINUATION
        return None

    def add(self, first: int, payload: bytes) -> tuple[int, bytes] | None:
        """Add a fragment :meth:`check` admitted: ``(opcode, message)`` when it completed one, else None."""
        if first & 0x0F:
            self.opcode = first & 0x0F
        self.parts.append(payload)
        self.size += len(payload)
        if not first & 0x80:
            return None
        op, parts = self.opcode, self.parts
        self.reset()
        return op, parts[0] if len(parts) == 1 else b"".join(parts)

    def reset(self) -> None:
        self.opcode = 0
        self.parts = []
        self.size = 0
