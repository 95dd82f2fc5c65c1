"""FreeSWITCH ``mod_audio_stream`` (``uuid_audio_stream <uuid> start <wss-url> mono 16k <metadata>``): every message.

Owns the messages of the WebSocket mod_audio_stream opens from a FreeSWITCH
channel to the gateway: the metadata text it sends first
(:func:`parse_metadata`), the caller's audio framing (:data:`RATES`, L16), the
text events the FreeSWITCH side sends later (:func:`parse_event`), and what
a bot sends back (:class:`BotStream`: ``streamAudio``, and the control
messages of brisvox's convention, :data:`CLEAR` and :data:`HANGUP`). The
tests play FreeSWITCH with :class:`FreeSwitchStream` and :func:`bot_event`.

What mod_audio_stream documents, and what is implemented as documented
(github.com/amigniter/mod_audio_stream ``README.md``, sections "API /
Commands", "Events" and "play"; ``audio_streamer_glue.cpp``,
``processMessage`` and ``eventCallback``; ``mod_audio_stream.c``, the
``uuid_audio_stream`` syntax):

* ``uuid_audio_stream <uuid> start <wss-url> <mix-type> <sampling-rate>
  <metadata>``: the module connects to ``wss-url``, sends ``metadata`` (any
  UTF-8 text) as the first TEXT message once connected, then streams the
  channel's audio as BINARY frames of L16 (``mono``: the caller's audio
  alone) at ``8k`` or ``16k``, 20 ms a frame unless ``STREAM_BUFFER_SIZE``
  says more (a multiple of 20, at most 500 ms). ``STREAM_EXTRA_HEADERS``
  (a JSON object) adds headers to the upgrade request.
* ``uuid_audio_stream <uuid> send_text <text>`` sends a TEXT message;
  ``stop <text>`` sends it and closes the socket; the channel's hang-up
  closes it too.
* A TEXT message from the server ``{"type":"streamAudio","data":{"audioDataType":"raw",
  "sampleRate":8000,"audioData":"<base64>"}}`` is written to a file (raw at
  8, 16, 24, 32, 48 or 64 kHz) and fires the event ``mod_audio_stream::play``
  with the file's path; any other TEXT message fires ``mod_audio_stream::json``
  with the message as its body. Nothing else is read.

Where the documentation is silent, or offers nothing, the choices:

* The stream does not say its rate: the route URL's ``sample-rate`` query
  (``?sample-rate=16000``, as Exotel's, :func:`brisvox.wire.exotel.rate_from_path`)
  names it, 8000 when absent; anything but 8000 or 16000 is 1003
  (``bad_media_format``). L16 is little-endian (FreeSWITCH's host order).
  ``mono`` is required (``mixed`` and ``stereo`` cannot be told apart on the wire).
* The metadata is required and must be a JSON object (the first message
  being anything else closes 1007 or, audio, 1008): its keys are the call's
  parameters (bounded as every parameter), ``uuid`` its transport id,
  ``caller``/``from`` and ``called``/``to`` its numbers.
* The module cannot stop playback, hang up or carry DTMF: a FreeSWITCH
  event handler does, by brisvox's convention on top of the two events
  above: on ``mod_audio_stream::json`` with ``{"type":"clear"}`` it runs
  ``uuid_break <uuid> all`` (the barge-in), with ``{"type":"hangup"}``
  ``uuid_kill <uuid>``; on a DTMF event it runs ``uuid_audio_stream <uuid>
  send_text {"type":"dtmf","digit":"5"}``; on ``mod_audio_stream::play`` it
  plays the file (``uuid_broadcast <uuid> <file> aleg``).
* The bot's audio goes in ``streamAudio`` messages of L16 at the stream's
  rate, each at least 200 ms at 8 kHz (3.2 KB; a file per message, so fewer,
  longer files): :class:`brisvox.wire.exotel.Chunker`.

The parsers raise :class:`AudioStreamError` (the carriers'
:class:`~brisvox.wire.mediastream.StreamError`).

Invariants:

* :func:`parse_metadata` and :func:`parse_event` read any bytes: a value, or
  :class:`AudioStreamError` ``bad_json`` / ``bad_message`` (not a JSON object,
  or an event without a string ``type``) / ``bad_dtmf``; nothing else.
* Kept text is bounded: the metadata's parameters as
  :func:`brisvox.wire.jsontext.checked_params`, drops counted.
* The bot's messages are byte templates: :attr:`BotStream.media_prefix` +
  base64 + :data:`~brisvox.wire.mediastream.MEDIA_SUFFIX` is exactly the
  documented ``streamAudio`` object.
* :func:`bot_event` never raises: anything unparseable is ``("invalid", None)``.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

from brisvox.wire.dtmf import DIGITS
from brisvox.wire.exotel import rate_from_path
from brisvox.wire.jsontext import MAX_PARAM_VALUE, caller_called, checked_params, param_text, text
from brisvox.wire.mediastream import L16LE, MediaFormat, StreamError, json_object

AudioStreamError = StreamError  # a refusal (kind, close code, reason: brisvox.wire.mediastream)

RATES = (8000, 16000)  # uuid_audio_stream's 8k and 16k
FORMATS = {rate: MediaFormat("L16", rate, L16LE, 2) for rate in RATES}
CLEAR = b'{"type":"clear"}'
HANGUP = b'{"type":"hangup"}'
ID_KEY = "uuid"


def stream_format(path: str) -> MediaFormat:
    """The stream's format: the route URL's ``sample-rate`` (8000 when absent); raises
    :class:`AudioStreamError` (``bad_media_format``; ``bad_start`` for a malformed query)."""
    rate = rate_from_path(path) or 8000
    fmt = FORMATS.get(rate)
    if fmt is None:
        raise StreamError("bad_media_format", "sample-rate must be 8000 or 16000")
    return fmt


@dataclass(frozen=True, slots=True)
class Metadata:
    """The first message: the call's parameters, its id (``uuid``), how many were dropped."""

    params: dict[str, str] | None
    dropped: int = 0

    @property
    def ids(self) -> dict[str, str]:
        v = (self.params or {}).get(ID_KEY)
        return {ID_KEY: v} if v and param_text(v, MAX_PARAM_VALUE) is not None else {}

    @property
    def numbers(self) -> tuple[str, str]:
        return caller_called(self.params)


