"""What the carriers' JSON media streams share: Twilio Media Streams, Telnyx Media Streaming, Exotel.

Owns the refusal type of these protocols (:class:`StreamError`, whose
``kind`` is the stable counter label and ``code`` the WebSocket close code a
bot answers it with, :data:`CLOSE_CODES`) and the parsers of the messages
whose shape the carriers share to the key (:mod:`brisvox.wire.twilio`,
:mod:`brisvox.wire.telnyx` and :mod:`brisvox.wire.exotel` build and parse the rest):

* carrier -> bot: ``media`` (``media.payload`` base64 audio, ``media.track``
  naming the leg: :func:`media_payload`), ``mark`` (``mark.name``, the echo
  of a bot's mark: :func:`mark_name`), ``dtmf`` (``dtmf.digit``: :func:`dtmf_digit`);
* bot -> carrier, read by the callers (the ``brisvox call`` client, the load
  generator): ``media``, ``mark``, ``clear`` (:func:`bot_event`).

It also owns :class:`MediaFormat`, one stream's audio as both directions
carry it (an encoding, a rate, the codec that reads and writes it; Twilio's
is :data:`PCMU_8K`, Telnyx's are ``brisvox.wire.telnyx.FORMATS``), and
:data:`L16LE`, 16-bit linear PCM in little-endian byte order (and
:data:`L16BE`, Telnyx's network order, the same :class:`L16`): the L16 of
Plivo's streams (:mod:`brisvox.wire.plivo`) and of Vonage's binary frames
(:mod:`brisvox.wire.vonage`) and Exotel's raw/slin (:mod:`brisvox.wire.exotel`),
written once for all.

The parsers take the decoded JSON value (the callers decode: orjson on the
hot paths) and raise :class:`StreamError`.

Invariants:

* :func:`media_payload` decodes strict base64 and refuses more than its
  ``max_bytes``; a copy of another track than the caller's (``inbound``,
  ``inbound_track``) is None, never an error (a stream of both tracks is legal).
* :func:`dtmf_digit` answers one of ``0-9 * # A-D``, upper case.
* :func:`whole_number` reads a number sent as a string only from ASCII digits
  (:func:`brisvox.wire.jsontext.ascii_int`); any other string is ``bad_start``
  (1007), never a ValueError.
* :func:`bot_event` never raises: anything unparseable is ``("invalid", None)``.
* :func:`json_object` (the control messages of chan_websocket and mod_audio_stream,
  rare, read with the standard library's parser) refuses bad JSON, bad UTF-8 and
  nesting too deep as ``bad_json``, another JSON value as ``bad_message``.
* :meth:`L16.decode` refuses an odd-length payload (``bad_media``);
  :attr:`MediaFormat.wire_dtype` is the codec's sample type on the wire.
"""

from __future__ import annotations

import binascii
import json
from binascii import a2b_base64
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from brisvox.wire.dtmf import DIGITS
from brisvox.wire.g711 import PCMU
from brisvox.wire.jsontext import ascii_int, quote

MAX_MEDIA_BYTES = 8000  # 1 s of G.711 per message is far beyond what a carrier sends
MEDIA_SUFFIX = b'"}}'  # ends a bot's media message: <prefix of the stream> + base64 + this
INBOUND_TRACKS = ("inbound", "inbound_track")

# the close code a bot answers each kind of refusal with (docs/PROTOCOL.md)
CLOSE_CODES: dict[str, int] = {
    "bad_json": 1007, "bad_message": 1007, "bad_start": 1007, "bad_media": 1007, "bad_base64": 1007,
    "bad_mark": 1007, "bad_dtmf": 1007, "media_before_start": 1008, "no_start": 1008,
    "bad_media_format": 1003, "binary_frame": 1003, "media_too_large": 1009,
    # a Twilio stream not bound to the call the gateway's webhook answered (brisvox.gateway.control.stream_tokens)
    "no_stream_token": 1008, "bad_stream_token": 1008, "replayed_stream_token": 1008,
    "foreign_account": 1008, "foreign_call": 1008,
}


