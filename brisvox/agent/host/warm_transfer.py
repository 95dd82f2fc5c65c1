"""WarmTransfer: the caller's side of a warm transfer, decided (no I/O here).

A warm transfer (``warm_transfer(target, reason)``, a built-in SideEffect tool, or a flow's
``warm_transfer`` action) puts the caller on hold, places a consult leg to ``target`` through
the gateway's ``dial`` (``consult_for`` = the caller's call, ``summary``), waits for the
person's verdict (the gateway's ConsultResult), then bridges the two legs (Bridge ->
BridgeResult) or comes back to the caller and says why not. Configured by ``[warm_transfer]``
of the agent file (:class:`WarmConfig`; docs/TOOLS.md).

Inputs, each with the clock's ``at``: :meth:`start`, :meth:`hold_spoken` (the hold message
played), :meth:`summary_ready`, :meth:`dialled` (the dial's reply), :meth:`consult_result`,
:meth:`bridge_result`, :meth:`tick`, :meth:`bridge_lost` (the gateway's BridgeEnded). Each
returns the actions the runner performs:

* ``Speak(text)``: say a line to the caller (the hold message, an outcome message); the runner
  reports :meth:`hold_spoken` after the hold message;
* ``Hold(on)``: the hold audio (``hold_audio`` looped, or silence) starts / stops; while on
  hold the caller's speech starts no turn;
* ``Summarize(reason)``: build the summary (the LLM's, bounded, or the template) and report
  :meth:`summary_ready`;
* ``Dial(target, summary)``: the ``dial`` command with the consult args;
* ``BridgeLegs(consult_id)``: send Bridge;
* ``HangUpLeg(consult_id)``: Hangup of the consult leg (it may still live);
* ``Done(outcome, said)``: the transfer is over: ``bridged`` (the tool's result; the actor
  stays attached but unheard, phase ``bridged``, until the call ends or the bridge does), or
  ``no_answer`` | ``busy`` | ``declined`` | ``failed`` (the conversation goes on; ``said`` is
  what the caller was told);
* ``Resume(said, note)``: after ``Done("bridged")``, the person's leg ended while the caller
  stayed (BridgeEnded): the caller is back with the agent, who says ``said``
  (``bridge_lost_message``) as its own turn; ``note`` goes into the conversation for the
  model (the transfer failed after the bridge; no second warm transfer in this call).

Invariants: ``Done`` is returned exactly once per transfer; after it nothing but
:meth:`record` answers (and a dial answered after the transfer gave up, which is hung up); every wait is bounded (the dial's answer by ``timeout_s`` from the dial; the verdict by
:meth:`WarmConfig.verdict_window_s` from the answer, the longest the consult leg's own screen can
take, so a person who answers late in the ring still hears the summary and answers; the bridge by
:data:`BRIDGE_WAIT_S`, the summary by ``summary_timeout_s`` in the runner:
the machine's deadlines are :attr:`deadline`, which :meth:`tick` enforces); a consult leg that
answered, may still live and was not bridged is hung up (``HangUpLeg``) before ``Done``: at once, except
a declined one, whose own agent says its goodbye to the person and hangs up itself, so the caller's side
hangs it up only after :data:`DECLINED_GRACE_S` (``HangUpLeg.after``); the caller is off hold
(``Hold(False)``) before any outcome message is spoken. While bridged :attr:`holding` is true (the
caller talks to the person: their speech and keys start no turn of the agent's); ``Resume`` is
returned at most once, only from the bridged phase, and the outcome becomes ``bridge_lost``.
"""

from __future__ import annotations

import re
import string
import wave
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from brisvox.agent.host.consult_screen import longest_screen_s