def parse_metadata(raw: bytes) -> Metadata:
    """The metadata (the first TEXT message) -> :class:`Metadata`; raises :class:`AudioStreamError`."""
    params, dropped = checked_params(json_object(raw))
    return Metadata(params or None, dropped)


def parse_event(raw: bytes) -> tuple[str, str]:
    """(type, digit or "") of a later TEXT message (``send_text``); raises :class:`AudioStreamError`."""
    obj = json_object(raw)
    kind = obj.get("type")
    if type(kind) is not str:
        raise StreamError("bad_message", "a message without a string type")
    if kind != "dtmf":
        return kind, ""
    digit = obj.get("digit")
    if type(digit) is not str or len(digit) != 1 or digit.upper() not in DIGITS:
        raise StreamError("bad_dtmf", "dtmf without a valid digit")
    return kind, digit.upper()


class BotStream:
    """The bot's messages on one stream at ``rate``: ``streamAudio`` as a byte template."""

    def __init__(self, rate: int) -> None:
        self.media_prefix = (b'{"type":"streamAudio","data":{"audioDataType":"raw","sampleRate":'
                             + str(rate).encode() + b',"audioData":"')


# --- FreeSWITCH -> bot (the tests play FreeSWITCH and its event handler) ----------------------


class FreeSwitchStream:
    """Builds what mod_audio_stream (and the event handler's ``send_text``) sends on one stream."""

    def __init__(self, uuid: str = "5f1a2c3e-0000-4000-8000-000000000001", params: dict[str, Any] | None = None,
                 rate: int = 8000) -> None:
        self.uuid = uuid
        self.params = dict(params or {})
        self.fmt = FORMATS[rate]

    def metadata(self) -> str:
        return text({ID_KEY: self.uuid, **self.params})

    @staticmethod
    def dtmf(digit: str) -> str:
        return text({"type": "dtmf", "digit": digit})


def bot_event(msg: Any) -> tuple[str, Any]:
    """``(event, value)`` of one decoded bot message: streamAudio -> ("media", the audio
    bytes), clear / hangup -> None, another type -> its name; anything unparseable ``("invalid", None)``."""
    try:
        kind = msg.get("type")
        if kind == "streamAudio":
            data = msg["data"]
            if data.get("audioDataType") != "raw" or type(data.get("sampleRate")) is not int:
                return "invalid", None
            return "media", binascii.a2b_base64(data["audioData"], strict_mode=True)
        return (kind, None) if type(kind) is str else ("invalid", None)
    except Exception:
        return "invalid", None
