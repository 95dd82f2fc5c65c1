"""Exotel Voicebot applet (bidirectional AgentStream WebSocket): every message, both directions.

Owns the JSON text messages of the stream Exotel opens when a call reaches
a Voicebot applet (or a Connect Voice AI call with ``streamtype=bidirectional``),
its audio formats, the cutting of the bot's audio into the chunk sizes
Exotel plays, and the HTTP Basic credential of the upgrade request.

What the documentation defines, as implemented here (Exotel developer docs:
"WebSocket protocol", developer.exotel.com/docs/agentstream/websocket-protocol;
"Working with the Stream and Voicebot Applet",
developer.exotel.com/docs/agentstream/stream-voicebot-applet; the Beta
"Updated Extension Guide", developer.exotel.com/docs/agentstream/stream-voicebot-extension;
Exotel's own protocol notes in github.com/exotel/Agent-Stream,
docs/reference/WEBSOCKET_PROTOCOL.md and docs/AGENTSTREAM_WSS_PROTOCOL.md):

* Exotel -> bot (built by :class:`ExotelStream`, as Exotel sends them: the
  ``brisvox call`` client and the tests play Exotel; parsed by the gateway
  with :func:`parse_start` and the parsers shared with Twilio and Telnyx,
  :mod:`brisvox.wire.mediastream`): ``connected``; ``start``
  (``sequence_number`` and ``stream_sid`` at the top level; ``start.stream_sid``,
  ``call_sid``, ``account_sid``, ``from``, ``to``, ``custom_parameters`` (the
  query parameters of the applet's URL, up to 3, 256 characters),
  ``media_format`` {``encoding``, ``sample_rate``, ``bit_rate``}, the
  numbers as strings: ``"audio/x-raw"``, ``"8000"``, ``"16"``); ``media``
  (``media`` {``chunk``, ``timestamp``, ``payload``: base64 of 16-bit mono
  PCM, little-endian, about every 100 ms}); ``dtmf`` (``dtmf`` {``digit``,
  ``duration``}: Voicebot only); ``mark`` (the echo of a bot's mark, "sent
  when audio you previously sent has finished playing"); ``stop``
  (``stop`` {``call_sid``, ``account_sid``, ``reason``}).
* bot -> Exotel (built by :class:`BotStream`): ``media`` (``stream_sid``,
  ``media.payload``), ``mark`` (``stream_sid``, ``mark.name``), ``clear``
  (``stream_sid``: drop the queued audio, for barge-in).
* Audio: "raw/slin (16-bit, 8kHz, mono PCM little-endian) encoded in
  base64", at the applet's sample rate: 8000 (the default), 16000 or 24000,
  chosen by ``?sample-rate=`` on the URL (:data:`RATE_QUERY`).
* Outbound chunks: at least 3.2 KB, at most 100 KB, a multiple of 320 bytes
  ("smaller chunks risk audio distortion, larger chunks cause timeouts,
  non-compliant sizes create gaps in audio playback"): :class:`Chunker`.
* Authentication: IP whitelisting, or Basic auth written into the URL
  (``wss://<user>:<password>@host/path``), which Exotel sends as
  ``Authorization: Basic base64(user:password)``. Exotel signs nothing.

Where the documentation is silent or contradicts itself, chosen here:

* Encoding names: the pages name the linear format ``raw/slin``,
  ``audio/x-raw``, ``linear16`` and (Beta) ``audio/L16;rate=N``: all are
  :data:`~brisvox.wire.mediastream.L16LE` (:data:`LINEAR`). The Beta guide's
  mu-law option, another bit rate, another channel count or a rate other
  than 8000, 16000, 24000 is refused with 1003 (``bad_media_format``): the
  chunk rules are written for 16-bit PCM. A ``start`` without
  ``media_format`` (or without its rate) is L16 at the URL's
  ``sample-rate``, else 8000 Hz (the documented defaults). Numbers are read
  as strings or numbers (the two documents differ); a string that is not
  ASCII digits (``"²"``), in ``start`` or in the URL's ``sample-rate``, and a
  ``sample-rate`` named twice in the URL, are a malformed ``start``
  (``bad_start``, 1007).
* Field names "can vary slightly by applet / Connect path" (Exotel's own
  notes; its sample bridges read ``streamSid`` too): each field is read by its
  documented snake-case name, else its camel-case one. The stream's id is
  ``stream_sid`` (top level, else ``start``), else the ``call_sid`` (one
  Exotel example has no ``stream_sid``); a start with neither is refused
  (``bad_start``).
* ``token`` and ``sample-rate`` are transport settings in the URL, not
  call parameters: they are removed from ``custom_parameters`` (a
  credential never reaches the agent).
* The bot's messages carry ``stream_sid`` and nothing else of the example's
  counters (Exotel's own sample bridges send none).
* 3.2 KB is not 100 ms at 8 kHz (it is 200 ms; 100 ms at 16 kHz): the
  minimum is read as bytes, the stricter of the two. Whether Exotel echoes
  the marks a ``clear`` flushes is not said: echoes after a ``clear`` are
  swallowed either way (:mod:`brisvox.gateway.carriers.carrier_stream`).
* The Basic credential is its password (:func:`basic_password`); the user
  name is free.

Invariants:

* :func:`parse_start` bounds what it keeps (an id, ``from`` or ``to`` that is
  not a string of 1 to ``MAX_ID`` or ``MAX_PARAM_VALUE`` characters without
  control characters is dropped, parameters as
  :func:`brisvox.wire.jsontext.checked_params`; each drop counted in
  ``Start.dropped``) and refuses a stream id that is not such a string.
* :class:`Chunker` only ever yields chunks that are a multiple of
  :data:`CHUNK_MULTIPLE` bytes and, while audio keeps coming, at least
  :data:`MIN_CHUNK_BYTES` (under :data:`MAX_CHUNK_BYTES` as long as what is
  added at once is); only :meth:`Chunker.flush` (the end of a talkspurt, a
  mark, a hang-up) yields a shorter one, padded with silence to the multiple.
* The bot's media message is ``BotStream.media_prefix + base64 + MEDIA_SUFFIX``
  (a byte template, no JSON encoder on the hot path).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from brisvox.wire.jsontext import (
    MAX_PARAM_VALUE,
    caller_called,
    checked_params,
    kept_text,
    param_text,
    quote,
    text,
)
from brisvox.wire.mediastream import L16LE, BotTemplates, MediaFormat, StreamError, whole_number

MAX_ID = 128
RATES = (8000, 16000, 24000)  # the applet's sample rates
DEFAULT_RATE = 8000
RATE_QUERY = "sample-rate"  # the URL's query parameter naming the rate
URL_SETTINGS = frozenset({"token", RATE_QUERY})  # query parameters that are not call parameters
LINEAR = frozenset({"raw/slin", "audio/x-raw", "linear16", "audio/l16", "l16", "slin"})
FORMATS: dict[int, MediaFormat] = {rate: MediaFormat("raw/slin", rate, L16LE, 2) for rate in RATES}
DEFAULT_FORMAT = FORMATS[DEFAULT_RATE]
TAKEN = "16-bit linear PCM (raw/slin) mono at 8000, 16000 or 24000 Hz"
MIN_CHUNK_BYTES = 3200  # "Minimum 3.2 KB"
MAX_CHUNK_BYTES = 100_000  # "Maximum 100 KB"
CHUNK_MULTIPLE = 320  # "Must be a multiple of 320 bytes"


def _field(obj: dict[str, Any], snake: str, camel: str) -> Any:
    v = obj.get(snake)
    return obj.get(camel) if v is None else v


def rate_from_path(path: str) -> int | None:
    """The ``sample-rate`` of a request path's query (None when absent); raises
    :class:`StreamError` (``bad_start``) when it is not ASCII digits or is repeated."""
    values = parse_qs(urlsplit(path).query, keep_blank_values=True).get(RATE_QUERY, [])
    if not values:
        return None
    if len(values) > 1:
        raise StreamError("bad_start", f"the URL names {RATE_QUERY} more than once")
    v = whole_number(values[0].strip(), f"the URL's {RATE_QUERY}")
    return v if type(v) is int else None


def media_format(fmt: Any, default_rate: int | None = None) -> MediaFormat:
    """The format of ``start.media_format`` (absent: L16 at ``default_rate``, else 8 kHz);
    raises :class:`StreamError` (``bad_media_format``, 1003)."""
    rate: Any = default_rate or DEFAULT_RATE
    if fmt is None:
        enc, bits, channels = "raw/slin", 16, 1
    elif type(fmt) is dict:
        enc = fmt.get("encoding", "raw/slin")
        given = whole_number(_field(fmt, "sample_rate", "sampleRate"), "media_format.sample_rate", 9)
        bits = whole_number(_field(fmt, "bit_rate", "bitRate"), "media_format.bit_rate", 9)
        channels = whole_number(fmt.get("channels", 1), "media_format.channels", 9)
        if type(enc) is str and ";rate=" in enc:  # the Beta guide's audio/L16;rate=16000
            enc, _, in_name = enc.partition(";rate=")
            given = whole_number(in_name.strip(), "the encoding's rate", 9) if given is None else given
        rate = rate if given is None else given
        bits = 16 if bits is None else bits
    else:
        raise StreamError("bad_media_format", f"media_format must be an object ({TAKEN})")
    found = FORMATS.get(rate) if type(rate) is int else None
    if type(enc) is not str or enc.strip().lower() not in LINEAR or bits != 16 or channels != 1 or found is None:
        shown = f"{str(enc)[:24]} {str(rate)[:8]} Hz {str(bits)[:4]} bit x{str(channels)[:4]}"
        raise StreamError("bad_media_format", f"unsupported media format {shown} (brisvox takes {TAKEN})")
    return found


@dataclass(frozen=True, slots=True)
class Start:
    """What a bot keeps of ``start``; a field is None when absent (or dropped: ``dropped``
    counts the ids, numbers and parameters dropped as malformed)."""

    stream_id: str
    format: MediaFormat = DEFAULT_FORMAT
    call_sid: str | None = None
    account_sid: str | None = None
    caller: str | None = None  # start.from
    called: str | None = None  # start.to
    params: dict[str, str] | None = None  # custom_parameters, without the URL's settings
    dropped: int = 0

    @property
    def numbers(self) -> tuple[str, str]:
        """(caller, called): ``start.from``/``start.to``, else those the custom parameters name."""
        return caller_called(self.params, self.caller, self.called)

    @property
    def ids(self) -> dict[str, str]:
        """The stream's ids by their Exotel names (stream_sid first)."""
        ids = {"stream_sid": self.stream_id}
        if self.call_sid is not None:
            ids["call_sid"] = self.call_sid
        if self.account_sid is not None:
            ids["account_sid"] = self.account_sid
        return ids