BRIDGE_WAIT_S = 5.0  # the gateway answers a Bridge at once; this bounds a lost reply
HOLD_AUDIO_MAX_BYTES = 4 * 1024 * 1024  # about 2 min of 16 kHz 16-bit mono
HOLD_AUDIO_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
TEMPLATE_FIELDS = frozenset({"reason", "caller", "called", "target"})
DEFAULT_TEMPLATE = "You have a transferred call. The caller {caller} needs help with: {reason}."


@dataclass(frozen=True, slots=True)
class WarmConfig:
    """``[warm_transfer]`` of an agent file (docs/TOOLS.md, "Warm transfer")."""

    hold_message: str = "Please hold while I connect you."
    hold_audio: str = ""  # a mono 16-bit WAV looped while the caller waits ("" : silence)
    timeout_s: float = 30.0  # from the dial to the person's answer (the ring)
    accept: str = "confirm"  # "confirm": yes / DTMF 1 accepts, no / 2 declines; "after_summary"
    summary: str = "template"  # "llm": one bounded request from the call's context, else the template
    summary_template: str = DEFAULT_TEMPLATE
    summary_max_chars: int = 400
    summary_timeout_s: float = 4.0
    via: str = "sip"  # "sip" | "twilio"
    trunk: str = ""  # a [[sip.trunks]] name ("": the gateway's default)
    consult_agent: str = ""  # the agent the consult leg runs ("": this agent)
    consult_prompt: str = "Press 1 or say yes to take the call, or press 2 or say no to decline."
    verdict_timeout_s: float = 10.0  # the consulted person's silence after the prompt: declined
    no_answer_message: str = "I'm sorry, nobody answered. I'm back with you; how else can I help?"
    busy_message: str = "I'm sorry, the line is busy. I'm back with you; how else can I help?"
    declined_message: str = "I'm sorry, they can't take the call right now. I'm back with you; how else can I help?"
    failed_message: str = "I'm sorry, I couldn't connect you. I'm back with you; how else can I help?"
    bridge_lost_message: str = "Sorry, the line to my colleague dropped. I'm back with you."

    @classmethod
    def from_table(cls, t: Mapping[str, Any]) -> WarmConfig:
        return cls(**{k: t[k] for k in cls.__dataclass_fields__ if k in t})

    def verdict_window_s(self, summary_chars: int | None = None) -> float:
        """From the person's answer: how long the caller's side waits for their verdict (a
        summary of ``summary_chars``, at most ``summary_max_chars``): the longest the consult
        leg's screen takes with these settings (the leg runs the consult agent's settings,
        normally these)."""
        chars = self.summary_max_chars if summary_chars is None else summary_chars
        return longest_screen_s(chars, self.consult_prompt, self.accept, self.verdict_timeout_s)

    def consult_bound_s(self) -> float:
        """The longest from the dial to the verdict: the ring, then the longest screen."""
        return self.timeout_s + self.verdict_window_s()

    def message(self, outcome: str) -> str:
        return str(getattr(self, f"{outcome}_message", self.failed_message))

    def problems(self, base: Path | None = None) -> list[tuple[str, str]]:
        """``(key, message)`` of what the file model cannot check: the template's fields and
        the hold audio file (exists, a mono 16-bit PCM WAV, bounded size)."""
        out: list[tuple[str, str]] = []
        names: set[str] = set()
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(self.summary_template) if f is not None}
        except ValueError as e:
            out.append(("warm_transfer.summary_template", f"not a template: {e}"))
        if bad := sorted(n for n in names if n not in TEMPLATE_FIELDS):
            out.append(("warm_transfer.summary_template", f"unknown field(s) {', '.join(map(repr, bad))}; "
                        f"known: {', '.join(sorted(TEMPLATE_FIELDS))}"))
        if self.hold_audio:
            why = hold_audio_problem(resolve(self.hold_audio, base))
            if why:
                out.append(("warm_transfer.hold_audio", why))
        return out


