"""Vonage Voice API WebSockets (NCCO ``connect`` to an endpoint of type ``websocket``): every message.

Owns the messages of the WebSocket Vonage opens to the gateway when a call's
NCCO connects it to a ``websocket`` endpoint, and the audio format the
endpoint's ``content-type`` names:

* Vonage -> bot (built by :class:`VonageStream`, as Vonage sends them: the
  ``brisvox call`` client and the tests play Vonage; parsed by the gateway
  with :func:`parse_connected`, :func:`dtmf_event`, :func:`notify_name` and
  :meth:`Format.decode`): the text ``websocket:connected``, the caller's
  audio as binary frames, the text ``websocket:dtmf``, ``websocket:notify``
  and ``websocket:cleared``.
* bot -> Vonage (:data:`CLEAR`, :func:`notify`, binary audio frames; read
  back by the client with :func:`bot_event`).

What Vonage documents, and what is implemented as documented (the Voice API
guide "WebSockets", developer.vonage.com/en/voice/voice-api/concepts/websockets,
as kept in Vonage's documentation repository github.com/Nexmo/nexmo-developer,
``_documentation/en/voice/voice-api/concepts/websockets.md``; the same page's
``clear``/``notify`` commands as described by the AsyncAPI document generated
from it, github.com/api-evangelist/vonage ``asyncapi/vonage-asyncapi.yml``;
Vonage's Node SDK, ``packages/voice/lib/types/Endpoint/WebsocketAuthorization.ts``):

* The first message is text: ``{"event":"websocket:connected",
  "content-type":"audio/l16;rate=16000", ...}``, the NCCO endpoint's
  ``headers`` at the top level of the object (no ``headers`` key), "a
  maximum length of 512 bytes".
* ``content-type`` is ``audio/l16;rate=16000`` or ``audio/l16;rate=8000``;
  every later binary message is 20 ms of 16-bit linear PCM at that rate:
  320 bytes at 8 kHz, 640 at 16 kHz. The audio written back "must be in the
  same format", "each message is 320 or 640 bytes ... and contains 20ms of
  audio"; Vonage buffers what is sent faster than real time (1024 messages
  in the guide, 3072 in the AsyncAPI document).
* DTMF: ``{"event":"websocket:dtmf","digit":"5","duration":260}``, one digit
  (``0-9 * #``) per event, ``duration`` in milliseconds.
* ``{"action":"clear"}`` drops the audio Vonage buffered and stops playback,
  answered by ``{"event":"websocket:cleared"}``; ``{"action":"notify",
  "payload":{...}}`` is answered by ``{"event":"websocket:notify",
  "payload":{...}}`` (the same payload) once the audio sent before it played.
* The endpoint's ``authorization`` ``{"type":"custom","value":"Bearer ..."}``
  sends that value verbatim as the ``Authorization`` header of the opening
  handshake (``type: vonage`` sends the JWT of Vonage's signed webhooks).
* Nothing on the socket transfers, hangs up or plays DTMF: those are the
  Voice API's REST calls (``PUT /v1/calls/{uuid}``, ``.../dtmf``). When the
  application closes the socket the ``connect`` action ends and the NCCO goes
  on with its next action (the call completes when there is none).

Where the documentation is silent, the choices:

* Byte order: little-endian (the AsyncAPI document's "16-bit signed
  little-endian"; the guide says only "Linear PCM 16-bit"), the
  :class:`~brisvox.wire.mediastream.L16LE` codec shared with Plivo.
* ``content-type`` is read case-insensitively, spaces ignored; one without a
  rate of 8000 or 16000 (or none at all) is refused with 1003
  (``bad_media_format``): decoding a guessed rate would hand the agent
  noise silently.
* The call's parameters are the connected event's keys but ``event`` and
  ``content-type`` (those two names are Vonage's: a header of that name is
  lost), bounded like every parameter (a nested object or a list is dropped
  and counted); the caller and the called number are the ``from``/``to`` (or
  ``caller``/``called``) headers, and ``uuid`` / ``conversation_uuid`` (the
  names of the answer webhook's ids, which the NCCO passes on as headers)
  are the call's transport ids. The socket itself carries no call id.
* A mark is a ``notify`` whose payload is ``{"mark": <name>}``; a
  ``websocket:notify`` whose payload has no such string is ``bad_mark``.
* A ``websocket:dtmf`` whose ``duration`` is not a whole number of 0 to
  60000 ms is read with duration 0 (only the digit is required); a digit
  outside ``0-9 * # A-D`` is ``bad_dtmf``.
* A binary frame must hold whole samples (an odd length is ``bad_media``)
  and at most 1 s of audio (``media_too_large``); its length need not be
  20 ms (Vonage sends 20 ms, but a shorter frame is still audio).

The parsers take the decoded JSON value (the callers decode) and raise
:class:`VonageError` (the carriers' shared
:class:`~brisvox.wire.mediastream.StreamError`: ``kind`` is the stable
counter label, ``code`` the WebSocket close code a bot answers it with).

Invariants:

* :func:`parse_connected` keeps only bounded text (ids of 1 to ``MAX_ID``
  characters without control characters, the parameters as
  :func:`brisvox.wire.jsontext.checked_params`), each drop counted in
  ``Connected.dropped``; it refuses any format but the two documented ones.
* :meth:`Format.decode` refuses an odd length and more than 1 s of audio;
  :meth:`Format.frames` cuts the bot's audio into whole 20 ms messages, the
  last one padded with silence (Vonage takes no other length).
* The bot's text messages are byte templates: :data:`CLEAR` and
  :func:`notify` (only the mark's name is encoded per message).
* :func:`bot_event` never raises: anything unparseable is ``("invalid", None)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

import numpy as np

from brisvox.wire.dtmf import DIGITS
from brisvox.wire.jsontext import caller_called, checked_params, param_text
from brisvox.wire.mediastream import L16LE, StreamError

CONNECTED, DTMF, NOTIFY, CLEARED = "websocket:connected", "websocket:dtmf", "websocket:notify", "websocket:cleared"
MEDIA_TYPE = "audio/l16"
RATES = (8000, 16000)  # the documented content-types
RESERVED = ("event", "content-type")  # the connected event's own keys; every other one is a header
ID_KEYS = ("uuid", "conversation_uuid")  # the answer webhook's ids, as the NCCO passes them on
MARK_KEY = "mark"  # a notify's payload: {"mark": <name>}
MAX_ID = 128
MAX_DTMF_MS = 60000

VonageError = StreamError  # a refusal (kind, close code, reason: brisvox.wire.mediastream)

CLEAR = b'{"action":"clear"}'
_NOTIFY_HEAD = b'{"action":"notify","payload":{"mark":'


def notify(name: str) -> bytes:
    """The ``notify`` that marks ``name``: Vonage answers it once the audio before it played."""
    return _NOTIFY_HEAD + encode_basestring(name).encode() + b"}}"


@dataclass(frozen=True, slots=True)
class Format:
    """The stream's audio, both directions: 16-bit linear PCM, little-endian, mono, at ``rate``."""

    rate: int = 16000

    @property
    def content_type(self) -> str:
        return f"{MEDIA_TYPE};rate={self.rate}"

    @property
    def frame(self) -> int:
        """Samples in one 20 ms message."""
        return self.rate // 50

    @property
    def max_bytes(self) -> int:
        """The largest binary frame accepted: 1 s of audio."""
        return self.rate * 2

    def decode(self, data: bytes) -> np.ndarray:
        """A binary frame -> int16 samples; raises :class:`VonageError` (odd length, over 1 s)."""
        if len(data) > self.max_bytes:
            raise StreamError("media_too_large", "a binary frame over 1 s of audio")
        return L16LE.decode(data)

    def frames(self, samples: np.ndarray) -> Iterator[bytes]:
        """``samples`` as whole 20 ms messages; the last one padded with silence."""
        f = self.frame
        n = len(samples)
        if n == f:
            yield L16LE.encode(samples).tobytes()
            return
        for i in range(0, n, f):
            chunk = L16LE.encode(samples[i:i + f])
            if len(chunk) < f:
                chunk = np.concatenate([chunk, np.zeros(f - len(chunk), "<i2")])
            yield chunk.tobytes()