def parse_start(msg: dict[str, Any], default_rate: int | None = None) -> Start:
    """The ``start`` message (a dict whose event is ``start``; ``default_rate``: the URL's
    ``sample-rate``, for a start that does not say); raises :class:`StreamError`."""
    start = msg.get("start")
    if type(start) is not dict:
        raise StreamError("bad_start", "start without a start object")
    dropped = 0
    kept: dict[str, str | None] = {}
    for snake, camel, limit in (("call_sid", "callSid", MAX_ID), ("account_sid", "accountSid", MAX_ID),
                                ("from", "from", MAX_PARAM_VALUE), ("to", "to", MAX_PARAM_VALUE)):
        kept[snake], d = kept_text(_field(start, snake, camel), limit)
        dropped += d
    sid = _field(msg, "stream_sid", "streamSid") or _field(start, "stream_sid", "streamSid") or kept["call_sid"]
    if type(sid) is not str or not sid or param_text(sid, MAX_ID) is None:
        raise StreamError("bad_start", "start without a valid stream_sid")
    fmt = media_format(_field(start, "media_format", "mediaFormat"), default_rate)
    params, d = checked_params(_field(start, "custom_parameters", "customParameters"))
    if params is not None:
        params = {k: v for k, v in params.items() if k.lower() not in URL_SETTINGS}
    return Start(sid, fmt, kept["call_sid"], kept["account_sid"], kept["from"], kept["to"], params, dropped + d)