def resolve(path: str, base: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base is None else base / p


def hold_audio_problem(path: Path) -> str:
    """Why ``path`` cannot be the hold audio ("" when it can)."""
    try:
        size = path.stat().st_size
    except OSError as e:
        return f"{path}: cannot read: {e.strerror or e}"
    if size > HOLD_AUDIO_MAX_BYTES:
        return f"{path}: {size} bytes, at most {HOLD_AUDIO_MAX_BYTES}"
    try:
        with wave.open(str(path), "rb") as w:
            ch, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
    except (wave.Error, EOFError, OSError) as e:
        return f"{path}: not a PCM WAV file: {e}"
    if ch != 1 or width != 2:
        return f"{path}: {ch} channel(s) of {8 * width} bits; the hold audio is mono 16-bit PCM"
    if rate not in HOLD_AUDIO_RATES:
        return f"{path}: {rate} Hz; one of {', '.join(map(str, HOLD_AUDIO_RATES))}"
    if frames < rate // 10:
        return f"{path}: shorter than 0.1 s"
    return ""


_CTRL = re.compile(r"[\x00-\x1f\x7f]+")


def bound_summary(text: str, max_chars: int) -> str:
    """A summary fit for the consult leg and a SIP header: control characters (CR, LF, tabs)
    become spaces, runs of spaces one, then cut at ``max_chars`` on a word boundary (a single
    word longer than the bound is cut hard), the cut marked with an ellipsis within the bound."""
    flat = " ".join(_CTRL.sub(" ", text).split())
    if len(flat) <= max_chars:
        return flat
    room = max(1, max_chars - 1)
    cut = flat[:room + 1]
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut[:room]
    head = head[:room].rstrip(" ,;:.-")
    return f"{head}\u2026" if head else flat[:max_chars]


def template_summary(cfg: WarmConfig, reason: str, caller: str = "", called: str = "", target: str = "") -> str:
    """The template's summary (unknown fields were refused at load), bounded."""
    text = cfg.summary_template.format(reason=reason or "not given", caller=caller or "(number unknown)",
                                       called=called, target=target)
    return bound_summary(text, cfg.summary_max_chars)


def dial_outcome(error: str) -> str:
    """The outcome of a dial that failed with ``error`` (the gateway's reason)."""
    e = error.lower()
    if "busy" in e:
        return "busy"
    if "no answer" in e or "timeout" in e or "did not answer" in e:
        return "no_answer"
    if "declined" in e:
        return "declined"
    return "failed"


# -- actions -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Speak:
    text: str


@dataclass(frozen=True, slots=True)
class Hold:
    on: bool


@dataclass(frozen=True, slots=True)
class Summarize:
    reason: str


@dataclass(frozen=True, slots=True)
class Dial:
    target: str
    summary: str


@dataclass(frozen=True, slots=True)
class BridgeLegs:
    consult_id: str


@dataclass(frozen=True, slots=True)
class HangUpLeg:
    consult_id: str
    after: float = 0.0  # seconds: a declined leg's own agent says its goodbye and hangs up first


DECLINED_GRACE_S = 6.0  # a declined leg: its goodbye ("Okay, I'll let them know.") plays, it hangs itself up;
# the caller's side hangs it up after this at the latest (a leg that did not end by then must not live on)


@dataclass(frozen=True, slots=True)
class Resume:
    said: str
    note: str


@dataclass(frozen=True, slots=True)
class Done:
    outcome: str
    said: str = ""
    detail: str = ""


Action = Speak | Hold | Summarize | Dial | BridgeLegs | HangUpLeg | Done | Resume


class Phase(Enum):
    IDLE = "idle"
    HOLD_MESSAGE = "hold_message"
    SUMMARIZING = "summarizing"
    DIALLING = "dialling"
    CONSULTING = "consulting"
    BRIDGING = "bridging"
    BRIDGED = "bridged"  # Done("bridged") returned: the caller talks to the person, the agent waits unheard
    DONE = "done"


class WarmTransfer:
    """One warm transfer of one call (see the module docstring)."""

    __slots__ = ("cfg", "target", "reason", "phase", "deadline", "consult_id", "summary", "outcome",
                 "detail", "started_at", "dialled_at", "answered_at", "verdict_at", "verdict", "bridged_at",
                 "ended_at", "summary_source", "held_at", "lost_at")

    def __init__(self, cfg: WarmConfig, target: str, reason: str) -> None:
        self.cfg = cfg
        self.target = target
        self.reason = reason
        self.phase = Phase.IDLE
        self.deadline: float | None = None  # when tick() must be called next (None: nothing pending)
        self.held_at: float | None = None
        self.consult_id = ""
        self.summary = ""
        self.summary_source = ""  # "llm" | "template"
        self.outcome = ""
        self.detail = ""
        self.verdict = ""  # the ConsultResult's outcome
        self.started_at: float | None = None
        self.dialled_at: float | None = None
        self.answered_at: float | None = None
        self.verdict_at: float | None = None
        self.bridged_at: float | None = None
        self.ended_at: float | None = None
        self.lost_at: float | None = None  # the bridge ended with the person's leg (BridgeEnded)

    @property
    def holding(self) -> bool:
        """The caller is on hold: their speech must start no turn."""
        return self.phase not in (Phase.IDLE, Phase.DONE)

    @property
    def done(self) -> bool:
        """Over (``Done`` returned): also while bridged."""
        return self.phase in (Phase.DONE, Phase.BRIDGED)

    def start(self, at: float) -> list[Action]:
        if self.phase is not Phase.IDLE:
            return []
        self.started_at = at
        if self.cfg.hold_message.strip():
            self.phase = Phase.HOLD_MESSAGE
            return [Speak(self.cfg.hold_message.strip())]
        return self._hold(at)

    def hold_spoken(self, at: float) -> list[Action]:
        if self.phase is not Phase.HOLD_MESSAGE:
            return []
        return self._hold(at)

    def summary_ready(self, text: str, source: str, at: float) -> list[Action]:
        if self.phase is not Phase.SUMMARIZING:
            return []
        self.summary = bound_summary(text, self.cfg.summary_max_chars)
        self.summary_source = source
        self.phase, self.dialled_at = Phase.DIALLING, at
        self.deadline = at + self.cfg.timeout_s
        return [Dial(self.target, self.summary)]

    def dialled(self, ok: bool, consult_id: str, error: str, at: float) -> list[Action]:
        """The dial's reply: answered (``consult_id``, the leg) or failed (``error``)."""
        if self.phase is not Phase.DIALLING:
            if ok and consult_id and self.phase is Phase.DONE and not self.consult_id:
                return [HangUpLeg(consult_id)]  # answered after we gave up: it must not live on
            return []
        if not ok or not consult_id:
            return self._end(dial_outcome(error), error or "the dial failed", at)
        self.consult_id, self.answered_at, self.phase = consult_id, at, Phase.CONSULTING
        if self.deadline is not None and at >= self.deadline:  # after the ring's end: nobody waits for it
            return self._end("no_answer", f"answered after the {self.cfg.timeout_s:g} s ring", at, hang_leg=True)
        self.deadline = at + self.cfg.verdict_window_s(len(self.summary))  # the person hears it all and answers
        return []

    def consult_result(self, consult_id: str, outcome: str, detail: str, at: float) -> list[Action]:
        if consult_id != self.consult_id or self.phase is not Phase.CONSULTING:
            return []
        self.verdict, self.verdict_at = outcome, at
        if outcome == "accepted":
            self.phase = Phase.BRIDGING
            self.deadline = at + BRIDGE_WAIT_S
            return [BridgeLegs(consult_id)]
        if outcome == "declined":
            return self._end("declined", detail or "declined", at, hang_leg=True, leg_after=DECLINED_GRACE_S)
        return self._end("no_answer", detail or outcome, at, hang_leg=False)  # hung_up: the leg is gone

    def bridge_result(self, ok: bool, detail: str, at: float) -> list[Action]:
        if self.phase is not Phase.BRIDGING:
            return []
        if ok:
            self.bridged_at = at
            return self._end("bridged", detail, at, hang_leg=False)
        return self._end("failed", detail or "the bridge was refused", at, hang_leg=True)

    def bridge_lost(self, detail: str, at: float) -> list[Action]:
        """The gateway's BridgeEnded: the person's leg ended and the caller is back (see the
        module docstring)."""
        if self.phase is not Phase.BRIDGED:
            return []
        self.phase, self.outcome, self.lost_at = Phase.DONE, "bridge_lost", at
        self.detail = detail or "the consult leg ended"
        said = self.cfg.bridge_lost_message.strip()
        heard = f' and was told: "{said}"' if said else ""
        note = (f"The warm transfer to {self.target} failed after the bridge: the line to the person dropped "
                f"({self.detail[:100]}). The caller is back with you{heard}. Do not apologize again; go on "
                "helping them (for example take a message). warm_transfer cannot be used again in this call.")
        return [Resume(said, note)]

    def tick(self, now: float) -> list[Action]:
        if self.deadline is None or now < self.deadline:
            return []
        if self.phase is Phase.DIALLING:
            return self._end("no_answer", f"no answer within {self.cfg.timeout_s:g} s", now, hang_leg=True)
        if self.phase is Phase.CONSULTING:
            window = self.cfg.verdict_window_s(len(self.summary))
            return self._end("no_answer", f"no verdict within {window:.0f} s of the answer", now, hang_leg=True)
        if self.phase is Phase.BRIDGING:
            return self._end("failed", "no answer to the bridge in time", now, hang_leg=True)
        self.deadline = None
        return []

    def record(self) -> dict[str, Any]:
        """The call record's ``warm_transfer`` entry: the consult leg and every time (ms from
        the transfer's start)."""
        t0 = self.started_at

        def ms(t: float | None) -> int | None:
            return None if t is None or t0 is None else round((t - t0) * 1000)

        return {"target": self.target, "outcome": self.outcome or None, "detail": self.detail[:200],
                "summary_source": self.summary_source, "summary_chars": len(self.summary),
                "legs": [{"leg": "caller", "held_ms": ms(self.held_at),
                          "back_ms": (ms(self.lost_at) if self.lost_at is not None else
                                      ms(self.ended_at) if self.outcome and self.outcome != "bridged" else None),
                          "bridged_ms": ms(self.bridged_at), "bridge_lost_ms": ms(self.lost_at)},
                         {"leg": "consult", "call_id": self.consult_id or None, "dialled_ms": ms(self.dialled_at),
                          "answered_ms": ms(self.answered_at), "verdict": self.verdict or None,
                          "verdict_ms": ms(self.verdict_at), "bridged_ms": ms(self.bridged_at)}],
                "ended_ms": ms(self.ended_at)}

    # -- internals
    def _hold(self, at: float) -> list[Action]:
        self.phase, self.held_at, self.deadline = Phase.SUMMARIZING, at, None
        return [Hold(True), Summarize(self.reason)]

    def _end(self, outcome: str, detail: str, at: float, hang_leg: bool = False,
             leg_after: float = 0.0) -> list[Action]:
        self.phase, self.outcome, self.detail, self.ended_at = Phase.DONE, outcome, detail, at
        self.deadline = None
        acts: list[Action] = []
        if hang_leg and self.consult_id:
            acts.append(HangUpLeg(self.consult_id, leg_after))
        if outcome == "bridged":
            self.phase = Phase.BRIDGED  # BridgeEnded may still bring the caller back (bridge_lost)
            return [*acts, Done(outcome, "", detail)]
        said = self.cfg.message(outcome).strip()
        acts.append(Hold(False))
        if said:
            acts.append(Speak(said))
        return [*acts, Done(outcome, said, detail)]
