"""CallWarm: a call actor's warm transfer, run (the decisions are WarmTransfer's).

Held by every cascaded :class:`~brisvox.agent.host.actor.CallActor` whose telephony port can
dial; the ``warm_transfer`` tool reaches it through the port
(:meth:`~brisvox.agent.tool_engine.builtin.LinkTelephony.warm_transfer` -> :meth:`run`), so the
whole sequence runs inside that tool call (a SideEffect: the tool engine runs it once) and its
result tells the model what became of it. It does the machine's actions through the
:class:`WarmHost` the actor gives it:

* ``Speak`` -> the line as its own round of the running turn, out of the context
  (:meth:`LlmRunner.announce <brisvox.agent.pipeline.llm.runner.LlmRunner.announce>`), waited
  for until played (bounded: :func:`speak_bound`); the hold message's end is the machine's
  :meth:`~brisvox.agent.host.warm_transfer.WarmTransfer.hold_spoken`;
* ``Hold(True)`` -> the hold audio looped (its first :data:`HOLD_LOOP_S` seconds, as clip
  rounds of :data:`HOLD_PIECE_S` each, so a stop waits for one piece at most), or silence;
  ``Hold(False)`` stops it and waits for the piece playing;
* ``Summarize`` -> with ``summary = "llm"``, ONE request to the call's LLM from its context,
  bounded by ``summary_timeout_s``; the template when it fails, times out or answers nothing;
* ``Dial`` -> the gateway's ``dial`` with ``consult_for`` and ``summary``, bounded by what is
  left of ``timeout_s``; then the leg's ConsultResult, bounded by the machine's verdict window
  from the answer (:meth:`~brisvox.agent.host.warm_transfer.WarmConfig.verdict_window_s`). A Twilio dial
  (``via = "twilio"``) answers at Twilio's 201 with the CallSid alone (the call is queued, not
  answered): the answer is the gateway's ConsultResult ``answered`` (the leg's stream arrived),
  which names the leg, waited for within the same bound (none: ``no_answer``, and the port
  hangs up a leg whose answer comes after that);
* ``BridgeLegs`` -> Bridge (with ``keep``: the actor stays attached, unheard, for the bridge)
  and its BridgeResult (bounded); ``HangUpLeg`` -> Hangup of the leg;
* after the run, :meth:`bridge_lost` (the gateway's BridgeEnded: the person's leg ended, the
  caller is back) -> ``Resume``: once the bot is idle (a reply the model gave during the
  bridge was never heard: the gateway dropped its audio; bounded by :data:`RESUME_WAIT_S`),
  the note into the context, then ``bridge_lost_message`` as the bot's own turn
  (:meth:`WarmHost.resume`), so the conversation goes on from there.

Invariants: while :attr:`holding` (on hold, and bridged to the person) the caller's speech
starts no turn (the actor keeps the audio from the chain, as on a hold); one transfer per call (a second :meth:`run` raises
ToolError); every await is bounded; a cancelled run (the call ending) hangs up a consult leg
that answered; :meth:`record` is the call record's ``warm_transfer`` (every leg and its times).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from brisvox.agent.conversation.context import SystemMessage
from brisvox.agent.host.warm_transfer import (
    BRIDGE_WAIT_S,
    Action,
    BridgeLegs,
    Dial,
    Done,
    HangUpLeg,
    Hold,
    Phase,
    Resume,
    Speak,
    Summarize,
    WarmConfig,
    WarmTransfer,
    bound_summary,
    resolve,
    template_summary,
)
from brisvox.agent.pipeline.cascade.tts_clips import Clip
from brisvox.agent.tool_engine.registry import ToolError
from brisvox.clock import Clock

log = logging.getLogger("brisvox.agent.warm_transfer")

HOLD_LOOP_S = 8.0  # the hold audio looped: at most its first 8 s (the clip cache is shared and bounded)
HOLD_PIECE_S = 2.0
RESUME_WAIT_S = 3.0  # back from a lost bridge: the bot's reply from the bridge's time ends first, at most this
DIAL_REPLY_GRACE_S = 1.0  # the consult dial's request outlives its ring timeout by this much
TWILIO_QUEUED = "twilio:"  # a Twilio consult leg's name until the gateway's ConsultResult "answered" names it
SUMMARY_PROMPT = ("You write the short spoken introduction of a phone call being transferred to a colleague. "
                  "From the conversation below, say who is calling (if known), what they need and anything "
                  "already done, in at most {chars} characters, plain sentences, no preamble, no lists.")


def speak_bound(text: str) -> float:
    """How long a spoken line may take to play before the run goes on without it (s)."""
    return 4.0 + len(text) / 8.0


class WarmHost(Protocol):
    """What the warm transfer needs of its actor and its telephony port."""

    call_id: str
    ring_rate: int  # the tts ring's rate (the hold audio's clips)

    def announce(self, text: str, clip: bool) -> Awaitable[tuple[int, int] | None]: ...
    def round_over(self, epoch: int, rnd: int) -> bool: ...
    def put_clip(self, clip: Clip) -> None: ...
    def summary_llm(self) -> Any: ...  # the call's LlmProvider (None: the template only)
    def conversation(self) -> list[Any]: ...  # the context's messages
    def caller(self) -> tuple[str, str]: ...  # (caller, called) numbers ("" unknown)
    def agent(self) -> str: ...
    def dial(self, target: str, agent: str, via: str, timeout: float, trunk: str,  # noqa: ASYNC109
             extra: dict[str, Any]) -> Awaitable[tuple[bool, dict[str, Any], str]]: ...
    def consult_result(self, consult_id: str, timeout: float) -> Awaitable[Any]: ...  # noqa: ASYNC109
    def bridge(self, other: str, timeout: float) -> Awaitable[tuple[bool, str]]: ...  # noqa: ASYNC109
    def hangup_leg(self, consult_id: str, reason: str) -> None: ...
    def resume(self, note: str, said: str) -> None: ...  # the note into the context, ``said`` as a turn


@dataclass(frozen=True, slots=True)
class HoldAudio:
    pieces: tuple[Clip, ...]


@lru_cache(maxsize=8)
def _hold_pieces(path: str, mtime_ns: int, rate: int) -> HoldAudio:
    import wave

    import soxr

    with wave.open(path, "rb") as w:
        src = w.getframerate()
        pcm = np.frombuffer(w.readframes(min(w.getnframes(), int(HOLD_LOOP_S * src))), dtype="<i2")
    out = pcm if src == rate else np.asarray(soxr.resample(pcm, src, rate), dtype=np.int16)
    n = max(1, int(HOLD_PIECE_S * rate))
    chunks = [out[a:a + n] for a in range(0, len(out), n) if len(out[a:a + n]) >= rate // 10]
    pieces = []
    for i, c in enumerate(chunks):
        c = np.ascontiguousarray(c, dtype=np.int16)
        c.setflags(write=False)
        pieces.append(Clip(f"(hold audio {Path(path).name} {i + 1}/{len(chunks)})", c, (), rate))
    return HoldAudio(tuple(pieces))


def hold_audio(path: Path, rate: int) -> HoldAudio:
    """The hold audio's clips at ``rate`` (cached per file version), empty when unreadable
    (checked at load: a file changed since is logged and the caller waits in silence)."""
    try:
        return _hold_pieces(str(path), path.stat().st_mtime_ns, rate)
    except Exception as e:  # noqa: BLE001 - a broken file means silence, never a failed transfer
        log.warning("hold audio %s unusable (%s): the caller waits in silence", path, type(e).__name__)
        return HoldAudio(())


class CallWarm:
    """See the module docstring."""

    __slots__ = ("host", "cfg", "clock", "base", "machine", "heard", "_hold", "_holding_audio")

    def __init__(self, host: WarmHost, cfg: WarmConfig, clock: Clock, base: Path | None = None) -> None:
        self.host = host
        self.cfg = cfg
        self.clock = clock
        self.base = base  # the agent file's directory (a relative hold_audio)
        self.machine: WarmTransfer | None = None
        self.heard: list[str] = []  # what the caller was told, in order
        self._hold: asyncio.Task[None] | None = None
        self._holding_audio = False

    @property
    def holding(self) -> bool:
        return self.machine is not None and self.machine.holding

    async def run(self, target: str, reason: str) -> dict[str, Any]:
        """The warm transfer to ``target`` (already checked against transfer_targets): the
        tool's result."""
        if self.machine is not None:
            raise ToolError("a warm transfer already ran in this call")
        m = self.machine = WarmTransfer(self.cfg, target, reason)
        log.info("call %s: warm transfer started", self.host.call_id)
        acts = m.start(self.clock.now())
        done: Done | None = None
        try:
            while acts:
                nxt: list[Action] = []
                for a in acts:
                    if isinstance(a, Done):
                        done = a
                    else:
                        nxt += await self._do(a)
                acts = nxt
        finally:
            await self._stop_hold()
            if done is None and m.consult_id and m.outcome != "bridged":  # cancelled mid-way: the leg must not live on
                self.host.hangup_leg(m.consult_id, "warm_transfer_cancelled")
        assert done is not None
        log.info("call %s: warm transfer %s", self.host.call_id, done.outcome)
        if done.outcome == "bridged":
            return {"status": "bridged", "note": "the caller now talks to the person at the target and cannot hear "
                                                 "you: say nothing more (if that line drops you will be told)"}
        return {"status": done.outcome, "detail": done.detail[:200], "caller_heard": list(self.heard),
                "note": "the caller has been told this already: do not repeat it; go on helping them"}

    def record(self) -> dict[str, Any] | None:
        return self.machine.record() if self.machine is not None else None

    def bridge_lost(self, reason: str) -> bool:
        """The gateway's BridgeEnded: the caller is back (see the module docstring). False when
        no bridge of this call's was on (a stray frame: nothing done)."""
        m = self.machine
        acts = m.bridge_lost(reason, self.clock.now()) if m is not None else []
        for a in acts:
            if isinstance(a, Resume):
                log.info("call %s: the bridged consult leg ended (%s): the caller is back", self.host.call_id,
                         reason[:80] or "no reason")
                if a.said:
                    self.heard.append(a.said)
                self.host.resume(a.note, a.said)
        return bool(acts)

    # -- the actions
    async def _do(self, a: Action) -> list[Action]:
        m = self.machine
        assert m is not None
        match a:
            case Speak(text=text):
                await self._speak(text)
                return m.hold_spoken(self.clock.now()) if m.phase is Phase.HOLD_MESSAGE else []
            case Hold(on=on):
                if on:
                    self._start_hold()
                else:
                    await self._stop_hold()
                return []
            case Summarize(reason=reason):
                text, source = await self._summary(reason)
                return m.summary_ready(text, source, self.clock.now())
            case Dial(target=target, summary=summary):
                return await self._dial(target, summary)
            case BridgeLegs(consult_id=cid):
                ok, detail = await self.host.bridge(cid, BRIDGE_WAIT_S)
                return m.bridge_result(ok, detail, self.clock.now())
            case HangUpLeg(consult_id=cid, after=after):
                reason = "warm_transfer_" + (m.outcome or "given_up")
                if after > 0:  # a declined leg says goodbye and ends itself; this is the backstop
                    asyncio.get_running_loop().call_later(after, self.host.hangup_leg, cid, reason)
                else:
                    self.host.hangup_leg(cid, reason)
                return []
        return []

    async def _speak(self, text: str) -> None:
        handle = await self.host.announce(text, False)
        if handle is None:
            return
        self.heard.append(text)
        await self._wait_over(handle, speak_bound(text))

    async def _wait_over(self, handle: tuple[int, int], bound: float) -> None:
        deadline = self.clock.now() + bound
        while not self.host.round_over(*handle) and self.clock.now() < deadline:
            await self.clock.sleep(0.05)

    async def _dial(self, target: str, summary: str) -> list[Action]:
        m, cfg = self.machine, self.cfg
        assert m is not None and m.deadline is not None
        ring = max(1, math.ceil(m.deadline - self.clock.now()))  # what is left of timeout_s, whole seconds
        # the gateway replies once its ring timer fired: the request waits past it (else its no-answer, or a
        # last-moment answer whose leg must be hung up, is lost and the outcome is "unknown")
        ok, data, error = await self.host.dial(target, cfg.consult_agent or self.host.agent(), cfg.via,
                                               ring + DIAL_REPLY_GRACE_S, cfg.trunk,
                                               {"consult_for": self.host.call_id, "summary": summary,
                                                "ring_timeout_s": ring})
        leg, sid = str(data.get("call_id") or ""), str(data.get("call_sid") or "")
        if ok and not leg and sid:  # Twilio queued the call: its leg exists once the callee answered
            ok, leg, error = await self._answered(sid)
        acts = m.dialled(ok, leg, error, self.clock.now())
        if m.phase is not Phase.CONSULTING:
            return acts
        res = await self.host.consult_result(m.consult_id, max(0.0, m.deadline - self.clock.now()))
        if res is None:
            return [*acts, *m.tick(max(self.clock.now(), m.deadline))]
        return [*acts, *m.consult_result(res.consult_id, res.outcome, res.detail, self.clock.now())]

    async def _answered(self, sid: str) -> tuple[bool, str, str]:
        """A Twilio consult dial answered 201 with CallSid ``sid``: the gateway's ConsultResult
        ``answered`` (its stream arrived) names the leg, bounded by what is left of ``timeout_s``
        (Twilio rings for that long). ``(ok, leg's call id, error)`` as the dial's reply would be."""
        m = self.machine
        assert m is not None and m.deadline is not None
        res = await self.host.consult_result(TWILIO_QUEUED + sid, max(0.0, m.deadline - self.clock.now()))
        if res is None:
            return False, "", f"no answer within {self.cfg.timeout_s:g} s (Twilio call {sid[:40]})"
        if res.outcome != "answered" or not res.consult_id:
            return False, "", f"the Twilio call {sid[:40]} ended: {res.outcome} {res.detail[:100]}".strip()
        return True, str(res.consult_id), ""

    async def _summary(self, reason: str) -> tuple[str, str]:
        cfg = self.cfg
        caller, called = self.host.caller()
        fallback = template_summary(cfg, reason, caller, called, self.machine.target if self.machine else "")
        llm = self.host.summary_llm() if cfg.summary == "llm" else None
        if llm is None:
            return fallback, "template"
        from brisvox.agent.pipeline.llm.summarizer import collect_text, conversation_lines
        from brisvox.providers.base import LlmMessage, LlmRequest

        convo = "\n".join(conversation_lines(self.host.conversation()[1:], 500)[-40:])
        req = LlmRequest(messages=(LlmMessage("system", SUMMARY_PROMPT.format(chars=cfg.summary_max_chars)),
                                   LlmMessage("user", f"Reason for the transfer: {reason or 'not given'}\n\n{convo}")),
                         temperature=0.0, max_tokens=max(32, cfg.summary_max_chars // 3), tool_choice="none")
        try:
            async with self.clock.timeout(cfg.summary_timeout_s):
                text = await collect_text(llm, req)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a timeout, a provider error: the template is the summary
            log.warning("call %s: warm transfer summary failed (%s): the template is used", self.host.call_id,
                        type(e).__name__)
            return fallback, "template"
        text = bound_summary(text, cfg.summary_max_chars)
        return (text, "llm") if text else (fallback, "template")

    # -- the hold audio
    def _start_hold(self) -> None:
        if not self.cfg.hold_audio or (self._hold is not None and not self._hold.done()):
            return
        audio = hold_audio(resolve(self.cfg.hold_audio, self.base), self.host.ring_rate)
        if audio.pieces:
            self._holding_audio = True
            self._hold = asyncio.get_running_loop().create_task(self._loop(audio), name=f"hold-{self.host.call_id}")

    async def _loop(self, audio: HoldAudio) -> None:
        i = 0
        while self._holding_audio:
            piece = audio.pieces[i % len(audio.pieces)]
            self.host.put_clip(piece)  # fresh in the shared cache right before its round
            handle = await self.host.announce(piece.text, True)
            if handle is None:
                return
            await self._wait_over(handle, piece.seconds + 3.0)
            i += 1

    async def _stop_hold(self) -> None:
        self._holding_audio = False
        task, self._hold = self._hold, None
        if task is None or task.done():
            return
        try:
            async with self.clock.timeout(HOLD_PIECE_S + 3.5):  # the piece playing ends first
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
        except asyncio.CancelledError:
            task.cancel()
            raise


class _ActorSeam:
    """A cascaded call actor and its telephony port as the warm transfer sees them (:class:`WarmHost`)."""

    __slots__ = ("a", "port", "call_id", "ring_rate")

    def __init__(self, actor: Any, port: Any) -> None:
        self.a, self.port, self.call_id = actor, port, actor.call_id
        self.ring_rate = int(actor.tts.cfg.ring_rate)

    def announce(self, text: str, clip: bool) -> Awaitable[tuple[int, int] | None]:
        return self.a.runner.announce(text, clip)

    def round_over(self, epoch: int, rnd: int) -> bool:
        return bool(self.a.book.round_over(epoch, rnd))

    def put_clip(self, clip: Clip) -> None:
        self.a.tts.clip_cache().put(clip)

    def summary_llm(self) -> Any:
        return self.a.runner.provider

    def conversation(self) -> list[Any]:
        return list(self.a.context)

    def caller(self) -> tuple[str, str]:
        info = self.a.call_info
        return str(info.caller or ""), str(info.called or "")

    def agent(self) -> str:
        return str(self.a.agent)

    def dial(self, target: str, agent: str, via: str, timeout: float, trunk: str,  # noqa: ASYNC109
             extra: dict[str, Any]) -> Awaitable[tuple[bool, dict[str, Any], str]]:
        return self.port.dial(target, agent, via, timeout, trunk=trunk, extra=extra)

    def consult_result(self, consult_id: str, timeout: float) -> Awaitable[Any]:  # noqa: ASYNC109
        return self.port.consult_result(consult_id, timeout)

    def bridge(self, other: str, timeout: float) -> Awaitable[tuple[bool, str]]:  # noqa: ASYNC109
        return self.port.bridge(other, timeout)

    def hangup_leg(self, consult_id: str, reason: str) -> None:
        self.port.hangup_leg(consult_id, reason)

    def resume(self, note: str, said: str) -> None:
        if not self.a.hung_up:
            self.a.tasks.spawn(self._resume(note, said), f"bridge-lost-{self.call_id}")

    async def _resume(self, note: str, said: str) -> None:
        """Once the bot is idle (bounded by :data:`RESUME_WAIT_S`: a reply the model gave during
        the bridge is over once the gateway dropped its audio and reported the position), the
        note into the context and ``said`` as the bot's own turn (a bot turn starts only idle)."""
        a = self.a
        deadline = a.clock.now() + RESUME_WAIT_S
        while not a.idle() and not a.hung_up and a.clock.now() < deadline:
            await a.clock.sleep(0.05)
        if a.hung_up:
            return
        a.context.push(SystemMessage(note))
        if said:
            a.say_line(said)


def attach(actor: Any, port: Any, cfg: WarmConfig, base: Path | None = None) -> CallWarm:
    """Give ``actor`` (a cascaded CallActor) its warm transfer over ``port`` (a LinkTelephony):
    the port's ``warm_transfer`` runs it (its Bridge keeps the actor attached), the port's
    BridgeEnded reaches :meth:`CallWarm.bridge_lost`, the actor mutes the caller while it holds
    (and while bridged) and puts its record in the call record."""
    warm = CallWarm(_ActorSeam(actor, port), cfg, actor.clock, base)
    actor.warm = warm
    port.warm = warm.run
    port.bridge_ended = lambda f: warm.bridge_lost(f.reason)
    return warm
