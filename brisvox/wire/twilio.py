"""Twilio Media Streams (bidirectional ``<Connect><Stream>``): every message, both directions.

Owns the JSON text messages of the protocol (docs/PROTOCOL.md) and the
``X-Twilio-Signature`` of the upgrade request:

* Twilio -> bot (built by :class:`TwilioStream`, as Twilio itself sends
  them: the ``brisvox call`` client, the load generator and the tests play
  Twilio; parsed by the gateway with :func:`parse_start`,
  :func:`media_payload`, :func:`mark_name`, :func:`dtmf_digit`):
  ``connected``, ``start`` (streamSid, callSid, accountSid, mediaFormat,
  customParameters), ``media`` (base64 mu-law 8 kHz, track ``inbound``),
  ``mark`` (the echo of a bot's mark), ``dtmf``, ``stop``.
* bot -> Twilio (built by :class:`BotStream`: the gateway, fake bots in the
  tests; parsed with :func:`bot_message`, or :func:`bot_event` on the load
  generator's hot path): ``media``, ``mark``, ``clear``.

The parsers take the decoded JSON value (the callers decode: orjson on the
hot paths) and raise :class:`TwilioError`, whose ``kind`` is the stable
counter label and ``code`` the WebSocket close code a bot answers it with.

Invariants:

* The hot paths are byte templates, not a JSON encoder: a bot's media
  message is ``BotStream.media_prefix + base64 + MEDIA_SUFFIX`` (the prefix
  built once per stream); a caller's media message is ``MEDIA_HEAD`` (three
  counters) + base64 + :attr:`TwilioStream.media_tail` (fixed per stream),
  the pieces the load generator pre-encodes and masks (``bench/loadgen/wire.py``).
* :class:`TwilioStream` counts as Twilio does: ``sequenceNumber`` from 1 over
  every message after ``connected``; ``media.chunk`` from 1 and
  ``media.timestamp`` (milliseconds since the stream started), all strings.
* :func:`parse_start` bounds what it keeps (a callSid or accountSid that is
  not a string of 1 to ``MAX_SID`` characters without control characters is
  dropped, parameters as :func:`brisvox.wire.jsontext.checked_params`; each
  drop counted in ``Start.dropped``), and refuses a streamSid that would need
  escaping; :func:`media_payload` decodes strict base64 and refuses more than
  ``MAX_MEDIA_BYTES``.
* :func:`bot_event` reads a message exactly as :func:`bot_message` does,
  without building a message object; anything unparseable is ``invalid``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from binascii import a2b_base64
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from brisvox.wire.dtmf import DIGITS
from brisvox.wire.jsontext import caller_called, checked_params, param_text, quote

RATE = 8000
FRAME = 160  # 20 ms of mu-law: one media message
ENCODING = "audio/x-mulaw"
MAX_MEDIA_BYTES = 8000  # 1 s of mu-law per message is far beyond what Twilio sends
MAX_SID = 128

# the close code a bot answers each kind of refusal with (docs/PROTOCOL.md)
CLOSE_CODES: dict[str, int] = {
    "bad_json": 1007, "bad_message": 1007, "bad_start": 1007, "bad_media": 1007, "bad_base64": 1007,
    "bad_mark": 1007, "bad_dtmf": 1007, "media_before_start": 1008, "no_start": 1008,
    "bad_media_format": 1003, "binary_frame": 1003, "media_too_large": 1009,
}


class TwilioError(ValueError):
    """A message a bot refuses: ``kind`` (counter label), ``code`` (close code), ``reason``."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.code = CLOSE_CODES[kind]


def signature(auth_token: str, url: str, params: dict[str, str] | None = None) -> str:
    """X-Twilio-Signature: base64(HMAC-SHA1(token, url + sorted(k + v)))."""
    data = url + "".join(k + v for k, v in sorted((params or {}).items()))
    mac = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(mac).decode()


# --- Twilio -> bot ----------------------------------------------------------------------

MEDIA_HEAD = '{{"event":"media","sequenceNumber":"{}","media":{{"track":"inbound","chunk":"{}","timestamp":"{}","payload":"'


