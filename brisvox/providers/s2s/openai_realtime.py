"""OpenAI Realtime speech-to-speech over one WebSocket per call (the GA event protocol).

Owns :class:`OpenAiRealtime` and :class:`OpenAiRealtimeSession`, the
:mod:`brisvox.providers.s2s.base` contract on OpenAI's Realtime events.

Wire shape: the GA one (no ``OpenAI-Beta`` header). ``wss://.../v1/realtime?model=<model>``
with ``Authorization: Bearer <key>``; the set-up is one ``session.update``::

    {"type": "realtime", "output_modalities": ["audio"], "instructions": ...,
     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}   # or {"type": "audio/pcmu"}
                         "transcription": {"model": ..., "language": ...},
                         "turn_detection": {"type": "server_vad", ...} | null},
               "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": ...}},
     "tools": [{"type": "function", "name", "description", "parameters"}], "tool_choice": "auto"}

``connect`` returns once ``session.updated`` arrived (an ``error`` instead:
ProviderError ``auth`` for a key/permission code, else ``bad_request``),
after replaying ``config.history`` as ``conversation.item.create`` items, in
order: user text ``{"type": "message", "role": "user", "content":
[{"type": "input_text"}]}``, assistant text (``output_text``; what the caller
heard), ``function_call`` and ``function_call_output``. Input is PCM16 at
24 kHz, or G.711 μ-law at 8 kHz with ``config.g711_passthrough``; output is
PCM16 at 24 kHz. Beta event names of the output (``response.audio.delta``,
``response.audio_transcript.delta``) are accepted too.

Calls: ``send_audio`` -> ``input_audio_buffer.append`` (base64, through the
shared sender). ``user_started`` sends nothing: the caller's audio has been
streaming into the input buffer all along, and brisvox's VAD fires after the
speech began, so an ``input_audio_buffer.clear`` would cut the start of the
turn (barge-in is ``cancel_response``). ``user_ended`` waits until the
queued audio is on the socket, then ``input_audio_buffer.commit`` +
``response.create``. ``cancel_response`` sends ``response.cancel`` only for a
response in flight (``response.created`` .. ``response.done``); a response we
asked for that the server has not announced yet is cancelled as soon as its
``response.created`` arrives; the caller's queued audio keeps flowing.
``truncate`` -> ``conversation.item.truncate`` (``content_index`` 0,
``audio_end_ms``; the server trims the transcript itself, ``heard_text`` is
not sent). ``send_tool_results`` -> one ``function_call_output`` item per
result, in order, and no ``response.create`` (the stage asks for it).
``send_note`` -> a ``system`` message item (``input_text``), no response
asked for; the Realtime API takes items while a response is in flight
without interrupting it, so nothing is held back.

Events: ``input_audio_buffer.speech_started/stopped`` -> S2sSpeechStarted/
Stopped (``audio_start_ms``/``audio_end_ms``); input transcription
``.delta``/``.completed`` -> S2sInputTranscript (final False/True);
``response.created`` -> S2sResponseStarted; audio delta -> S2sAudio (a chunk
that is not base64 is counted in ``dropped``); transcript delta ->
S2sOutputTranscript; a function call -> exactly one S2sToolCall per
``call_id``, from the first of ``response.function_call_arguments.done`` /
``response.output_item.done`` / ``response.done``'s output that carries the
arguments, else assembled from the argument deltas at ``response.done``
(dropped when the response was cancelled); ``response.done`` ->
S2sResponseDone (status, usage tokens); ``error`` -> S2sError non-fatal,
except ``session_expired`` which ends the session (S2sError fatal, then
S2sClosed with the reason); ``response_cancel_not_active`` (a cancel that
crossed the response's end) is swallowed. Audio of a response we cancelled
is passed on unmarked (the stage checks its epoch). Known benign events
(:data:`BENIGN`) are ignored; any other type, and argument deltas of a call
already answered, are counted in ``dropped``.
"""

from __future__ import annotations

import asyncio
import base64
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson
from websockets.asyncio.client import ClientConnection

