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

What the opening SAYS (an IVR menu and a voicemail greeting have the same cadence; only the
words tell them apart): with ``[amd] transcripts`` (default on) and a :class:`Transcriber`
given (:meth:`CallAmd.listen_with`; the agent process gives :class:`JobTranscriber`, the local
Whisper of the call's worker), the ``AmdStart`` says ``transcripts`` (the detector holds a
cadence "machine" until its deadline for a menu cue) and, while the screen is detecting, the
opening from the answer to now is transcribed :data:`HEAR_FIRST_S` after the answer, then
:data:`HEAR_EVERY_S` after each job is done (one job at a time, each bounded by
:data:`HEAR_TIMEOUT_S`) and each text goes to the worker as an ``AmdHear``.
The worker's detector makes the verdict from it (a menu cue: ``ivr``; a greeting cue:
``machine``): the verdict has one source, the detector, and the actor's deadline. The chain's
own STT is not used: the pump keeps the screened audio from it (its text would open turns),
and a cloud STT's account should not pay for screening. A worker without the Whisper model
(``unsupported``) stops the transcribing for the call: the detector then has cadence only.

Invariants: while :attr:`screening` the pump keeps the caller's audio and VAD events from the
chain (the actor asks it); the workers' verdict, beep and greeting-end events are fed to the
screen in order; the timer and the transcribing task never outlive the call (``close``) nor,
for the transcribing, the detecting; a verdict reaches the call's events (``amd`` CallEvent)
and the record's ``amd`` section.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from brisvox.agent.host.amd_screen import (
    Action,
    AmdConfig,
    AmdScreen,
    Converse,
    Detect,
    HangUp,
    Phase,
    SpeakMessage,
)
from brisvox.clock import Clock
from brisvox.providers.local_whisper import stt_job
from ipc.frames import AmdHear, AmdStart, ErrorReply, SttJobResult
from ipc.tick_events import AmdBeepEvent, AmdGreetingEndEvent, AmdVerdictEvent

log = logging.getLogger("brisvox.agent.amd")

HEAR_FIRST_S = 1.2  # the first transcription: the opening's first words (a menu's "thank you for calling")
HEAR_EVERY_S = 0.4  # between the end of one transcription of the opening and the next
HEAR_TIMEOUT_S = 2.0  # one transcription at most (a slower one is dropped: the deadline is near)
HEAR_MIN_SAMPLES = 8000  # 0.5 s of in16: less than that holds no cue
HEAR_MAX_SAMPLES = 7 * 16_000  # the newest 7 s (the worker's in16 ring holds 8 s by default)

# The text of in16 [start, end): "" for none, None when it cannot be had at all (no model)
Transcriber = Callable[[int, int], Awaitable[str | None]]


class JobTranscriber:
    """The local STT of the call's worker (Whisper, an ``SttJob``) as a :data:`Transcriber`:
    a refusal or a timeout is "" (this time), ``unsupported`` (no model there) is None."""

    __slots__ = ("channel", "call_id", "timeout", "failed")

    def __init__(self, channel: Any, call_id: str, timeout: float = HEAR_TIMEOUT_S) -> None:
        self.channel = channel  # brisvox.providers.worker_jobs.JobChannel
        self.call_id = call_id
        self.timeout = timeout
        self.failed = 0

    async def __call__(self, start: int, end: int) -> str | None:
        reply = await stt_job(self.channel, self.call_id, start, end, self.timeout, self.timeout, max_tokens=32)
        if isinstance(reply, SttJobResult):
            return reply.text
        self.failed += 1
        return None if isinstance(reply, ErrorReply) and reply.kind == "unsupported" else ""


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

    __slots__ = ("host", "clock", "screen", "_timer", "_closed", "_reported", "_transcriber", "_hearing", "heard",
                 "hear_failed")

    def __init__(self, host: AmdHost, cfg: AmdConfig, clock: Clock) -> None:
        self.host = host
        self.clock = clock
        self.screen = AmdScreen(cfg)
        self._timer: asyncio.Task[None] | None = None
        self._closed = False
        self._reported = False  # the verdict went to the call's events
        self._transcriber: Transcriber | None = None
        self._hearing: asyncio.Task[None] | None = None
        self.heard = 0  # AmdHear frames sent
        self.hear_failed = 0  # transcriptions that gave nothing in time

    def listen_with(self, transcriber: Transcriber) -> None:
        """The STT that transcribes the screened opening (before the answer; with ``[amd]
        transcripts`` off it is never used)."""
        self._transcriber = transcriber

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
        for t in (self._timer, self._hearing):
            if t is not None and not t.done():
                t.cancel()

    # -- internals
    def _apply(self, acts: list[Action]) -> None:
        h = self.host
        for a in acts:
            match a:
                case Detect(max_wait_ms=ms):
                    pos = h.in16_pos()
                    hear = self._transcriber is not None and self.screen.cfg.transcripts
                    h.to_worker(AmdStart(call_id=h.call_id, in16_pos=pos, max_wait_ms=ms,
                                         leave_message=self.screen.cfg.on_machine == "leave_message",
                                         transcripts=hear))
                    if hear and not self._closed:
                        self._hearing = h.spawn(self._hear(pos), f"amd-hear-{h.call_id}")
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

    async def _hear(self, start: int) -> None:
        """While detecting: the opening so far transcribed, its text to the worker's detector."""
        assert self._transcriber is not None
        last = start
        wait = HEAR_FIRST_S  # each job costs about the same (Whisper's encoder pads to 30 s): few, well placed
        while not self._closed and self.screen.phase is Phase.DETECTING:
            await self.clock.sleep(wait)
            wait = HEAR_EVERY_S
            end = self.host.in16_pos()
            if end - start < HEAR_MIN_SAMPLES or end <= last:
                continue
            text: str | None = ""
            try:
                async with self.clock.timeout(HEAR_TIMEOUT_S):
                    text = await self._transcriber(max(start, end - HEAR_MAX_SAMPLES), end)
            except TimeoutError:
                pass
            if text is None:  # no STT there: cadence alone
                log.info("call %s: amd has no transcripts (the worker has no local STT)", self.host.call_id)
                return
            last = end
            if not text.strip():
                self.hear_failed += 1
            elif not self._closed and self.screen.phase is Phase.DETECTING:
                self.heard += 1
                self.host.to_worker(AmdHear(call_id=self.host.call_id, text=text[:2000], end_pos=end))
