"""A scripted speech-to-speech provider on the injected clock (the simulator's and the tests').

Owns :class:`ScriptedS2s`: a session that hears the caller and answers the way
a realtime model does, in the contract's events, so the S2S stage under test is
the production one. Caller and bot audio are the word codec
(:mod:`brisvox.providers.word_codec`): the session decodes the caller's words
from the audio it is sent (16 kHz, no conversion), and speaks its replies as
encoded words at ``output_rate``, so a listener can decode exactly what it
heard (the simulator's wire oracle).

* Turns: with ``provider`` turn detection its own energy VAD (speech after
  ``vad_start`` s, the end after ``vad_silence`` s of silence: SpeechStarted,
  SpeechStopped, the input transcript, then a response); with ``brisvox`` the
  stage's ``user_ended`` commits the words heard so far.
* Responses: one :class:`S2sReply` of the script per response (the default
  when the script is empty): ``first_audio`` s after the request a response
  starts, its words stream as audio pieces of ``piece`` s at ``speed`` x real
  time, each word's transcript delta just before its audio; then its tool
  calls, then ``response.done``. The stage's ``create_response`` after tool
  results takes the next reply, as does a greeting.
* Barge-in: with ``provider`` detection caller speech during a response
  cancels it by itself (what OpenAI's ``interrupt_response`` does), with
  SpeechStarted first; ``cancel_response`` cancels it too. ``late_audio``
  sends one more piece of a cancelled response (a provider that keeps
  talking after a cancel: the stage must drop it).
* Faults: ``fail_connects`` refused connects (then they work again);
  ``refuse_after`` refuses every connect after that many;
  ``die_at_response`` ends the session (S2sClosed with an error) in the middle
  of that response number.
* :class:`S2sProbe` records every connect's config, truncate, tool result,
  cancel, note and response, for the tests' exact assertions.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import ProviderError
from brisvox.providers.s2s.base import (
    S2sAudio,
    S2sClosed,
    S2sConfig,
    S2sEvent,
    S2sInputTranscript,
    S2sOutputTranscript,
    S2sResponseDone,
    S2sResponseStarted,
    S2sSpeechStarted,
    S2sSpeechStopped,
    S2sToolCall,
    S2sToolResult,
)
from brisvox.providers.scripted_session import EventQueue
from brisvox.providers.word_codec import THRESHOLD, Decoder, Vocab, encode


@dataclass(frozen=True, slots=True)
class S2sCall:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class S2sReply:
    say: str = ""
    calls: tuple[S2sCall, ...] = ()
    first_audio: float = 0.3


@dataclass(slots=True)
class S2sProbe:
    connects: int = 0
    configs: list[S2sConfig] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)  # response ids, in order
    user_turns: list[str] = field(default_factory=list)  # the words committed per turn
    truncates: list[tuple[str, int, str]] = field(default_factory=list)
    tool_results: list[list[S2sToolResult]] = field(default_factory=list)
    cancels: int = 0
    notes: list[str] = field(default_factory=list)
    create_responses: int = 0
    audio_bytes: int = 0
    late_audio_sent: int = 0


class ScriptedS2s:
    name = "scripted_s2s"

    def __init__(self, vocab: Vocab, script: Sequence[S2sReply] = (), *, default: S2sReply | None = None,
                 output_rate: int = 24000, clock: Clock = CLOCK, vad_start: float = 0.04,
                 vad_silence: float = 0.3, piece: float = 0.2, speed: float = 4.0, late_audio: bool = False,
                 fail_connects: int = 0, refuse_after: int = 0, die_at_response: int = 0, mode: Literal["openai", "gemini"] = "openai"
                 ) -> None:
        self.vocab = vocab
        self.script = list(script)
        self.default = default or S2sReply("okay")
        self.output_rate = output_rate
        self.clock = clock
        self.vad_start = vad_start
        self.vad_silence = vad_silence
        self.piece = piece
        self.speed = speed
        self.late_audio = late_audio
        self.fail_connects = fail_connects
        self.refuse_after = refuse_after
        self.die_at_response = die_at_response
        self.mode = mode
        self.probe = S2sProbe()
        self._rids = itertools.count(1)
        self.sessions: list[ScriptedS2sSession] = []

    def next_reply(self) -> S2sReply:
        return self.script.pop(0) if self.script else self.default

    async def connect(self, config: S2sConfig, timeout: float) -> ScriptedS2sSession:  # noqa: ASYNC109
        self.probe.connects += 1
        self.probe.configs.append(config)
        if self.fail_connects > 0 or (self.refuse_after and self.probe.connects > self.refuse_after):
            self.fail_connects = max(0, self.fail_connects - 1)
            raise ProviderError("connect", "scripted refusal")
        await self.clock.sleep(0.05)
        s = ScriptedS2sSession(self, config)
        self.sessions.append(s)
        return s


class ScriptedS2sSession:
    input_rate = 16000
    input_encoding: Literal["pcm16", "g711_ulaw"] = "pcm16"
    supports_truncate = True

    def __init__(self, prov: ScriptedS2s, config: S2sConfig) -> None:
        self.prov = prov
        self.cfg = config
        self.output_rate = prov.output_rate
        self.dropped = 0
        self._q = EventQueue((S2sClosed,))
        self._dec = Decoder(prov.vocab)
        self._heard: list[str] = []
        self._speech = 0.0  # seconds of speech in the current run
        self._silence = 0.0
        self._speaking = False
        self._response: asyncio.Task[None] | None = None
        self._rid = ""
        self._items = itertools.count(1)
        self._closed = False

    # -- audio in and the provider's VAD ----------------------------------------------------
    def send_audio(self, audio: bytes) -> None:
        if self._closed:
            raise ProviderError("closed", "session closed")
        self.prov.probe.audio_bytes += len(audio)
        samples = np.frombuffer(audio, dtype="<i2")
        self._heard += self._dec.feed(samples)
        dur = len(samples) / self.input_rate
        loud = bool(np.any(np.abs(samples.astype(np.int32)) >= THRESHOLD))
        if loud:
            self._speech += dur
            self._silence = 0.0
            if not self._speaking and self._speech >= self.prov.vad_start:
                self._speaking = True
                if self.cfg.turn_detection == "provider":
                    self._push(S2sSpeechStarted())
                    if self._response is not None and not self._response.done():
                        self._cancel()  # the model stops itself when the caller speaks
        else:
            self._silence += dur
            if self._silence >= 0.06:
                self._speech = 0.0
            if self._speaking and self._silence >= self.prov.vad_silence:
                self._speaking = False
                if self.cfg.turn_detection == "provider":
                    self._push(S2sSpeechStopped())
                    self._commit()

    def _commit(self) -> None:
        last = self._dec.close_run()
        words = self._heard + ([last] if last else [])
        self._heard = []
        text = " ".join(words)
        self.prov.probe.user_turns.append(text)
        if text:
            self._push(S2sInputTranscript(text, final=True))
        self._start_response()

    # -- turn detection by the stage ----------------------------------------------------------
    async def user_started(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check()

    async def user_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check()
        self._commit()

    async def create_response(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check()
        self.prov.probe.create_responses += 1
        self._start_response()

    async def cancel_response(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check()
        self._cancel()

    async def truncate(self, item_id: str, audio_end_ms: int, heard_text: str, timeout: float) -> None:  # noqa: ASYNC109
        self._check()
        self.prov.probe.truncates.append((item_id, audio_end_ms, heard_text))

    async def send_tool_results(self, results: Sequence[S2sToolResult], timeout: float) -> None:  # noqa: ASYNC109
        self._check()
        self.prov.probe.tool_results.append(list(results))

    async def send_note(self, text: str, timeout: float) -> None:  # noqa: ASYNC109
        self._check()
        self.prov.probe.notes.append(text)

    def events(self) -> AsyncIterator[S2sEvent]:
        return self._q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self._end("")

    # -- responses ------------------------------------------------------------------------------
    def _start_response(self) -> None:
        if self._response is not None and not self._response.done():
            self._cancel()
        reply = self.prov.next_reply()
        self._response = asyncio.get_running_loop().create_task(self._respond(reply))

    async def _respond(self, reply: S2sReply) -> None:
        p = self.prov
        await p.clock.sleep(reply.first_audio)
        rid = f"resp_{next(p._rids)}"
        self._rid = rid
        p.probe.responses.append(rid)
        self._push(S2sResponseStarted(rid))
        if p.die_at_response and len(p.probe.responses) == p.die_at_response:
            await p.clock.sleep(p.piece / p.speed)
            self._end("scripted cut mid-response")
            return
        words = reply.say.split()
        if words:
            item = f"item_{next(self._items)}"
            audio, spans = encode(p.vocab, words, self.output_rate)
            n = max(1, int(p.piece * self.output_rate))
            said = 0
            for a in range(0, len(audio), n):
                b = min(len(audio), a + n)
                while said < len(spans) and spans[said].start < b:
                    self._push(S2sOutputTranscript(rid, item, ("" if said == 0 else " ") + spans[said].word))
                    said += 1
                self._push(S2sAudio(rid, item, audio[a:b].astype("<i2").tobytes()))
                await p.clock.sleep(p.piece / p.speed)
        for c in reply.calls:
            self._push(S2sToolCall(rid, f"call_{next(p._rids)}", c.name, orjson.dumps(c.args).decode()))
        self._push(S2sResponseDone(rid, "completed"))

    def _cancel(self) -> None:
        t = self._response
        if t is None or t.done():
            return
        self.prov.probe.cancels += 1
        t.cancel()
        rid = self._rid
        if self.prov.late_audio and rid:
            self.prov.probe.late_audio_sent += 1
            audio, _ = encode(self.prov.vocab, ["stale"], self.output_rate)
            self._push(S2sAudio(rid, "item_late", audio.astype("<i2").tobytes()))
        if rid:
            self._push(S2sResponseDone(rid, "cancelled"))

    # -- plumbing ---------------------------------------------------------------------------------
    def _push(self, ev: S2sEvent) -> None:
        if not self._closed:
            self._q.push(ev)

    def _check(self) -> None:
        if self._closed:
            raise ProviderError("closed", "session closed")

    def _end(self, error: str) -> None:
        if self._closed:
            return
        t = self._response
        if t is not None and not t.done() and t is not asyncio.current_task():
            t.cancel()
        self._q.push(S2sClosed(error))
        self._closed = True


__all__ = ["S2sCall", "S2sProbe", "S2sReply", "ScriptedS2s", "ScriptedS2sSession"]
