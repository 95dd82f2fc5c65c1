"""ConsultScreen: the consulted person's side of a warm transfer, decided (no I/O here).

A call whose ``CallStart.consult_for`` is set is a warm transfer's consult leg: the agent does
not converse there. It says the summary of the caller's call (``CallStart.consult_summary``)
and, with ``accept = "confirm"``, the prompt ("Press 1 or say yes ..."); then it listens.

Inputs, each with the clock's ``at``: :meth:`start`, :meth:`spoken` (the opening played),
:meth:`dtmf`, :meth:`transcript` (a user turn's text), :meth:`tick`, :meth:`ended`. Each
returns the actions the runner performs:

* ``Say(text)``: the opening (summary + prompt), or the short reply to the person's answer;
* ``Verdict(accepted, detail)``: send ConsultVerdict for this leg.

Rules: DTMF ``1`` or a "yes" accepts, ``2`` or a "no" declines (at any time after the start,
the opening included: a person may answer before it ends); an answer that is both or
neither is no answer (the prompt is said again and the wait starts again; the
:data:`MAX_UNCLEAR`-th such answer declines, ``unclear``); no answer by ``verdict_timeout_s`` after
the opening played declines (``no_response``); with ``accept = "after_summary"`` the verdict
is accepted once the opening played (a "no" or 2 before that still declines).

Invariants: exactly one ``Verdict`` per leg at most (never after :meth:`ended`); nothing but
:meth:`record` answers after it; the deadline is :attr:`deadline` (:meth:`tick` enforces it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

YES = frozenset({"yes", "yeah", "yep", "yup", "sure", "ok", "okay", "accept", "certainly", "absolutely"})
NO = frozenset({"no", "nope", "decline", "can't", "cannot", "busy", "not"})
ACCEPTED_REPLY = "Thank you. Connecting you now."
DECLINED_REPLY = "Okay, I'll let them know. Goodbye."
MAX_UNCLEAR = 3  # the third answer that is neither yes nor no declines ("unclear")
OPENING_BOUND_S = 20.0  # the opening's playout may take this long past its length estimate (8 characters/s)
ANSWER_SLACK_S = 2.0  # the person's last answer: its transcript, and the verdict's way to the caller's agent
_WORD = re.compile(r"[a-z']+")


def opening_bound_s(summary_chars: int, prompt: str) -> float:
    """How long the leg waits for its opening (a summary of ``summary_chars`` and ``prompt``)
    to play before it listens anyway."""
    return OPENING_BOUND_S + (summary_chars + len(prompt)) / 8.0


def longest_screen_s(summary_chars: int, prompt: str, accept: str, verdict_timeout_s: float) -> float:
    """The longest a screen with these settings takes from its start (the leg's answer) to its
    verdict: the opening played within :func:`opening_bound_s`, then (``confirm``) up to
    :data:`MAX_UNCLEAR` waits of ``verdict_timeout_s``, each after the prompt said again (8
    characters/s, 4 s more), and :data:`ANSWER_SLACK_S`. The caller's side of the transfer
    waits this long after the answer before it gives up on a verdict: a backstop that never
    cuts a screen short (the screen declines a silent person itself)."""
    out = opening_bound_s(summary_chars, prompt) + ANSWER_SLACK_S
    if accept == "confirm":
        out += MAX_UNCLEAR * (verdict_timeout_s + 4.0 + len(prompt) / 8.0)
    return out


def answer_of(text: str) -> bool | None:
    """True for a yes, False for a no, None for neither or both (``"yes, no"``)."""
    words = set(_WORD.findall(text.lower()))
    yes, no = bool(words & YES), bool(words & NO)
    return None if yes == no else yes


@dataclass(frozen=True, slots=True)
class Say:
    text: str


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    detail: str


ConsultAction = Say | Verdict


class Phase(Enum):
    IDLE = "idle"
    OPENING = "opening"
    LISTENING = "listening"
    DECIDED = "decided"
    ENDED = "ended"


class ConsultScreen:
    """One consult leg's screening (see the module docstring)."""

    __slots__ = ("accept", "verdict_timeout_s", "phase", "deadline", "verdict", "detail", "started_at",
                 "spoken_at", "verdict_at", "unclear")

    def __init__(self, accept: str = "confirm", verdict_timeout_s: float = 10.0) -> None:
        if accept not in ("confirm", "after_summary"):
            raise ValueError(f"accept: {accept!r} is not confirm or after_summary")
        self.accept = accept
        self.verdict_timeout_s = verdict_timeout_s
        self.phase = Phase.IDLE
        self.deadline: float | None = None
        self.verdict: bool | None = None
        self.detail = ""
        self.started_at: float | None = None
        self.spoken_at: float | None = None
        self.verdict_at: float | None = None
        self.unclear = 0  # answers that were neither yes nor no

    def start(self, summary: str, prompt: str, at: float) -> list[ConsultAction]:
        if self.phase is not Phase.IDLE:
            return []
        self.phase, self.started_at = Phase.OPENING, at
        parts = [summary.strip(), prompt.strip() if self.accept == "confirm" else ""]
        return [Say(" ".join(p for p in parts if p))]

    def spoken(self, at: float) -> list[ConsultAction]:
        if self.phase is not Phase.OPENING:
            return []
        self.spoken_at = at
        if self.accept == "after_summary":
            return self._decide(True, "after_summary", at, reply=False)
        self.phase, self.deadline = Phase.LISTENING, at + self.verdict_timeout_s
        return []

    def dtmf(self, digit: str, at: float) -> list[ConsultAction]:
        if self.phase not in (Phase.OPENING, Phase.LISTENING) or digit not in ("1", "2"):
            return []
        return self._decide(digit == "1", "dtmf", at)

    def transcript(self, text: str, at: float) -> list[ConsultAction]:
        if self.phase not in (Phase.OPENING, Phase.LISTENING):
            return []
        ans = answer_of(text)
        if ans is not None:
            return self._decide(ans, "speech", at)
        self.unclear += 1
        if self.unclear >= MAX_UNCLEAR:
            return self._decide(False, "unclear", at)
        if self.phase is Phase.LISTENING:  # the prompt is said again: the wait starts again
            self.deadline = at + self.verdict_timeout_s
        return []

    def tick(self, now: float) -> list[ConsultAction]:
        if self.deadline is None or now < self.deadline or self.phase is not Phase.LISTENING:
            return []
        return self._decide(False, "no_response", now, reply=False)

    def ended(self, at: float) -> None:
        """The leg ended (bridged, or the person hung up): nothing more is decided."""
        self.phase, self.deadline = Phase.ENDED, None

    def record(self) -> dict[str, Any]:
        t0 = self.started_at

        def ms(t: float | None) -> int | None:
            return None if t is None or t0 is None else round((t - t0) * 1000)

        return {"accept": self.accept, "verdict": None if self.verdict is None else
                ("accepted" if self.verdict else "declined"), "detail": self.detail,
                "spoken_ms": ms(self.spoken_at), "verdict_ms": ms(self.verdict_at)}

    def _decide(self, accepted: bool, detail: str, at: float, reply: bool = True) -> list[ConsultAction]:
        self.phase, self.deadline = Phase.DECIDED, None
        self.verdict, self.detail, self.verdict_at = accepted, detail, at
        acts: list[ConsultAction] = [Verdict(accepted, detail)]
        if reply:
            acts.append(Say(ACCEPTED_REPLY if accepted else DECLINED_REPLY))
        return acts
