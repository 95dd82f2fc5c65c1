"""Stage machinery of a call actor: bounded three-lane inboxes, the stage loop,
epoch filtering, guarded sends and task ownership.

Owns how frames move between the stages of one call:

* :class:`Inbox`: a SYSTEM lane (overtakes everything), an UPSTREAM lane
  (frames against the flow, always ``put_nowait``) and a bounded DATA lane.
  Lossy inboxes drop the OLDEST data frame when full; lossless ones make the
  sender wait (back-pressure). The SYSTEM and UPSTREAM lanes hold ``sys_cap``
  frames; past it a frame is dropped and counted, except a ``LOSSLESS`` one
  (Stop, Interrupt, BotStarted, BotEnded: bounded by their producers, see
  :mod:`~brisvox.agent.pipeline.stage.pipeline_frames`), which is queued and
  counted (``sys_over`` / ``up_over``). Every drop is counted, never silent.
* :class:`Stage`: one task per stage running ``process`` for each frame,
  constructed as ``Stage(call, cfg, inbox, *own)`` (the call's shared
  :class:`~brisvox.agent.pipeline.stage.call_context.CallContext`, the stage's config, its
  inbox, then only what is truly its own) and named after its inbox,
  system frames first, plus a single level-triggered deadline
  (``self.deadline``; ``on_deadline(now)`` runs when it passes). A DropStale
  stage drops data frames of epochs older than the newest epoch it has seen.
* :class:`EpochWatch`: the newest epoch the TurnDriver has decided (bumped at
  the barge-in decision, before the Interrupt frame travels). Helper tasks
  check it right before every send (:meth:`Stage.guarded_send`), so late audio
  or text of a cut epoch never enters the pipeline once the decision is made.
* :class:`TaskOwner`: every task of a call is spawned through it and ended by
  ``close()``; ``live()`` lets tests assert that nothing leaked. Each task is
  attributed to a stage: a stage's own task by name (``Stage.start``), a
  helper to the stage whose task (or helper) spawned it. A task that ends
  with an unexpected exception (not a cancellation, not a normal return) is
  handed to ``on_failure(task, stage, exc)`` when one is set (the actor's
  stage supervision), else logged; either way its exception is retrieved.

Upstream rule: upstream frames are only ever ``put_nowait`` (never awaited),
so a bidirectional chain cannot deadlock.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from brisvox.agent.pipeline.stage.pipeline_frames import (
    DATA,
    SYSTEM,
    UPSTREAM,
    Interrupt,
    PipelineFrame,
    Stop,
)

if TYPE_CHECKING:
    from brisvox.agent.pipeline.stage.call_context import CallContext

log = logging.getLogger("brisvox.agent")


class Inbox:
    """Three lanes; ``get`` returns SYSTEM, then UPSTREAM, then DATA frames."""

    __slots__ = (
        "name",
        "data_cap",
        "sys_cap",
        "lossy",
        "_sys",
        "_up",
        "_data",
        "_waiter",
        "_timer",
        "_timer_at",
        "_space",
        "dropped",
        "sys_dropped",
        "up_dropped",
        "sys_over",
        "up_over",
        "max_queued",
    )

    def __init__(self, name: str, data_cap: int, *, lossy: bool = False, sys_cap: int = 32) -> None:
        self.name = name
        self.data_cap = data_cap
        self.sys_cap = sys_cap
        self.lossy = lossy
        self._sys: deque[PipelineFrame] = deque()
        self._up: deque[PipelineFrame] = deque()
        self._data: deque[PipelineFrame] = deque()
        self._waiter: asyncio.Future[bool] | None = None  # the one getter (the stage task), parked
        self._timer: asyncio.TimerHandle | None = None  # the armed deadline timer (kept across gets)
        self._timer_at = 0.0  # ... and the deadline it is armed for
        self._space = asyncio.Event()
        self._space.set()
        self.dropped = 0
        self.sys_dropped = 0
        self.up_dropped = 0
        self.sys_over = 0  # LOSSLESS frames queued past sys_cap (never dropped)
        self.up_over = 0
        self.max_queued = 0

    def __len__(self) -> int:
        return len(self._sys) + len(self._up) + len(self._data)

    def put_nowait(self, frame: PipelineFrame) -> bool:
        """Non-blocking put into the frame's lane. False (and counted) when it was
        dropped; a lossy data lane drops its oldest frame instead and returns True."""
        lane = frame.LANE
        if lane == SYSTEM:
            if len(self._sys) >= self.sys_cap:
                if not frame.LOSSLESS:
                    self.sys_dropped += 1
                    log.error("inbox %s: system lane full, frame dropped", self.name)
                    return False
                self.sys_over += 1
            self._sys.append(frame)
        elif lane == UPSTREAM:
            if len(self._up) >= self.sys_cap:
                if not frame.LOSSLESS:
                    self.up_dropped += 1
                    return False
                self.up_over += 1
            self._up.append(frame)
        else:
            if len(self._data) >= self.data_cap:
                if not self.lossy:
                    self.dropped += 1
                    return False
                self._data.popleft()
                self.dropped += 1
            self._data.append(frame)
            if len(self._data) > self.max_queued:
                self.max_queued = len(self._data)
            if len(self._data) >= self.data_cap:
                self._space.clear()
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(True)
        return True

    def data_room(self) -> bool:
        """The data lane takes one more frame now (a lossless put would not wait)."""
        return len(self._data) < self.data_cap

    async def put(self, frame: PipelineFrame) -> None:
        """Put with back-pressure on a lossless data lane (other lanes never wait)."""
        if frame.LANE == DATA and not self.lossy:
            while len(self._data) >= self.data_cap:
                self._space.clear()
                await self._space.wait()
        self.put_nowait(frame)

    def _pop(self) -> PipelineFrame | None:
        if self._sys:
            return self._sys.popleft()
        if self._up:
            return self._up.popleft()
        if self._data:
            f = self._data.popleft()
            if len(self._data) < self.data_cap:
                self._space.set()
            return f
        return None

    async def get(self, deadline: float | None = None) -> PipelineFrame | None:
        """Next frame, or None once ``deadline`` (loop time) has passed with nothing queued.

        One getter at a time (the stage's task). It parks on a bare future that the
        next put resolves, and the deadline is a plain loop timer resolving the same
        future (False): no Event waiter list, no Timeout context per wait.

        The timer outlives the wait: a stage keeps the same deadline over many frames
        (a turn or mark timeout spans a whole utterance), so a get for the deadline the
        timer is already armed for reuses it instead of scheduling and cancelling one
        loop timer per frame; it is cancelled only when the deadline changes or goes
        away. A timer that fires with no getter parked resolves nothing (the next get
        sees the deadline has passed by the loop clock)."""
        while True:
            f = self._pop()
            if f is not None:
                return f
            loop = asyncio.get_running_loop()
            if deadline is not None and deadline <= loop.time():
                return None
            timer = self._timer
            if deadline is None:
                if timer is not None:
                    timer.cancel()
                    self._timer = None
            elif timer is None or self._timer_at != deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(deadline, self._expire)
                self._timer_at = deadline
            fut: asyncio.Future[bool] = loop.create_future()
            self._waiter = fut
            try:
                put = await fut
            finally:
                if self._waiter is fut:
                    self._waiter = None
            if not put:
                return self._pop()

    def _expire(self) -> None:
        """The deadline timer fired: wake the parked getter with False (nothing put)."""
        self._timer = None
        w = self._waiter
        if w is not None and not w.done():
            self._waiter = None
            w.set_result(False)

    def cancel_timer(self) -> None:
        """Drop the armed deadline timer (the stage is done with this inbox)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def has_interrupt_after(self, epoch: int) -> bool:
        """An Interrupt for a newer epoch is queued (a send may be abandoned)."""
        return any(isinstance(f, Interrupt) and f.epoch > epoch for f in self._sys)

    def stats(self) -> dict[str, int]:
        return {
            "dropped": self.dropped,
            "sys_dropped": self.sys_dropped,
            "up_dropped": self.up_dropped,
            "sys_over": self.sys_over,
            "up_over": self.up_over,
            "max_queued": self.max_queued,
        }


class EpochWatch:
    """The newest epoch decided by the TurnDriver (the sole epoch authority)."""

    __slots__ = ("latest",)

    def __init__(self) -> None:
        self.latest = 0

    def bump(self, epoch: int) -> None:
        if epoch > self.latest:
            self.latest = epoch

    def stale(self, epoch: int) -> bool:
        return epoch < self.latest


class TaskOwner:
    """Owns every asyncio task of one call; ``close()`` ends them all.

    Invariants: a task is tracked from ``spawn`` until it ends; ``stage_of`` is
    known for every tracked task spawned by a stage or from inside one (else
    ""); ``on_failure`` is called once per task that failed, from the task's
    done callback (so it must not block: it may only schedule work)."""

    __slots__ = ("name", "_tasks", "_stage", "spawned", "on_failure")

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stage: dict[asyncio.Task[Any], str] = {}
        self.spawned = 0
        self.on_failure: Callable[[asyncio.Task[Any], str, BaseException], None] | None = None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, stage: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of the call. ``stage``: the stage it belongs to; None:
        the stage of the task spawning it (a helper belongs to its stage)."""
        if stage is None:
            cur = asyncio.current_task()
            stage = self._stage.get(cur, "") if cur is not None else ""
        t = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(t)
        if stage:
            self._stage[t] = stage
        t.add_done_callback(self._done)
        self.spawned += 1
        return t

    def stage_of(self, t: asyncio.Task[Any]) -> str:
        return self._stage.get(t, "")

    def _done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        stage = self._stage.pop(t, "")
        if t.cancelled():
            return
        exc = t.exception()
        if exc is None:
            return
        hook = self.on_failure
        if hook is None:
            log.error("task %s failed", t.get_name(), exc_info=exc)
            return
        try:
            hook(t, stage, exc)
        except Exception:  # the hook is the supervisor: never let it break the loop's callback
            log.exception("task %s failed and its failure handler failed too", t.get_name())

    def live(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    def of_stages(self, stages: set[str]) -> list[asyncio.Task[Any]]:
        """The live tasks attributed to any of ``stages``."""
        return [t for t in self._tasks if not t.done() and self._stage.get(t, "") in stages]

    async def close(self, timeout: float = 1.0) -> int:  # noqa: ASYNC109
        """Cancel every task and wait for them (bounded). Returns how many did not end."""
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=timeout)
            return len(pending)
        return 0


async def cancel_and_join(task: asyncio.Task[Any] | None, timeout: float) -> bool:  # noqa: ASYNC109
    """Cancel ``task`` and wait for it to end (bounded). True if it ended."""
    if task is None or task.done():
        return True
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=timeout)
    return bool(done)


class Stage:
    """One pipeline stage: a task running :meth:`process` for each frame.

    Every stage is built the same way: ``Stage(call, cfg, inbox, *own)``; the
    base keeps the call's clock, epoch watch and task owner as its own
    attributes (no hop through the context on the hot path) and leaves the
    typed ``cfg`` to the subclass (the base stage, a pass-through, has none).
    Subclasses set ``DROP_STALE``; they call :meth:`send` to pass frames on
    (awaiting back-pressure on a lossless downstream data lane) and
    :meth:`guarded_send` from helper tasks.
    """

    DROP_STALE = False

    def __init__(self, call: CallContext, cfg: object, inbox: Inbox) -> None:
        self.name = inbox.name
        self.call = call
        self.inbox = inbox
        self.clock = call.clock
        self.watch = call.watch
        self.tasks = call.tasks
        self.next: Stage | None = None
        self.epoch = 0  # newest epoch seen (DropStale)
        self.deadline: float | None = None
        self.stale_dropped = 0
        self.processed = 0
        self.stopped = False
        self._task: asyncio.Task[Any] | None = None

    # -- wiring
    def pipe(self, nxt: Stage) -> Stage:
        self.next = nxt
        return nxt

    def start(self) -> None:
        self._task = self.tasks.spawn(self.run(), self.name, stage=self.name)

    @property
    def task(self) -> asyncio.Task[Any] | None:
        return self._task

    # -- loop
    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.inbox.cancel_timer()  # no deadline timer outlives the stage's task

    async def _run(self) -> None:
        inbox = self.inbox
        while True:
            frame = await inbox.get(self.deadline)
            if frame is None:
                self.deadline = None
                await self.on_deadline(self.clock.now())
                continue
            if self.DROP_STALE and frame.LANE == DATA:
                ep = frame.epoch
                if ep < self.epoch:
                    self.stale_dropped += 1
                    continue
                if ep > self.epoch:
                    await self.on_new_epoch(ep)
                    self.epoch = ep
            elif isinstance(frame, Interrupt) and frame.epoch > self.epoch:
                self.epoch = frame.epoch
            self.processed += 1
            await self.process(frame)
            if isinstance(frame, Stop):
                self.stopped = True
                await self.on_stop()
                return
            if self.deadline is not None and self.deadline <= self.clock.now():
                self.deadline = None
                await self.on_deadline(self.clock.now())

    async def process(self, frame: PipelineFrame) -> None:
        await self.send(frame)

    async def on_deadline(self, now: float) -> None:
        """The stage's deadline passed (level-triggered: compare state with ``now``)."""

    async def on_new_epoch(self, epoch: int) -> None:
        """A data frame of a newer epoch arrived without an Interrupt (DropStale only)."""

    async def on_stop(self) -> None:
        """After Stop was processed and forwarded: end helper tasks."""

    def arm(self, at: float | None) -> None:
        """Set the deadline to the earliest of the current one and ``at``."""
        if at is None:
            return
        if self.deadline is None or at < self.deadline:
            self.deadline = at

    # -- sending
    async def send(self, frame: PipelineFrame) -> None:
        nxt = self.next
        if nxt is None:
            return
        if frame.LANE == DATA:
            await nxt.inbox.put(frame)
        else:
            nxt.inbox.put_nowait(frame)

    def send_nowait(self, frame: PipelineFrame) -> bool:
        nxt = self.next
        if nxt is None:
            return False
        return nxt.inbox.put_nowait(frame)

    async def guarded_send(self, frame: PipelineFrame) -> bool:
        """Send from a helper task: dropped (False) if the frame's epoch is already
        stale by the driver's decision, checked right before the put."""
        if self.watch.stale(frame.epoch):
            self.stale_dropped += 1
            return False
        nxt = self.next
        if nxt is None:
            return False
        if frame.LANE == DATA and not nxt.inbox.lossy:
            while len(nxt.inbox._data) >= nxt.inbox.data_cap:
                nxt.inbox._space.clear()
                await nxt.inbox._space.wait()
                if self.watch.stale(frame.epoch):
                    self.stale_dropped += 1
                    return False
        return nxt.inbox.put_nowait(frame)

    def stats(self) -> dict[str, int]:
        d = {"processed": self.processed, "stale_dropped": self.stale_dropped}
        d.update(self.inbox.stats())
        return d
