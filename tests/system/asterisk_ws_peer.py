"""A test peer playing Asterisk's chan_websocket: the media WebSocket of ``Dial(WebSocket/<connection>/c(ulaw))``.

Built from Asterisk's documentation page "WebSocket" (channel drivers,
docs.asterisk.org/Configuration/Channel-Drivers/WebSocket; the wire is
:mod:`brisvox.wire.asterisk_ws`), section by section:

* "Outgoing Connections": Asterisk connects to the ``uri`` of its
  ``websocket_client.conf`` entry and, once the server accepts, sends the
  TEXT ``MEDIA_START`` (connection id, channel, format, optimal frame size):
  :meth:`AsteriskWsPeer.hello`. ``username``/``password`` of that entry
  send ``Authorization: Basic`` (``password=`` here); its ``protocols =
  media`` (the example of res_websocket_client's documentation) offers the
  ``media`` subprotocol, which the server must answer.
* "Media Transfer": the caller's audio goes as BINARY frames of raw audio in
  the dial string's codec, 160 bytes of ulaw every 20 ms
  (:meth:`AsteriskWsPeer.send_audio`); the bot's BINARY frames are played
  (here: handed to ``on_audio`` as they arrive).
* "Control Commands and Events", the commands: ``FLUSH_MEDIA`` discards what
  is queued (``on_clear``: the flush the peer sees), ``HANGUP`` hangs the
  channel up and closes the socket (the peer closes it), any other known
  command is read and ignored; a TEXT frame that is no command of the
  driver's is counted ``invalid`` (Asterisk answers ``ERROR``; the peer
  sends it too).
* The events: ``DTMF_END digit:<d>`` carries the caller's digits
  (``send_dtmf``, with :meth:`brisvox.wire.asterisk_ws.AsteriskStream.dtmf`); Asterisk's own hang-up only closes
  the socket (no event: ``bye`` is None).
* "Control Commands and Events" formats: plain text by default, JSON with
  ``fmt="json"`` (``f(json)`` in the dial string).
"""

from __future__ import annotations

import numpy as np

from brisvox.client.media_stream import StreamTransport
from brisvox.wire import asterisk_ws as aw
from brisvox.wire.exotel import basic_header
from brisvox.wire.mediastream import StreamError


class AsteriskWsPeer(StreamTransport):
    """One chan_websocket channel connected to a bot's WebSocket server (see the module docstring)."""

    def __init__(self, url: str, codec: str = "ulaw", fmt: str = aw.PLAIN, password: str = "") -> None:
        super().__init__(url)
        self.stream = aw.AsteriskStream(codec, fmt)
        self.media = self.stream.media
        self.rate = self.media.rate
        self.ids = {"connection_id": self.stream.connection_id}
        self.commands: list[str] = []
        self.subprotocols = ["media"]  # websocket_client.conf's protocols = media, as Asterisk's example sets
        if password:
            self.headers["Authorization"] = basic_header("asterisk", password)

    def hello(self) -> list[str]:
        return [self.stream.media_start()]

    def bye(self) -> str | None:
        return None

    def decode_audio(self, wire: bytes) -> np.ndarray:
        return self.media.codec.decode(wire)

    def encode_audio(self, pcm: np.ndarray) -> bytes:
        return self.media.codec.encode(np.ascontiguousarray(pcm, dtype=np.int16)).tobytes()

    async def on_message(self, message: str | bytes, now: float) -> None:
        if isinstance(message, bytes):
            self.heard(message, now)
            return
        try:
            name, _, _ = aw.parse_command(message.encode())
        except StreamError:
            self.invalid += 1
            await self.ws.send(self.stream.event("ERROR", error_text="unknown command"))
            return
        self.commands.append(name)
        if name == "FLUSH_MEDIA":
            self._events.on_clear(now)
        elif name == "HANGUP":
            await self.ws.close()

    async def send_audio(self, pcm: np.ndarray) -> None:
        await self.send(self.encode_audio(pcm))  # one binary frame
