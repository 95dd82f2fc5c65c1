"""CallAmd: a call actor's answering-machine screening, run (the decisions are AmdScreen's).

Held by :class:`~brisvox.agent.host.actor.CallActor` when the agent file has ``[amd] enabled``
and the call was dialled (``transport_ids.direction`` or the ``direction`` parameter is
``outbound``). Owns the call's :class:`~brisvox.agent.host.amd_screen.AmdScreen`, the one timer
task of its deadlines, and the doing of its actions through the :class:`AmdHost` the actor
gives it:

* ``Detect`` -> an ``AmdStart`` to the call's worker at the in16 position of the answer;
* ``Converse`` -> the verdict into the model's context (a system note, unless ``human``), the
  flow moved to the action's node at the first turn (``node:<name>``), and the chain told
  the call is answered (the greeting waiting for it is spoken: the agent
  speaks first only now);
* ``SpeakMessage`` -> the chain answered and the message spoken as the bot's turn, the
  caller's audio still kept from the chain (a recording voicemail cannot barge in), then the
  hang-up once it played;
* ``HangUp`` -> the hang-up (``amd_<verdict>``, ``amd_message_left``).

Invariants: while :attr:`screening` the pump keeps the caller's audio and VAD events from the
chain (the actor asks it); the workers' verdict, beep and greeting-end events are fed to the
screen in order; the timer never outlives the call (``close``); a verdict reaches the call's
events (``amd`` CallEvent) and the record's ``amd`` section.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from brisvox.agent.host.amd_screen import (
    Action,
    AmdConfig,
    AmdScreen,
    Converse,
    Detect,
    HangUp,
    SpeakMessage,
)
from brisvox.clock import Clock
from ipc.frames import AmdStart
from ipc.tick_events import AmdBeepEvent, AmdGreetingEndEvent, AmdVerdictEvent

log = logging.getLogger("brisvox.agent.amd")


class AmdHost(Protocol):
    """What the screening needs of its actor."""

    call_id: str

    def in16_pos(self) -> int: ...
    def spawn(self, coro: Any, name: str) -> Any: ...
    def to_worker(self, frame: Any) -> None: ...
    def converse(self, note: str, node: str) -> None: ...
    def speak(self, text: str) -> None: ...
    def hang_up_after_playout(self, reason: str) -> None: ...
    def amd_event(self, data: Mapping[str, Any]) -> None: ...


def dialled(transport_ids: Mapping[str, str], params: Mapping[str, Any]) -> bool:
    """The call was placed by brisvox (a SIP dial, a Twilio calls create)."""
    return transport_ids.get("direction") == "outbound" or params.get("direction") == "outbound"


def verdict_note(verdict: str, confidence: float) -> str:
    """What the model is told of a verdict it converses after (``continue`` on a non-human)."""
    what = {"machine": "an answering machine (a voicemail greeting)", "ivr": "an automated phone menu (IVR)",
            "fax": "a fax machine", "uncertain": "uncertain: it may be a person or a machine"}.get(verdict, verdict)
    return (f"Answering-machine detection on this outbound call: {what} "
            f"(confidence {confidence:.2f}). Act accordingly.")


class CallAmd:
    """See the module docstring."""

    __slots__ = ("host", "clock", "screen", "_timer", "_closed", "_reported")

    def __init__(self, host: AmdHost, cfg: AmdConfig, clock: Clock) -> None:
        self.host = host
        self.clock = clock
        self.screen = AmdScreen(cfg)
        self._timer: asyncio.Task[None] | None = None
        self._closed = False
        self._reported = False  # the verdict went to the call's events

    @property
    def screening(self) -> bool:
        return self.screen.screening or self.screen.answered_at is None

    def answered(self) -> None:
        """The gateway says the dialled call is answered (its first answer only counts)."""
        self._apply(self.screen.answered(self.clock.now()))

    def on_event(self, ev: AmdVerdictEvent | AmdBeepEvent | AmdGreetingEndEvent, at: float) -> None:
        match ev:
            case AmdVerdictEvent():
                acts = self.screen.verdict(ev.verdict, ev.confidence, at, {"rule": ev.rule, "audio_ms": ev.ms}
                                           if ev.rule else {"audio_ms": ev.ms})
            case AmdBeepEvent():
                acts = self.screen.beep(at)
            case AmdGreetingEndEvent():
                acts = self.screen.greeting_ended(at)
        self._apply(acts)

    def message_played(self) -> None:
        self._apply(self.screen.message_played(self.clock.now()))

    def record(self) -> dict[str, Any]:
        return self.screen.record()

    def close(self) -> None:
        self._closed = True
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()

    # -- internals
    def _apply(self, acts: list[Action]) -> None:
        h = self.host
        for a in acts:
            match a:
                case Detect(max_wait_ms=ms):
                    h.to_worker(AmdStart(call_id=h.call_id, in16_pos=h.in16_pos(), max_wait_ms=ms,
                                         leave_message=self.screen.cfg.on_machine == "leave_message"))
                case Converse(verdict=v, confidence=c, node=node):
                    self._verdict_event()
                    h.converse("" if v == "human" else verdict_note(v, c), node)
                case SpeakMessage(text=text):
                    self._verdict_event()
                    h.speak(text)
                    h.hang_up_after_playout("amd_message_left")
                case HangUp(reason=reason):
                    self._verdict_event()
                    h.hang_up_after_playout(reason)
        if not acts:
            self._verdict_event()  # a machine whose beep is awaited: the verdict is known already
        self._arm()

    def _verdict_event(self) -> None:
        if self.screen.verdict_ and not self._reported:
            self._reported = True
            log.info("call %s: amd %s (%.2f, %s) -> %s", self.host.call_id, self.screen.verdict_,
                     self.screen.confidence, self.screen.source, self.screen.action_)
            self.host.amd_event(self.record())

    def _arm(self) -> None:
        if self._closed or self.screen.deadline is None:
            return
        if self._timer is None or self._timer.done():
            self._timer = self.host.spawn(self._run_timer(), f"amd-{self.host.call_id}")

    async def _run_timer(self) -> None:
        while not self._closed and (due := self.screen.deadline) is not None:
            delay = due - self.clock.now()
            if delay > 0:
                await self.clock.sleep(delay)
                continue
            self._apply(self.screen.tick(self.clock.now()))