class Codec(Protocol):
    """What a stream's audio codec does (:class:`brisvox.wire.g711.G711`, :class:`L16`, ...)."""

    def encode(self, pcm: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...

    def decode(self, data: bytes) -> np.ndarray: ...


class L16:
    """16-bit linear PCM in one byte order (``dtype``: ``"<i2"`` little-endian, ``">i2"``
    network order), with the G711 codecs' encode/decode: :data:`L16LE` and :data:`L16BE`."""

    name = "L16"

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def encode(self, pcm: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """int16 samples -> int16 in the byte order (``out``, when given, of ``dtype`` and the same length)."""
        if out is None:
            return np.ascontiguousarray(pcm, dtype=self.dtype)
        np.copyto(out, pcm)
        return out

    def decode(self, data: bytes | bytearray | memoryview) -> np.ndarray:
        """int16 wire bytes in the byte order -> int16 samples; raises :class:`StreamError` for an odd length."""
        if len(data) & 1:
            raise StreamError("bad_media", "L16 payload of odd length")
        return np.frombuffer(data, dtype=self.dtype).astype(np.int16)


L16LE = L16("<i2")  # Plivo's L16, Vonage's binary frames, Exotel's raw/slin
L16BE = L16(">i2")  # Telnyx's L16: RTP's network byte order


@dataclass(frozen=True, slots=True)
class MediaFormat:
    """One stream's audio (both directions): ``encoding`` as the carrier names it at ``rate``,
    read and written by ``codec``, ``width`` bytes per sample on the wire."""

    encoding: str
    rate: int
    codec: Codec
    width: int

    @property
    def wire_dtype(self) -> str:
        if self.width == 1:
            return "u1"
        return "<i2" if self.codec is L16LE else ">i2"  # Telnyx's L16 is big-endian

    @property
    def frame(self) -> int:
        """Samples in 20 ms."""
        return self.rate // 50

    @property
    def max_media_bytes(self) -> int:
        return self.rate * self.width  # 1 s


PCMU_8K = MediaFormat("PCMU", 8000, PCMU, 1)


class StreamError(ValueError):
    """A message a bot refuses: ``kind`` (counter label), ``code`` (close code), ``reason``."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.code = CLOSE_CODES[kind]


def json_object(raw: bytes | str) -> dict[str, Any]:
    """A text message that must be a JSON object; raises :class:`StreamError` (``bad_json``,
    ``bad_message`` for another JSON value)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        raise StreamError("bad_json", "invalid JSON") from None
    if type(obj) is not dict:
        raise StreamError("bad_message", "expected a JSON object")
    return obj


def whole_number(v: Any, what: str, max_digits: int = 6) -> Any:
    """``v`` (a number field the carriers send as a number or as a string) as an int when it
    is a string of ASCII digits; another string raises :class:`StreamError` (``bad_start``,
    1007: ``str.isdigit`` is true for "²"); a value of another type is returned as it is
    (the caller refuses it as a format)."""
    if type(v) is not str:
        return v
    n = ascii_int(v, max_digits)
    if n is None:
        raise StreamError("bad_start", f"{what} is not a number")
    return n


def media_payload(msg: dict[str, Any], max_bytes: int = MAX_MEDIA_BYTES) -> bytes | None:
    """The audio bytes of a ``media`` message; None for a copy of another track than the
    caller's. Raises :class:`StreamError`. Called 50 times a second per call."""
    media = msg.get("media")
    payload = media.get("payload") if type(media) is dict else None
    if type(payload) is not str:
        raise StreamError("bad_media", "media without a payload")
    track = media.get("track")  # type: ignore[union-attr]
    if track is not None and track not in INBOUND_TRACKS:
        return None  # an outbound track copy: not caller audio
    try:
        raw = a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError):
        raise StreamError("bad_base64", "invalid base64 payload") from None
    if len(raw) > max_bytes:
        raise StreamError("media_too_large", "media payload too large")
    return raw


def mark_name(msg: dict[str, Any]) -> str:
    """The name in a ``mark`` message (the echo of a bot's mark); raises :class:`StreamError`."""
    m = msg.get("mark")
    name = m.get("name") if type(m) is dict else None
    if type(name) is not str:
        raise StreamError("bad_mark", "mark without a name")
    return name


def dtmf_digit(msg: dict[str, Any]) -> str:
    """The digit of a ``dtmf`` message, upper case (0-9 * # A-D); raises :class:`StreamError`."""
    d = msg.get("dtmf")
    digit = d.get("digit") if type(d) is dict else None
    if type(digit) is not str or len(digit) != 1 or digit.upper() not in DIGITS:
        raise StreamError("bad_dtmf", "dtmf without a valid digit")
    return digit.upper()


def bot_event(msg: Any) -> tuple[str, Any]:
    """``(event, value)`` of one decoded bot message: media -> the audio bytes, mark -> its
    name, clear -> None, another event -> its name, anything unparseable -> ``("invalid", None)``."""
    try:
        event = msg.get("event", "")
        if event == "media":
            return "media", a2b_base64(msg["media"]["payload"])
        if event == "mark":
            return "mark", str(msg.get("mark", {}).get("name", ""))
        if event == "clear":
            return "clear", None
        return str(event) or "other", None
    except Exception:
        return "invalid", None


class BotTemplates:
    """A bot's messages on one stream as byte templates (Telnyx's, Exotel's): ``media_prefix``
    + base64 + :data:`MEDIA_SUFFIX`, ``mark_prefix`` + the quoted name + ``}}``, ``clear``;
    nothing per message is encoded but the payload and a mark's name. A subclass sets the
    three (class attributes, or slots filled per stream)."""

    __slots__ = ()
    media_prefix: bytes
    clear: bytes
    mark_prefix: bytes

    def media(self, audio: bytes) -> bytes:
        """A media message of ``audio`` (wire bytes in the stream's format)."""
        return self.media_prefix + binascii.b2a_base64(audio, newline=False) + MEDIA_SUFFIX

    def mark(self, name: str) -> bytes:
        return self.mark_prefix + quote(name) + b"}}"
