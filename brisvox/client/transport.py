"""What a call transport offers the client's runner, whatever the protocol.

Owns the :class:`CallTransport` interface (open, send one 20 ms frame of
caller audio, press DTMF digits, hang up) and :class:`BotEvents`, the
callbacks a transport calls as the bot's side arrives: audio (PCM16 at the
call's rate), a clear (drop buffered bot audio), digits the bot pressed,
and the end of the call. Every callback gets ``time.monotonic()`` at
arrival, the one clock of the client.

Invariants: a transport calls ``on_end`` at most once; it never calls a
callback after ``close()`` returned; every network await inside a transport
has a timeout (``TransportError`` when it passes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

FRAME_MS = 20
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0


class TransportError(Exception):
    """The call could not be placed or broke (refused, timed out, closed)."""


def _nop_audio(pcm: np.ndarray, now: float) -> None:
    return None


def _nop_now(now: float) -> None:
    return None


def _nop_text(text: str, now: float) -> None:
    return None


@dataclass(slots=True)
class BotEvents:
    """Callbacks for what the far end sends (all optional)."""

    on_audio: Callable[[np.ndarray, float], None] = _nop_audio
    on_clear: Callable[[float], None] = _nop_now
    on_dtmf: Callable[[str, float], None] = _nop_text  # digits the bot pressed
    on_end: Callable[[str, float], None] = _nop_text  # the far end hung up (reason)


class CallTransport(Protocol):
    """One call over one protocol. ``rate`` is the PCM rate of both directions."""

    rate: int
    call_id: str  # the server's call id when the protocol tells it ("" otherwise)
    ids: dict[str, str]  # protocol ids (streamSid, SIP Call-ID) to find the call record

    async def open(self, events: BotEvents) -> None: ...

    async def send_audio(self, pcm: np.ndarray) -> None: ...

    async def send_dtmf(self, digits: str) -> None: ...

    async def close(self) -> None: ...
