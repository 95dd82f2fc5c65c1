"""Gemini Live (``BidiGenerateContent`` over one WebSocket) behind the S2S contract (:mod:`.base`).

Owns :class:`GeminiLive` (the provider) and :class:`GeminiLiveSession`.

Wire
    ``wss://generativelanguage.googleapis.com/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent``
    with the key in the ``x-goog-api-key`` header (never in the URL, which
    proxies and logs keep). The first client message is ``setup`` (model
    ``models/<model>``, ``responseModalities ["AUDIO"]``, the prebuilt voice,
    the instructions as ``systemInstruction``, the tools as ONE
    ``functionDeclarations`` entry built by :func:`convert_gemini.tools`,
    ``realtimeInputConfig.automaticActivityDetection.disabled`` = brisvox turn
    detection, input and output transcription on, ``sessionResumption`` with
    the handle when resuming); ``connect`` returns once the server answered
    ``setupComplete`` (a close instead is a ProviderError: ``auth``,
    ``rate_limited``, ``bad_request`` or ``server`` by its code and reason; no
    answer within the timeout is ``timeout``). ``config.extra`` is merged into
    the setup (``generationConfig`` into the generation config), e.g.
    ``contextWindowCompression``. The server sends its JSON in BINARY frames
    (text frames are accepted too).

History
    ``config.history`` is replayed before ``connect`` returns as one
    ``clientContent`` with ``turnComplete: false`` (the model does not answer
    it), in the shape :func:`convert_gemini.convert` gives the text LLM: user
    and ``model`` turns, ``functionCall`` parts on the model turn and the
    results of one round as ``functionResponse`` parts of one user turn, a
    short user turn first when the history starts with the bot. Skipped when
    ``config.resume_handle`` is set: the server restores the conversation.

Audio
    In: PCM16 mono 16 kHz only (``input_encoding`` is always ``pcm16``: Gemini
    takes no μ-law), as ``realtimeInput.audio`` with ``mimeType
    audio/pcm;rate=16000``, through the shared bounded sender. Out: the
    ``inlineData`` audio parts of ``modelTurn``, PCM16 24 kHz.

Responses and items (Gemini has neither id: both are minted)
    A response (``gl-r<n>``, its one item ``gl-i<n>``) opens at the first
    ``modelTurn`` / ``outputTranscription`` / ``toolCall`` while none is open
    and ends with S2sResponseDone at ``turnComplete`` (completed), at
    ``interrupted`` (S2sInterrupted, then status cancelled) or right after a
    ``toolCall`` (completed): Gemini 3 sends no ``turnComplete`` before the
    tool response, 2.5 models do; a ``turnComplete`` with no response open is
    ignored. After ``toolResponse`` Gemini goes on by itself (a new response;
    ``create_response`` is a no-op). Model output that still arrives after
    ``interrupted`` (before that turn's ``turnComplete``, our ``activityEnd``
    or ``stale_limit`` seconds) keeps the cancelled response's ids, so the
    stage drops it by its epoch; it never opens a new response.
    ``usageMetadata`` (prompt / response token counts) of the turn goes into
    the Done. ``inputTranscription`` pieces are S2sInputTranscript deltas;
    the whole text follows as a final one at ``finished`` or when the next
    response opens.

Turn detection and barge-in
    ``provider``: Gemini's VAD; it interrupts itself (``interrupted``) and
    nothing is sent by ``user_started`` / ``user_ended`` / ``cancel_response``.
    ``brisvox``: ``user_started`` sends ``activityStart``, ``user_ended``
    ``activityEnd`` (Gemini then answers); ``cancel_response`` sends
    ``activityStart`` (which interrupts the generation) unless an activity is
    already open: the adapter tracks the activity, so two ``activityStart``
    never go out without an ``activityEnd`` between them, and ``user_ended``
    outside an activity sends nothing.

Notes
    ``send_note(text)`` (a late tool result) is a user-role ``clientContent``
    turn with ``turnComplete: false``. Client content interrupts the
    generation in flight, so a note is held while a response is open or tool
    results are awaited, and goes out when that turn ends.

Truncation (an approximation; ``supports_truncate`` False)
    The protocol cannot cut the model's turn at an audio position.
    ``truncate(item_id, audio_end_ms, heard_text)`` sends a ``clientContent``
    with one user turn holding a bracketed note (:func:`truncate_note`): the
    caller heard only ``heard_text`` of the previous answer and the rest was
    not said; ``turnComplete: false`` so nothing is generated for it.

Other server messages
    ``toolCall.functionCalls`` -> one S2sToolCall each (``args`` as JSON
    text); ``toolCallCancellation.ids`` -> S2sToolCancelled;
    ``sessionResumptionUpdate`` -> S2sResumable (the handle; empty while not
    resumable); ``goAway`` -> a non-fatal S2sError ``go_away`` (the stage
    reconnects with the handle). Unknown keys are ignored; a message with
    none of the known keys, a non-JSON / non-object / oversized frame and bad
    base64 audio are counted in ``dropped`` and the session lives on. A close
    or cut ends it with one S2sClosed (``closed: <code>``).

Nothing here logs caller audio, transcripts or tool arguments.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from brisvox.providers import convert_gemini as conv
from brisvox.providers.base import LlmMessage, LlmTool, LlmToolCall, ProviderError
from brisvox.providers.s2s.base import (
    S2sAudio,
    S2sConfig,
    S2sError,
    S2sInputTranscript,
    S2sInterrupted,
    S2sItem,
    S2sOutputTranscript,
    S2sResponseDone,
    S2sResponseStarted,
    S2sResumable,
    S2sToolCall,
    S2sToolCancelled,
    S2sToolResult,
    TurnDetection,
)
from brisvox.providers.s2s.ws_session import MAX_EVENT_BYTES, S2sWsSession
from brisvox.providers.ws_common import b64_pcm, close_ws, resolve_url, send_bounded, ws_connect

API_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
DEFAULT_MODEL = "gemini-live-2.5-flash-preview"
INPUT_RATE = 16000
OUTPUT_RATE = 24000
INPUT_MIME = f"audio/pcm;rate={INPUT_RATE}"
STALE_LIMIT = 1.5  # s: output after `interrupted` keeps the cancelled ids at most this long
KNOWN = ("setupComplete", "serverContent", "toolCall", "toolCallCancellation", "goAway",
         "sessionResumptionUpdate", "usageMetadata")
MINTED_CALL = "gl-c"  # call ids we mint when the server gives none (never echoed back as ids)


# --- pure message builders -------------------------------------------------------------------


def model_path(model: str) -> str:
    return model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"


def setup_message(config: S2sConfig, model: str) -> dict[str, Any]:
    gen: dict[str, Any] = {"responseModalities": ["AUDIO"]}
    if config.voice:
        gen["speechConfig"] = {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": config.voice}}}
    setup: dict[str, Any] = {"model": model_path(model), "generationConfig": gen}
    if config.instructions:
        setup["systemInstruction"] = {"parts": [{"text": config.instructions}]}
    if config.tools:
        setup["tools"] = conv.tools([LlmTool(t.name, t.description, t.parameters) for t in config.tools])
    setup["realtimeInputConfig"] = {
        "automaticActivityDetection": {"disabled": config.turn_detection == "brisvox"}}
    setup["inputAudioTranscription"] = {}
    setup["outputAudioTranscription"] = {}
    setup["sessionResumption"] = {"handle": config.resume_handle} if config.resume_handle else {}
    for k, v in config.extra.items():
        if k == "generationConfig" and isinstance(v, Mapping):
            gen.update(v)
        elif v is not None:
            setup[k] = v
    return {"setup": setup}


def history_turns(items: Sequence[S2sItem]) -> list[dict[str, Any]]:
    """The conversation as Gemini ``Content`` turns (the text LLM's conversion, reused)."""
    msgs: list[LlmMessage] = []
    for it in items:
        last = msgs[-1] if msgs else None
        if it.kind == "user":
            msgs.append(LlmMessage("user", it.text))
        elif it.kind == "assistant":
            if last is not None and last.role == "assistant" and not last.tool_calls:
                msgs[-1] = replace(last, text=" ".join(t for t in (last.text, it.text) if t))
            else:
                msgs.append(LlmMessage("assistant", it.text))
        elif it.kind == "tool_call":
            pid = "" if it.call_id.startswith(MINTED_CALL) else it.call_id
            call = LlmToolCall(it.call_id, it.name, it.arguments or "{}", provider_id=pid)
            if last is not None and last.role == "assistant":
                msgs[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                msgs.append(LlmMessage("assistant", tool_calls=(call,)))
        elif it.kind == "tool_result":
            msgs.append(LlmMessage("tool", it.output, call_id=it.call_id, name=it.name))
    return conv.convert(msgs)[1]


def client_content(turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"clientContent": {"turns": turns, "turnComplete": False}}


def truncate_note(heard_text: str) -> str:
    heard = " ".join(heard_text.split())
    if not heard:
        return "[Note: the caller interrupted you before hearing any of your previous answer; none of it was said.]"
    return (f"[Note: the caller interrupted you. Of your previous answer they heard only: \"{heard}\". "
            "The rest of it was not said.]")


def response_object(output: str) -> dict[str, Any]:
    """A tool's JSON output as the object a ``functionResponse.response`` must be."""
    try:
        value = orjson.loads(output) if output else None
    except orjson.JSONDecodeError:
        value = output
    return value if isinstance(value, dict) else {"result": value}


def setup_refused(code: int, reason: str) -> ProviderError:
    """The ProviderError for a socket the server closed instead of answering the setup."""
    r = reason.lower()
    detail = f"setup refused: close {code} {reason[:200]}".rstrip()
    if "api key" in r or "unauthenticated" in r or "permission" in r:
        return ProviderError("auth", detail, retryable=False)
    if "quota" in r or "resource_exhausted" in r or "rate limit" in r or code == 1013:
        return ProviderError("rate_limited", detail)
    if code in (1003, 1007, 1008):
        return ProviderError("bad_request", detail, retryable=False)
    return ProviderError("server", detail)


async def await_setup(ws: ClientConnection, timeout: float) -> None:  # noqa: ASYNC109
    """Read until ``setupComplete`` (other frames before it are skipped)."""
    try:
        async with asyncio.timeout(max(0.0, timeout)):
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes) and len(msg) <= MAX_EVENT_BYTES:
                    with contextlib.suppress(UnicodeDecodeError):
                        msg = msg.decode()
                if not isinstance(msg, str) or len(msg) > MAX_EVENT_BYTES:
                    continue
                with contextlib.suppress(orjson.JSONDecodeError):
                    obj = orjson.loads(msg)
                    if isinstance(obj, dict) and "setupComplete" in obj:
                        return
    except TimeoutError:
        raise ProviderError("timeout", f"no setupComplete within {timeout:g}s") from None
    except ConnectionClosed as e:
        raise setup_refused(e.rcvd.code if e.rcvd else 1006, e.rcvd.reason if e.rcvd else "") from None


# --- the session ---------------------------------------------------------------------------------


class GeminiLiveSession(S2sWsSession):
    input_rate = INPUT_RATE
    output_rate = OUTPUT_RATE
    supports_truncate = False

    def __init__(self, ws: ClientConnection, turn_detection: TurnDetection, *,
                 stale_limit: float = STALE_LIMIT) -> None:
        super().__init__(ws)
        self.turn_detection: TurnDetection = turn_detection
        self.resume_handle = ""  # the latest resumable handle the server gave
        self.go_away = ""  # the goAway timeLeft, once the server announced its close
        self._stale_limit = stale_limit
        self._n = 0
        self._rid = ""  # the response in flight ("" = none)
        self._iid = ""
        self._stale: tuple[str, str, float] = ("", "", 0.0)  # interrupted response, item, when
        self._usage = (0, 0)
        self._heard = ""  # input transcription of the caller's turn so far
        self._active = False  # brisvox mode: an activityStart is open
        self._minted: set[str] = set()
        self._notes: list[str] = []  # send_note texts held while a response is in flight
        self._tool_wait = False  # a toolCall ended the last response; Gemini waits for the results

    # -- client messages ------------------------------------------------------------------------
    def _audio_message(self, audio: bytes) -> str:
        return ('{"realtimeInput":{"audio":{"data":"' + base64.b64encode(audio).decode()
                + '","mimeType":"' + INPUT_MIME + '"}}}')

    async def _activity(self, start: bool, timeout: float) -> None:  # noqa: ASYNC109
        self._active = start
        await self._send_json({"realtimeInput": {"activityStart" if start else "activityEnd": {}}}, timeout)

    async def user_started(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        if self.turn_detection == "brisvox" and not self._active:
            await self._activity(True, timeout)

    async def user_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        if self.turn_detection == "brisvox" and self._active:
            end = time.monotonic() + timeout
            await self.flush_audio(timeout)  # activityEnd must follow the turn's audio
            self._stale = ("", "", 0.0)  # what comes next answers the new turn
            await self._activity(False, max(0.01, end - time.monotonic()))

    async def create_response(self, timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()  # Gemini continues by itself after a toolResponse

    async def cancel_response(self, timeout: float) -> None:  # noqa: ASYNC109
        """brisvox mode: ``activityStart`` interrupts the generation (unless one is open);
        provider mode: Gemini already interrupted itself. A closed session: nothing to stop."""
        if self._closed or self.turn_detection != "brisvox" or self._active:
            return
        with contextlib.suppress(ProviderError):
            await self._activity(True, timeout)

    async def truncate(self, item_id: str, audio_end_ms: int, heard_text: str,
                       timeout: float) -> None:  # noqa: ASYNC109
        turn = {"role": "user", "parts": [{"text": truncate_note(heard_text)}]}
        await self._send_json(client_content([turn]), timeout)

    async def send_note(self, text: str, timeout: float) -> None:  # noqa: ASYNC109
        """A user-role ``clientContent`` turn, ``turnComplete: false``. Client content interrupts
        the generation in flight, so while a response is open (or tool results are awaited)
        the note is held and goes out when that turn ends."""
        self._check_open()
        if not text:
            return
        if self._rid or self._tool_wait:
            self._notes.append(text)
            return
        await self._send_json(client_content([{"role": "user", "parts": [{"text": text}]}]), timeout)

    async def _send_held_notes(self) -> None:
        notes, self._notes = self._notes, []
        turns = [{"role": "user", "parts": [{"text": t}]} for t in notes]
        with contextlib.suppress(ProviderError):
            await self._send_json(client_content(turns), 2.0)

    async def send_tool_results(self, results: Sequence[S2sToolResult], timeout: float) -> None:  # noqa: ASYNC109
        self._check_open()
        if not results:
            return
        out: list[dict[str, Any]] = []
        for r in results:
            fr: dict[str, Any] = {"name": r.name, "response": response_object(r.output)}
            if r.call_id not in self._minted:
                fr = {"id": r.call_id, **fr}
            out.append(fr)
        await self._send_json({"toolResponse": {"functionResponses": out}}, timeout)

    async def send_history(self, items: Sequence[S2sItem], timeout: float) -> None:  # noqa: ASYNC109
        turns = history_turns(items)
        if turns:
            await self._send_json(client_content(turns), timeout)

    # -- server messages ----------------------------------------------------------------------
    async def _message(self, msg: str | bytes) -> str:
        if isinstance(msg, bytes):  # Gemini sends its JSON in binary frames
            if len(msg) > self._max_event:
                self.dropped += 1
                return ""
            try:
                msg = msg.decode()
            except UnicodeDecodeError:
                self.dropped += 1
                return ""
        return await super()._message(msg)

    async def _handle(self, obj: dict[str, Any]) -> str:
        if not any(k in obj for k in KNOWN):
            self.dropped += 1
            return ""
        um = obj.get("usageMetadata")
        if isinstance(um, dict):
            self._usage = (_int(um.get("promptTokenCount")),
                           _int(um.get("responseTokenCount") or um.get("candidatesTokenCount")))
        sc = obj.get("serverContent")
        sc = sc if isinstance(sc, dict) else {}
        await self._content(sc)
        tc = obj.get("toolCall")
        if isinstance(tc, dict):
            await self._tool_call(tc)
        if sc.get("interrupted") is True:
            await self._interrupted()
        if sc.get("turnComplete") is True:
            self._stale = ("", "", 0.0)
            if self._rid:
                await self._end("completed")
        tcc = obj.get("toolCallCancellation")
        if isinstance(tcc, dict):
            ids = tcc.get("ids")
            ids = tuple(str(i) for i in ids if isinstance(i, str | int)) if isinstance(ids, list) else ()
            if ids:
                await self._emit(S2sToolCancelled(ids))
                self._tool_wait = False
                self._release_notes()
        sru = obj.get("sessionResumptionUpdate")
        if isinstance(sru, dict):
            handle = sru.get("newHandle")
            if sru.get("resumable") is True and isinstance(handle, str) and handle:
                self.resume_handle = handle
                await self._emit(S2sResumable(handle))
            else:
                await self._emit(S2sResumable(""))
        ga = obj.get("goAway")
        if isinstance(ga, dict):
            self.go_away = str(ga.get("timeLeft") or "")
            await self._emit(S2sError("go_away", f"the server ends the session in {self.go_away or '?'}",
                                      fatal=False))
        return ""

    async def _content(self, sc: dict[str, Any]) -> None:
        mt = sc.get("modelTurn")
        parts = mt.get("parts") if isinstance(mt, dict) else None
        for part in parts if isinstance(parts, list) else []:
            inline = part.get("inlineData") if isinstance(part, dict) else None
            if not isinstance(inline, dict) or not str(inline.get("mimeType", "audio/")).startswith("audio/"):
                continue  # text / thought parts are not spoken
            pcm = b64_pcm(inline.get("data"))
            if pcm is None:
                self.dropped += 1
                continue
            if pcm:
                rid, iid = await self._target()
                await self._emit(S2sAudio(rid, iid, pcm))
        ot = sc.get("outputTranscription")
        text = ot.get("text") if isinstance(ot, dict) else None
        if isinstance(text, str) and text:
            rid, iid = await self._target()
            await self._emit(S2sOutputTranscript(rid, iid, text))
        it = sc.get("inputTranscription")
        if isinstance(it, dict):
            text = it.get("text")
            if isinstance(text, str) and text:
                self._heard += text
                await self._emit(S2sInputTranscript(text, final=False))
            if it.get("finished") is True:
                await self._heard_final()

    async def _tool_call(self, tc: dict[str, Any]) -> None:
        calls = tc.get("functionCalls")
        calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        if not calls:
            self.dropped += 1
            return
        rid = self._rid or (await self._open())[0]  # a call after `interrupted` is a new response
        for fc in calls:
            cid = fc.get("id")
            if not isinstance(cid, str) or not cid:
                cid = f"{MINTED_CALL}{len(self._minted) + 1}"
                self._minted.add(cid)
            args = fc.get("args")
            await self._emit(S2sToolCall(rid, cid, str(fc.get("name") or ""),
                                         orjson.dumps(args if args is not None else {}).decode()))
        self._tool_wait = True  # set before the end: held notes wait for the results' turn
        await self._end("completed")  # the calls are the response; the rest follows the results

    async def _interrupted(self) -> None:
        if not self._rid:
            return
        rid, iid = self._rid, self._iid
        await self._emit(S2sInterrupted(rid))
        await self._end("cancelled")
        self._stale = (rid, iid, time.monotonic())

    # -- responses ------------------------------------------------------------------------------
    async def _target(self) -> tuple[str, str]:
        """The ids model output belongs to: the open response, the interrupted one while its
        turn is not over, or a new response."""
        if self._rid:
            return self._rid, self._iid
        rid, iid, at = self._stale
        if rid and time.monotonic() - at < self._stale_limit:
            return rid, iid
        return await self._open()

    async def _open(self) -> tuple[str, str]:
        self._n += 1
        self._rid, self._iid = f"gl-r{self._n}", f"gl-i{self._n}"
        self._stale = ("", "", 0.0)
        self._usage = (0, 0)
        self._tool_wait = False
        await self._heard_final()
        await self._emit(S2sResponseStarted(self._rid))
        return self._rid, self._iid

    async def _end(self, status: str) -> None:
        rid, self._rid, self._iid = self._rid, "", ""
        await self._emit(S2sResponseDone(rid, status, *self._usage))
        self._usage = (0, 0)
        self._release_notes()

    def _release_notes(self) -> None:
        if self._notes and not self._closed and not self._rid and not self._tool_wait:
            self._tasks.spawn(self._send_held_notes())

    async def _heard_final(self) -> None:
        if self._heard:
            text, self._heard = self._heard, ""
            await self._emit(S2sInputTranscript(text, final=True))


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


# --- the provider ----------------------------------------------------------------------------


class GeminiLive:
    def __init__(self, api_key: str | None, *, model: str = DEFAULT_MODEL,
                 base_url: str = "wss://generativelanguage.googleapis.com", voice: str = "",
                 name: str = "gemini_live", stale_limit: float = STALE_LIMIT) -> None:
        if not api_key:
            raise ProviderError("auth", "gemini_live: no API key (set GEMINI_API_KEY)", retryable=False)
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.voice = voice
        self.stale_limit = stale_limit
        self._headers = {"x-goog-api-key": api_key}

    @property
    def url(self) -> str:
        return self.base_url + API_PATH

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await resolve_url(self.base_url, timeout)

    async def connect(self, config: S2sConfig, timeout: float) -> GeminiLiveSession:  # noqa: ASYNC109
        end = time.monotonic() + timeout
        ws = await ws_connect(self.url, self._headers, timeout)
        try:
            if self.voice and not config.voice:
                config = replace(config, voice=self.voice)
            setup = setup_message(config, config.model or self.model)
            await send_bounded(ws, orjson.dumps(setup).decode(), max(0.01, end - time.monotonic()))
            await await_setup(ws, end - time.monotonic())
        except BaseException:
            await close_ws(ws, 0.5)
            raise
        session = GeminiLiveSession(ws, config.turn_detection, stale_limit=self.stale_limit)
        if config.history and not config.resume_handle:
            try:
                await session.send_history(config.history, max(0.01, end - time.monotonic()))
            except BaseException:
                await session.close(0.5)
                raise
        return session
