"""Plivo Audio Streams (bidirectional ``<Stream bidirectional="true">``): every message, both directions.

Owns the JSON text messages of Plivo's stream protocol, the audio formats a
stream may carry and the ``X-Plivo-Signature-V3`` of the upgrade request:

* Plivo -> bot (built by :class:`PlivoStream`, as Plivo sends them: the
  ``brisvox call`` client and the tests play Plivo; parsed by the gateway
  with :func:`parse_start`, :func:`media_payload`, :func:`played_name`,
  :func:`dtmf_digit`): ``start`` (streamId, callId, accountId, mediaFormat,
  the top-level ``extra_headers``), ``media`` (base64 audio, track
  ``inbound``), ``playedStream`` (a checkpoint played), ``clearedAudio``,
  ``dtmf``, ``stop``.
* bot -> Plivo (built by :class:`BotStream`: the gateway, fake bots in the
  tests; read with :func:`bot_event`): ``playAudio``, ``checkpoint``,
  ``clearAudio``, ``sendDTMF``.

What the vendor documents, and what is implemented as documented:

* "Stream Event Protocol" / "Audio Streaming Protocol Reference"
  (plivo.com/docs/voice/audio-streaming/audio-streaming,
  plivo.com/docs/voice-agents/audio-streaming/concepts/audio-streaming-reference):
  ``start`` with ``start.callId``, ``start.streamId``, ``start.accountId``,
  ``start.tracks``, ``start.mediaFormat`` {``encoding``, ``sampleRate``} and a
  top-level ``extra_headers`` string; ``media`` with ``streamId`` and
  ``media`` {``track``, ``timestamp`` (Unix ms, a string), ``chunk``,
  ``payload``}; ``sequenceNumber`` a number from 1.
* "<Stream>" XML element (plivo.com/docs/voice/xml/audiostream) and
  "playAudio event": the stream's ``contentType`` is ``audio/x-mulaw;rate=8000``,
  ``audio/x-l16;rate=8000`` or ``audio/x-l16;rate=16000``; ``playAudio``
  carries ``media`` {``contentType``, ``sampleRate``, ``payload``} with the
  same three formats; ``extraHeaders`` are ``key=value`` pairs of letters and
  digits, at most 512 bytes.
* "Checkpoint event": ``{"event":"checkpoint","streamId","name"}``, answered
  by ``{"event":"playedStream","streamId","name"}`` once the audio before it
  played (only if it played). Plivo's support article on the same feature
  names the answer ``played``: both names are read as the echo.
* "Clear audio stream": ``{"event":"clearAudio","streamId"}``, answered by
  ``{"event":"clearedAudio","streamId","sequenceNumber"}``.
* The protocol page lists ``sendDTMF`` among the messages to Plivo; its
  shape, ``{"event":"sendDTMF","dtmf":"<digits>"}``, and the shape of the
  ``dtmf`` event, ``{"event":"dtmf","dtmf":{"digit"}}``, are those of Plivo's
  own stream client (github.com/plivo-labs/agent-transport, audio_stream/plivo.rs).
* "Validation" (plivo.com/docs/voice/xml/request/validation) and Plivo's SDK
  (plivo-python ``utils/signature_v3.py``): every request Plivo makes carries
  ``X-Plivo-Signature-V3`` (and ``-Ma-V3``, keyed with the main account's
  token) and ``X-Plivo-Signature-V3-Nonce``; for a GET the signed text is
  ``scheme://host/path`` (``?`` and the query sorted by name when there is
  one) ``+ "." + nonce``, HMAC-SHA256 with the auth token, base64; a header
  may hold several signatures, comma-separated (:func:`signature`).

Where the documentation is silent, the choices:

* L16 byte order: not stated; Plivo's own stream client reads and writes
  little-endian, so does this module.
* A ``start`` without ``mediaFormat`` is refused (``bad_media_format``): the
  XML pages disagree on the default format (L16 in one, mu-law in another),
  and decoding the wrong one would pass noise to the agent silently.
* ``extra_headers`` is read as ``key=value`` pairs split on ``;`` (the
  protocol page's example) or ``,`` (the XML page's example), or a JSON object;
  a repeated name keeps its first value, the others are dropped and counted.
* ``sampleRate`` is read as a number or a string of ASCII digits; any other
  string (``"²"``) is a malformed ``start`` (``bad_start``, 1007).
* ``stop`` is not in the protocol page's list but the guides tell a server to
  handle it: ``{"event":"stop"}`` ends the call; closing the socket does too.
* A bot's audio goes out in the stream's own format (the support pages warn
  against switching formats between ``playAudio`` events).

The parsers take the decoded JSON value (the callers decode) and raise
:class:`PlivoError` (the carriers' shared
:class:`~brisvox.wire.mediastream.StreamError`: ``kind`` is the stable
counter label, ``code`` the WebSocket close code a bot answers it with);
the ``media`` payload and the ``dtmf`` digit are read by the shared parsers
of :mod:`brisvox.wire.mediastream`, whose shapes Plivo's messages have. A
``playedStream`` without a name is ``bad_mark`` (it is Plivo's mark echo),
an odd-length L16 payload ``bad_media``.

Invariants:

* :func:`parse_start` bounds what it keeps (an id that is not a string of 1
  to ``MAX_ID`` characters without control characters is dropped, the
  ``extra_headers`` as :func:`brisvox.wire.jsontext.checked_params`; each drop
  counted in ``Start.dropped``), refuses a streamId that would need escaping
  and any format but the three documented ones; :func:`media_payload`
  decodes strict base64, refuses an odd L16 payload and more than 1 s of
  the stream's format.
* The hot paths are byte templates: a bot's audio message is
  ``BotStream.media_prefix + base64 + MEDIA_SUFFIX`` (the prefix names the
  stream's format, built once per stream).
* :func:`bot_event` never raises: anything unparseable is ``invalid``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from binascii import a2b_base64
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import numpy as np

from brisvox.wire.g711 import PCMU
from brisvox.wire.jsontext import caller_called, checked_params, param_text, quote
from brisvox.wire.mediastream import CLOSE_CODES as CLOSE_CODES
from brisvox.wire.mediastream import L16LE, StreamError, whole_number
from brisvox.wire.mediastream import MEDIA_SUFFIX as MEDIA_SUFFIX
from brisvox.wire.mediastream import dtmf_digit as dtmf_digit
from brisvox.wire.mediastream import media_payload as stream_payload

MULAW, L16 = "audio/x-mulaw", "audio/x-l16"
RATES: dict[str, tuple[int, ...]] = {MULAW: (8000,), L16: (8000, 16000)}  # the documented formats
MAX_ID = 128

PlivoError = StreamError  # a refusal (kind, close code, reason: brisvox.wire.mediastream)


@dataclass(frozen=True, slots=True)
class Format:
    """One stream's audio: ``encoding`` (``MULAW`` or ``L16``) at ``rate``."""

    encoding: str = MULAW
    rate: int = 8000

    @property
    def width(self) -> int:
        """Bytes per sample on the wire."""
        return 1 if self.encoding == MULAW else 2

    @property
    def max_bytes(self) -> int:
        """The largest payload accepted: 1 s of audio (Plivo sends 20 ms chunks)."""
        return self.rate * self.width

    def decode(self, raw: bytes) -> np.ndarray:
        """Wire bytes -> int16 samples (L16: little-endian)."""
        if self.encoding == MULAW:
            return PCMU.decode(raw)
        return L16LE.decode(raw)

    def encode(self, samples: np.ndarray) -> bytes:
        """int16 samples -> wire bytes."""
        if self.encoding == MULAW:
            return PCMU.encode(np.ascontiguousarray(samples, dtype=np.int16)).tobytes()
        return L16LE.encode(samples).tobytes()


