"""CallContext: what every stage of one call shares, built once per call.

Owns the per-call parts the stages of a call actor have in common, so that
every stage is constructed the same way, ``Stage(call, cfg, inbox, *own)``
(``own``: only what is truly the stage's own, e.g. its provider):

* the call clock, the :class:`~brisvox.agent.pipeline.stage.base.EpochWatch` (the newest
  epoch the turn driver decided) and the :class:`~brisvox.agent.pipeline.stage.base.TaskOwner`
  every task of the call is spawned through;
* the :class:`~brisvox.agent.conversation.playout_book.PlayoutBook`, the :class:`LedgerLink` (the pure
  :class:`~brisvox.playout.ledger.EpochLedger` and the links it sends on)
  and the :class:`~brisvox.agent.conversation.timeline.Timeline`;
* the links out of the actor as two small interfaces (``gateway``:
  ``to_gateway``; ``worker``: ``to_worker`` and ``smart_turn``) and the call's
  ``tts`` ring (``sink``), with the call and TTS sample rates;
* the :class:`UpstreamRouter`: frames against the flow (BotStarted,
  BotEnded) are delivered by their type to the inbox of the stage the chain
  declares for them (``brisvox/agent/pipeline/chain.py``), always ``put_nowait`` (the
  upstream rule of ``brisvox/agent/pipeline/stage/base.py``: a bidirectional chain cannot
  deadlock).

The barge-in fast path lives here too, because it only touches these parts:
:meth:`CallContext.clear` (``book.note_clear`` first, then Clear to the
gateway and TtsCut to the worker through the ledger) and
:meth:`CallContext.pause` (``book.note_pause`` / ``note_resume``, then Pause /
Resume to the gateway), both synchronous inside the driver's decision step.

The context is frozen (its parts are fixed for the call's life); the parts
themselves are mutable, and owned by the call's one event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from brisvox.agent.conversation.playout_book import PlayoutBook, PlayoutConfig
from brisvox.agent.conversation.timeline import Timeline
from brisvox.agent.pipeline.stage.base import EpochWatch, Inbox, TaskOwner
from brisvox.agent.pipeline.stage.call_io import AudioSink, GatewayLink, WorkerLink
from brisvox.agent.pipeline.stage.pipeline_frames import PipelineFrame
from brisvox.clock import CLOCK, Clock
from brisvox.playout import ledger as L
from brisvox.playout.ledger import EpochLedger
from ipc.frames import Clear, Frame, Pause, Resume, TtsCut


class LedgerLink:
    """The call's :class:`~brisvox.playout.ledger.EpochLedger` (which decides) and the links
    its actions go out on: Clear and Pause/Resume to the gateway, TtsCut to the worker.

    ``clear(epoch)`` makes every epoch below ``epoch`` dead (Clear(epoch - 1) and TtsCut(epoch
    - 1, tts write position): on the wire they name the newest DEAD epoch), only for an epoch
    above every earlier one; ``pause``/``resume`` send only what the ledger lets through.
    Each returns whether anything was sent.
    """

    __slots__ = ("call_id", "gateway", "worker", "sink", "clock_ns", "machine", "_send")

    def __init__(self, call_id: str, gateway: GatewayLink, worker: WorkerLink, sink: AudioSink,
                 clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.call_id = call_id
        self.gateway = gateway
        self.worker = worker
        self.sink = sink
        self.clock_ns = clock_ns
        self.machine = EpochLedger()
        cid = call_id
        self._send: dict[type, Callable[[Any], None]] = {
            L.SendClear: lambda a: gateway.to_gateway(Clear(cid, a.dead, a.sent_ns, a.lazy)),
            L.SendTtsCut: lambda a: worker.to_worker(TtsCut(cid, a.dead, a.tts_pos)),
            L.SendPause: lambda a: gateway.to_gateway(Pause(cid, a.epoch, a.sent_ns)),
            L.SendResume: lambda a: gateway.to_gateway(Resume(cid, a.epoch, a.sent_ns)),
        }

    @property
    def epoch(self) -> int:
        """The newest epoch cleared for (every epoch below it is dead)."""
        return self.machine.epoch

    @property
    def sent(self) -> int:
        return self.machine.sent

    def _run(self, actions: list[L.LedgerAction]) -> bool:
        for a in actions:
            self._send[type(a)](a)
        return bool(actions)

    def clear(self, epoch: int, lazy: bool = False) -> bool:
        return self._run(self.machine.clear_for(epoch, self.sink.write_pos, self.clock_ns(), lazy))

    def pause(self, epoch: int) -> bool:
        return self._run(self.machine.pause(epoch, self.clock_ns()))

    def resume(self, epoch: int) -> bool:
        return self._run(self.machine.resume(epoch, self.clock_ns()))


class UpstreamRouter:
    """Frames against the flow, delivered by type to the inbox bound for it.

    Bound once at assembly (:func:`brisvox.agent.pipeline.chain.assemble`); ``send`` is
    always non-blocking. A frame of a type nothing is bound for is counted
    (``unrouted``) and dropped."""

    __slots__ = ("_routes", "unrouted")

    def __init__(self) -> None:
        self._routes: dict[type[PipelineFrame], Inbox] = {}
        self.unrouted = 0

    def bind(self, kinds: Iterable[type[PipelineFrame]], inbox: Inbox) -> None:
        for k in kinds:
            self._routes[k] = inbox

    def send(self, frame: PipelineFrame) -> bool:
        inbox = self._routes.get(type(frame))
        if inbox is None:
            self.unrouted += 1
            return False
        return inbox.put_nowait(frame)


class _Nowhere:
    """Links that drop every frame and a sink that only counts (:meth:`CallContext.detached`)."""

    __slots__ = ("write_pos", "frames")

    def __init__(self) -> None:
        self.write_pos = 0
        self.frames = 0

    def to_gateway(self, frame: Frame) -> None:
        self.frames += 1

    def to_worker(self, frame: Frame) -> None:
        self.frames += 1

    async def smart_turn(self, end_pos: int, timeout: float) -> float | None:  # noqa: ASYNC109
        return None

    def write(self, samples: np.ndarray) -> int:
        self.write_pos += len(samples)
        return len(samples)


@dataclass(frozen=True, slots=True)
class CallContext:
    call_id: str
    clock: Clock
    watch: EpochWatch
    tasks: TaskOwner
    book: PlayoutBook
    ledger: LedgerLink
    timeline: Timeline
    gateway: GatewayLink
    worker: WorkerLink
    sink: AudioSink
    upstream: UpstreamRouter
    call_rate: int
    tts_rate: int

    @classmethod
    def create(
        cls,
        call_id: str,
        *,
        gateway: GatewayLink,
        worker: WorkerLink,
        sink: AudioSink,
        call_rate: int,
        tts_rate: int,
        clock: Clock = CLOCK,
        playout: PlayoutConfig | None = None,
        watch: EpochWatch | None = None,
        tasks: TaskOwner | None = None,
        book: PlayoutBook | None = None,
    ) -> CallContext:
        """A fresh context: a new watch, task owner (``call:<id>``), book, ledger,
        timeline and router unless given."""
        return cls(
            call_id=call_id,
            clock=clock,
            watch=watch if watch is not None else EpochWatch(),
            tasks=tasks if tasks is not None else TaskOwner(f"call:{call_id}"),
            book=book if book is not None else PlayoutBook(clock, call_rate, tts_rate, playout or PlayoutConfig()),
            ledger=LedgerLink(call_id, gateway, worker, sink),
            timeline=Timeline(),
            gateway=gateway,
            worker=worker,
            sink=sink,
            upstream=UpstreamRouter(),
            call_rate=call_rate,
            tts_rate=tts_rate,
        )

    @classmethod
    def detached(
        cls,
        call_id: str = "detached",
        *,
        call_rate: int = 8000,
        tts_rate: int = 24000,
        clock: Clock = CLOCK,
        watch: EpochWatch | None = None,
        tasks: TaskOwner | None = None,
        book: PlayoutBook | None = None,
    ) -> CallContext:
        """A context whose links drop every frame (no smart-turn verdict) and whose
        sink counts samples: for a stage run on its own (tests, benches)."""
        nowhere = _Nowhere()
        return cls.create(call_id, gateway=nowhere, worker=nowhere, sink=nowhere, call_rate=call_rate,
                          tts_rate=tts_rate, clock=clock, watch=watch, tasks=tasks, book=book)

    # -- the barge-in fast path (synchronous, inside the driver's decision step) -----------
    def clear(self, new_epoch: int, at: float) -> None:
        """Every epoch below ``new_epoch`` is dead: the book first, then Clear and TtsCut."""
        self.book.note_clear(new_epoch, at)
        self.ledger.clear(new_epoch)

    def pause(self, epoch: int, at: float, paused: bool) -> None:
        """Hold (``paused``) or release the bot's audio of ``epoch`` at the gateway (what the
        ledger lets through: not a dead epoch, not twice, a Resume only of the held one)."""
        if paused:
            if self.ledger.pause(epoch):
                self.book.note_pause(at)
        elif self.ledger.resume(epoch):
            self.book.note_resume()