class TwilioStream:
    """Builds the messages Twilio sends for one call (mutable counters; one per call)."""

    def __init__(self, index: int = 0, tag: str = "bench", *, stream_sid: str = "", call_sid: str = "",
                 account_sid: str = "ACbench000000") -> None:
        self.stream_sid = stream_sid or f"MZ{tag}{index:06d}"
        self.call_sid = call_sid or f"CA{tag}{index:06d}"
        self.account_sid = account_sid
        self.media_tail = f'"}},"streamSid":"{self.stream_sid}"}}'
        self._seq = 0
        self._chunk = 0

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @staticmethod
    def connected() -> str:
        return '{"event":"connected","protocol":"Call","version":"1.0.0"}'

    def start(self, custom: dict[str, str] | None = None) -> str:
        return json.dumps({
            "event": "start",
            "sequenceNumber": str(self._next_seq()),
            "start": {
                "accountSid": self.account_sid,
                "streamSid": self.stream_sid,
                "callSid": self.call_sid,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": ENCODING, "sampleRate": RATE, "channels": 1},
                "customParameters": custom or {},
            },
            "streamSid": self.stream_sid,
        })

    def media(self, payload_b64: str) -> str:
        """One media message of ``payload_b64`` (base64 mu-law, 20 ms)."""
        self._chunk += 1
        chunk = self._chunk
        return MEDIA_HEAD.format(self._next_seq(), chunk, (chunk - 1) * 20) + payload_b64 + self.media_tail

    def mark(self, name: str) -> str:
        return json.dumps({"event": "mark", "sequenceNumber": str(self._next_seq()),
                           "streamSid": self.stream_sid, "mark": {"name": name}})

    def dtmf(self, digit: str) -> str:
        return json.dumps({"event": "dtmf", "sequenceNumber": str(self._next_seq()),
                           "streamSid": self.stream_sid, "dtmf": {"track": "inbound_track", "digit": digit}})

    def stop(self) -> str:
        return json.dumps({"event": "stop", "sequenceNumber": str(self._next_seq()),
                           "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
                           "streamSid": self.stream_sid})


@dataclass(frozen=True, slots=True)
class Start:
    """What a bot keeps of ``start``. An id or the parameters are None when absent
    (or dropped: ``dropped`` counts the ids and parameters dropped as malformed)."""

    stream_sid: str
    call_sid: str | None = None
    account_sid: str | None = None
    params: dict[str, str] | None = None  # customParameters
    dropped: int = 0

    @property
    def numbers(self) -> tuple[str, str]:
        """(caller, called): the From/To (or caller/called) custom parameters, as TwiML
        passes them (``<Parameter name="From" value="{{From}}"/>``); "" when absent."""
        return caller_called(self.params)

    @property
    def ids(self) -> dict[str, str]:
        """The stream's ids by their Twilio names (streamSid first)."""
        ids = {"streamSid": self.stream_sid}
        if self.call_sid is not None:
            ids["callSid"] = self.call_sid
        if self.account_sid is not None:
            ids["accountSid"] = self.account_sid
        return ids


def parse_start(msg: dict[str, Any]) -> Start:
    """The ``start`` message (a dict whose event is ``start``); raises :class:`TwilioError`."""
    start = msg.get("start")
    if type(start) is not dict:
        raise TwilioError("bad_start", "start without a start object")
    sid = start.get("streamSid") or msg.get("streamSid")
    if type(sid) is not str or not sid or len(sid) > MAX_SID or '"' in sid or "\\" in sid:
        raise TwilioError("bad_start", "start without a valid streamSid")
    fmt = start.get("mediaFormat") or {}
    if type(fmt) is not dict or fmt.get("encoding", ENCODING) != ENCODING \
            or fmt.get("sampleRate", RATE) != RATE or fmt.get("channels", 1) != 1:
        raise TwilioError("bad_media_format", "only audio/x-mulaw 8000 Hz mono is supported")
    ids = [start.get("callSid"), start.get("accountSid")]
    kept = [param_text(i, MAX_SID) if type(i) is str and i else None for i in ids]
    params, dropped = checked_params(start.get("customParameters"))
    dropped += sum(1 for i, k in zip(ids, kept, strict=True) if i is not None and k is None)
    return Start(sid, kept[0], kept[1], params, dropped)


