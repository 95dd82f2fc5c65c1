"""CallConsult: a warm transfer's consult leg, hosted (the decisions are ConsultScreen's).

A call whose ``CallStart.consult_for`` is set runs in consult mode: the agent process builds
its actor as usual (the agent's STT and TTS, the consult agent's ``[warm_transfer]``
settings) but with no conversation: the actor's greeting is the opening (the summary and,
with ``accept = "confirm"``, the prompt) and its LLM stage is this leg's :class:`ConsultEar`,
which hears each of the person's turns, feeds it to the screen and answers with the screen's
short line (or the prompt again when the answer was neither yes nor no) without any model.
DTMF goes to the screen directly (never to the chain). The verdict leaves as ConsultVerdict,
once; after a decline the leg hangs up once the reply played, after an accept it waits for
the gateway's CallEnd(reason="bridged") (it ends quietly then) and hangs up by itself if no
bridge came within :data:`BRIDGE_GRACE_S`.

Invariants: one verdict per leg; nothing is decided before the opening began (a leg that
starts in early media is greeted at its answer, :data:`ANSWER_BOUND_S` at most); every wait
is bounded (the opening's playout by :data:`OPENING_BOUND_S` past its length, the person's
answer by ``verdict_timeout_s``);
the task never outlives the call (:meth:`close`); :meth:`record` is the record's ``consult``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

from brisvox.agent.host.consult_screen import (
    OPENING_BOUND_S,
    ConsultAction,
    ConsultScreen,
    Say,
    Verdict,
    opening_bound_s,
)
from brisvox.agent.host.warm_transfer import WarmConfig, bound_summary
from brisvox.clock import Clock
from brisvox.providers.base import Done, LlmEvent, LlmRequest, TextDelta
from brisvox.providers.llm_stream import GeneratedStream
from ipc.frames import ConsultVerdict

log = logging.getLogger("brisvox.agent.consult")

ANSWER_BOUND_S = 60.0  # a leg started before its answer (early media) waits this long for it
BRIDGE_GRACE_S = 20.0  # an accepted leg not bridged by then hangs up
CONSULT_SUMMARY_MAX = 1000  # the largest summary_max_chars


class ConsultEar:
    """The consult leg's LLM stage: no model; the person's last turn goes to the screen and
    the reply is the screen's line (streamed like any answer)."""

    name = "consult"

    def __init__(self, consult: CallConsult) -> None:
        self.consult = consult

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    def stream(self, request: LlmRequest) -> GeneratedStream:
        return GeneratedStream(self.name, self._events(request))

    async def _events(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        user = [m.text for m in request.messages if m.role == "user"]
        reply = self.consult.heard(user[-1] if user else "")
        words = reply.split(" ") if reply else []
        for i, w in enumerate(words):
            yield TextDelta(w if i == len(words) - 1 else w + " ")
        yield Done("stop")


class CallConsult:
    """See the module docstring. ``send`` puts a frame on the leg's link to the gateway;
    ``hang_up(reason)`` ends the leg once the bot is idle."""

    __slots__ = ("call_id", "consult_for", "cfg", "clock", "screen", "summary", "send", "hang_up", "ear", "actor",
                 "_task", "_said", "_closed", "_sent")

    def __init__(self, call_id: str, consult_for: str, cfg: WarmConfig, summary: str, clock: Clock,
                 send: Callable[[Any], None], hang_up: Callable[[str], None]) -> None:
        self.call_id, self.consult_for, self.cfg, self.clock = call_id, consult_for, cfg, clock
        self.screen = ConsultScreen(cfg.accept, cfg.verdict_timeout_s)
        self.summary = bound_summary(summary, CONSULT_SUMMARY_MAX)  # bounded again: the frame is the process boundary
        self.send, self.hang_up = send, hang_up
        self.ear = ConsultEar(self)
        self.actor: Any = None
        self._task: asyncio.Task[None] | None = None
        self._said = ""  # the screen's line for the turn being answered
        self._closed = False
        self._sent = False

    def parts(self, cfg: Any, providers: Any) -> tuple[Any, Any]:
        """The leg's actor config and providers: the ear as its LLM (no S2S), and neither a
        speculative start nor a window summary (the ear hears each of the person's turns once,
        and only theirs)."""
        from dataclasses import replace

        from brisvox.agent.pipeline.speculation.policy import SpeculationConfig

        cfg = replace(cfg, llm=replace(cfg.llm, speculation=SpeculationConfig(),
                                       summary=replace(cfg.llm.summary, provider="")),
                      turn=replace(cfg.turn, speculation=SpeculationConfig()))
        return cfg, replace(providers, llm=self.ear, s2s=None)

    def opening(self) -> str:
        """The actor's greeting: the summary and the prompt (starts the screen)."""
        acts = self.screen.start(self.summary or "You have a transferred call.", self.cfg.consult_prompt,
                                 self.clock.now())
        return " ".join(a.text for a in acts if isinstance(a, Say))

    def bind(self, actor: Any) -> None:
        """The leg's actor is built: watch the opening's end and the deadline."""
        self.actor = actor
        actor.consult = self
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"consult-{self.call_id}")

    def heard(self, text: str) -> str:
        """A turn of the person's (the ear): the line to answer it with."""
        self._apply(self.screen.transcript(text, self.clock.now()))
        said, self._said = self._said, ""
        if said:
            return said
        return self.cfg.consult_prompt if self.screen.verdict is None else ""

    def dtmf(self, digit: str) -> None:
        """A key of the person's: the verdict leaves at once; the reply (and a decline's
        hang-up) once the bot is idle (a line cannot start over the opening)."""
        acts = self.screen.dtmf(digit, self.clock.now())
        self._apply(acts, hang_up=False)
        said, self._said = self._said, ""
        if said and self.actor is not None:
            self.actor.tasks.spawn(self._reply(said, self.screen.verdict is False), "consult-reply")

    async def _reply(self, text: str, hang_up: bool) -> None:
        deadline = self.clock.now() + OPENING_BOUND_S
        while not self._closed and not self.actor.idle() and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        if not self._closed:
            self.actor.say_line(text)
            if hang_up:
                self.hang_up("consult_declined")

    def ended(self, reason: str) -> None:
        self.screen.ended(self.clock.now())

    def record(self) -> dict[str, Any]:
        return {"consult_for": self.consult_for, **self.screen.record()}

    def close(self) -> None:
        self._closed = True
        self.screen.ended(self.clock.now())
        if self._task is not None and not self._task.done():
            self._task.cancel()

    # -- internals
    def _apply(self, acts: list[ConsultAction], hang_up: bool = True) -> None:
        for a in acts:
            if isinstance(a, Verdict) and not self._sent:
                self._sent = True
                log.info("call %s: consult verdict %s (%s)", self.call_id,
                         "accepted" if a.accepted else "declined", a.detail)
                self.send(ConsultVerdict(call_id=self.call_id, accepted=a.accepted, detail=a.detail))
                if not a.accepted and hang_up:
                    self.hang_up("consult_declined")  # after the reply: the host's hang-up waits for the bot
            elif isinstance(a, Say):
                self._said = a.text

    async def _run(self) -> None:
        a = self.actor
        answered_by = self.clock.now() + ANSWER_BOUND_S  # a leg started in early media greets at the answer
        while not self._closed and a.driver.st.greetings == 0 and self.clock.now() < answered_by:
            await self.clock.sleep(0.05)
        bound = opening_bound_s(len(self.summary), self.cfg.consult_prompt)
        deadline = self.clock.now() + bound
        await self.clock.sleep(0.2)
        while not self._closed and not a.idle() and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        if self._closed:
            return
        self._apply(self.screen.spoken(self.clock.now()))
        while not self._closed and (due := self.screen.deadline) is not None:
            await self.clock.sleep(max(0.0, due - self.clock.now()))
            self._apply(self.screen.tick(self.clock.now()))
        if self.screen.verdict:  # accepted: the bridge ends this leg; if it never comes, leave
            await self.clock.sleep(BRIDGE_GRACE_S)
            if not self._closed:
                log.warning("call %s: accepted but not bridged within %.0f s: hanging up", self.call_id,
                            BRIDGE_GRACE_S)
                self.hang_up("consult_not_bridged")
