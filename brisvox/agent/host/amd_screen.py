"""AmdScreen: what a dialled call does between the answer and its first word, by the AMD verdict.

A voicemail's 200 OK looks exactly like a person's, so an agent with ``[amd] enabled`` does not
converse when the gateway reports a dialled call answered: the call is *screened*. The workers'
detector (it hears the caller's audio; the agent's loop runs none of it) classifies the opening as
``human``, ``machine``, ``ivr``, ``fax`` or ``uncertain`` and reports a beep after a machine's
greeting; this machine decides, per the agent file's action for that verdict, what happens next.

Inputs, each with the clock's ``at``: :meth:`answered` (the gateway's answer of a dialled call),
:meth:`verdict`, :meth:`beep`, :meth:`greeting_ended`, :meth:`message_played`, :meth:`tick`.
Each returns the actions the actor performs (no I/O here):

* ``Detect(max_wait_ms)``: ask the workers for a verdict (at the answer);
* ``Converse(verdict, confidence, node)``: the call is answered for the pipeline now (the
  greeting, if any, is spoken; ``node``: the flow node to enter first, "" for none) and the
  verdict is put into the model's context;
* ``SpeakMessage(text)``: say the voicemail message (after the beep, the greeting's end or the
  beep wait), then report :meth:`message_played`;
* ``HangUp(reason)``: end the call (``amd_<verdict>`` or ``amd_message_left``).

The action per verdict is ``continue`` (converse), ``hang_up``, ``leave_message`` (a machine's
greeting is waited out, then the message; for other verdicts it is spoken at once) or
``node:<name>`` (converse, starting at that flow node).

Invariants: exactly one verdict is taken per call (the first; a later one is ignored); a verdict
comes by ``max_wait_ms`` after the answer plus :data:`DEADLINE_SLACK_S` even when the workers
never answer (``uncertain``, ``source = "deadline"``); nothing converses before the verdict
(the agent speaks first only after it); ``HangUp`` is returned at most once and nothing but
:meth:`record` answers after it; the message is spoken at most once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

VERDICTS = ("human", "machine", "ivr", "fax", "uncertain")
ACTION = re.compile(r"^(continue|hang_up|leave_message|node:[A-Za-z0-9_-]{1,64})$")
DEADLINE_SLACK_S = 0.5  # past the workers' own deadline: their verdict (or its loss) is due by then


@dataclass(frozen=True, slots=True)
class AmdConfig:
    """``[amd]`` of an agent file (docs/OUTBOUND.md): ``enabled``; ``max_wait_ms``, the verdict's
    deadline after the answer; ``on_<verdict>``, its action; ``message``, what ``leave_message``
    says; ``beep_wait_ms``, how long after a machine verdict the beep is waited for at most;
    ``transcripts``, the opening is transcribed during screening (local STT) so that an IVR menu
    is told from a voicemail by its words (a cadence "machine" then waits until ``max_wait_ms``)."""

    enabled: bool = False
    max_wait_ms: int = 3000
    on_human: str = "continue"
    on_machine: str = "hang_up"
    on_ivr: str = "hang_up"
    on_fax: str = "hang_up"
    on_uncertain: str = "continue"
    message: str = ""
    beep_wait_ms: int = 20000
    transcripts: bool = True

    @classmethod
    def from_table(cls, t: Mapping[str, Any]) -> AmdConfig:
        return cls(**{k: t[k] for k in cls.__dataclass_fields__ if k in t})

    def action(self, verdict: str) -> str:
        return str(getattr(self, f"on_{verdict}"))

    def problems(self, flow_nodes: frozenset[str] | None) -> list[tuple[str, str]]:
        """``(key, message)`` for each contradiction (the file model checks types and ranges)."""
        out: list[tuple[str, str]] = []
        for v in VERDICTS:
            a = self.action(v)
            if not ACTION.match(a):
                out.append((f"amd.on_{v}", f"{a!r} is not continue, hang_up, leave_message or node:<name>"))
            elif a == "leave_message" and not self.message.strip():
                out.append((f"amd.on_{v}", "leave_message needs amd.message, the words to leave"))
            elif a.startswith("node:"):
                if flow_nodes is None:
                    out.append((f"amd.on_{v}", f"{a} names a flow node, and the agent has no [flow]"))
                elif a[5:] not in flow_nodes:
                    out.append((f"amd.on_{v}", f"{a}: the flow has no node {a[5:]!r}"))
        return out


# -- actions -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Detect:
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class Converse:
    verdict: str
    confidence: float
    node: str = ""


@dataclass(frozen=True, slots=True)
class SpeakMessage:
    text: str


@dataclass(frozen=True, slots=True)
class HangUp:
    reason: str


Action = Detect | Converse | SpeakMessage | HangUp


class Phase(Enum):
    WAITING_ANSWER = "waiting_answer"
    DETECTING = "detecting"
    WAITING_BEEP = "waiting_beep"
    SPEAKING = "speaking"
    CONVERSING = "conversing"
    ENDED = "ended"


class AmdScreen:
    """One dialled call's screening (see the module docstring)."""

    __slots__ = ("cfg", "phase", "answered_at", "deadline", "verdict_", "confidence", "source", "verdict_at",
                 "beep_at", "message_at", "action_", "detail")

    def __init__(self, cfg: AmdConfig) -> None:
        self.cfg = cfg
        self.phase = Phase.WAITING_ANSWER
        self.answered_at: float | None = None
        self.deadline: float | None = None  # when tick() must be called next (None: nothing pending)
        self.verdict_ = ""
        self.confidence = 0.0
        self.source = ""  # "detector" | "deadline"
        self.verdict_at: float | None = None
        self.beep_at: float | None = None
        self.message_at: float | None = None
        self.action_ = ""
        self.detail: dict[str, Any] = {}

    @property
    def screening(self) -> bool:
        """The call is answered but the pipeline must not converse yet."""
        return self.phase in (Phase.DETECTING, Phase.WAITING_BEEP, Phase.SPEAKING)

    def answered(self, at: float) -> list[Action]:
        if self.phase is not Phase.WAITING_ANSWER:
            return []
        self.phase, self.answered_at = Phase.DETECTING, at
        self.deadline = at + self.cfg.max_wait_ms / 1000 + DEADLINE_SLACK_S
        return [Detect(self.cfg.max_wait_ms)]

    def verdict(self, kind: str, confidence: float, at: float, detail: Mapping[str, Any] | None = None) -> list[Action]:
        if self.phase is not Phase.DETECTING:
            return []
        if kind not in VERDICTS:
            kind, confidence = "uncertain", 0.0
        return self._take(kind, max(0.0, min(1.0, confidence)), at, "detector", detail or {})

    def beep(self, at: float) -> list[Action]:
        if self.phase is Phase.DETECTING:
            self.beep_at = at  # a beep before the verdict: the detector's verdict follows it
            return []
        if self.phase is Phase.WAITING_BEEP:
            self.beep_at = at
            return self._speak(at)
        return []

    def greeting_ended(self, at: float) -> list[Action]:
        """The machine's greeting ended with no beep heard (the detector's word for it)."""
        return self._speak(at) if self.phase is Phase.WAITING_BEEP else []

    def message_played(self, at: float) -> list[Action]:
        if self.phase is not Phase.SPEAKING:
            return []
        return self._end("amd_message_left")

    def tick(self, now: float) -> list[Action]:
        if self.deadline is None or now < self.deadline:
            return []
        if self.phase is Phase.DETECTING:
            return self._take("uncertain", 0.0, now, "deadline", {})
        if self.phase is Phase.WAITING_BEEP:
            return self._speak(now)
        self.deadline = None
        return []

    def record(self) -> dict[str, Any]:
        """The call record's ``amd`` section (times in ms from the answer)."""
        t0 = self.answered_at

        def ms(t: float | None) -> int | None:
            return None if t is None or t0 is None else round((t - t0) * 1000)

        return {"verdict": self.verdict_ or None, "confidence": round(self.confidence, 3), "source": self.source,
                "action": self.action_, "verdict_ms": ms(self.verdict_at), "beep_ms": ms(self.beep_at),
                "message_ms": ms(self.message_at), **({"detail": self.detail} if self.detail else {})}

    # -- internals
    def _take(self, kind: str, confidence: float, at: float, source: str, detail: Mapping[str, Any]) -> list[Action]:
        self.verdict_, self.confidence, self.verdict_at, self.source = kind, confidence, at, source
        self.detail = dict(detail)
        action = self.action_ = self.cfg.action(kind)
        self.deadline = None
        if action == "hang_up":
            return self._end(f"amd_{kind}")
        if action == "leave_message":
            if kind == "machine" and self.beep_at is None:
                self.phase = Phase.WAITING_BEEP
                self.deadline = at + self.cfg.beep_wait_ms / 1000
                return []
            return self._speak(at)
        self.phase = Phase.CONVERSING
        return [Converse(kind, confidence, action[5:] if action.startswith("node:") else "")]

    def _speak(self, at: float) -> list[Action]:
        self.phase, self.message_at, self.deadline = Phase.SPEAKING, at, None
        return [SpeakMessage(self.cfg.message)]

    def _end(self, reason: str) -> list[Action]:
        self.phase, self.deadline = Phase.ENDED, None
        return [HangUp(reason)]
