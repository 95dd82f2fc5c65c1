"""Asterisk's WebSocket channel driver (``chan_websocket``, ``Dial(WebSocket/<connection>/...)``): every message.

Owns the control messages and the audio framing of the media WebSocket
Asterisk opens to the gateway (an outgoing connection of
``websocket_client.conf``): the events Asterisk sends (:func:`parse_event`,
built by :class:`AsteriskStream` when the tests play Asterisk), the commands
a bot sends (:func:`command`, read back by :func:`parse_command`), and the
formats of the binary media (:data:`FORMATS`).

What Asterisk documents, and what is implemented as documented (the
documentation page "WebSocket" of the channel drivers,
docs.asterisk.org/Configuration/Channel-Drivers/WebSocket, as kept in
github.com/asterisk/documentation ``docs/Configuration/Channel-Drivers/WebSocket.md``;
the driver's source ``channels/chan_websocket.c``):

* "Media Transfer": media both ways is raw audio in BINARY frames, in the
  dial string's ``c(<codec>)`` (160 bytes every 20 ms for ulaw/alaw); TEXT
  frames carry the control messages. Asterisk re-frames and re-times what
  the app sends when each message is the ``optimal_frame_size`` (or a
  multiple of it): the bot sends exactly one 20 ms frame per message.
* "Max Message Size and Flow Control": at most 65500 bytes per message (a
  longer one closes the socket and hangs up); about 1000 frames queued, with
  ``MEDIA_XOFF`` at 900 and ``MEDIA_XON`` below 800.
* "Control Commands and Events": two formats, chosen by the operator
  (``chan_websocket.conf`` ``control_message_format`` or the dial string's
  ``f(json)``, from 20.18.0/22.8.0/23.2.0; plain text is the default). Plain
  text: one line, the name and its parameters appended
  (``MEDIA_START connection_id:<uuid> channel:<name> channel_id:<id>
  format:ulaw optimal_frame_size:160 ptime:20``; ``DTMF_END digit:5
  channel_id:<id>``; the correlation id of ``MEDIA_BUFFERING_COMPLETED`` /
  ``STOP_MEDIA_BUFFERING`` positional). JSON: one object per TEXT frame,
  ``{"event": ...}`` from Asterisk (``MEDIA_START`` also carries
  ``channel_variables``), ``{"command": ...}`` to it. Commands are
  case-sensitive.
* Commands (bot -> Asterisk): ``ANSWER``, ``HANGUP`` ("hung up and the
  websocket ... closed"), ``START_MEDIA_BUFFERING``, ``STOP_MEDIA_BUFFERING``,
  ``FLUSH_MEDIA`` ("discard any queued but not sent ... if an automated agent
  detects the caller is speaking and wants to interrupt a prompt"),
  ``PAUSE_MEDIA``, ``CONTINUE_MEDIA``, ``MARK_MEDIA`` (newer releases),
  ``GET_STATUS``, ``REPORT_QUEUE_DRAINED``, ``SET_MEDIA_DIRECTION``.
* Events (Asterisk -> bot): ``MEDIA_START``, ``DTMF_END``, ``MEDIA_XOFF``,
  ``MEDIA_XON``, ``STATUS``, ``MEDIA_BUFFERING_COMPLETED``,
  ``MEDIA_MARK_PROCESSED`` (newer releases), ``QUEUE_DRAINED``, ``ERROR``
  (``chan_websocket.c``: ``error_text``, the rest of the plain-text line).
* Nothing on the socket carries DTMF from the app to the caller, nor a transfer.

Where the documentation is silent, the choices:

* ``slin`` / ``slin16`` are Asterisk's signed linear in host byte order:
  little-endian (every platform Asterisk ships for), the
  :class:`~brisvox.wire.mediastream.L16LE` codec. The formats taken are
  ``ulaw``, ``alaw`` (8 kHz), ``slin`` (8 kHz) and ``slin16`` (16 kHz); any
  other (``opus`` needs passthrough framing, ``g722``...) is refused with
  1003 (``bad_media_format``).
* The control format of a connection is the one ``MEDIA_START`` came in:
  a text frame whose first byte is ``{`` is JSON, any other plain text.
  The bot answers in that format.
* A plain-text parameter is ``name:value``; a word without a colon continues
  the previous value (``error_text`` holds spaces); a first word without a
  colon is positional only for the events that take a correlation id. A
  repeated parameter keeps the first.

The parsers raise :class:`AsteriskError` (the carriers' shared
:class:`~brisvox.wire.mediastream.StreamError`: ``kind`` the counter label,
``code`` the close code).

Invariants:

* :func:`parse_event` reads any bytes: an :class:`Event`, or
  :class:`AsteriskError` ``bad_json`` (JSON that does not parse), ``bad_message``
  (not UTF-8, a control character, no event name, a JSON value that is not
  an object or an event that is not a string, a plain-text word the grammar
  refuses), ``bad_start`` (a ``MEDIA_START`` without a connection id or with a
  bad frame size), ``bad_media_format`` (a format not in :data:`FORMATS`),
  ``bad_dtmf`` (a ``DTMF_END`` without one digit of ``0-9 * # A-D``); nothing else.
* :func:`command` and :func:`parse_command` are inverse for every command
  name of :data:`COMMANDS` and, for ``STOP_MEDIA_BUFFERING`` and ``MARK_MEDIA``,
  correlation id without whitespace, colons or control characters, in both formats; a command is at most :data:`MAX_TEXT` bytes
  (chan_websocket reads no longer text).
* Values are bounded: ids and parameters of at most ``MAX_PARAM_VALUE``
  characters, the JSON ``channel_variables`` as
  :func:`brisvox.wire.jsontext.checked_params` (dropped ones counted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from brisvox.wire.dtmf import DIGITS
from brisvox.wire.g711 import PCMA, PCMU
from brisvox.wire.jsontext import MAX_PARAM_VALUE, checked_params, data, text
from brisvox.wire.mediastream import L16LE, MediaFormat, StreamError, json_object

AsteriskError = StreamError  # a refusal (kind, close code, reason: brisvox.wire.mediastream)

PLAIN, JSON = "plain-text", "json"  # the two control message formats (chan_websocket.conf's names)
MAX_TEXT = 128  # chan_websocket's MAX_TEXT_MESSAGE_LEN: the longest command it reads
MAX_MESSAGE = 65500  # the longest WebSocket message Asterisk takes

# the dial string's c(<codec>) -> the stream's audio
FORMATS: dict[str, MediaFormat] = {
    "ulaw": MediaFormat("ulaw", 8000, PCMU, 1),
    "alaw": MediaFormat("alaw", 8000, PCMA, 1),
    "slin": MediaFormat("slin", 8000, L16LE, 2),
    "slin16": MediaFormat("slin16", 16000, L16LE, 2),
}

EVENTS = ("MEDIA_START", "DTMF_END", "MEDIA_XOFF", "MEDIA_XON", "STATUS", "MEDIA_BUFFERING_COMPLETED",
          "MEDIA_MARK_PROCESSED", "QUEUE_DRAINED", "ERROR")
COMMANDS = ("ANSWER", "HANGUP", "START_MEDIA_BUFFERING", "STOP_MEDIA_BUFFERING", "FLUSH_MEDIA", "PAUSE_MEDIA",
            "CONTINUE_MEDIA", "MARK_MEDIA", "GET_STATUS", "REPORT_QUEUE_DRAINED")
_POSITIONAL = ("MEDIA_BUFFERING_COMPLETED", "MEDIA_MARK_PROCESSED", "STOP_MEDIA_BUFFERING", "MARK_MEDIA")
_NAME = re.compile(r"[A-Z][A-Z_]{0,63}")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_KEY = re.compile(r"[a-z_]{1,64}")
_CORRELATION = re.compile(r"[^\x00-\x20\x7f:]{1,120}")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of Asterisk's: its name, its parameters as text, the format it came in."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    fmt: str = PLAIN
    variables: dict[str, str] | None = None  # MEDIA_START's channel_variables (JSON only)
    dropped: int = 0  # channel variables dropped as malformed


@dataclass(frozen=True, slots=True)
class MediaStart:
    """What a bot keeps of ``MEDIA_START``: the connection, the channel, the media format."""

    connection_id: str
    channel: str
    channel_id: str
    media: MediaFormat
    optimal_frame_size: int
    ptime: int
    fmt: str
    variables: dict[str, str] | None
    dropped: int


def _text(v: Any) -> str | None:
    """A JSON value as parameter text (strings, ints, booleans), or None."""
    if type(v) is str:
        return v
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is int:
        return str(v)
    return None


def _plain(line: str) -> tuple[str, dict[str, str]]:
    words = line.split(" ")
    name = words[0]
    params: dict[str, str] = {}
    last = ""
    for i, w in enumerate(words[1:]):
        if not w:
            continue
        key, colon, value = w.partition(":")
        if colon and _KEY.fullmatch(key):
            if key not in params:
                params[key] = value
            last = key
        elif last:
            params[last] += " " + w
        elif i == 0 and name in _POSITIONAL:
            params["correlation_id"] = w
            last = "correlation_id"
        else:
            raise StreamError("bad_message", f"{name}: a word the plain-text grammar refuses")
    return name, params


def _json(raw: bytes, key: str) -> tuple[str, dict[str, Any]]:
    obj = json_object(raw)
    name = obj.get(key)
    if type(name) is not str:
        raise StreamError("bad_message", f"a JSON message without its {key!r}")
    return name, obj


def _line(raw: bytes) -> str:
    try:
        line = raw.decode()
    except UnicodeDecodeError:
        raise StreamError("bad_message", "not UTF-8") from None
    line = line.rstrip("\r\n")
    if _CONTROL.search(line):
        raise StreamError("bad_message", "a control character")
    return line


def parse_event(raw: bytes) -> Event:
    """One TEXT frame of Asterisk's -> :class:`Event`; raises :class:`AsteriskError` (module invariants)."""
    if raw[:1] == b"{":
        name, obj = _json(raw, "event")
        if not _NAME.fullmatch(name):
            raise StreamError("bad_message", "not an event name")
        params = {}
        for k, v in obj.items():
            t = _text(v)
            if k != "event" and t is not None and len(t) <= MAX_PARAM_VALUE:
                params[k] = t
        variables, dropped = (None, 0)
        if "channel_variables" in obj:
            variables, dropped = checked_params(obj["channel_variables"])
        ev = Event(name, params, JSON, variables, dropped)
    else:
        name, params = _plain(_line(raw))
        if not _NAME.fullmatch(name):
            raise StreamError("bad_message", "not an event name")
        if any(len(v) > MAX_PARAM_VALUE for v in params.values()):
            raise StreamError("bad_message", "a parameter too long")
        ev = Event(name, params, PLAIN)
    if name == "DTMF_END":
        dtmf_digit(ev)
    return ev


