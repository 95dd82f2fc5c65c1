"""Twilio Media Streams (bidirectional ``<Connect><Stream>``): every message, both directions.

Owns the JSON text messages of the protocol (docs/PROTOCOL.md) and the
``X-Twilio-Signature`` of the upgrade request:

* Twilio -> bot (built by :class:`TwilioStream`, as Twilio itself sends
  them: the ``brisvox call`` client, the load generator and the tests play
  Twilio; parsed by the gateway with :func:`parse_start` and the parsers
  it shares with Telnyx, :mod:`brisvox.wire.mediastream`: ``media_payload``,
  ``mark_name``, ``dtmf_digit``, re-exported here):
  ``connected``, ``start`` (streamSid, callSid, accountSid, mediaFormat,
  customParameters), ``media`` (base64 mu-law 8 kHz, track ``inbound``),
  ``mark`` (the echo of a bot's mark), ``dtmf``, ``stop``.
* bot -> Twilio (built by :class:`BotStream`: the gateway, fake bots in the
  tests; parsed with :func:`bot_message`, or :func:`bot_event` on the load
  generator's hot path): ``media``, ``mark``, ``clear``.

The parsers take the decoded JSON value (the callers decode: orjson on the
hot paths) and raise :class:`TwilioError` (the shared
:class:`~brisvox.wire.mediastream.StreamError`), whose ``kind`` is the stable
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
  escaping or holds a control character; ``media_payload`` decodes strict base64 and refuses more than
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
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from brisvox.wire.jsontext import caller_called, checked_params, param_text, quote
from brisvox.wire.mediastream import CLOSE_CODES as CLOSE_CODES
from brisvox.wire.mediastream import MAX_MEDIA_BYTES as MAX_MEDIA_BYTES
from brisvox.wire.mediastream import MEDIA_SUFFIX as MEDIA_SUFFIX
from brisvox.wire.mediastream import StreamError
from brisvox.wire.mediastream import bot_event as bot_event
from brisvox.wire.mediastream import dtmf_digit as dtmf_digit
from brisvox.wire.mediastream import mark_name as mark_name
from brisvox.wire.mediastream import media_payload as media_payload

RATE = 8000
FRAME = 160  # 20 ms of mu-law: one media message
ENCODING = "audio/x-mulaw"
MAX_SID = 128
# the <Parameter> of the TwiML the gateway's webhook serves that carries the stream's one-time
# token (Twilio passes it back in start.customParameters; brisvox.gateway.control.stream_tokens)
TOKEN_PARAM = "brisvox_stream_token"

TwilioError = StreamError  # a refusal (kind, close code, reason: brisvox.wire.mediastream)


def signature(auth_token: str, url: str, params: dict[str, str] | list[tuple[str, str]] | None = None) -> str:
    """X-Twilio-Signature: base64(HMAC-SHA1(token, url + sorted(k + v))); ``params`` are a
    POST's form fields (a list of pairs keeps a repeated name: sorted by name, then value)."""
    pairs = params.items() if isinstance(params, dict) else params or []
    data = url + "".join(k + v for k, v in sorted(pairs))
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
    if type(sid) is not str or not sid or len(sid) > MAX_SID or '"' in sid or "\\" in sid \
            or param_text(sid, MAX_SID) is None:
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


# --- bot -> Twilio ----------------------------------------------------------------------

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
