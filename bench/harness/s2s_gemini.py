"""A loopback WebSocket server that speaks Gemini Live's ``BidiGenerateContent`` protocol.

:class:`FakeGeminiLive` (a :class:`~bench.harness.ws_vendors.FakeWs`) answers
``setup`` with ``setupComplete`` and plays a script of model answers, one per
caller turn. Like Gemini it sends its JSON in binary frames (``text_frames``
for text ones). A caller turn ends at ``activityEnd`` (set-up with automatic
activity detection disabled), at a ``clientContent`` with ``turnComplete``,
or (automatic mode) when a simple energy detector heard ``min_speech_ms`` of
speech in the ``realtimeInput`` audio and then ``silence_ms`` of silence.

An answer is a tuple of :class:`Say` parts: each streams ``audio_ms`` of
PCM16 24 kHz as ``modelTurn.inlineData`` chunks of ``chunk_ms`` with the
``text`` as ``outputTranscription`` pieces; a part with ``calls`` then sends
them in a ``toolCall`` and the next part follows the client's
``toolResponse`` by itself (no client request), as Gemini does. The answer
ends with ``generationComplete`` and ``turnComplete`` (+ ``usageMetadata``:
100 prompt tokens, one response token per 40 ms of audio), then a
``sessionResumptionUpdate`` whose handle restores the script position when a
later ``setup`` carries it. ``heard`` texts are sent as ``inputTranscription``
at the start of the answer of the same index.

Barge-in: ``activityStart`` (or ``barge_ms`` of speech in automatic mode)
during an answer stops the stream and sends ``interrupted`` then
``turnComplete``; during a tool wait it sends ``toolCallCancellation``.

Everything the client sent is in :attr:`log` (:class:`GlLog`): the setups,
the kind of every message in order, the audio bytes and MIME types, the
activity signals, the ``clientContent`` and ``toolResponse`` bodies.

Modes (comma-separated): ``reject`` (HTTP 403), ``silent_setup`` (never
answers the setup), ``slow_setup`` (``setup_delay`` before setupComplete),
``close_setup`` (close 1008 instead of setupComplete), ``transcript_first``
(each transcript piece before its audio), ``bundled`` (audio + transcript in
one message; generation/turn complete in the last), ``split_tool`` (a
toolCall split in two messages), ``tool_turn_complete`` (a turnComplete
after the toolCall, as 2.5 models do), ``error_close`` (close 1011 with a
reason after the first chunk), ``cut`` (socket aborted after the first
chunk), ``oversized`` (a > 1 MiB frame in the first answer), ``garbage``
(non-JSON, a JSON array, unknown keys, bad base64 audio in the first
answer), ``late_audio`` (a chunk AFTER ``interrupted``), ``go_away`` (a
goAway after setupComplete).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from websockets.asyncio.server import ServerConnection

from bench.harness.ws_vendors import FakeWs, WsLog

OUT_RATE = 24000


@dataclass(frozen=True)
class Say:
    """One part of a model answer (see the module doc)."""

    audio_ms: int = 0
    text: str = ""
    calls: tuple[tuple[str, str, Mapping[str, Any]], ...] = ()  # (id, name, args)


Answer = tuple[Say, ...]


@dataclass
class GlLog(WsLog):
    setups: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # every client message, in order
    audio: bytearray = field(default_factory=bytearray)
    audio_mimes: set[str] = field(default_factory=set)
    client_contents: list[dict[str, Any]] = field(default_factory=list)
    tool_responses: list[dict[str, Any]] = field(default_factory=list)
    answers: int = 0  # answers started
    interrupts: int = 0
    cancellations: int = 0
    handles: list[str] = field(default_factory=list)  # handles issued
    resumed: list[str] = field(default_factory=list)  # known handles a setup came back with


def pcm(ms: int, value: int = 1000, rate: int = OUT_RATE) -> bytes:
    return value.to_bytes(2, "little", signed=True) * (rate * ms // 1000)


def pieces(text: str) -> list[str]:
    """Transcript pieces whose concatenation is ``text`` (a word and its trailing space each)."""
    return re.findall(r"\s*\S+\s*", text) if text.strip() else []


class _Conn:
    def __init__(self, ws: ServerConnection, manual: bool, pos: int, resumption: bool) -> None:
        self.ws = ws
        self.manual = manual
        self.pos = pos
        self.resumption = resumption
        self.task: asyncio.Task[None] | None = None
        self.tool_ids: list[str] = []  # calls waiting for their toolResponse
        self.tool_done = asyncio.Event()
        self.speech_ms = 0.0
        self.silence_ms = 0.0
        self.barge_ms = 0.0
        self.first_chunk_done = False

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


class FakeGeminiLive(FakeWs):
    def __init__(self, mode: str = "", script: tuple[Answer, ...] = (), *, heard: tuple[str, ...] = (),
                 chunk_ms: int = 40, pace: float = 0.005, setup_delay: float = 0.3, text_frames: bool = False,
                 speech_level: int = 300, min_speech_ms: int = 100, silence_ms: int = 200,
                 barge_ms: int = 60) -> None:
        super().__init__(mode)
        self.modes = {m for m in mode.split(",") if m}
        self.script = script
        self.heard = heard
        self.chunk_ms = chunk_ms
        self.pace = pace
        self.setup_delay = setup_delay
        self.text_frames = text_frames
        self.speech_level = speech_level
        self.min_speech_ms = min_speech_ms
        self.silence_ms = silence_ms
        self.barge_ms_needed = barge_ms
        self.log: GlLog = GlLog()
        self._handles: dict[str, int] = {}
        self._hostile_sent = False

    async def __aenter__(self) -> FakeGeminiLive:
        await super().__aenter__()
        return self

    def _check(self, conn: ServerConnection, request: Any) -> Any:
        if "reject" in self.modes:
            return conn.respond(403, "API key not valid\n")
        return None

    async def _send(self, ws: ServerConnection, obj: Any) -> None:
        data = orjson.dumps(obj)
        await ws.send(data.decode() if self.text_frames else data)

    # -- the connection -------------------------------------------------------------------
    async def serve(self, ws: ServerConnection) -> None:
        first = await ws.recv()
        obj = orjson.loads(first)
        self.log.kinds.append("setup")
        self.log.controls.append(obj)
        setup = obj.get("setup") if isinstance(obj, dict) else None
        if not isinstance(setup, dict):
            await ws.close(1007, "Invalid JSON payload: the first message must be setup")
            return
        self.log.setups.append(setup)
        if "silent_setup" in self.modes:
            async for msg in ws:
                self._record(msg)
            return
        if "close_setup" in self.modes:
            await ws.close(1008, "models/unknown is not found for API version v1beta")
            return
        if "slow_setup" in self.modes:
            await asyncio.sleep(self.setup_delay)
        aad = (setup.get("realtimeInputConfig") or {}).get("automaticActivityDetection") or {}
        resumption = setup.get("sessionResumption")
        handle = resumption.get("handle") if isinstance(resumption, dict) else None
        pos = 0
        if isinstance(handle, str) and handle in self._handles:
            pos = self._handles[handle]
            self.log.resumed.append(handle)
        conn = _Conn(ws, aad.get("disabled") is True, pos, isinstance(resumption, dict))
        await self._send(ws, {"setupComplete": {}})
        if "go_away" in self.modes:
            await self._send(ws, {"goAway": {"timeLeft": "10s"}})
        try:
            async for msg in ws:
                await self._client(conn, msg)
        finally:
            if conn.task is not None:
                conn.task.cancel()
                with contextlib.suppress(BaseException):
                    await conn.task

    def _record(self, msg: str | bytes) -> dict[str, Any]:
        obj = orjson.loads(msg)
        ri = obj.get("realtimeInput") if isinstance(obj, dict) else None
        if isinstance(ri, dict) and "audio" in ri:
            audio = ri["audio"]
            data = base64.b64decode(audio.get("data", ""))
            self.log.audio += data
            self.log.audio_bytes += len(data)
            self.log.audio_mimes.add(str(audio.get("mimeType")))
            self.log.kinds.append("audio")
            return obj
        self.log.controls.append(obj)
        if isinstance(ri, dict):
            self.log.kinds += [k for k in ("activityStart", "activityEnd") if k in ri]
        elif isinstance(obj, dict) and "clientContent" in obj:
            self.log.kinds.append("clientContent")
            self.log.client_contents.append(obj["clientContent"])
        elif isinstance(obj, dict) and "toolResponse" in obj:
            self.log.kinds.append("toolResponse")
            self.log.tool_responses.append(obj["toolResponse"])
        else:
            self.log.kinds.append("other")
        return obj

    async def _client(self, conn: _Conn, msg: str | bytes) -> None:
        obj = self._record(msg)
        ri = obj.get("realtimeInput")
        if isinstance(ri, dict):
            if "audio" in ri and not conn.manual:
                await self._detect(conn, ri["audio"])
            if "activityStart" in ri:
                await self._interrupt(conn)
            if "activityEnd" in ri:
                self._start(conn)
        elif "clientContent" in obj:
            if obj["clientContent"].get("turnComplete") is True:
                self._start(conn)
        elif "toolResponse" in obj:
            conn.tool_done.set()

    async def _detect(self, conn: _Conn, audio: dict[str, Any]) -> None:
        m = re.search(r"rate=(\d+)", str(audio.get("mimeType")))
        rate = int(m.group(1)) if m else 16000
        samples = np.frombuffer(base64.b64decode(audio.get("data", "")), dtype="<i2")
        if not len(samples):
            return
        ms = len(samples) * 1000 / rate
        loud = float(np.abs(samples.astype(np.int32)).mean()) >= self.speech_level
        if conn.busy:
            conn.barge_ms = conn.barge_ms + ms if loud else 0.0
            if conn.barge_ms >= self.barge_ms_needed:
                conn.speech_ms, conn.silence_ms = conn.barge_ms, 0.0  # the caller goes on
                conn.barge_ms = 0.0
                await self._interrupt(conn)
            return
        if loud:
            conn.speech_ms += ms
            conn.silence_ms = 0.0
        elif conn.speech_ms >= self.min_speech_ms:
            conn.silence_ms += ms
            if conn.silence_ms >= self.silence_ms:
                conn.speech_ms = conn.silence_ms = 0.0
                self._start(conn)

    # -- answers --------------------------------------------------------------------------
    def _start(self, conn: _Conn) -> None:
        if conn.busy:
            return
        pos = conn.pos
        conn.pos += 1
        self.log.answers += 1
        answer = self.script[pos] if pos < len(self.script) else ()
        conn.task = asyncio.get_running_loop().create_task(self._answer(conn, pos, answer))

    async def _interrupt(self, conn: _Conn) -> None:
        if not conn.busy:
            return
        assert conn.task is not None
        conn.task.cancel()
        with contextlib.suppress(BaseException):
            await conn.task
        if conn.tool_ids:
            ids, conn.tool_ids = conn.tool_ids, []
            self.log.cancellations += 1
            await self._send(conn.ws, {"toolCallCancellation": {"ids": ids}})
            return
        self.log.interrupts += 1
        await self._send(conn.ws, {"serverContent": {"interrupted": True}})
        if "late_audio" in self.modes:
            await self._audio(conn, pcm(self.chunk_ms, 77), "")
        await self._send(conn.ws, {"serverContent": {"turnComplete": True}})

    async def _answer(self, conn: _Conn, pos: int, answer: Answer) -> None:
        ws = conn.ws
        if pos < len(self.heard) and self.heard[pos]:
            ps = pieces(self.heard[pos]) or [self.heard[pos]]
            for i, p in enumerate(ps):
                tr: dict[str, Any] = {"text": p}
                if i == len(ps) - 1:
                    tr["finished"] = True
                await self._send(ws, {"serverContent": {"inputTranscription": tr}})
        total_ms = 0
        for say in answer:
            total_ms += say.audio_ms
            await self._say(conn, say, pos)
            if say.calls:
                conn.tool_ids = [c[0] for c in say.calls]
                conn.tool_done.clear()
                fcs = [{"id": cid, "name": name, "args": dict(args)} for cid, name, args in say.calls]
                if "split_tool" in self.modes and len(fcs) > 1:
                    await self._send(ws, {"toolCall": {"functionCalls": fcs[:1]}})
                    await self._send(ws, {"toolCall": {"functionCalls": fcs[1:]}})
                else:
                    await self._send(ws, {"toolCall": {"functionCalls": fcs}})
                if "tool_turn_complete" in self.modes:
                    await self._send(ws, {"serverContent": {"turnComplete": True}})
                await conn.tool_done.wait()
                conn.tool_ids = []
        usage = {"promptTokenCount": 100, "responseTokenCount": total_ms // 40,
                 "totalTokenCount": 100 + total_ms // 40}
        if "bundled" in self.modes:
            await self._send(ws, {"serverContent": {"generationComplete": True, "turnComplete": True},
                                  "usageMetadata": usage})
        else:
            await self._send(ws, {"serverContent": {"generationComplete": True}})
            await self._send(ws, {"serverContent": {"turnComplete": True}, "usageMetadata": usage})
        if conn.resumption:
            handle = f"h{len(self.log.handles) + 1}"
            self._handles[handle] = conn.pos
            self.log.handles.append(handle)
            await self._send(ws, {"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})

    async def _say(self, conn: _Conn, say: Say, pos: int) -> None:
        words = pieces(say.text)
        n = max(1, -(-say.audio_ms // self.chunk_ms)) if say.audio_ms else 1
        left = say.audio_ms
        for k in range(n):
            ms = min(self.chunk_ms, left)
            left -= ms
            text = "".join(words[k * len(words) // n:(k + 1) * len(words) // n])
            await self._audio(conn, pcm(ms, 1000 + pos) if ms else b"", text)
            if not conn.first_chunk_done:
                conn.first_chunk_done = True
                await self._hostile(conn)
            await asyncio.sleep(self.pace)

    async def _audio(self, conn: _Conn, audio: bytes, text: str) -> None:
        ws = conn.ws
        turn: dict[str, Any] = {"modelTurn": {"parts": [{"inlineData": {"mimeType": f"audio/pcm;rate={OUT_RATE}",
                                                        "data": base64.b64encode(audio).decode()}}]}}
        tr: dict[str, Any] = {"outputTranscription": {"text": text}}
        if "bundled" in self.modes:
            sc: dict[str, Any] = {**(turn if audio else {}), **(tr if text else {})}
            if sc:
                await self._send(ws, {"serverContent": sc})
            return
        order = [tr, turn] if "transcript_first" in self.modes else [turn, tr]
        for sc in order:
            if (sc is turn and audio) or (sc is tr and text):
                await self._send(ws, {"serverContent": sc})

    async def _hostile(self, conn: _Conn) -> None:
        """The faults sent once, after the first chunk of the first answer."""
        ws = conn.ws
        if "cut" in self.modes:
            ws.transport.abort()
            await asyncio.sleep(3600)  # the connection is gone; wait for the cancel
        if "error_close" in self.modes:
            await ws.close(1011, "Internal error encountered.")
            await asyncio.sleep(3600)
        if self._hostile_sent:
            return
        self._hostile_sent = True
        if "oversized" in self.modes:
            big = base64.b64encode(pcm(25_000)).decode()  # ~1.6 MiB of base64
            await self._send(ws, {"serverContent": {"modelTurn": {"parts": [
                {"inlineData": {"mimeType": f"audio/pcm;rate={OUT_RATE}", "data": big}}]}}})
        if "garbage" in self.modes:
            await ws.send(b"\x00this is not json")
            await ws.send("[1, 2, 3]")
            await self._send(ws, {"somethingNew": {"x": 1}})
            await self._send(ws, {"serverContent": {"modelTurn": {"parts": [
                {"inlineData": {"mimeType": f"audio/pcm;rate={OUT_RATE}", "data": "@@not base64@@"}}]}}})