def media_start(ev: Event) -> MediaStart:
    """The ``MEDIA_START`` event ``ev`` read; raises :class:`AsteriskError`."""
    p = ev.params
    cid = p.get("connection_id", "")
    if not cid:
        raise StreamError("bad_start", "MEDIA_START without a connection_id")
    media = FORMATS.get(p.get("format", ""))
    if media is None:
        raise StreamError("bad_media_format", f"only {', '.join(FORMATS)} are supported")
    size = _number(p.get("optimal_frame_size"), media.frame * media.width)
    ptime = _number(p.get("ptime"), 20)
    if not 0 < size <= MAX_MESSAGE or not 0 < ptime <= 1000:
        raise StreamError("bad_start", "MEDIA_START with a bad optimal_frame_size or ptime")
    return MediaStart(cid, p.get("channel", ""), p.get("channel_id", ""), media, size, ptime, ev.fmt,
                      ev.variables, ev.dropped)


def _number(v: str | None, default: int) -> int:
    if v is None:
        return default
    if not v.isascii() or not v.isdigit() or len(v) > 6:
        raise StreamError("bad_start", "MEDIA_START with a number that is not one")
    return int(v)


def dtmf_digit(ev: Event) -> str:
    """The digit of a ``DTMF_END`` event, upper case; raises :class:`AsteriskError`."""
    d = ev.params.get("digit", "")
    if len(d) != 1 or d.upper() not in DIGITS:
        raise StreamError("bad_dtmf", "DTMF_END without a valid digit")
    return d.upper()