# --- the Basic credential of the upgrade request ----------------------------------------------

def basic_password(header: str) -> str:
    """The password of an ``Authorization: Basic`` header; "" for any other header or a
    malformed one."""
    scheme, _, b64 = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        decoded = base64.b64decode(b64.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return ""
    return decoded.partition(":")[2]


def basic_header(user: str, password: str) -> str:
    """The ``Authorization`` value Exotel sends for ``wss://user:password@host``."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --- Exotel -> bot (what the client and the tests send as Exotel) ----------------------------

MEDIA_HEAD = '{{"event":"media","sequence_number":"{}","stream_sid":{},"media":{{"chunk":"{}","timestamp":"{}","payload":"'


class ExotelStream:
    """Builds the messages Exotel sends for one stream (mutable counters; one per call):
    ``sequence_number`` from 1 over every message after ``connected``, ``media.chunk`` from 1,
    ``media.timestamp`` in milliseconds since the stream started, all strings (the
    documented examples)."""

    def __init__(self, index: int = 0, tag: str = "bench", *, stream_sid: str = "", call_sid: str = "",
                 fmt: MediaFormat = DEFAULT_FORMAT) -> None:
        self.stream_sid = stream_sid or f"MZ{tag}{index:06d}"
        self.call_sid = call_sid or f"CA{tag}{index:06d}"
        self.format = fmt
        self._sid = quote(self.stream_sid).decode()
        self._seq = 0
        self._chunk = 0
        self._ms = 0

    def _next_seq(self) -> str:
        self._seq += 1
        return str(self._seq)

    @staticmethod
    def connected() -> str:
        return text({"event": "connected"})

    def start(self, custom: dict[str, str] | None = None, caller: str = "", called: str = "") -> str:
        start: dict[str, Any] = {"stream_sid": self.stream_sid, "call_sid": self.call_sid,
                                 "account_sid": "ACbrisvox"}
        if caller:
            start["from"] = caller
        if called:
            start["to"] = called
        start["custom_parameters"] = custom or {}
        start["media_format"] = {"encoding": "audio/x-raw", "sample_rate": str(self.format.rate), "bit_rate": "16"}
        return text({"event": "start", "sequence_number": self._next_seq(), "stream_sid": self.stream_sid,
                     "start": start})

    def media(self, payload_b64: str, ms: int = 20) -> str:
        """One media message of ``payload_b64`` (base64 audio in the stream's format, ``ms`` long)."""
        self._chunk += 1
        head = MEDIA_HEAD.format(self._next_seq(), self._sid, self._chunk, self._ms)
        self._ms += ms
        return head + payload_b64 + '"}}'

    def mark(self, name: str) -> str:
        return text({"event": "mark", "sequence_number": self._next_seq(), "stream_sid": self.stream_sid,
                     "mark": {"name": name}})

    def dtmf(self, digit: str) -> str:
        return text({"event": "dtmf", "sequence_number": self._next_seq(), "stream_sid": self.stream_sid,
                     "dtmf": {"digit": digit, "duration": "100"}})

    def stop(self, reason: str = "callended") -> str:
        return text({"event": "stop", "sequence_number": self._next_seq(), "stream_sid": self.stream_sid,
                     "stop": {"call_sid": self.call_sid, "account_sid": "ACbrisvox", "reason": reason}})


# --- bot -> Exotel ---------------------------------------------------------------------------

class BotStream(BotTemplates):
    """Builds the messages a bot sends on one stream (UTF-8 bytes), each naming the stream."""

    __slots__ = ("clear", "mark_prefix", "media_prefix")

    def __init__(self, stream_sid: str) -> None:
        sid = quote(stream_sid)
        self.media_prefix = b'{"event":"media","stream_sid":' + sid + b',"media":{"payload":"'
        self.clear = b'{"event":"clear","stream_sid":' + sid + b"}"
        self.mark_prefix = b'{"event":"mark","stream_sid":' + sid + b',"mark":{"name":'


class Chunker:
    """The bot's audio of one stream, cut into the chunks Exotel plays without gaps (see the
    module invariants): :meth:`add` keeps wire bytes until there are :data:`MIN_CHUNK_BYTES`,
    then yields the largest multiple of :data:`CHUNK_MULTIPLE` and keeps the rest."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes kept, not yet yielded."""
        return len(self._buf)

    def add(self, wire: bytes | bytearray | memoryview) -> bytes | None:
        buf = self._buf
        buf += wire
        if len(buf) < MIN_CHUNK_BYTES:
            return None
        n = len(buf) - len(buf) % CHUNK_MULTIPLE
        chunk = bytes(buf[:n])
        del buf[:n]
        return chunk

    def flush(self) -> bytes | None:
        """What is kept, padded with silence to a multiple of :data:`CHUNK_MULTIPLE`; None when nothing is."""
        if not self._buf:
            return None
        chunk = bytes(self._buf) + bytes(-len(self._buf) % CHUNK_MULTIPLE)
        self._buf.clear()
        return chunk

    def drop(self) -> int:
        """Forget what is kept (a ``clear``); returns how many bytes."""
        n = len(self._buf)
        self._buf.clear()
        return n
