"""The call's events for the caller's side: transcript lines, turn latencies, tool calls.

Owns :class:`CallEvents`, made by the actor only for a call whose ``CallStart``
said ``events`` (a native client's ``"events": true``, the browser playground:
docs/PROTOCOL.md "Call events"); a call without it has none and pays nothing.
It sends :class:`ipc.frames.CallEvent` frames to the gateway through the
call's link (a NOBLOCK send: a full socket drops the frame, and the link counts
it), which forwards each as a ``call_event`` message. The events:

* ``user_turn`` ``{epoch, text}``: the caller's final transcript of a turn, when the
  runner pushes it (the observer seam, :mod:`brisvox.agent.pipeline.llm.observer`);
* ``bot_turn`` ``{epoch, text}``: what the caller heard of the bot's answer: at the
  first look (every :data:`POLL_S`) that finds the call idle again with no barge-in since the last
  one (the answer played whole, no tool call open: all of it was heard), else when the turn settles (the played-text
  cut applied: before the caller's next turn, or at the hang-up); once per answer;
* ``turn_metrics`` ``{epoch, voice_to_voice_ms, end_of_turn_ms, llm_first_token_ms,
  tts_first_audio_ms}``: once per turn, at the first look after its first audio went
  out (the timeline's marks; a figure it lacks is null);
* ``tool_call`` ``{epoch, tool, outcome}``: one tool call's outcome, as recorded.

Invariants:

* Nothing here blocks or raises into the call: the observer calls and
  :meth:`CallEvents.poll` are synchronous and O(1) per look (the newest turns only);
  the one task that looks every :data:`POLL_S` is the call's (its TaskOwner ends it at
  the hang-up), sleeps on the call's clock and stops, logged once, if a look fails.
* Bounded: at most :data:`MAX_EVENTS` events per call (the rest are dropped and
  counted, ``dropped``); a text is cut to :data:`MAX_TEXT` characters.
* A tool call carries its name and outcome only, never its arguments or its result.
* The observer the call already has (the agent link's) keeps every effect it had:
  the tap passes each call through and only listens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brisvox.agent.conversation.context import AssistantMessage, UserMessage
from ipc.frames import CallEvent, Frame

if TYPE_CHECKING:
    from brisvox.agent.conversation.context import Context, Message
    from brisvox.agent.pipeline.llm.observer import CallObserver
    from brisvox.agent.tool_engine.registry import ToolSpec

log = logging.getLogger("brisvox.agent.call_events")

MAX_EVENTS = 2000
MAX_TEXT = 1000
POLL_S = 0.2  # how often the turn figures and an answer played whole are looked for


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1000.0, 1)


class CallEvents:
    """One call's event source (see the module docstring)."""

    def __init__(self, call_id: str, send: Callable[[Frame], None], actor: Any) -> None:
        self.call_id = call_id
        self.send = send
        self.actor = actor
        self.timeline = actor.timeline
        self.tap: _Tap | None = None
        self.interrupts = 0  # the actor's barge-ins when the last bot_turn went out
        self.sent = 0
        self.dropped = 0
        self._measured = -1  # the newest epoch whose turn_metrics went out

    def emit(self, name: str, **fields: Any) -> None:
        if self.sent >= MAX_EVENTS:
            self.dropped += 1
            return
        self.sent += 1
        self.send(CallEvent(call_id=self.call_id, name=name, data=fields))

    def install(self, actor: Any) -> None:
        """Tap the actor's runner (after the agent link bound itself, if it did) and start
        looking (a task of the call)."""
        runner = getattr(actor, "runner", None)
        if runner is not None and hasattr(runner, "observer"):
            self.tap = runner.observer = _Tap(runner.observer, self)
        actor.tasks.spawn(self._look(actor.clock), "call-events")

    async def _look(self, clock: Any) -> None:
        while True:
            await clock.sleep(POLL_S)
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the call goes on without its events
                log.exception("call %s: call events stopped", self.call_id)
                return

    def poll(self) -> None:
        """One look: the turn_metrics of the turns whose first audio is out,
        and the bot's answer once the call is idle again (played whole)."""
        tap = self.tap
        if tap is not None and self.actor.idle() and self.actor.interrupts() == self.interrupts:
            ctx = self.actor.runner.ctx
            if not ctx.has_open_tool_calls():
                tap.heard(ctx)
        turns = self.timeline.turns
        if not turns:
            return
        fresh = []
        for t in reversed(turns.values()):
            if t.epoch <= self._measured:
                break
            if t.first_audio_out is not None:
                fresh.append(t)
            if len(fresh) >= 4:
                break
        for t in reversed(fresh):
            self._measured = max(self._measured, t.epoch)
            first = t.first_round()
            ttft = _ms(first.request, first.first_token) if first is not None else None
            self.emit("turn_metrics", epoch=t.epoch, voice_to_voice_ms=_ms(t.speech_end, t.first_audio_out),
                      end_of_turn_ms=_ms(t.speech_end, t.turn_end), llm_first_token_ms=ttft,
                      tts_first_audio_ms=_ms(t.first_token(), t.first_audio_out))

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "dropped": self.dropped}


class _Tap:
    """A :class:`~brisvox.agent.pipeline.llm.observer.CallObserver` that passes every call to
    ``inner`` (the agent link's, or none: then the runner's defaults) and emits the events."""

    def __init__(self, inner: CallObserver | None, events: CallEvents) -> None:
        self.inner = inner
        self.events = events
        self._epoch = 0
        self._bot_from = 0  # the context index after the last settled bot turn

    def on_user_turn(self, epoch: int, text: str) -> None:
        if self.inner is not None:
            self.inner.on_user_turn(epoch, text)
        self._epoch = epoch
        self.events.emit("user_turn", epoch=epoch, text=text[:MAX_TEXT])

    def on_settled(self, ctx: Context) -> list[Message]:
        notes = self.inner.on_settled(ctx) if self.inner is not None else []
        self.heard(ctx, len(notes))
        return notes

    def heard(self, ctx: Context, notes: int = 0) -> None:
        """The bot's messages since the last bot_turn, as one (``notes``: system messages the
        settle appends after them)."""
        msgs = ctx.messages
        if self._bot_from > len(msgs):  # a flow swapped the context in
            self._bot_from = max((i + 1 for i, x in enumerate(msgs) if isinstance(x, UserMessage)), default=0)
        heard = [x.text.strip() for x in msgs[self._bot_from:] if isinstance(x, AssistantMessage) and x.text.strip()]
        self._bot_from = len(msgs) + notes
        self.events.interrupts = self.events.actor.interrupts()
        if heard:
            self.events.emit("bot_turn", epoch=self._epoch, text=" ".join(heard)[:MAX_TEXT])

    def on_tool_outcome(self, epoch: int, call_id: str, tool: str, outcome: str) -> None:
        if self.inner is not None:
            self.inner.on_tool_outcome(epoch, call_id, tool, outcome)
        self.events.emit("tool_call", epoch=epoch, tool=tool[:64], outcome=outcome[:64])

    def offered(self, specs: list[ToolSpec]) -> list[ToolSpec]:
        return specs if self.inner is None else self.inner.offered(specs)

    def screened(self, name: str) -> bool:
        return self.inner is not None and self.inner.screened(name)
