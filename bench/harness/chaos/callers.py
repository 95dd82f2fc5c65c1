"""The chaos run's callers: one call per :class:`CallSpec`, over Twilio, native WebSocket or SIP.

A caller speaks the recorded question at each of its :data:`~.script.TURNS`
turns (:class:`brisvox.client.script.CallerScript`: the same state machine as
``brisvox call``), on a 20 ms grid, and keeps what it saw: per-turn latency
(caller stopped -> first loud bot audio), unanswered turns, which voice each
turn's loud bot audio was in (:func:`voice_of`: the primary TTS's 440 Hz
tone or the secondary's 660 Hz one), who ended the call and when. Client-side faults (``CallSpec.fault``):

* ``slowread``: the receive side sleeps 60 ms per message (a slow consumer,
  3x slower than the bot's 20 ms frames): the gateway's send buffer fills;
* ``nomarks`` (Twilio): ``mark`` messages are never echoed;
* ``malformed``: five malformed messages mid-answer (bad JSON, an unknown
  event, a bad binary frame), under the gateway's fault budget;
* ``hangup_answer``: the socket is aborted (no ``stop``) 0.4 s into answer 2;
* ``hangup_tool``: ``slowbook`` calls abort 0.8 s into answer 2, while the
  3 s booking still runs.

Invariants: every await is bounded (open 15 s, the whole call
``MAX_CALL_S``); a transport is always closed or aborted; an exception in
one call is recorded in its result, never raised into the others.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench.harness.call_daemon import SPEECH
from bench.harness.chaos.script import TURNS
from brisvox.client.native import NativeTransport
from brisvox.client.script import CallerScript, ScriptTiming, Step
from brisvox.client.sip import SipTransport
from brisvox.client.speech import Line, is_loud, make_line, read_wav
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport
from brisvox.wire.twilio import TwilioStream

RATE = 8000
MAX_CALL_S = 60.0
TIMING = ScriptTiming(lead_in=0.4, answer_wait=8.0, answer_gap=0.8, pause=0.3, tail=0.4)
READ_DELAY_S = 0.06
VOICE_SPLIT_HZ = 550.0  # between the primary's 440 Hz tone and the secondary's 660 Hz one (vendors.py)


def voice_of(pcm: np.ndarray, rate: int = RATE) -> str:
    """"primary" or "secondary": the tone's frequency from its zero crossings (two per period)."""
    x = pcm.astype(np.int32)
    crossings = int(np.count_nonzero((x[:-1] < 0) != (x[1:] < 0)))
    hz = crossings * rate / (2 * max(1, len(x)))
    return "secondary" if hz > VOICE_SPLIT_HZ else "primary"


@dataclass(frozen=True)
class CallSpec:
    idx: int
    transport: str  # twilio | native | sip
    variant: str  # see script.VARIANTS
    fault: str = ""  # client fault (module docstring)
    delay: float = 0.0  # start offset into the run, seconds

    @property
    def label(self) -> str:
        return f"#{self.idx} {self.transport}/{self.variant}{'/' + self.fault if self.fault else ''}"


@dataclass
class CallResult:
    spec: CallSpec
    call_id: str = ""
    ids: dict[str, str] = field(default_factory=dict)
    t_open: float | None = None
    t_end: float | None = None
    ended_by: str = ""  # client | server | error
    end_reason: str = ""
    turns: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    malformed_sent: int = 0
    marks_dropped: int = 0

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["spec"] = asdict(self.spec)
        return d


def speech_line() -> Line:
    return make_line(SPEECH.name, read_wav(SPEECH, RATE), RATE)


class _WsProxy:
    """A websocket whose reads are slowed and/or whose mark echoes are dropped."""

    def __init__(self, ws: Any, read_delay: float = 0.0, drop_marks: bool = False) -> None:
        self._ws = ws
        self._delay = read_delay
        self._drop_marks = drop_marks
        self.dropped = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)

    def __aiter__(self) -> Any:
        return self._gen()

    async def _gen(self) -> Any:
        async for m in self._ws:
            if self._delay:
                await asyncio.sleep(self._delay)
            yield m

    async def send(self, m: Any) -> None:
        if self._drop_marks and isinstance(m, str) and '"event":"mark"' in m.replace(" ", ""):
            self.dropped += 1
            return
        await self._ws.send(m)


class ChaosTwilio(TwilioTransport):
    def __init__(self, url: str, idx: int, read_delay: float = 0.0, drop_marks: bool = False) -> None:
        super().__init__(url, tag="chaos")
        self.stream = TwilioStream(idx, tag=f"chaos{int(time.time()) % 100000}")
        self.ids = {"streamSid": self.stream.stream_sid, "callSid": self.stream.call_sid}
        self.proxy: _WsProxy | None = None
        self._read_delay, self._drop_marks = read_delay, drop_marks

    async def _receive(self) -> None:
        if self._read_delay or self._drop_marks:
            self.proxy = _WsProxy(self.ws, self._read_delay, self._drop_marks)
            self.ws = self.proxy
        await super()._receive()


class ChaosNative(NativeTransport):
    def __init__(self, url: str, read_delay: float = 0.0) -> None:
        super().__init__(url, rate=RATE)
        self._read_delay = read_delay

    async def _receive(self) -> None:
        if self._read_delay:
            self.ws = _WsProxy(self.ws, self._read_delay)
        await super()._receive()


