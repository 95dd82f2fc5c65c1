"""The base class of every call leg: the required sends and defaults for optional capabilities.

Owns :class:`TransportLeg`, which the Twilio, Telnyx, native and SIP legs subclass,
and :class:`InbandTones`, the outbound DTMF of a peer that has no DTMF
message (Twilio, Telnyx, Exotel, Vonage), which such a leg holds: the digits played as
tones through the media channel.
It satisfies the :class:`~brisvox.gateway.core.calls.Leg` protocol the pacer and
the core drive. A subclass must implement ``can_send``, ``send_audio``,
``send_clear`` and ``hangup``; the optional capabilities default to "not
supported" here:

* marks a peer echoes (``marks_by_echo`` False: the gateway reports a mark
  played when its release position passes it; ``send_mark`` is a no-op);
* outbound DTMF (``send_dtmf`` refuses every digit, ``tick_dtmf`` sends nothing);
* transfer (``transfer`` answers failure at once);
* the call's events (``send_call_event``: dropped, False; only a native leg whose
  client asked for them sends them);
* the end of a talkspurt on a Pause or underrun (``end_spurt``: nothing to do
  for a peer that does not mark talkspurts);
* per-tick housekeeping (``poll``).

The hang-up reason decides how a leg tells the caller's side why
(:func:`ws_close_code`, :func:`q850_cause`): a reason starting with
``stage_failed:`` (the agent ended the call because one of its stages
failed) closes a WebSocket leg with 1011 and sends the SIP BYE with Q.850
cause 41 (temporary failure); every other hang-up is a normal one (1000,
cause 16). A WebSocket leg's close frame carries the reason cut to 123
bytes of UTF-8 at a character boundary (RFC 6455;
:func:`brisvox.wire.ws_framing.close_reason`, applied by the connection), so
a reason of any length or script still closes and the hang-up completes.

:data:`SESSION_LOG` is the WebSocket legs' log of a peer's bad input (a
connection closed for a malformed message, a call's first dropped one, a
call closed by its fault budget): one line per site per minute, the rest
counted (the WebSocket server exports them in ``ws_log_suppressed``), so a
peer opening connection after connection cannot flood the log.

Invariants: every method runs on the gateway's loop, inside the pacer's tick
or the callback that read the agent's frame; none may block or await. A
refusal is reported through the return value or the ``done`` callback,
never by raising.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from brisvox.runtime.log_limit import LogLimiter
from brisvox.wire import dtmf
from brisvox.wire.sip_message import quoted_string

SESSION_LOG = LogLimiter(logging.getLogger("brisvox.gateway.ws"))

FAILURE_PREFIX = "stage_failed:"  # the agent's reason: a stage of the call failed
WS_NORMAL, WS_GOING_AWAY, WS_FAILURE = 1000, 1001, 1011  # WebSocket close codes (RFC 6455 7.4.1)
# hang-up reasons the gateway itself gives that are not a normal end: the caller's side can tell
# a host going away (retry elsewhere) and a lost agent process from a conversation that ended
GOING_AWAY_REASONS = frozenset({"shutdown"})
SERVER_FAILURE_REASONS = frozenset({"agent process died"})
Q850_NORMAL, Q850_FAILURE = 16, 41  # normal call clearing, temporary failure
REASON_TEXT_MAX = 128  # bytes of a hang-up reason in a SIP header's quoted-string


def reason_text(reason: str, limit: int = REASON_TEXT_MAX) -> str:
    """``reason`` made safe for a SIP quoted-string or reason phrase: control characters
    (CR, LF, NUL, ...) become spaces, ``"`` and ``\\`` are escaped, at most ``limit`` bytes."""
    return quoted_string(reason, limit)


def is_failure(reason: str) -> bool:
    """The hang-up reason says the call ended because the agent side failed."""
    return reason.startswith(FAILURE_PREFIX) or reason in SERVER_FAILURE_REASONS


def ws_close_code(reason: str) -> int:
    if reason in GOING_AWAY_REASONS:
        return WS_GOING_AWAY
    return WS_FAILURE if is_failure(reason) else WS_NORMAL


def q850_cause(reason: str) -> int:
    return Q850_FAILURE if is_failure(reason) or reason in GOING_AWAY_REASONS else Q850_NORMAL


class TransportLeg:
    """The transport side of one call (see the module docstring)."""

    transport = ""
    marks_by_echo = False  # the peer echoes marks; else the gateway reports them on release

    @property
    def can_send(self) -> bool:
        raise NotImplementedError

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        raise NotImplementedError

    def send_clear(self) -> None:
        raise NotImplementedError

    def hangup(self, reason: str) -> None:
        raise NotImplementedError

    # -- optional capabilities: defaults ---------------------------------------------

    def end_spurt(self) -> None:
        pass

    def send_mark(self, name: str) -> None:
        pass

    def send_dtmf(self, digits: str) -> int:
        """Queue ``digits`` for the peer; returns how many were refused (here: all)."""
        return len(digits)

    def tick_dtmf(self, now: float) -> bool:
        """Send the next DTMF packet if one is due; True while DTMF holds the audio."""
        return False

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None:
        done(False, f"a {self.transport} call cannot be transferred")

    def send_call_event(self, name: str, fields: dict[str, Any]) -> bool:
        """Show the peer one event of the call (CallEvent); False: not sent (dropped)."""
        return False

    def poll(self, now: float) -> None:
        pass


class InbandTones:
    """SendDtmf as in-band tones, held by a leg whose peer has no DTMF message.

    :meth:`queue` turns digits into their tones (:func:`brisvox.wire.dtmf.tone_sequence` at
    the leg's rate); :meth:`next_frame` hands out 20 ms of them a tick, which the leg sends
    through its ``send_audio``, paced like audio and holding the out ring meanwhile. Digits
    queued while tones play follow them; :meth:`drop` (a Clear) ends them.

    Invariants: ``playing`` is True from a queue of at least one valid digit until the frame
    that holds the last sample was handed out or :meth:`drop`; a frame is never longer than
    20 ms at the rate it was asked for."""

    __slots__ = ("_tones", "_pos")

    def __init__(self) -> None:
        self._tones: np.ndarray | None = None
        self._pos = 0

    @property
    def playing(self) -> bool:
        return self._tones is not None

    def queue(self, digits: str, rate: int) -> int:
        """Queue ``digits``; returns how many were refused (not DTMF digits)."""
        valid = "".join(d for d in digits if d.upper() in dtmf.DIGITS)
        tones = dtmf.tone_sequence(valid, rate)
        if self._tones is not None:
            tones = np.concatenate([self._tones[self._pos:], tones])
        self._tones, self._pos = tones, 0
        return len(digits) - len(valid)

    def next_frame(self, rate: int) -> np.ndarray | None:
        """The next 20 ms of tones (possibly empty at the very end); None when none play."""
        t = self._tones
        if t is None:
            return None
        frame = rate // 50
        chunk = t[self._pos:self._pos + frame]
        self._pos += frame
        if self._pos >= len(t):
            self._tones = None
        return chunk

    def drop(self) -> None:
        self._tones = None


def send_tones(leg: TransportLeg, tones: InbandTones, rate: int, now: float) -> bool:
    """A leg's ``tick_dtmf`` over its :class:`InbandTones`: send the next frame through the
    leg's ``send_audio``; True while tones hold the audio."""
    chunk = tones.next_frame(rate)
    if chunk is None:
        return False
    if len(chunk):
        leg.send_audio(chunk, now)
    return True
