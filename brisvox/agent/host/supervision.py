"""Stage supervision: a stage that dies of an unexpected exception ends its call on purpose.

Owns what happens to a call when one of its tasks fails: a stage's own task,
or a helper spawned through the call's
:class:`~brisvox.agent.pipeline.stage.base.TaskOwner` from inside a stage (the
TaskOwner attributes every task to the stage that spawned it). Without this
a failed stage leaves a silent call: the caller hears nothing until they
hang up.

The end of a failed call, in order (:class:`StageSupervisor`):

1. One ERROR log line (call id, stage, exception, traceback), the failure
   kept for the call record (:class:`StageFailure`) and counted by the host
   (``on_stage_failure``: the agent process's ``stage_failures`` stats, per
   stage). Caller audio and DTMF are discarded from then on.
2. Every stage upstream of the TTS stage, and their helpers, are cancelled
   (bounded join), so nothing starts another response and no barge-in can
   cut what follows.
3. When the output path still works (the failed stage is neither the TTS
   stage nor the tts ring writer, :data:`OUTPUT_PATH`, and both still run)
   the apology (:attr:`SupervisionConfig.apology`) is spoken as a NEW epoch
   through the barge-in path: the watch is bumped, ``CallContext.clear``
   (book first, then Clear to the gateway and TtsCut to the worker), an
   Interrupt into the TTS stage, then the text as one round. Its end is the
   BotEnded of that epoch (the end mark played), which the upstream router
   now delivers here; the wait is bounded by ``apology_timeout``. When the
   output path is the failed part the call hangs up at once.
4. ``CallActor.hangup(stage_failed:<stage>)``: Stop to the stages still
   running, every task of the call ended (bounded), the record built; then
   the host is told (``on_hangup``; without one the actor sends Hangup
   with the reason to the gateway on its link).

Invariants: at most one end per call (the first failure decides; later
ones, e.g. while the call is ending, are counted in ``later`` and logged as
one WARNING line each, without a traceback); a failure after the hang-up
began changes nothing but the record; a hang-up from elsewhere (the caller
left during the apology) cancels the supervisor's end and is the call's end
instead; no other call is touched (every part here is the call's own).
With ``SupervisionConfig.enabled`` False the TaskOwner only logs failures,
as a call without supervision would.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.pipeline_frames import (
    BotEnded,
    BotStarted,
    Interrupt,
    LlmResponseEnded,
    LlmResponseStarted,
    TextChunk,
)

if TYPE_CHECKING:
    from brisvox.agent.host.actor import CallActor

log = logging.getLogger("brisvox.agent.supervision")

STAGE_FAILED = "stage_failed:"  # the reason prefix; the gateway reads it too (brisvox/gateway/core/leg.py)
OUTPUT_PATH = frozenset({"tts", "out"})  # the stages the apology is spoken through
DEFAULT_APOLOGY = "Sorry, something went wrong on our side. Please call again."
UNKNOWN_STAGE = "call"  # a failed task no stage spawned


@dataclass(frozen=True, slots=True)
class SupervisionConfig:
    """``enabled``: failures end the call (False: only logged); ``apology``: spoken
    before the hang-up when the output path works ("": none); ``apology_timeout``:
    seconds from the decision to the apology's end mark at most; ``join_timeout``:
    seconds to wait for cancelled tasks."""

    enabled: bool = True
    apology: str = DEFAULT_APOLOGY
    apology_timeout: float = 6.0
    join_timeout: float = 1.0


@dataclass(slots=True)
class StageFailure:
    """What the call record says about the failure that ended the call.

    ``apology``: "played" (its end mark came back), "mark_timeout", "no_audio"
    (the TTS produced nothing), "timeout" (not played within the bound),
    "skipped" (the output path failed), "none" (no apology configured), "cut"
    (the call ended otherwise first), "" (not decided yet)."""

    stage: str
    task: str
    error: str
    at: float
    apology: str = ""
    later: int = 0

    def as_record(self) -> dict[str, Any]:
        return {"stage": self.stage, "task": self.task, "error": self.error, "apology": self.apology,
                "later_failures": self.later}


# -- the pure parts ---------------------------------------------------------------------------


def failure_reason(stage: str) -> str:
    """The hang-up reason of a call ended by ``stage``'s failure."""
    return f"{STAGE_FAILED}{stage or UNKNOWN_STAGE}"


def failed_stage(reason: str) -> str | None:
    """The stage a hang-up reason names, or None for any other reason."""
    return reason[len(STAGE_FAILED):] or None if reason.startswith(STAGE_FAILED) else None


def unexpected_exception(task: asyncio.Task[Any]) -> BaseException | None:
    """The exception a finished task died of; None for a cancellation or a normal end."""
    if not task.done() or task.cancelled():
        return None
    return task.exception()


def speaks_apology(stage: str, output_alive: bool, apology: str) -> bool:
    """The apology is spoken only through a working output path, and only if there is one."""
    return bool(apology.strip()) and output_alive and stage not in OUTPUT_PATH


def apology_epoch(*epochs: int) -> int:
    """An epoch above every epoch of the call so far (the apology's)."""
    return max((0, *epochs)) + 1


def task_label(task: asyncio.Task[Any], owner: str) -> str:
    """The task's name without the call's ``call:<id>:`` prefix."""
    name = task.get_name()
    return name[len(owner) + 1:] if name.startswith(owner + ":") else name


# -- the supervisor ---------------------------------------------------------------------------