from brisvox.providers.base import ProviderError
from brisvox.providers.s2s.base import (
    S2sAudio,
    S2sConfig,
    S2sError,
    S2sInputTranscript,
    S2sItem,
    S2sOutputTranscript,
    S2sResponseDone,
    S2sResponseStarted,
    S2sSpeechStarted,
    S2sSpeechStopped,
    S2sToolCall,
    S2sToolResult,
)
from brisvox.providers.s2s.ws_session import AUDIO_QUEUE, MAX_EVENT_BYTES, S2sWsSession
from brisvox.providers.ws_common import b64_pcm, resolve_url, ws_connect

DEFAULT_MODEL = "gpt-realtime"
DEFAULT_URL = "wss://api.openai.com/v1/realtime"
TRANSCRIPTION_MODEL = "gpt-4o-mini-transcribe"
RATE = 24000
SERVER_VAD: dict[str, Any] = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                              "silence_duration_ms": 500, "create_response": True, "interrupt_response": True}
AUTH_CODES = frozenset({"invalid_api_key", "invalid_authentication", "unauthorized", "authentication_error",
                        "permission_denied", "insufficient_permissions", "forbidden"})
FATAL_CODES = frozenset({"session_expired"})
SWALLOWED_CODES = frozenset({"response_cancel_not_active"})
AUDIO_DELTA = frozenset({"response.output_audio.delta", "response.audio.delta"})
TRANSCRIPT_DELTA = frozenset({"response.output_audio_transcript.delta", "response.audio_transcript.delta"})
BENIGN = frozenset({
    "session.created", "session.updated", "transcription_session.updated", "rate_limits.updated",
    "conversation.created", "conversation.item.created", "conversation.item.added", "conversation.item.done",
    "conversation.item.retrieved", "conversation.item.deleted", "conversation.item.truncated",
    "conversation.item.input_audio_transcription.segment", "response.output_item.added",
    "response.content_part.added", "response.content_part.done", "response.output_audio.done",
    "response.audio.done", "response.output_audio_transcript.done", "response.audio_transcript.done",
    "response.output_text.delta", "response.output_text.done", "response.text.delta", "response.text.done",
    "input_audio_buffer.committed", "input_audio_buffer.cleared", "input_audio_buffer.timeout_triggered",
    "output_audio_buffer.started", "output_audio_buffer.stopped", "output_audio_buffer.cleared",
})
CALLS_REMEMBERED = 256


@dataclass
class _Call:
    """A function call being streamed: its deltas until a done event carries the arguments."""

    response_id: str
    name: str = ""
    parts: list[str] = field(default_factory=list)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def history_item(item: S2sItem) -> dict[str, Any] | None:
    """The ``conversation.item.create`` item of one replayed entry (None: nothing to replay)."""
    if item.kind in ("user", "assistant"):
        if not item.text:
            return None
        part = "input_text" if item.kind == "user" else "output_text"
        return {"type": "message", "role": item.kind, "content": [{"type": part, "text": item.text}]}
    if item.kind == "tool_call":
        return {"type": "function_call", "call_id": item.call_id, "name": item.name,
                "arguments": item.arguments or "{}"}
    if item.kind == "tool_result":
        return {"type": "function_call_output", "call_id": item.call_id, "output": item.output}
    return None


def session_config(config: S2sConfig, voice: str, transcription_model: str) -> dict[str, Any]:
    """The ``session`` object of the set-up ``session.update`` (the GA shape, see the module doc)."""
    fmt: dict[str, Any] = {"type": "audio/pcmu"} if config.g711_passthrough else {"type": "audio/pcm",
                                                                                    "rate": RATE}
    vad: dict[str, Any] | None = None
    if config.turn_detection == "provider":
        vad = {**SERVER_VAD, **_obj(config.extra.get("vad"))}
    transcription: dict[str, Any] = {"model": str(config.extra.get("transcription_model") or transcription_model)}
    if config.language:
        transcription["language"] = config.language.split("-")[0]
    output: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": RATE}}
    if config.voice or voice:
        output["voice"] = config.voice or voice
    return {
        "type": "realtime",
        "output_modalities": ["audio"],
        "instructions": config.instructions,
        "audio": {"input": {"format": fmt, "transcription": transcription, "turn_detection": vad},
                  "output": output},
        "tools": [{"type": "function", "name": t.name, "description": t.description,
                   "parameters": dict(t.parameters)} for t in config.tools],
        "tool_choice": "auto",
    }