def make_transport(spec: CallSpec, ws_port: int, sip_port: int) -> Any:
    agent = f"chaos_{spec.variant}"
    delay = READ_DELAY_S if spec.fault == "slowread" else 0.0
    if spec.transport == "twilio":
        return ChaosTwilio(f"ws://127.0.0.1:{ws_port}/twilio/{agent}", spec.idx, delay, spec.fault == "nomarks")
    if spec.transport == "native":
        return ChaosNative(f"ws://127.0.0.1:{ws_port}/ws/{agent}", delay)
    return SipTransport(f"sip:{spec.variant}@127.0.0.1:{sip_port}", codecs=("PCMU",), answer_timeout=15.0)


MALFORMED_TWILIO = ["{not json", '{"event":"media"}', '{"event":"bogus","x":1}', "[1,2,3]", '{"event":"dtmf"}']
MALFORMED_NATIVE = ["{not json", '{"event":"bogus"}', "[1,2,3]", '{"event":"dtmf","dtmf":{}}', '"x"']


async def _abort(tr: Any) -> None:
    """Hang up abruptly: drop the socket without a stop."""
    tr._ended = True
    ws = tr.ws
    if ws is not None and ws.transport is not None:
        ws.transport.abort()
    await tr.close()


async def run_one(spec: CallSpec, line: Line, ws_port: int, sip_port: int) -> CallResult:
    """One call to its end (see the module docstring); never raises."""
    await asyncio.sleep(spec.delay)
    res = CallResult(spec)
    sc = CallerScript([Step(line) for _ in range(TURNS)], RATE, TIMING)
    try:
        tr = make_transport(spec, ws_port, sip_port)
    except Exception as e:  # noqa: BLE001 - recorded
        res.ended_by, res.error = "error", f"{type(e).__name__}: {e}"
        return res

    def on_end(reason: str, now: float) -> None:
        if not res.ended_by:
            res.ended_by, res.end_reason, res.t_end = "server", reason, now
        sc.on_end(reason, now)

    voices: dict[int, Counter[str]] = {}  # turn index -> loud frames per voice

    def on_audio(pcm: np.ndarray, now: float) -> None:
        sc.on_bot_audio(pcm, now)
        turn = sc.attrib
        if turn is not None and len(pcm) and is_loud(pcm):
            voices.setdefault(turn.index, Counter())[voice_of(pcm)] += 1

    events = BotEvents(on_audio=on_audio, on_clear=sc.on_clear, on_dtmf=sc.on_bot_dtmf, on_end=on_end)
    t0 = time.monotonic()
    sc.start(t0)
    try:
        await asyncio.wait_for(tr.open(events), 15.0)
    except Exception as e:  # noqa: BLE001 - a refused call is a result
        res.ended_by, res.error, res.t_end = "error", f"open: {type(e).__name__}: {e}", time.monotonic()
        try:
            await tr.close()
        except Exception:  # noqa: BLE001
            pass
        return res
    res.t_open = time.monotonic()
    res.call_id, res.ids = tr.call_id, dict(tr.ids)
    aborted = False
    try:
        next_t = time.monotonic()
        while True:
            now = time.monotonic()
            if now - t0 > MAX_CALL_S:
                sc.on_end("time limit", now)
                if not res.ended_by:
                    res.ended_by, res.end_reason, res.t_end = "client", "time limit", now
            t2 = sc.turns[1] if len(sc.turns) > 1 else None
            cut = {"hangup_answer": 0.4, "hangup_tool": 0.8}.get(spec.fault)
            if cut is not None and t2 is not None and t2.t_first_audio is not None and now >= t2.t_first_audio + cut:
                res.ended_by, res.end_reason, res.t_end = "client", spec.fault, now
                aborted = True
                await _abort(tr)
                break
            t1 = sc.turns[0] if sc.turns else None
            if (spec.fault == "malformed" and not res.malformed_sent and t1 is not None
                    and t1.t_first_audio is not None and now >= t1.t_first_audio + 0.3):
                for m in MALFORMED_TWILIO if spec.transport == "twilio" else MALFORMED_NATIVE:
                    try:
                        await tr.ws.send(m)
                        res.malformed_sent += 1
                    except Exception:  # noqa: BLE001
                        break
            out = sc.tick(now)
            if out.hangup:
                if not res.ended_by:
                    res.ended_by, res.end_reason, res.t_end = "client", "hung up", now
                break
            if out.frame is not None:
                await tr.send_audio(out.frame)
            next_t += 0.02
            if next_t < time.monotonic() - 0.2:
                next_t = time.monotonic()
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
    except Exception as e:  # noqa: BLE001
        res.error = f"{type(e).__name__}: {e}"
    finally:
        if not aborted:
            try:
                await asyncio.wait_for(tr.close(), 10.0)
            except Exception as e:  # noqa: BLE001
                res.error = res.error or f"close: {type(e).__name__}"
    if isinstance(tr, ChaosTwilio) and tr.proxy is not None:
        res.marks_dropped = tr.proxy.dropped
    res.turns = [{"index": t.index, "latency_ms": t.latency_ms, "unanswered": t.unanswered,
                  "t_speech_start": t.t_speech_start, "t_speech_end": t.t_speech_end,
                  "t_first_audio": t.t_first_audio, "answer_s": round(t.answer_s, 3),
                  "voices": dict(voices.get(t.index, {}))}
                 for t in sc.turns if t.kind != "greeting"]
    return res


async def run_calls(specs: list[CallSpec], ws_port: int, sip_port: int) -> list[CallResult]:
    line = speech_line()
    return list(await asyncio.gather(*(run_one(s, line, ws_port, sip_port) for s in specs)))