def signature(auth_token: str, url: str, nonce: str) -> str:
    """X-Plivo-Signature-V3 of a GET of ``url``: base64(HMAC-SHA256(token, base + "." + nonce)),
    ``base`` being the URL without fragment, its query (if any) sorted by name then value."""
    u = urlsplit(url)
    pairs = sorted((k, v) for k, vs in parse_qs(u.query, keep_blank_values=True).items() for v in vs)
    base = urlunsplit((u.scheme, u.netloc, u.path, "", ""))
    if pairs:
        base += "?" + "&".join(f"{k}={v}" for k, v in pairs)
    mac = hmac.new(auth_token.encode(), f"{base}.{nonce}".encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def signature_matches(auth_token: str, url: str, nonce: str, header: str) -> bool:
    """One of the comma-separated signatures in ``header`` is that of ``url`` (constant time)."""
    expect = signature(auth_token, url, nonce).encode()
    return any(hmac.compare_digest(s.strip().encode(), expect) for s in header.split(","))


# --- Plivo -> bot ------------------------------------------------------------------------

MEDIA_HEAD = '{{"event":"media","sequenceNumber":{},"streamId":{},"media":{{"track":"inbound","timestamp":"{}","chunk":{},"payload":"'
MEDIA_TAIL = '"}}'


class PlivoStream:
    """Builds the messages Plivo sends for one stream (mutable counters; one per call)."""

    def __init__(self, index: int = 0, tag: str = "bench", *, fmt: Format = Format(), stream_id: str = "",
                 call_id: str = "", account_id: str = "MAbench000000") -> None:
        self.fmt = fmt
        self.stream_id = stream_id or f"{index:08d}-{tag}-stream"
        self.call_id = call_id or f"{index:08d}-{tag}-call"
        self.account_id = account_id
        self._sid = json.dumps(self.stream_id)
        self._seq = 0
        self._chunk = 0
        self._t0_ms = int(time.time() * 1000)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def start(self, extra_headers: str | dict[str, str] | None = None) -> str:
        msg: dict[str, Any] = {
            "event": "start",
            "sequenceNumber": self._next_seq(),
            "start": {
                "callId": self.call_id,
                "streamId": self.stream_id,
                "accountId": self.account_id,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": self.fmt.encoding, "sampleRate": self.fmt.rate},
            },
        }
        if extra_headers:
            msg["extra_headers"] = (extra_headers if isinstance(extra_headers, str)
                                    else ";".join(f"{k}={v}" for k, v in extra_headers.items()))
        return json.dumps(msg)

    def media(self, payload_b64: str) -> str:
        """One media message of ``payload_b64`` (base64 audio in the stream's format, 20 ms)."""
        self._chunk += 1
        ts = self._t0_ms + (self._chunk - 1) * 20
        return MEDIA_HEAD.format(self._next_seq(), self._sid, ts, self._chunk) + payload_b64 + MEDIA_TAIL

    def played(self, name: str) -> str:
        return json.dumps({"event": "playedStream", "sequenceNumber": self._next_seq(),
                           "streamId": self.stream_id, "name": name})

    mark = played  # the echo of a bot's mark, by the carriers' shared client's name

    def cleared(self) -> str:
        return json.dumps({"event": "clearedAudio", "sequenceNumber": self._next_seq(), "streamId": self.stream_id})

    def dtmf(self, digit: str) -> str:
        return json.dumps({"event": "dtmf", "sequenceNumber": self._next_seq(), "streamId": self.stream_id,
                           "dtmf": {"digit": digit}})

    def stop(self) -> str:
        return json.dumps({"event": "stop", "sequenceNumber": self._next_seq(), "streamId": self.stream_id})


@dataclass(frozen=True, slots=True)
class Start:
    """What a bot keeps of ``start``. An id or the headers are None when absent (or dropped:
    ``dropped`` counts the ids and headers dropped as malformed)."""

    stream_id: str
    fmt: Format = Format()
    call_id: str | None = None
    account_id: str | None = None
    params: dict[str, str] | None = None  # extra_headers
    dropped: int = 0

    @property
    def numbers(self) -> tuple[str, str]:
        """(caller, called): the from/to (or caller/called) extra headers; "" when absent."""
        return caller_called(self.params)

    @property
    def ids(self) -> dict[str, str]:
        """The stream's ids by their Plivo names (streamId first)."""
        ids = {"streamId": self.stream_id}
        if self.call_id is not None:
            ids["callId"] = self.call_id
        if self.account_id is not None:
            ids["accountId"] = self.account_id
        return ids


def parse_format(fmt: Any) -> Format:
    """``start.mediaFormat`` -> :class:`Format`; raises :class:`PlivoError` for anything but the
    three documented formats (an ``encoding`` may carry its ``;rate=`` as the XML spells it)."""
    if type(fmt) is not dict or type(fmt.get("encoding")) is not str:
        raise StreamError("bad_media_format", "start without a mediaFormat encoding")
    enc, _, tail = fmt["encoding"].strip().lower().partition(";")
    rate: Any = fmt.get("sampleRate")
    if rate is None and tail.strip().startswith("rate="):
        rate = tail.strip()[5:]
    rate = whole_number(rate, "mediaFormat.sampleRate")
    if enc not in RATES or type(rate) is not int or rate not in RATES[enc]:
        raise StreamError("bad_media_format", "only audio/x-mulaw 8000 Hz and audio/x-l16 8000 or 16000 Hz "
                                             "are supported")
    return Format(enc, rate)


def _headers(raw: Any) -> tuple[dict[str, str] | None, int]:
    """The ``extra_headers`` (``k=v`` pairs split on ``;`` or ``,``, or an object), bounded."""
    if type(raw) is not str:
        return checked_params(raw)
    pairs: dict[str, str] = {}
    bad = 0
    for part in raw.replace(",", ";").split(";"):
        k, eq, v = part.partition("=")
        if not part.strip():
            continue
        if not eq or not k.strip() or k.strip() in pairs:  # a repeated name: the first one is kept
            bad += 1
            continue
        pairs[k.strip()] = v.strip()
    params, dropped = checked_params(pairs)
    return params, dropped + bad


def parse_start(msg: dict[str, Any]) -> Start:
    """The ``start`` message (a dict whose event is ``start``); raises :class:`PlivoError`."""
    start = msg.get("start")
    if type(start) is not dict:
        raise StreamError("bad_start", "start without a start object")
    sid = start.get("streamId") or msg.get("streamId")
    if type(sid) is not str or not sid or len(sid) > MAX_ID or '"' in sid or "\\" in sid \
            or param_text(sid, MAX_ID) is None:
        raise StreamError("bad_start", "start without a valid streamId")
    fmt = parse_format(start.get("mediaFormat"))
    ids = [start.get("callId"), start.get("accountId")]
    kept = [param_text(i, MAX_ID) if type(i) is str and i else None for i in ids]
    params, dropped = _headers(msg.get("extra_headers"))
    dropped += sum(1 for i, k in zip(ids, kept, strict=True) if i is not None and k is None)
    return Start(sid, fmt, kept[0], kept[1], params, dropped)


def media_payload(msg: dict[str, Any], fmt: Format) -> bytes | None:
    """The audio bytes of a ``media`` message; None for another track than the caller's
    (``inbound``). Raises :class:`PlivoError` (an L16 payload of an odd length is
    ``bad_media``). Called 50 times a second per call."""
    raw = stream_payload(msg, fmt.max_bytes)
    if raw is not None and len(raw) % fmt.width:
        raise StreamError("bad_media", "an L16 payload has an even number of bytes")
    return raw


def played_name(msg: dict[str, Any]) -> str:
    """The checkpoint name in a ``playedStream`` (or ``played``) message; raises :class:`PlivoError`."""
    name = msg.get("name")
    if type(name) is not str:
        raise StreamError("bad_mark", "playedStream without a name")
    return name


# --- bot -> Plivo ------------------------------------------------------------------------


class BotStream:
    """Builds the messages a bot sends on one stream (UTF-8 bytes; nothing per message is
    encoded but the payload, a checkpoint's name and the digits)."""

    __slots__ = ("stream_id", "fmt", "media_prefix", "clear", "_checkpoint_prefix")

    def __init__(self, stream_id: str, fmt: Format = Format()) -> None:
        sid = quote(stream_id)
        self.stream_id = stream_id
        self.fmt = fmt
        self.media_prefix = (b'{"event":"playAudio","media":{"contentType":' + quote(fmt.encoding)
                             + b',"sampleRate":' + str(fmt.rate).encode() + b',"payload":"')
        self.clear = b'{"event":"clearAudio","streamId":' + sid + b"}"
        self._checkpoint_prefix = b'{"event":"checkpoint","streamId":' + sid + b',"name":'

    def media(self, audio: bytes) -> bytes:
        """A playAudio message of ``audio`` (wire bytes in the stream's format)."""
        return self.media_prefix + binascii.b2a_base64(audio, newline=False) + MEDIA_SUFFIX

    def checkpoint(self, name: str) -> bytes:
        return self._checkpoint_prefix + encode_basestring(name).encode() + b"}"

    @staticmethod
    def send_dtmf(digits: str) -> bytes:
        return b'{"event":"sendDTMF","dtmf":' + quote(digits) + b"}"


def bot_event(msg: Any) -> tuple[str, Any]:
    """``(event, value)`` of one decoded bot message: playAudio -> the wire bytes, checkpoint ->
    its name, sendDTMF -> the digits, clearAudio -> None; anything unparseable ``("invalid", None)``."""
    try:
        event = msg.get("event", "")
        if event == "playAudio":
            return "playAudio", a2b_base64(msg["media"]["payload"], strict_mode=True)
        if event == "checkpoint":
            return "checkpoint", str(msg["name"])
        if event == "sendDTMF":
            return "sendDTMF", str(msg["dtmf"])
        if event == "clearAudio":
            return "clearAudio", None
        return str(event) or "other", None
    except Exception:
        return "invalid", None