def media_payload(msg: dict[str, Any]) -> bytes | None:
    """The mu-law bytes of a ``media`` message; None for a copy of another track than the
    caller's (``inbound``). Raises :class:`TwilioError`. Called 50 times a second per call."""
    media = msg.get("media")
    payload = media.get("payload") if type(media) is dict else None
    if type(payload) is not str:
        raise TwilioError("bad_media", "media without a payload")
    track = media.get("track")  # type: ignore[union-attr]
    if track is not None and track not in ("inbound", "inbound_track"):
        return None  # an outbound track copy: not caller audio
    try:
        raw = a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError):
        raise TwilioError("bad_base64", "invalid base64 payload") from None
    if len(raw) > MAX_MEDIA_BYTES:
        raise TwilioError("media_too_large", "media payload too large")
    return raw


def mark_name(msg: dict[str, Any]) -> str:
    """The name in a ``mark`` message (the echo of a bot's mark); raises :class:`TwilioError`."""
    m = msg.get("mark")
    name = m.get("name") if type(m) is dict else None
    if type(name) is not str:
        raise TwilioError("bad_mark", "mark without a name")
    return name


def dtmf_digit(msg: dict[str, Any]) -> str:
    """The digit of a ``dtmf`` message, upper case (0-9 * # A-D); raises :class:`TwilioError`."""
    d = msg.get("dtmf")
    digit = d.get("digit") if type(d) is dict else None
    if type(digit) is not str or len(digit) != 1 or digit.upper() not in DIGITS:
        raise TwilioError("bad_dtmf", "dtmf without a valid digit")
    return digit.upper()


# --- bot -> Twilio ----------------------------------------------------------------------

MEDIA_SUFFIX = b'"}}'


class BotStream:
    """Builds the messages a bot sends on one stream (UTF-8 bytes; nothing per message is
    encoded but the payload and a mark's name)."""

    __slots__ = ("stream_sid", "media_prefix", "clear", "_mark_prefix")

    def __init__(self, stream_sid: str) -> None:
        sid = quote(stream_sid)
        self.stream_sid = stream_sid
        self.media_prefix = b'{"event":"media","streamSid":' + sid + b',"media":{"payload":"'
        self.clear = b'{"event":"clear","streamSid":' + sid + b'}'
        self._mark_prefix = b'{"event":"mark","streamSid":' + sid + b',"mark":{"name":'

    def media(self, ulaw: bytes) -> bytes:
        """A media message of ``ulaw`` (the gateway's pacer inlines this with a reused buffer)."""
        return self.media_prefix + binascii.b2a_base64(ulaw, newline=False) + MEDIA_SUFFIX

    def mark(self, name: str) -> bytes:
        return self._mark_prefix + encode_basestring(name).encode() + b"}}"  # jsontext.quote, inlined


@dataclass(frozen=True, slots=True)
class BotMessage:
    """One message from a bot: ``event`` is media, mark, clear, another name or invalid."""

    event: str
    payload: bytes = b""  # media: mu-law bytes
    name: str = ""  # mark: its name
    stream_sid: str = ""


def bot_message(msg: Any) -> BotMessage:
    """Read one decoded bot message; anything unparseable is event ``invalid``."""
    try:
        event = msg.get("event", "")
        sid = str(msg.get("streamSid", ""))
        if event == "media":
            return BotMessage("media", payload=base64.b64decode(msg["media"]["payload"]), stream_sid=sid)
        if event == "mark":
            return BotMessage("mark", name=str(msg.get("mark", {}).get("name", "")), stream_sid=sid)
        if event == "clear":
            return BotMessage("clear", stream_sid=sid)
        return BotMessage(str(event) or "other", stream_sid=sid)
    except Exception:
        return BotMessage("invalid")


def bot_event(msg: Any) -> tuple[str, Any]:
    """``(event, value)`` of one decoded bot message: media -> the mu-law bytes, mark -> its
    name, anything unparseable -> ``("invalid", None)`` (as :func:`bot_message`)."""
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
