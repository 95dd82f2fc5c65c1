"""What the WebSocket S2S adapters (OpenAI Realtime, Gemini Live) share.

Owns :class:`S2sWsSession`, on top of :class:`~brisvox.providers.ws_common.WsSession`
(one reader task, the bounded event pipe, exactly one :class:`S2sClosed`):

* Caller audio goes through ONE sender task and a bounded queue
  (``audio_queue`` chunks, 50 = 1 s of 20 ms frames): ``send_audio`` never
  waits; a full queue drops the oldest chunk and counts it
  (``audio_dropped``), so a slow socket delays nothing but its own audio.
  A chunk whose send outlasts ``AUDIO_SEND_TIMEOUT`` stays in the socket's
  write buffer (the library writes a frame before it waits for the drain)
  and the sender goes on: a slow socket is not a dead one; a closed socket
  ends the sender.
  Control messages (``_send_json``) go out directly and are bounded by the
  caller's timeout; the sender's audio and a control message never
  interleave inside one WebSocket frame (the library serialises sends).
  A control message that must FOLLOW the audio queued so far (OpenAI's
  ``input_audio_buffer.commit``, Gemini's ``activityEnd``) awaits
  ``flush_audio(timeout)`` first: it returns once every queued chunk is on
  the socket (a chunk taken from the queue is written in the same step).
* Vendor messages: JSON text only. A frame that is not JSON, not an object,
  larger than ``max_event_bytes`` or of an unknown type is counted in
  ``dropped`` and skipped; the session ends only when the vendor's handler
  says the protocol is dead.
* ``close()`` stops the sender first, then the socket (bounded); the sender also ends with the
  reader (a session the server ended sends nothing more).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any, Literal

import orjson
from websockets.asyncio.client import ClientConnection

from brisvox.providers.base import ProviderError
from brisvox.providers.s2s.base import S2sClosed, S2sEvent
from brisvox.providers.ws_common import WsSession, send_bounded

AUDIO_QUEUE = 50
MAX_EVENT_BYTES = 1 << 20  # a vendor event above this is dropped (audio deltas are ~10-50 KB)
AUDIO_SEND_TIMEOUT = 2.0


class S2sWsSession(WsSession):
    input_rate: int = 16000
    input_encoding: Literal["pcm16", "g711_ulaw"] = "pcm16"
    output_rate: int = 24000
    supports_truncate: bool = False

    def __init__(self, ws: ClientConnection, *, audio_queue: int = AUDIO_QUEUE,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(ws, 1024, S2sClosed)
        self.dropped = 0
        self.audio_dropped = 0
        self.audio_sent = 0
        self._max_event = max_event_bytes
        self._audio: deque[bytes] = deque(maxlen=max(1, audio_queue))
        self._audio_ready = asyncio.Event()
        self._audio_drained = asyncio.Event()
        self._audio_drained.set()
        self._sender = asyncio.get_running_loop().create_task(self._send_audio_loop())
        self._reader.add_done_callback(lambda _t: self._sender.cancel())  # a dead session sends nothing more

    # -- audio in -----------------------------------------------------------------------
    def send_audio(self, audio: bytes) -> None:
        self._check_open()
        if len(self._audio) == self._audio.maxlen:
            self.audio_dropped += 1
        self._audio.append(audio)
        self._audio_drained.clear()
        self._audio_ready.set()

    def _audio_message(self, audio: bytes) -> str:
        """The vendor's message carrying one chunk of caller audio."""
        raise NotImplementedError

    async def _send_audio_loop(self) -> None:
        try:
            while not self._closed:
                await self._audio_ready.wait()
                self._audio_ready.clear()
                while self._audio and not self._closed:
                    chunk = self._audio.popleft()
                    try:
                        await send_bounded(self._ws, self._audio_message(chunk), AUDIO_SEND_TIMEOUT)
                    except ProviderError as e:
                        if e.kind != "timeout":
                            return  # the reader sees the socket end and closes the session
                    self.audio_sent += 1
                self._audio_drained.set()
        finally:
            self._audio_drained.set()

    async def flush_audio(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until every chunk queued so far is on the socket (see the module doc).
        Raises ProviderError("closed") on a dead session, ("timeout") past ``timeout``."""
        self._check_open()
        try:
            async with asyncio.timeout(timeout):
                await self._audio_drained.wait()
        except TimeoutError:
            raise ProviderError("timeout", f"queued audio not sent within {timeout:g}s") from None
        self._check_open()

    def discard_queued_audio(self) -> None:
        self._audio.clear()
        self._audio_drained.set()

    # -- vendor events ----------------------------------------------------------------
    async def _message(self, msg: str | bytes) -> str:
        if isinstance(msg, bytes) or len(msg) > self._max_event:
            self.dropped += 1
            return ""
        try:
            obj = orjson.loads(msg)
        except orjson.JSONDecodeError:
            self.dropped += 1
            return ""
        if not isinstance(obj, dict):
            self.dropped += 1
            return ""
        return await self._handle(obj)

    async def _handle(self, obj: dict[str, Any]) -> str:
        """One vendor event; a non-empty result ends the session with that error."""
        raise NotImplementedError

    async def _emit(self, ev: S2sEvent) -> None:
        await self._pipe.put(ev)

    # -- end ------------------------------------------------------------------------------
    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self._sender.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._sender, min(timeout, 0.5))
        await super().close(timeout)