class StageSupervisor:
    """The stage supervision of one call actor (see the module docstring)."""

    __slots__ = ("actor", "cfg", "failure", "_task", "_ends")

    def __init__(self, actor: CallActor, cfg: SupervisionConfig) -> None:
        self.actor = actor
        self.cfg = cfg
        self.failure: StageFailure | None = None
        self._task: asyncio.Task[None] | None = None
        self._ends: Inbox | None = None
        if cfg.enabled:
            actor.tasks.on_failure = self.task_failed

    @property
    def ending(self) -> bool:
        """The supervisor is ending the call (the apology, the hang-up)."""
        return self._task is not None and not self._task.done()

    def task_failed(self, task: asyncio.Task[Any], stage: str, exc: BaseException) -> None:
        """The TaskOwner's failure hook (a done callback: decides, then schedules)."""
        a = self.actor
        stage = stage or UNKNOWN_STAGE
        label = task_label(task, a.tasks.name)
        if self.failure is not None:
            self.failure.later += 1
            log.warning("call %s: stage %s failed too (%s in task %s) while the call ends",
                        a.call_id, stage, type(exc).__name__, label)
            return
        self.failure = StageFailure(stage, label, type(exc).__name__, a.clock.now())
        ending = a.hung_up
        log.error("call %s: stage %s failed: %s: %s (task %s)%s", a.call_id, stage, type(exc).__name__, exc, label,
                  "" if ending else "; ending the call", exc_info=exc)
        if a.on_stage_failure is not None:
            a.on_stage_failure(stage)
        if ending:
            self.failure.apology = "cut"
            return
        a.close_input()
        self._task = asyncio.get_running_loop().create_task(self._end(), name=f"{a.tasks.name}:supervisor")

    async def _end(self) -> None:
        a = self.actor
        f = self.failure
        assert f is not None
        reason = failure_reason(f.stage)
        try:
            names = [s.name for s in a.stages]
            speaker = a.speaker
            upstream = set(names[: names.index((speaker or a.out).name)])
            await self._cancel(upstream)
            await self._stop_failed(f.stage)
            output_alive = speaker is not None and all(s.task is not None and not s.task.done()
                                                       for s in (speaker, a.out))
            if speaks_apology(f.stage, output_alive, self.cfg.apology):
                f.apology = await self._apologize()
            else:
                f.apology = "none" if not self.cfg.apology.strip() else "skipped"
        except Exception:  # the end itself must never leave the call running
            log.exception("call %s: the supervised end failed; hanging up", a.call_id)
        if a.hung_up:
            return  # ended otherwise meanwhile
        try:
            await a.hangup(reason)
        except Exception:  # the host must still hear of the end
            log.exception("call %s: the hang-up after the failure failed", a.call_id)
        if a.on_hangup is not None:
            a.on_hangup(reason)
        else:
            from ipc.frames import Hangup

            a.link.to_gateway(Hangup(call_id=a.call_id, reason=reason))

    async def _cancel(self, stages: set[str]) -> None:
        """Cancel the tasks of ``stages`` (their own and their helpers), bounded join."""
        a = self.actor
        tasks = [s.task for s in a.stages if s.name in stages and s.task is not None and not s.task.done()]
        tasks += [t for t in a.tasks.of_stages(stages) if t not in tasks]
        for t in tasks:
            t.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.cfg.join_timeout)
            if pending:
                log.warning("call %s: %d task(s) ignored their cancellation", a.call_id, len(pending))

    async def _stop_failed(self, stage: str) -> None:
        """A stage whose own task died never ran ``on_stop``: run it (bounded, best
        effort) so its provider session is closed."""
        st = next((s for s in self.actor.stages if s.name == stage), None)
        if st is None or st.task is None or not st.task.done() or st.task.cancelled() or st.stopped:
            return
        try:
            async with asyncio.timeout(self.cfg.join_timeout):
                await st.on_stop()
        except (Exception, TimeoutError) as e:  # noqa: BLE001 - the stage is already broken
            log.warning("call %s: on_stop of the failed stage %s: %s", self.actor.call_id, stage, type(e).__name__)

    async def _apologize(self) -> str:
        """Speak the apology as a new epoch; its outcome (see :class:`StageFailure`)."""
        a = self.actor
        text = self.cfg.apology.strip()
        epoch = apology_epoch(a.watch.latest, a.ledger.epoch, a.decided_epoch(), a.out.floor, a.out.tx_epoch, *(s.epoch for s in a.stages))
        ends = Inbox("supervisor", 4, sys_cap=8)
        self._ends = ends
        a.call.upstream.bind((BotStarted, BotEnded), ends)  # the driver is gone: its frames come here
        now = a.clock.now()
        a.watch.bump(epoch)  # late sends of every older epoch are dropped from now on
        a.call.clear(epoch, now)  # the barge-in fast path: book, Clear, TtsCut
        tts = a.speaker
        assert tts is not None  # speaks_apology: only through a TTS stage
        tts.inbox.put_nowait(Interrupt(epoch, epoch - 1, now))
        try:
            async with a.clock.timeout(self.cfg.apology_timeout):
                for frame in (LlmResponseStarted(epoch, 0), TextChunk(epoch, 0, text, last=True),
                              LlmResponseEnded(epoch)):
                    await tts.inbox.put(frame)
                while True:
                    got = await ends.get()
                    if isinstance(got, BotEnded) and got.epoch == epoch:
                        return "played" if got.reason == "mark" else got.reason
        except TimeoutError:
            log.warning("call %s: the apology did not play within %.1f s", a.call_id, self.cfg.apology_timeout)
            return "timeout"

    async def aclose(self) -> None:
        """The call ends otherwise: cancel the supervised end (not from inside it)."""
        t = self._task
        if t is None or t.done() or t is asyncio.current_task():
            return
        if self.failure is not None and not self.failure.apology:
            self.failure.apology = "cut"
        t.cancel()
        await asyncio.wait([t], timeout=self.cfg.join_timeout)