# --- bot -> Asterisk ------------------------------------------------------------------


def command(name: str, fmt: str = PLAIN, correlation_id: str = "") -> bytes:
    """The command ``name`` (one of :data:`COMMANDS`) in control format ``fmt``; a
    ``correlation_id`` only for the commands that take one, without a space, a colon or a
    control character (ValueError)."""
    if correlation_id and (name not in _POSITIONAL or not _CORRELATION.fullmatch(correlation_id)):
        raise ValueError(f"no correlation id {correlation_id[:32]!r} for {name}")
    if fmt == JSON:
        body: dict[str, str] = {"command": name}
        if correlation_id:
            body["correlation_id"] = correlation_id
        out = data(body)
    else:
        out = (f"{name} {correlation_id}" if correlation_id else name).encode()
    if len(out) > MAX_TEXT:
        raise ValueError(f"a chan_websocket command is at most {MAX_TEXT} bytes")
    return out


def parse_command(raw: bytes) -> tuple[str, str, str]:
    """(name, correlation id or "", format) of a bot's command; raises :class:`AsteriskError`
    (``bad_json``, ``bad_message``: an unknown command, more than :data:`MAX_TEXT` bytes)."""
    if len(raw) > MAX_TEXT:
        raise StreamError("bad_message", "a command over 128 bytes")
    if raw[:1] == b"{":
        name, obj = _json(raw, "command")
        cid = obj.get("correlation_id", "")
        fmt = JSON
        if type(cid) is not str:
            raise StreamError("bad_message", "a correlation_id that is not a string")
    else:
        name, params = _plain(_line(raw))
        cid, fmt = params.get("correlation_id", ""), PLAIN
    if name not in COMMANDS:
        raise StreamError("bad_message", f"unknown command {name[:32]!r}")
    return name, cid, fmt