def parse_format(content_type: Any) -> Format:
    """The connected event's ``content-type`` -> :class:`Format`; raises :class:`VonageError` for
    anything but ``audio/l16;rate=8000`` and ``audio/l16;rate=16000``."""
    if type(content_type) is str:
        media, *opts = content_type.replace(" ", "").lower().split(";")
        rates = [o[5:] for o in opts if o.startswith("rate=")]
        if media == MEDIA_TYPE and len(rates) == 1 and rates[0] in ("8000", "16000"):
            return Format(int(rates[0]))
    raise StreamError("bad_media_format", "only audio/l16;rate=8000 and audio/l16;rate=16000 are supported")


@dataclass(frozen=True, slots=True)
class Connected:
    """What a bot keeps of ``websocket:connected``: the format, the headers as the call's
    parameters (None when there were none), and how many were dropped as malformed."""

    fmt: Format
    params: dict[str, str] | None = None
    dropped: int = 0

    @property
    def ids(self) -> dict[str, str]:
        """The call's ids among the headers (``uuid``, ``conversation_uuid``), when well formed."""
        out = {}
        for k in ID_KEYS:
            v = (self.params or {}).get(k)
            if v and param_text(v, MAX_ID) is not None:
                out[k] = v
        return out

    @property
    def stream_id(self) -> str:
        """The name of the stream in the logs: its ``uuid`` header, "" without one."""
        return self.ids.get("uuid", "")

    @property
    def numbers(self) -> tuple[str, str]:
        """(caller, called): the from/to (or caller/called) headers; "" when absent."""
        return caller_called(self.params)


