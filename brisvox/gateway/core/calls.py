"""The call table: admission, call ids, the four rings of a call, and their lifetime.

Owns which calls exist, which transport leg and which agent process serves
each, and the shared-memory rings the gateway creates for them.

Invariants:

* At most ``max_calls`` calls exist; :meth:`CallTable.admit` refuses beyond
  that (and while draining) and counts the refusal by reason. Admission is
  synchronous, so two calls racing for the last slot cannot both get it.
  :meth:`CallTable.refusal` is that rule alone, without taking anything (the
  health answers: SIP OPTIONS, the WebSocket ``/healthz``); ``admit`` asks it
  first, so the two cannot disagree. A call admitted with a ``source`` (the
  signalling source address) is counted under it until its release; beyond
  ``per_source`` live calls of that source ``admit`` refuses (reason ``source``),
  whatever room the table has (one address cannot take every slot).
* The gateway creates all four rings of a call (``in``, ``in16``, ``tts``,
  ``out``; capacities a power of two covering ``ring_seconds``) at admission
  and unlinks them exactly once, in :meth:`CallTable.release`, after both the
  transport side and the agent side detached (or the detach timeout fired).
  A ring creation failure rolls back every ring already created. The rings'
  names carry the call's random ``ring_key`` (``ipc.ring.new_ring_key``), which
  only the frames to the call's agent and worker carry.
* The gateway is the single writer of ``in`` and the single owner of the
  ``out`` ring's cut floor; it reads ``out`` through one cursor per call
  whose position is the call's release (playback) position.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from brisvox.gateway.core.call_machine import CallMachine
from brisvox.gateway.metrics import CallStats
from brisvox.playout.gate import PlayoutGate
from ipc.ring import Ring, RingError, RingReader, new_ring_key, ring_name

log = logging.getLogger("brisvox.gateway")

KINDS = ("in", "in16", "tts", "out")
IN16_RATE = 16000


def ring_capacity(rate: int, seconds: float) -> int:
    need = max(1024, int(rate * seconds))
    return 1 << (need - 1).bit_length()


class Leg(Protocol):
    """The transport side of a call (SIP dialog + RTP, Twilio or native WebSocket), as the
    pacer and the core drive it; every leg subclasses :class:`brisvox.gateway.core.leg.TransportLeg`,
    which gives the optional capabilities their defaults."""

    transport: str
    marks_by_echo: bool  # the peer echoes marks (Twilio); else the gateway reports on release

    @property
    def can_send(self) -> bool: ...

    def send_audio(self, samples: np.ndarray, now: float) -> bool: ...

    def end_spurt(self) -> None: ...

    def send_clear(self) -> None: ...

    def send_mark(self, name: str) -> None: ...

    def tick_dtmf(self, now: float) -> bool: ...

    def send_dtmf(self, digits: str) -> int: ...

    def hangup(self, reason: str) -> None: ...

    def transfer(self, target: str, done: Callable[[bool, str], None], summary: str = "") -> None: ...

    def send_call_event(self, name: str, fields: dict[str, Any]) -> bool: ...

    def poll(self, now: float) -> None: ...


class Call:
    """One live call: its rings, leg, agent, pacing state, its playout gate (the epoch
    ledger, Pause hold, marks and release position: :class:`~brisvox.playout.gate.PlayoutGate`)
    and its lifecycle machine (the phase, which side is done, why it ended:
    :class:`~brisvox.gateway.core.call_machine.CallMachine`; ``state``, ``transport_done``,
    ``agent_done`` and ``end_reason`` read it)."""

    def __init__(self, call_id: str, transport: str, agent: str, call_rate: int, tts_rate: int,
                 rings: dict[str, Ring], started_ns: int, frame: int, *, max_marks: int = 64,
                 pause_max_s: float = 2.5, detach_timeout_s: float = 10.0, ring_key: str = "") -> None:
        self.call_id = call_id
        self.ring_key = ring_key  # in every ring name of the call (CallStart.ring_key, AttachCall.ring_key)
        self.transport = transport
        self.agent = agent
        self.agent_proc = ""  # DEALER identity of the agent process ("" = built-in agent)
        self.worker = -1
        self.call_rate = call_rate
        self.tts_rate = tts_rate
        self.rings = rings
        self.in_ring = rings["in"]
        self.out_ring = rings["out"]
        self.out_reader: RingReader = self.out_ring.reader(0)
        self.started_ns = started_ns
        self.leg: Leg | None = None
        self.machine = CallMachine(detach_timeout_s)  # the lifecycle: only the core feeds it
        self.transport_ids: dict[str, str] = {}
        self.params: dict[str, str] = {}  # bounded by brisvox.wire.jsontext.checked_params
        self.source = ""  # the source address admission counted it under ("": none given)
        self.caller = ""  # the caller's number (SIP From user, a From/caller parameter)
        self.events = False  # the leg asked for the call's events (CallStart.events; native "events")
        self.called = ""  # the number called (SIP To user, a To/called parameter)
        self.media = "answered"  # the call's media state (ipc.frames.CallMedia: early, answered, held)
        self.media_told = ""  # the media state the agent process was told ("": none yet)
        self.dial_ms: dict[str, int] = {}  # a dialled call's signalling times (CallMedia.dial)
        self.dial_told = False  # the agent process has them
        self.stats = CallStats()
        self.gate = PlayoutGate(self.stats, max_marks=max_marks, pause_max_s=pause_max_s)
        self.builtin: Any = None  # the echo agent, when it serves the call
        self.recording: Any = None  # its stereo WAV (brisvox/gateway/core/recorder.py), None: not recorded
        # warm transfer (brisvox/gateway/core/consults.py owns these rules)
        self.consult_for = ""  # a consult leg: the call id of the caller it consults for
        self.consult_summary = ""  # that leg's summary (CallStart.consult_summary; bounded, printable)
        self.consult_leg = ""  # a caller: its live consult leg's call id ("twilio:<CallSid>" until the stream)
        self.verdict = ""  # a consult leg: accepted / declined, once its agent said ("": not yet)
        self.consult_reported = False  # a consult leg whose dial was answered (its end is then a ConsultResult)
        self.bridged_with = ""  # the other leg of this call's bridge ("": not bridged)
        self.relay: RingReader | None = None  # bridged: reads the other leg's in ring (the pacer sends it)
        self.relay_playing = False  # the relay sent a frame on the last tick (a talkspurt is on)
        self.times: dict[str, int] = {"admitted": int(time.time() * 1000)}  # leg events, Unix ms
        # pacing
        self.frame = frame
        self.frame_s = frame / call_rate
        self.next_due = 0.0
        self.starved_at = -1.0
        self.partial_wait = False
        self.last_send = -1.0
        self.last_on_grid = False

    # -- the lifecycle, as the machine has it ---------------------------------------------

    @property
    def state(self) -> str:
        """starting -> active -> ending -> ended."""
        return self.machine.state

    @property
    def transport_done(self) -> bool:
        return self.machine.transport_done

    @property
    def agent_done(self) -> bool:
        return self.machine.agent_done

    @property
    def end_reason(self) -> str:
        return self.machine.end_reason

    @end_reason.setter
    def end_reason(self, reason: str) -> None:
        """A transport may name the reason before it reports the end (SIP's ring timeout)."""
        self.machine.end_reason = reason

    @property
    def release_pos(self) -> int:
        """The playback position: out-ring samples released so far."""
        return self.gate.release_pos

    def __repr__(self) -> str:
        return f"<Call {self.call_id} {self.transport} {self.agent} {self.state}>"


class AdmissionError(Exception):
    """A call was refused. ``reason``: full, draining, source (its source's share), rings."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class CallTable:
    """All calls of the gateway (see module invariants)."""

    def __init__(self, instance: str, max_calls: int, ring_seconds: float, frame_ms: int = 20, *,
                 max_marks: int = 64, pause_max_s: float = 2.5, detach_timeout_s: float = 10.0) -> None:
        self.instance = instance
        self.max_marks = max_marks
        self.pause_max_s = pause_max_s
        self.detach_timeout_s = detach_timeout_s
        self.max_calls = max_calls
        self.ring_seconds = ring_seconds
        self.frame_ms = frame_ms
        self.calls: dict[str, Call] = {}
        self.by_source: dict[str, int] = {}  # source address -> its live calls (only sources given)
        self.draining = False
        self.refused: dict[str, int] = {}
        self.admitted = 0
        self.released = 0
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}{int(time.time()) % 0x10000:04x}"

    def __len__(self) -> int:
        return len(self.calls)

    def new_id(self) -> str:
        return f"c{self._prefix}{next(self._ids):05d}"

    def refusal(self) -> str:
        """Why a new call would be refused now (``"draining"``, ``"full"``), ``""`` if it would
        be admitted (but for a ring creation failure). Takes and counts nothing."""
        if self.draining:
            return "draining"
        if len(self.calls) >= self.max_calls:
            return "full"
        return ""

    def admit(self, transport: str, agent: str, call_rate: int, tts_rate: int, *, source: str = "",
              per_source: int = 0) -> Call:
        reason = self.refusal()
        if reason:
            self._refuse(reason)
        if source and per_source and self.by_source.get(source, 0) >= per_source:
            self._refuse("source", f"{per_source} calls from {source}")
        call_id = self.new_id()
        rates = {"in": call_rate, "in16": IN16_RATE, "tts": tts_rate, "out": call_rate}
        rings: dict[str, Ring] = {}
        ring_key = new_ring_key()  # unguessable names: no other local user can create them first
        try:
            for kind in KINDS:
                name = ring_name(self.instance, call_id, kind, ring_key)
                rings[kind] = Ring.create(name, ring_capacity(rates[kind], self.ring_seconds), rates[kind])
        except (RingError, OSError) as e:
            for r in rings.values():
                r.unlink()
                r.close()
            log.error("could not create rings for %s: %s", call_id, e)
            self._refuse("rings", str(e))
        frame = call_rate * self.frame_ms // 1000
        call = Call(call_id, transport, agent, call_rate, tts_rate, rings, time.monotonic_ns(), frame,
                    max_marks=self.max_marks, pause_max_s=self.pause_max_s,
                    detach_timeout_s=self.detach_timeout_s, ring_key=ring_key)
        self.calls[call_id] = call
        if source:
            call.source = source
            self.by_source[source] = self.by_source.get(source, 0) + 1
        self.admitted += 1
        return call

    def _refuse(self, reason: str, detail: str = "") -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        raise AdmissionError(reason, detail)

    def get(self, call_id: str) -> Call | None:
        return self.calls.get(call_id)

    def release(self, call: Call) -> bool:
        """Forget the call and unlink its rings (once). Returns False if already released.
        (When is the call's machine's to say: :mod:`brisvox.gateway.core.lifecycle` asks.)"""
        if self.calls.pop(call.call_id, None) is None:
            return False
        if call.source:
            n = self.by_source.get(call.source, 0) - 1
            if n > 0:
                self.by_source[call.source] = n
            else:
                self.by_source.pop(call.source, None)
        for r in call.rings.values():
            r.unlink()
            r.close()
        self.released += 1
        return True