# --- Asterisk -> bot (the tests play Asterisk) ---------------------------------------------


class AsteriskStream:
    """Builds the events chan_websocket sends on one connection, in control format ``fmt``."""

    def __init__(self, codec: str = "ulaw", fmt: str = PLAIN, connection_id: str = "",
                 channel: str = "WebSocket/brisvox-00000001", channel_id: str = "1700000000.1",
                 variables: dict[str, str] | None = None) -> None:
        self.media = FORMATS[codec]
        self.fmt = fmt
        self.connection_id = connection_id or "e226e283-c90a-4ea9-9e37-389000b9ef47"
        self.channel = channel
        self.channel_id = channel_id
        self.variables = dict(variables or {})

    @property
    def frame_bytes(self) -> int:
        return self.media.frame * self.media.width

    def event(self, name: str, **params: Any) -> str:
        """Event ``name`` with ``params`` (a ``correlation_id`` is positional in plain text)."""
        if self.fmt == JSON:
            return text({"event": name, "channel_id": self.channel_id, **params})
        cid = params.pop("correlation_id", None)
        words = [name] + ([cid] if cid else []) + [f"{k}:{v}" for k, v in params.items()]
        return " ".join(words)

    def media_start(self) -> str:
        """The first event, in chan_websocket.c's order of parameters."""
        params: dict[str, Any] = {"connection_id": self.connection_id, "channel": self.channel,
                                  "channel_id": self.channel_id, "format": self.media.encoding,
                                  "optimal_frame_size": self.frame_bytes, "ptime": 20}
        if self.fmt == JSON:
            return text({"event": "MEDIA_START", **params, "channel_variables": self.variables})
        return " ".join(["MEDIA_START"] + [f"{k}:{v}" for k, v in params.items()])

    def dtmf(self, digit: str) -> str:
        """``DTMF_END`` of ``digit``."""
        if self.fmt == JSON:
            return self.event("DTMF_END", digit=digit)
        return f"DTMF_END digit:{digit} channel_id:{self.channel_id}"
