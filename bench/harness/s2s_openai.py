"""A loopback WebSocket server that speaks OpenAI's Realtime event protocol (the GA names).

:class:`FakeRealtime` (a :class:`~bench.harness.ws_vendors.FakeWs`) answers
``session.update`` with ``session.updated``, acknowledges items, commits,
clears and truncates the way the service does, and plays a script of
responses (:class:`Scripted`: audio streamed in ``response.output_audio.delta``
chunks, fast or at real time, a transcript split into deltas interleaved with
the audio, function calls streamed as argument deltas). Each
``response.create`` starts the next scripted response; with ``server_vad`` in
the session, speech (PCM energy of the appended audio) followed by the
configured silence commits the turn and starts it, and speech over a response
cancels it. ``response.cancel`` stops the streaming and answers
``response.done`` with status ``cancelled``. Past the script's end a
response is ``default`` (a short empty one unless given).

Everything the client sent is in :attr:`FakeRealtime.log` (:class:`RtLog`):
every event (appends without their audio), the session config, the appended
audio bytes, and the audio byte count at each commit.

Modes (comma-separated, ``FakeRealtime("reorder,garbage")``):

* ``reject``: HTTP 401 at the handshake; ``silent``: never answers
  ``session.update``; ``slow_first``: ``slow_first_s`` before ``session.updated``;
  ``setup_error`` / ``setup_auth``: an ``error`` (``invalid_value`` /
  ``invalid_api_key``) instead of ``session.updated``.
* ``reorder``: ``response.output_item.done`` of a call before its last
  argument delta; ``deltas_only``: argument deltas, then an
  ``output_item.done`` without arguments, and no ``arguments.done``.
* ``error_mid``: a non-fatal ``error`` after the first audio chunk;
  ``expire``: ``session_expired`` there, then the server closes; ``cut``: the
  socket is aborted there.
* ``garbage``: before the first chunk, a non-JSON frame, a JSON array, an
  unknown event type and an audio delta that is not base64 (4 drops);
  ``oversized``: a 1.2 MiB event there (1 drop).
* ``after_cancel``: 3 audio deltas of the cancelled response after a
  ``response.cancel``, then its ``response.done``.
* ``stall``: after ``session.updated`` the server stops reading until
  :attr:`FakeRealtime.resume` is set (a slow socket).

The response-level faults (``error_mid`` .. ``oversized``) hit the first
response of a connection only, so a test can prove the session lives on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from websockets.asyncio.server import ServerConnection

from bench.harness.ws_vendors import FakeWs, WsLog
from brisvox.wire.g711 import ulaw_decode

RATE = 24000


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: str  # JSON text, streamed in 3 deltas
    call_id: str = ""  # default call_<response>_<index>


@dataclass(frozen=True)
class Scripted:
    """One response of the script."""

    audio_ms: int = 300
    transcript: str = ""
    calls: tuple[ScriptedCall, ...] = ()
    chunk_ms: int = 100
    realtime: bool = False  # pace the chunks at real time (else as fast as the socket takes them)
    status: str = "completed"  # of its response.done: completed | incomplete | failed
    input_tokens: int = 50
    output_tokens: int = 20
    level: int = 0  # chunk i's samples are level + 100 (i + 1) (0: a ramp the tests check the order by)


@dataclass
class RtLog(WsLog):
    events: list[dict[str, Any]] = field(default_factory=list)
    session: dict[str, Any] = field(default_factory=dict)
    audio: bytearray = field(default_factory=bytearray)
    audio_at_commit: list[int] = field(default_factory=list)
    responses: int = 0

    @property
    def types(self) -> list[str]:
        return [str(e.get("type")) for e in self.events]

    def of(self, t: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == t]


def _chunk(n_samples: int, value: int) -> bytes:
    return np.full(n_samples, value, dtype=np.int16).tobytes()


class _Conn:
    """One client connection: its response task and server-VAD state."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.task: asyncio.Task[None] | None = None
        self.current = ("", "")  # (response id, audio item id) streaming now
        self.n = 0
        self.inputs = 0
        self.buffered_ms = 0.0
        self.pos_ms = 0.0
        self.speaking = False
        self.silent_ms = 0.0
        self.events = 0

    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