def parse_connected(msg: dict[str, Any]) -> Connected:
    """The ``websocket:connected`` event (a dict whose event is that); raises :class:`VonageError`."""
    fmt = parse_format(msg.get("content-type"))
    headers = {k: v for k, v in msg.items() if k not in RESERVED}
    params, dropped = checked_params(headers) if headers else (None, 0)
    return Connected(fmt, params, dropped)


def dtmf_event(msg: dict[str, Any]) -> tuple[str, int]:
    """(digit upper case, duration ms) of a ``websocket:dtmf`` event; raises :class:`VonageError`."""
    digit = msg.get("digit")
    if type(digit) is not str or len(digit) != 1 or digit.upper() not in DIGITS:
        raise StreamError("bad_dtmf", "websocket:dtmf without a valid digit")
    ms = msg.get("duration")
    return digit.upper(), ms if type(ms) is int and 0 <= ms <= MAX_DTMF_MS else 0


def notify_name(msg: dict[str, Any]) -> str:
    """The mark a ``websocket:notify`` answers (its payload's ``mark``); raises :class:`VonageError`."""
    payload = msg.get("payload")
    name = payload.get(MARK_KEY) if type(payload) is dict else None
    if type(name) is not str:
        raise StreamError("bad_mark", "websocket:notify without a mark")
    return name


# --- Vonage -> bot (the client and the tests play Vonage) ----------------------------------


class VonageStream:
    """Builds the text messages Vonage sends on one socket (the audio is binary, no message)."""

    def __init__(self, fmt: Format = Format(), headers: dict[str, Any] | None = None) -> None:
        self.fmt = fmt
        self.headers = dict(headers or {})

    def connected(self) -> str:
        """The first message: the event, the content-type, the NCCO's headers at the top level."""
        return json.dumps({"event": CONNECTED, "content-type": self.fmt.content_type, **self.headers})

    @staticmethod
    def dtmf(digit: str, duration: int = 260) -> str:
        return json.dumps({"event": DTMF, "digit": digit, "duration": duration})

    @staticmethod
    def notified(payload: Any) -> str:
        """The answer to a ``notify``: its payload, echoed."""
        return json.dumps({"event": NOTIFY, "payload": payload})

    @staticmethod
    def cleared() -> str:
        return json.dumps({"event": CLEARED})


def bot_event(msg: Any) -> tuple[str, Any]:
    """``(event, value)`` of one decoded bot text message: clear -> None, notify -> its payload,
    another action -> its name; anything unparseable ``("invalid", None)``."""
    try:
        action = msg.get("action", "")
        if action == "clear":
            return "clear", None
        if action == "notify":
            payload = msg["payload"]
            return ("notify", payload) if type(payload) is dict else ("invalid", None)
        return str(action) or "other", None
    except Exception:
        return "invalid", None
