"""A test peer playing FreeSWITCH's mod_audio_stream and the event handler docs/TRANSPORTS.md describes.

Built from mod_audio_stream's README (github.com/amigniter/mod_audio_stream;
the wire is :mod:`brisvox.wire.audio_stream`), section by section:

* "API / Commands", ``uuid_audio_stream <uuid> start <wss-url> mono 8k
  <metadata>``: the module connects to ``wss-url`` and sends ``metadata`` as
  the first TEXT message (:meth:`FreeSwitchPeer.hello`: a JSON object with
  the channel's ``uuid`` and the numbers), then the caller's audio as BINARY
  L16 frames, 20 ms each (:meth:`FreeSwitchPeer.send_audio`).
  ``STREAM_EXTRA_HEADERS`` adds ``Authorization: Bearer <token>`` (``token=``).
* "Events / play": a ``streamAudio`` TEXT message is written to a file and
  played by the handler (here: its audio handed to ``on_audio`` at once).
* "Events / response" (``mod_audio_stream::json``): any other TEXT message
  reaches the handler; ``{"type":"clear"}`` is its ``uuid_break`` (``on_clear``:
  the flush the peer sees), ``{"type":"hangup"}`` its ``uuid_kill`` (the
  channel hangs up and the module closes the socket); anything else is
  counted ``invalid``.
* The handler's ``uuid_audio_stream <uuid> send_text {"type":"dtmf","digit":"5"}``
  on a DTMF event carries the caller's digits (``send_dtmf``).
* ``stop`` or the channel's hang-up closes the socket: no message (``bye`` is None).
"""

from __future__ import annotations

import numpy as np
import orjson

from brisvox.client.media_stream import StreamTransport
from brisvox.wire import audio_stream as fs
from brisvox.wire.mediastream import L16LE


class FreeSwitchPeer(StreamTransport):
    """One FreeSWITCH channel streaming to a bot with mod_audio_stream (see the module docstring)."""

    def __init__(self, url: str, rate: int = 8000, params: dict[str, str] | None = None, token: str = "") -> None:
        super().__init__(url, params)
        self.rate = rate
        self.stream = fs.FreeSwitchStream(params=self.params, rate=rate)
        self.ids = {"uuid": self.stream.uuid}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def hello(self) -> list[str]:
        return [self.stream.metadata()]

    def bye(self) -> str | None:
        return None  # stop, or the channel's hang-up, only closes

    async def on_message(self, message: str | bytes, now: float) -> None:
        if isinstance(message, bytes):  # the module reads no binary message
            self.invalid += 1
            return
        try:
            event, value = fs.bot_event(orjson.loads(message))
            pcm = L16LE.decode(value) if event == "media" else None
        except ValueError:
            event, pcm = "invalid", None
        if pcm is not None:
            self._events.on_audio(pcm, now)
        elif event == "clear":
            self._events.on_clear(now)
        elif event == "hangup":
            await self.ws.close()
        else:
            self.invalid += 1

    async def send_audio(self, pcm: np.ndarray) -> None:
        await self.send(L16LE.encode(np.ascontiguousarray(pcm, dtype=np.int16)).tobytes())  # one binary frame