class _Deadline:
    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._end = self._loop.time() + timeout

    def left(self) -> float:
        return max(0.0, self._end - self._loop.time())


class OpenAiRealtimeSession(S2sWsSession):
    supports_truncate = True
    output_rate = RATE

    def __init__(self, ws: ClientConnection, *, g711: bool, audio_queue: int = AUDIO_QUEUE,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(ws, audio_queue=audio_queue, max_event_bytes=max_event_bytes)
        self.input_rate = 8000 if g711 else RATE
        self.input_encoding = "g711_ulaw" if g711 else "pcm16"
        self.errors = 0
        self._ready: asyncio.Future[ProviderError | None] = asyncio.get_running_loop().create_future()
        self._in_flight = ""  # response id between response.created and response.done
        self._cancel_sent = ""  # the response id we sent response.cancel for
        self._requested = 0  # response.create sent, response.created not seen yet
        self._cancel_wanted = False  # cancel the response we asked for once it is announced
        self._calls: dict[str, _Call] = {}  # call_id -> a call not answered yet
        self._item_call: dict[str, str] = {}  # item_id -> call_id (deltas without a call_id)
        self._answered: OrderedDict[str, None] = OrderedDict()  # call ids already emitted

    # -- calls ------------------------------------------------------------------------
    def _audio_message(self, audio: bytes) -> str:
        return orjson.dumps({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(audio).decode()}).decode()

    async def user_started(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()  # nothing on the wire (see the module doc)

    async def user_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        d = _Deadline(timeout)
        await self.flush_audio(d.left())
        await self._send_json({"type": "input_audio_buffer.commit"}, d.left())
        await self.create_response(d.left())

    async def create_response(self, timeout: float) -> None:  # noqa: ASYNC109
        self._requested += 1
        try:
            await self._send_json({"type": "response.create"}, timeout)
        except ProviderError:
            self._requested -= 1
            raise

    async def cancel_response(self, timeout: float) -> None:  # noqa: ASYNC109
        rid = self._in_flight
        if rid and rid != self._cancel_sent:
            self._cancel_sent = rid
            await self._send_json({"type": "response.cancel", "response_id": rid}, timeout)
        elif not rid and self._requested > 0:
            self._cancel_wanted = True

    async def truncate(self, item_id: str, audio_end_ms: int, heard_text: str,
                       timeout: float) -> None:  # noqa: ASYNC109
        await self._send_json({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                               "audio_end_ms": max(0, int(audio_end_ms))}, timeout)

    async def send_tool_results(self, results: Sequence[S2sToolResult], timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        d = _Deadline(timeout)
        for r in results:
            await self._send_json({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": r.call_id, "output": r.output}}, d.left())

    async def send_note(self, text: str, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        if text:
            await self._send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "system", "content": [{"type": "input_text", "text": text}]}}, timeout)

    async def _replay(self, history: Sequence[S2sItem], d: _Deadline) -> None:
        for item in history:
            obj = history_item(item)
            if obj is not None:
                await self._send_json({"type": "conversation.item.create", "item": obj}, d.left())

    # -- events -----------------------------------------------------------------------
    async def _handle(self, obj: dict[str, Any]) -> str:
        t = obj.get("type")
        if not isinstance(t, str):
            self.dropped += 1
            return ""
        if t in AUDIO_DELTA:
            pcm = b64_pcm(obj.get("delta"))
            if pcm is None:
                self.dropped += 1
            elif pcm:
                await self._emit(S2sAudio(_str(obj.get("response_id")), _str(obj.get("item_id")), pcm))
        elif t in TRANSCRIPT_DELTA:
            text = _str(obj.get("delta"))
            if text:
                await self._emit(S2sOutputTranscript(_str(obj.get("response_id")), _str(obj.get("item_id")), text))
        elif t == "response.created":
            await self._response_created(_str(_obj(obj.get("response")).get("id")))
        elif t == "response.done":
            await self._response_done(_obj(obj.get("response")))
        elif t == "response.function_call_arguments.delta":
            self._call_delta(obj)
        elif t == "response.function_call_arguments.done":
            await self._call_done(_str(obj.get("call_id")) or self._item_call.get(_str(obj.get("item_id")), ""),
                                  _str(obj.get("response_id")), _str(obj.get("name")), obj.get("arguments"))
        elif t in ("response.output_item.added", "response.output_item.done"):
            await self._output_item(t, _str(obj.get("response_id")), _obj(obj.get("item")))
        elif t == "input_audio_buffer.speech_started":
            await self._emit(S2sSpeechStarted(_int(obj.get("audio_start_ms"), -1)))
        elif t == "input_audio_buffer.speech_stopped":
            await self._emit(S2sSpeechStopped(_int(obj.get("audio_end_ms"), -1)))
        elif t == "conversation.item.input_audio_transcription.delta":
            text = _str(obj.get("delta"))
            if text:
                await self._emit(S2sInputTranscript(text, final=False))
        elif t == "conversation.item.input_audio_transcription.completed":
            await self._emit(S2sInputTranscript(_str(obj.get("transcript")), final=True))
        elif t == "conversation.item.input_audio_transcription.failed":
            err = _obj(obj.get("error"))
            self.errors += 1
            await self._emit(S2sError(_str(err.get("code")) or "transcription_failed",
                                      _str(err.get("message"))[:200]))
        elif t == "error":
            return await self._error(_obj(obj.get("error")))
        elif t == "session.updated" and not self._ready.done():
            self._ready.set_result(None)
        elif t not in BENIGN:
            self.dropped += 1
        return ""

    async def _error(self, err: dict[str, Any]) -> str:
        code = _str(err.get("code")) or _str(err.get("type")) or "error"
        message = _str(err.get("message"))[:200]
        if not self._ready.done():
            auth = code in AUTH_CODES or _str(err.get("type")) in AUTH_CODES
            self._ready.set_result(ProviderError("auth" if auth else "bad_request", f"{code}: {message}",
                                                 retryable=False))
            return ""
        if code in SWALLOWED_CODES:
            return ""
        if code == "conversation_already_has_active_response":
            self._requested = max(0, self._requested - 1)  # that response.create will not be answered
        self.errors += 1
        fatal = code in FATAL_CODES
        await self._emit(S2sError(code, message, fatal=fatal))
        return f"{code}: {message}" if fatal else ""

    async def _response_created(self, rid: str) -> None:
        self._in_flight = rid
        self._requested = max(0, self._requested - 1)
        await self._emit(S2sResponseStarted(rid))
        if self._cancel_wanted:
            self._cancel_wanted = False
            self._cancel_sent = rid
            self._tasks.spawn(self._send_quietly({"type": "response.cancel", "response_id": rid}))

    async def _send_quietly(self, obj: Mapping[str, Any]) -> None:
        try:
            await self._send_json(obj, 2.0)
        except ProviderError:
            pass

    async def _response_done(self, resp: dict[str, Any]) -> None:
        rid = _str(resp.get("id"))
        status = _str(resp.get("status")) or "completed"
        out = resp.get("output")
        for item in out if isinstance(out, list) else ():
            item = _obj(item)
            if item.get("type") == "function_call" and item.get("status", "completed") == "completed":
                await self._call_done(_str(item.get("call_id")), rid, _str(item.get("name")),
                                      item.get("arguments"))
        for call_id, call in list(self._calls.items()):
            if call.response_id in (rid, "") or not rid:
                if status not in ("cancelled", "failed"):
                    await self._call_done(call_id, rid, call.name, None, assemble=True)
                self._calls.pop(call_id, None)
        self._item_call = {i: c for i, c in self._item_call.items() if c in self._calls}
        if rid == self._in_flight or not rid:
            self._in_flight = ""
        usage = _obj(resp.get("usage"))
        await self._emit(S2sResponseDone(rid, status, _int(usage.get("input_tokens")),
                                         _int(usage.get("output_tokens"))))

    def _call(self, call_id: str, response_id: str) -> _Call:
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = _Call(response_id)
        return call

    def _call_delta(self, obj: dict[str, Any]) -> None:
        item_id = _str(obj.get("item_id"))
        call_id = _str(obj.get("call_id")) or self._item_call.get(item_id, "")
        if not call_id or call_id in self._answered:
            self.dropped += 1  # unattributable, or late: the call was already answered
            return
        if item_id:
            self._item_call[item_id] = call_id
        self._call(call_id, _str(obj.get("response_id"))).parts.append(_str(obj.get("delta")))

    async def _output_item(self, t: str, rid: str, item: dict[str, Any]) -> None:
        if item.get("type") != "function_call":
            return
        call_id = _str(item.get("call_id"))
        if not call_id:
            self.dropped += 1
            return
        if _str(item.get("id")):
            self._item_call[_str(item["id"])] = call_id
        if call_id in self._answered:
            return
        if t == "response.output_item.done" and item.get("status", "completed") == "completed":
            await self._call_done(call_id, rid, _str(item.get("name")), item.get("arguments"))
        else:
            call = self._call(call_id, rid)
            call.name = call.name or _str(item.get("name"))

    async def _call_done(self, call_id: str, rid: str, name: str, arguments: Any, *,
                         assemble: bool = False) -> None:
        """Emit the call once, when an event carries its arguments (``assemble``: at
        ``response.done``, from the deltas; a done event without them waits for that)."""
        if not call_id or call_id in self._answered:
            return
        call = self._call(call_id, rid)
        call.name = call.name or name
        args = _str(arguments)
        if not args:
            if not assemble:
                return
            args = "".join(call.parts) or "{}"
        self._answered[call_id] = None
        while len(self._answered) > CALLS_REMEMBERED:
            self._answered.popitem(last=False)
        self._calls.pop(call_id, None)
        await self._emit(S2sToolCall(rid or call.response_id, call_id, call.name, args))


class OpenAiRealtime:
    """The provider: one :class:`OpenAiRealtimeSession` per ``connect``."""

    def __init__(self, api_key: str | None, *, model: str = DEFAULT_MODEL, base_url: str = DEFAULT_URL,
                 voice: str = "", transcription_model: str = TRANSCRIPTION_MODEL,
                 audio_queue: int = AUDIO_QUEUE, max_event_bytes: int = MAX_EVENT_BYTES,
                 name: str = "openai_realtime") -> None:
        if not api_key:
            raise ProviderError("auth", "openai_realtime: no API key (set OPENAI_API_KEY)", retryable=False)
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.voice = voice
        self.transcription_model = transcription_model
        self.audio_queue = audio_queue
        self.max_event_bytes = max_event_bytes
        self._headers = {"Authorization": f"Bearer {api_key}"}

    def url(self, model: str) -> str:
        return f"{self.base_url}?model={quote(model, safe='')}"

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await resolve_url(self.base_url, timeout)

    async def connect(self, config: S2sConfig, timeout: float) -> OpenAiRealtimeSession:  # noqa: ASYNC109
        d = _Deadline(timeout)
        ws = await ws_connect(self.url(config.model or self.model), self._headers, timeout)
        s = OpenAiRealtimeSession(ws, g711=config.g711_passthrough, audio_queue=self.audio_queue,
                                  max_event_bytes=self.max_event_bytes)
        try:
            await s._send_json({"type": "session.update",
                                "session": session_config(config, self.voice, self.transcription_model)},
                               d.left())
            waits: set[asyncio.Future[Any]] = {s._ready, s._reader}
            done, _ = await asyncio.wait(waits, timeout=d.left(),
                                         return_when=asyncio.FIRST_COMPLETED)
            if s._ready.done():
                err = s._ready.result()
                if err is not None:
                    raise err
            elif done:
                raise ProviderError("connect", "the server closed the socket during the session set-up")
            else:
                raise ProviderError("timeout", f"no session.updated within {timeout:g}s")
            await s._replay(config.history, d)
        except BaseException:
            await s.close(min(1.0, max(0.1, d.left())))
            raise
        return s
