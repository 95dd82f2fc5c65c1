"""The events a WorkerTick carries, typed: one frozen dataclass per kind.

A worker's realtime lane makes them (``workers/realtime.py``, ``workers/call_table.py``),
the worker client reads them (``ipc/worker_client.py``, which also makes a stop
itself when a call's worker is lost and no other is ready) and hands each to the
call's owner (``brisvox/agent``: ``CallActor.on_worker``). Every event names its
call; ``pos`` is an in16 position; ``ns`` the ``time.monotonic_ns()`` at which the
worker made it. start/stop/falling also carry ``at``: the in16 position of the end
of the VAD window that decided them (the audio horizon of the decision; 0: unknown).

Why one class per kind (not one class with a kind enum): each kind carries
different fields (a stop's ``reason``, a gap's ``lost``, a failure's ``failures``),
so each class has exactly its own, and readers dispatch on the class (``match``).

Wire form: each event is a codec record (:func:`ipc.codec.record`), so
``WorkerTick.events`` holds ``{"kind": "stop", "call_id": ..., "pos": ..., ...}``
objects (a field at its default is left out: a stop that came from silence has no
``reason``), the same compact objects as before the events were typed. The frame
carries those objects and the receiver types them (:func:`from_wire`, about 1 us
an event): typing them inside the codec would make a WorkerTick with two events
60-120 % slower to encode and decode (measured when the events were typed: 3.1 us became 5.0 us
with the events as JSON arrays, 6.6 us as objects), and a tick goes to every
subscriber every 20 ms.
"""

from __future__ import annotations

from typing import Any

from ipc.codec import FrameError, Record, record, record_from_wire, record_to_wire


@record("start")
class SpeechStart(Record):
    """Speech started at ``pos``: the first sample of the first speech window (backdated)."""

    call_id: str
    pos: int
    at: int
    ns: int


@record("stop")
class SpeechStop(Record):
    """Speech stopped: ``pos`` is one past the last speech sample. ``reason`` is set when
    the stop did not come from silence: "gap" (input overrun), "vad_error", "overflow"
    (the VAD fell 2 s behind) or "worker_lost" (the call's worker died during speech)."""

    call_id: str
    pos: int
    at: int
    ns: int
    reason: str = ""


@record("falling")
class SpeechFalling(Record):
    """Opt-in (``vad.fall_delay_ms``): silence began ``fall_delay`` ago; ``pos`` is exactly
    the ``pos`` the stop of that fall will carry (early Smart Turn)."""

    call_id: str
    pos: int
    at: int
    ns: int


@record("gap")
class InputGap(Record):
    """``lost`` in16 samples of zeros were written at ``pos`` (the input ring overran)."""

    call_id: str
    pos: int
    lost: int
    ns: int


@record("vad_failed")
class VadFailed(Record):
    """The call's VAD failed open after ``failures`` failures in a row (the one non-fatal
    error of a fail-open): no VAD events until :class:`VadRecovered`."""

    call_id: str
    pos: int
    failures: int
    ns: int


@record("vad_recovered")
class VadRecovered(Record):
    """A recovery probe succeeded at ``pos``: the call's VAD runs again."""

    call_id: str
    pos: int
    ns: int


@record("amd_verdict")
class AmdVerdictEvent(Record):
    """The call's answering-machine verdict (after an ``AmdStart``): ``verdict`` one of human,
    machine, ivr, fax, uncertain; ``confidence`` 0..1; ``ms`` of audio from the answer;
    ``pos`` the in16 position where it was decided; ``rule`` what decided it."""

    call_id: str
    pos: int
    ns: int
    verdict: str
    confidence: float
    ms: int
    rule: str = ""


@record("amd_beep")
class AmdBeepEvent(Record):
    """A voicemail's beep began at ``pos`` (``hz``: its frequency): the machine records now."""

    call_id: str
    pos: int
    ns: int
    hz: float


@record("amd_greeting_end")
class AmdGreetingEndEvent(Record):
    """A machine's greeting ended at ``pos`` without a beep heard (``leave_message``)."""

    call_id: str
    pos: int
    ns: int


TickEvent = (SpeechStart | SpeechStop | SpeechFalling | InputGap | VadFailed | VadRecovered | AmdVerdictEvent
             | AmdBeepEvent | AmdGreetingEndEvent)


def to_wire(ev: TickEvent) -> dict[str, Any]:
    """An event -> the object ``WorkerTick.events`` carries."""
    return record_to_wire(ev)


def from_wire(obj: Any) -> TickEvent:
    """One object of ``WorkerTick.events`` -> its typed event. Raises :class:`FrameError` only."""
    r = record_from_wire(obj)
    if not isinstance(r, TickEvent):
        raise FrameError("bad_field", f"{r.KIND} is not a tick event")
    return r