class FakeRealtime(FakeWs):
    log: RtLog

    def __init__(self, mode: str = "", script: tuple[Scripted, ...] = (), *, user_text: str = "book a table for two",
                 slow_first_s: float = 0.3, vad_threshold: float = 500.0, default: Scripted | None = None) -> None:
        super().__init__(mode)
        self.modes = {m for m in mode.split(",") if m}
        self.mode = "reject" if "reject" in self.modes else mode
        self.script = list(script)
        self.default = default or Scripted(audio_ms=100)  # every response past the script
        self.user_text = user_text
        self.slow_first_s = slow_first_s
        self.vad_threshold = vad_threshold
        self.log = RtLog()
        self.resume = asyncio.Event()

    async def __aenter__(self) -> FakeRealtime:
        await super().__aenter__()
        return self

    # -- plumbing ------------------------------------------------------------------------
    async def _send(self, c: _Conn, obj: dict[str, Any]) -> None:
        c.events += 1
        await c.ws.send(orjson.dumps({"event_id": f"event_{c.events}", **obj}).decode())

    def _vad(self) -> dict[str, Any] | None:
        td = self.log.session.get("audio", {}).get("input", {}).get("turn_detection")
        return td if isinstance(td, dict) and td.get("type") == "server_vad" else None

    def _input_rate(self) -> tuple[int, bool]:
        fmt = self.log.session.get("audio", {}).get("input", {}).get("format", {})
        return (8000, True) if fmt.get("type") == "audio/pcmu" else (RATE, False)

    async def serve(self, ws: ServerConnection) -> None:
        c = _Conn(ws)
        try:
            await self._send(c, {"type": "session.created", "session": {"id": "sess_fake", "type": "realtime",
                                                                        "object": "realtime.session"}})
            async for msg in ws:
                obj = orjson.loads(msg)
                if isinstance(obj, dict):
                    await self._on(c, obj)
        finally:
            if c.task is not None:
                c.task.cancel()

    # -- client events -----------------------------------------------------------------
    async def _on(self, c: _Conn, obj: dict[str, Any]) -> None:
        t = obj.get("type")
        if t == "input_audio_buffer.append":
            pcm = base64.b64decode(obj.get("audio", ""))
            self.log.events.append({"type": t, "bytes": len(pcm)})
            self.log.audio += pcm
            await self._appended(c, pcm)
            return
        self.log.events.append(obj)
        if t == "session.update":
            await self._session_update(c, obj.get("session") or {})
        elif t == "input_audio_buffer.commit":
            self.log.audio_at_commit.append(len(self.log.audio))
            if c.buffered_ms < 100:
                await self._send(c, {"type": "error", "error": {
                    "type": "invalid_request_error", "code": "input_audio_buffer_commit_empty",
                    "message": "buffer too small"}})
            else:
                await self._committed(c)
        elif t == "input_audio_buffer.clear":
            c.buffered_ms = 0
            await self._send(c, {"type": "input_audio_buffer.cleared"})
        elif t == "conversation.item.create":
            item = {"id": f"item_c{len(self.log.events)}", "object": "realtime.item", **(obj.get("item") or {})}
            await self._send(c, {"type": "conversation.item.added", "previous_item_id": None, "item": item})
            await self._send(c, {"type": "conversation.item.done", "previous_item_id": None, "item": item})
        elif t == "conversation.item.truncate":
            await self._send(c, {"type": "conversation.item.truncated", "item_id": obj.get("item_id"),
                                 "content_index": obj.get("content_index"), "audio_end_ms": obj.get("audio_end_ms")})
        elif t == "response.create":
            if c.busy():
                await self._send(c, {"type": "error", "error": {
                    "type": "invalid_request_error", "code": "conversation_already_has_active_response",
                    "message": "a response is in progress"}})
            else:
                self._start(c)
        elif t == "response.cancel":
            if c.busy():
                await self._cancel(c)
            else:
                await self._send(c, {"type": "error", "error": {
                    "type": "invalid_request_error", "code": "response_cancel_not_active",
                    "message": "no active response"}})

    async def _session_update(self, c: _Conn, session: dict[str, Any]) -> None:
        self.log.session = session
        if "silent" in self.modes:
            return
        if "slow_first" in self.modes:
            await asyncio.sleep(self.slow_first_s)
        if "setup_error" in self.modes or "setup_auth" in self.modes:
            code = "invalid_api_key" if "setup_auth" in self.modes else "invalid_value"
            await self._send(c, {"type": "error", "error": {"type": "invalid_request_error", "code": code,
                                                            "message": "rejected", "param": "session"}})
            return
        await self._send(c, {"type": "session.updated", "session": {"id": "sess_fake",
                                                                    "object": "realtime.session", **session}})
        if "stall" in self.modes:
            await self.resume.wait()

    async def _appended(self, c: _Conn, raw: bytes) -> None:
        rate, ulaw = self._input_rate()
        samples = ulaw_decode(raw).astype(np.float64) if ulaw else \
            np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.float64)
        ms = 1000.0 * len(samples) / rate
        c.buffered_ms += ms
        vad = self._vad()
        if vad is not None and len(samples):
            loud = float(np.sqrt(np.mean(samples * samples))) >= self.vad_threshold
            if loud:
                c.silent_ms = 0
                if not c.speaking:
                    c.speaking = True
                    await self._send(c, {"type": "input_audio_buffer.speech_started",
                                         "audio_start_ms": int(c.pos_ms), "item_id": f"item_in_{c.inputs + 1}"})
                    if c.busy() and vad.get("interrupt_response", True):
                        await self._cancel(c)
            elif c.speaking:
                c.silent_ms += ms
                if c.silent_ms >= int(vad.get("silence_duration_ms", 500)):
                    c.speaking = False
                    await self._send(c, {"type": "input_audio_buffer.speech_stopped",
                                         "audio_end_ms": int(c.pos_ms + ms), "item_id": f"item_in_{c.inputs + 1}"})
                    await self._committed(c)
                    if vad.get("create_response", True) and not c.busy():
                        self._start(c)
        c.pos_ms += ms

    async def _committed(self, c: _Conn) -> None:
        c.inputs += 1
        c.buffered_ms = 0
        item = f"item_in_{c.inputs}"
        await self._send(c, {"type": "input_audio_buffer.committed", "previous_item_id": None, "item_id": item})
        words = self.user_text.split()
        for i, w in enumerate(words):
            await self._send(c, {"type": "conversation.item.input_audio_transcription.delta", "item_id": item,
                                 "content_index": 0, "delta": w if i == 0 else " " + w})
        await self._send(c, {"type": "conversation.item.input_audio_transcription.completed", "item_id": item,
                             "content_index": 0, "transcript": self.user_text})

    # -- responses ---------------------------------------------------------------------
    def _start(self, c: _Conn) -> None:
        sc = self.script.pop(0) if self.script else self.default
        self.log.responses += 1
        c.n += 1
        c.current = (f"resp_{c.n}", f"item_{c.n}")
        c.task = asyncio.get_running_loop().create_task(self._respond(c, sc, *c.current))

    async def _cancel(self, c: _Conn) -> None:
        assert c.task is not None
        c.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await c.task
        rid, item = c.current
        if "after_cancel" in self.modes:
            for i in range(3):
                await self._send(c, {"type": "response.output_audio.delta", "response_id": rid, "item_id": item,
                                     "output_index": 0, "content_index": 0,
                                     "delta": base64.b64encode(_chunk(240, 7000 + i)).decode()})
        await self._send(c, {"type": "response.done", "response": {
            "id": rid, "object": "realtime.response", "status": "cancelled",
            "status_details": {"type": "cancelled", "reason": "client_cancelled"}, "output": [],
            "usage": {"total_tokens": 10, "input_tokens": 8, "output_tokens": 2}}})

    async def _hostile_first(self, c: _Conn, rid: str, item: str) -> None:
        if "garbage" in self.modes:
            await c.ws.send("this is not json {")
            await c.ws.send("[1, 2, 3]")
            await self._send(c, {"type": "response.brand_new_thing", "response_id": rid})
            await self._send(c, {"type": "response.output_audio.delta", "response_id": rid, "item_id": item,
                                 "output_index": 0, "content_index": 0, "delta": "@@@ not base64 @@@"})
        if "oversized" in self.modes:
            await self._send(c, {"type": "response.output_audio.delta", "response_id": rid, "item_id": item,
                                 "output_index": 0, "content_index": 0, "delta": "A" * (1200 * 1024)})

    async def _hostile_after_chunk(self, c: _Conn) -> bool:
        """After the first audio chunk; True: the response (and maybe the socket) ends here."""
        if "error_mid" in self.modes:
            await self._send(c, {"type": "error", "error": {"type": "server_error", "code": "server_hiccup",
                                                            "message": "transient"}})
        if "expire" in self.modes:
            await self._send(c, {"type": "error", "error": {
                "type": "invalid_request_error", "code": "session_expired",
                "message": "Your session hit the maximum duration of 60 minutes."}})
            await c.ws.close()
            return True
        if "cut" in self.modes:
            c.ws.transport.abort()
            return True
        return False

    async def _respond(self, c: _Conn, sc: Scripted, rid: str, item: str) -> None:
        pace = sc.chunk_ms / 1000.0 if sc.realtime else 0.0
        output: list[dict[str, Any]] = []
        await self._send(c, {"type": "response.created", "response": {
            "id": rid, "object": "realtime.response", "status": "in_progress", "output": []}})
        if sc.audio_ms > 0 or sc.transcript:
            msg: dict[str, Any] = {"id": item, "type": "message", "role": "assistant", "status": "in_progress",
                                   "content": []}
            part = {"response_id": rid, "item_id": item, "output_index": 0, "content_index": 0}
            await self._send(c, {"type": "response.output_item.added", "response_id": rid, "output_index": 0,
                                 "item": msg})
            await self._send(c, {"type": "response.content_part.added", **part,
                                 "part": {"type": "audio", "transcript": ""}})
            if c.n == 1:
                await self._hostile_first(c, rid, item)
            words = sc.transcript.split()
            deltas = [w if i == 0 else " " + w for i, w in enumerate(words)]
            n = math.ceil(sc.audio_ms / sc.chunk_ms) if sc.audio_ms > 0 else 0
            per = RATE * sc.chunk_ms // 1000
            left = RATE * sc.audio_ms // 1000
            for i in range(max(n, len(deltas))):
                if i < n:
                    k = min(per, left)
                    left -= k
                    await self._send(c, {"type": "response.output_audio.delta", **part,
                                         "delta": base64.b64encode(_chunk(k, sc.level + 100 * (i + 1))).decode()})
                    if i == 0 and c.n == 1 and await self._hostile_after_chunk(c):
                        return
                if i < len(deltas):
                    await self._send(c, {"type": "response.output_audio_transcript.delta", **part,
                                         "delta": deltas[i]})
                await asyncio.sleep(pace)
            await self._send(c, {"type": "response.output_audio_transcript.done", **part,
                                 "transcript": sc.transcript})
            await self._send(c, {"type": "response.output_audio.done", **part})
            await self._send(c, {"type": "response.content_part.done", **part,
                                 "part": {"type": "audio", "transcript": sc.transcript}})
            msg = {**msg, "status": "completed",
                   "content": [{"type": "output_audio", "transcript": sc.transcript}]}
            await self._send(c, {"type": "response.output_item.done", "response_id": rid, "output_index": 0,
                                 "item": msg})
            output.append(msg)
        for j, call in enumerate(sc.calls):
            output.append(await self._stream_call(c, rid, len(output), j, call))
        await self._send(c, {"type": "response.done", "response": {
            "id": rid, "object": "realtime.response", "status": sc.status, "status_details": None,
            "output": [] if "deltas_only" in self.modes else output,
            "usage": {"total_tokens": sc.input_tokens + sc.output_tokens, "input_tokens": sc.input_tokens,
                      "output_tokens": sc.output_tokens}}})

    async def _stream_call(self, c: _Conn, rid: str, index: int, j: int, call: ScriptedCall) -> dict[str, Any]:
        call_id = call.call_id or f"call_{rid[5:]}_{j}"
        fc: dict[str, Any] = {"id": f"fc_{rid[5:]}_{j}", "type": "function_call", "status": "in_progress",
                              "call_id": call_id, "name": call.name, "arguments": ""}
        base = {"response_id": rid, "item_id": fc["id"], "output_index": index, "call_id": call_id}
        await self._send(c, {"type": "response.output_item.added", "response_id": rid, "output_index": index,
                             "item": fc})
        a = call.arguments
        cut = [0, len(a) // 3, 2 * len(a) // 3, len(a)]
        parts = [a[cut[k]:cut[k + 1]] for k in range(3)]
        done = {**fc, "status": "completed", "arguments": a}
        item_done = {"type": "response.output_item.done", "response_id": rid, "output_index": index,
                     "item": {**done, "arguments": ""} if "deltas_only" in self.modes else done}
        for k, p in enumerate(parts):
            if k == 2 and "reorder" in self.modes:
                await self._send(c, item_done)
            await self._send(c, {"type": "response.function_call_arguments.delta", **base, "delta": p})
        if "deltas_only" not in self.modes:
            await self._send(c, {"type": "response.function_call_arguments.done", **base, "name": call.name,
                                 "arguments": a})
        if "reorder" not in self.modes:
            await self._send(c, item_done)
        return done
