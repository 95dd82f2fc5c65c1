"""The seam between the transports and the gateway core: what a transport may ask of it.

Owns :class:`CallHost`, the one interface a transport (the WebSocket server
and its Twilio and native sessions, the SIP user agent and its RTP legs)
receives instead of the concrete :class:`~brisvox.gateway.core.gateway_core.GatewayCore`.
A transport admits a call, attaches its leg (:class:`~brisvox.gateway.core.leg.TransportLeg`)
with :meth:`CallHost.start_call`, feeds the caller's audio and DTMF in, and
reports the end of its side; everything else (rings, agents, workers, the
pacer, the epoch ledger) stays behind the seam.

Invariants:

* :meth:`CallHost.audio_in` is the only writer of a call's ``in`` ring and
  of its receive counters (``packets_in``, ``bytes_in``, ``samples_in``):
  no transport touches ``call.in_ring`` or those counters itself. Audio
  arriving after the transport side ended is dropped (still counted as a
  received packet).
* :meth:`CallHost.transport_ended` is idempotent; a transport calls it once
  its side of the call is gone, whatever the cause. A call whose agent side
  never started (the transport gave up before :meth:`CallHost.start_call`)
  is released with :meth:`CallHost.abandon`, never left in the table.
* Every method is called on the gateway's loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from brisvox.gateway.config import GatewaySettings
    from brisvox.gateway.core.calls import Call, Leg


class CallHost(Protocol):
    """What a transport may ask of the gateway core (see the module docstring)."""

    @property
    def settings(self) -> GatewaySettings: ...

    @property
    def draining(self) -> bool:
        """New calls are refused (shutdown or drain): SIP answers 503, WebSocket 1013."""
        ...

    # -- admission -----------------------------------------------------------------

    def admit(self, transport: str, agent: str, call_rate: int, *, source: str = "",
              media_timeout_s: float = 0.0) -> Call:
        """Admit a call (rings created). ``source``: the caller's address (SIP: the signalling
        source; WebSocket: the client after ``trusted_proxies``), which may hold at most
        ``[gateway] max_calls_per_source`` live calls ("": not counted); ``media_timeout_s``:
        hang the call up ("media timeout") after that long without an inbound packet (0: never).
        Raises AdmissionError (full, draining, source, rings)."""
        ...

    def refusal(self) -> str:
        """Why :meth:`admit` would refuse a new call now: ``"draining"`` or ``"full"`` (``""``:
        it would admit one). The same rule as :meth:`admit`, cheap, takes and counts nothing:
        the health answers (SIP OPTIONS, the WebSocket ``/healthz``) ask it."""
        ...

    def note_refused(self, reason: str) -> None:
        """A transport refused a call itself before :meth:`admit` (e.g. SIP while draining)."""
        ...

    def start_call(self, call: Call, leg: Leg, on_ready: Callable[[bool, str], None]) -> None:
        """Attach ``leg`` and start the agent side; ``on_ready(ok, why)`` follows once."""
        ...

    def abandon(self, call: Call) -> None:
        """The agent side of ``call`` never started: release it once the transport is done."""
        ...

    # -- the caller's side, in ----------------------------------------------------------

    def audio_in(self, call: Call, pcm16: np.ndarray, rate: int, wire_bytes: int = -1, gap: int = 0) -> None:
        """Caller audio at ``rate``: ``gap`` samples of silence (lost packets), then ``pcm16``,
        written to the call's ``in`` ring. ``wire_bytes`` >= 0 also counts one received
        packet of that size (a transport whose packets all carry audio counts them here)."""
        ...

    def packet_in(self, call: Call, wire_bytes: int) -> None:
        """One received media packet that does not (or not yet) reach :meth:`audio_in`."""
        ...

    def dtmf_in(self, call: Call, digit: str, duration_ms: int) -> None: ...

    def media_state(self, call: Call, state: str, dial: dict[str, int] | None = None) -> None:
        """The call's media state is now ``state`` (``ipc.frames.MEDIA_STATES``: early media
        of a dialled call, answered, held); ``dial``: a dialled call's signalling times so far
        (``CallMedia.dial``). The agent side hears of each change once (``CallStart.media``
        before its start, ``CallMedia`` after it); the same state again changes nothing."""
        ...

    def mark_echo(self, call: Call, name: str) -> None:
        """A peer that echoes marks (Twilio, native in echo mode) played mark ``name``."""
        ...

    def protocol_error(self, call: Call | None, counter: str) -> None:
        """Malformed input from the peer: counts ``counter`` (if any) and the call's ``malformed``."""
        ...

    def count(self, name: str, n: int = 1) -> None:
        """A gateway-wide counter (exported in ``stats``)."""
        ...

    # -- the caller's side, ending -----------------------------------------------------

    def transport_ended(self, call: Call, reason: str) -> None:
        """The caller side is gone (BYE, stop, close, timeout). Idempotent."""
        ...

    def hangup(self, call: Call, reason: str) -> None:
        """End the call from the gateway's side (the leg hangs up, then reports the end)."""
        ...

    # -- the loop -------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle: ...


class Listener(Protocol):
    """A socket server that carries the transports of one config section (the registry's
    :data:`~brisvox.gateway.transports.LISTENERS` make them; the core starts and stops them)."""

    async def start(self) -> tuple[str, int]: ...

    async def shutdown(self) -> None: ...

    def drain(self) -> None:
        """The gateway drains: new calls are refused from now on (a SIP listener removes its
        trunk registrations, so registrars stop sending calls)."""

    def stats(self) -> dict[str, Any]: ...

    def reload(self, cfg: Any) -> dict[str, str]:
        """``brisvoxd reload``: ``cfg`` is the section as the file now says; apply what can change
        live (the SIP listener: its trunks), keep the rest until the next start; returns what was
        done (name -> a short phrase). Raises ConfigError when it cannot apply it."""


ListenerFactory = Callable[[CallHost, Any], Listener]  # (the core, its config section) -> the listener
DialDone = Callable[[dict[str, Any] | None, str], None]
# listener, host, target, agent, ring, done, trunk, params (the command's, unchecked: the dial function
# checks them), admitted: called with the dial's Call once it is admitted, before its agent side
# starts (None: nobody asks; a dialer whose call is admitted later, Twilio's, never calls it)
DialAdmitted = Callable[["Call"], None]


class DialFn(Protocol):
    """How one ``via`` places a dial (the positional arguments above); ``await_answer`` (a plain
    dial's, given only when true): report once the callee answered or the dial failed."""

    def __call__(self, listener: Any, host: CallHost, target: str, agent: str, ring_s: float, done: DialDone,
                 trunk: str, params: Any, admitted: DialAdmitted | None, /, *, await_answer: bool = ...) -> None: ...


@dataclass(frozen=True, slots=True)
class Dialer:
    """How a ``dial`` command with one ``via`` is placed: by ``dial`` on the listener of
    ``section``; ``disabled`` is the refusal when that listener is not enabled."""

    section: str
    dial: DialFn
    disabled: str
