"""Telnyx Media Streaming (bidirectional, RTP mode): every message, both directions.

Owns the JSON text messages of Telnyx's media WebSocket, its media formats
and its stream token header. What the documentation defines, as implemented
here (Telnyx developer docs: "Stream call media over WebSocket", the AsyncAPI
reference at developers.telnyx.com/api-reference/websockets/stream-call-media-over-websocket;
"Media Streaming over Websockets", docs/voice/programmable-voice/media-streaming;
the Call Control ``streaming_start`` / ``answer`` parameters; TeXML ``<Stream>``):

* Telnyx -> bot (built by :class:`TelnyxStream`, as Telnyx sends them: the
  ``brisvox call`` client and the tests play Telnyx; parsed by the gateway
  with :func:`parse_start`, the format's codec (:data:`FORMATS`) and the
  parsers shared with Twilio, :mod:`brisvox.wire.mediastream`): ``connected`` (``version``; the
  stream token as ``connected.x-telnyx-streaming-auth-token`` when one is
  configured), ``start`` (``stream_id`` and ``sequence_number`` at the top
  level; ``start.call_control_id``, ``call_session_id``, ``user_id``,
  ``from``, ``to``, ``client_state``, ``custom_parameters``,
  ``media_format`` {``encoding``, ``sample_rate``, ``channels``}),
  ``media`` (``media.track`` inbound | outbound, ``chunk``, ``timestamp``,
  ``payload``: base64 RTP payload without RTP headers), ``mark`` (the echo
  of a bot's mark, once the audio before it played, or at once when nothing
  is queued, and for every queued mark on a ``clear``), ``dtmf``
  (``dtmf.digit``), ``error`` (``error`` or ``payload`` {``code``,
  ``title``, ``detail``}: Telnyx refusing one of the bot's frames), ``stop``.
* bot -> Telnyx (built by :class:`BotStream`): ``media``
  (``{"event":"media","media":{"payload":...}}``, 20 ms to 30 s of audio
  in the stream's bidirectional codec), ``mark`` (``mark.name``), ``clear``
  (drops queued media; Telnyx echoes the queued marks). No message carries
  the stream id: the documented bot frames have none.
* Formats: the bidirectional RTP codecs are PCMU, PCMA, G722, OPUS, AMR-WB
  and L16 (AsyncAPI "Client Media Frame"), at a
  ``stream_bidirectional_sampling_rate`` of 8000, 16000, 22050, 24000 or
  48000 Hz; the streamed (caller's) audio is ``stream_codec``, transcoded
  only between PCMU and PCMA, else the call's own codec (TeXML ``<Stream>``).
* :data:`AUTH_HEADER`: Telnyx sends the ``stream_auth_token`` of the
  Call Control command as this header of the upgrade request. Telnyx signs
  webhooks (Ed25519), never the media WebSocket: this token (or a ``token``
  query parameter of the ``stream_url``) is its only credential.

Where the documentation is silent, chosen here:

* The bidirectional codec is not announced on the stream (``start`` gives
  only the format of the caller's audio): the bot answers in the format of
  ``start.media_format``, so ``stream_bidirectional_codec`` and
  ``stream_bidirectional_sampling_rate`` must match ``stream_codec`` (docs/TRANSPORTS.md).
* Formats taken (:data:`FORMATS`): PCMU and PCMA at 8 kHz, L16 at 8 or 16
  kHz, mono; ``audio/x-mulaw`` and ``audio/x-alaw`` (the older examples'
  names) mean PCMU and PCMA; no ``media_format`` means PCMU 8 kHz. Anything
  else (G722, OPUS, AMR-WB, another rate, stereo) is refused with 1003:
  brisvox carries no second codec. ``sample_rate`` and ``channels`` are read
  as numbers or as strings of ASCII digits; any other string (``"²"``) is a
  malformed ``start`` (1007, :func:`brisvox.wire.mediastream.whole_number`).
* L16 is in network byte order (big-endian), as every RTP L16 payload
  (RFC 3551 4.5.11); an odd-length L16 payload is malformed.
* ``error`` frames are counted and logged, never charged to the call's fault
  budget (they report the bot's frames, not bad input).

Invariants:

* :func:`parse_start` bounds what it keeps: an id, ``from``, ``to`` or
  ``client_state`` that is not a string of 1 to ``MAX_ID`` (ids) or
  ``MAX_PARAM_VALUE`` characters without control characters is dropped,
  parameters as :func:`brisvox.wire.jsontext.checked_params`; each drop is
  counted in ``Start.dropped``; a ``stream_id`` that is not such a string
  without ``"`` or ``\\`` refuses the start (``bad_start``).
* A media message is read with ``mediastream.media_payload(msg, fmt.max_media_bytes)``
  (more than 1 s of audio in one message is refused) and decoded with
  ``fmt.codec`` (:data:`L16` refuses an odd length as ``bad_media``).
* The bot's media message is ``BotStream.media_prefix + base64 + MEDIA_SUFFIX``
  (a byte template, no JSON encoder on the hot path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brisvox.wire.g711 import PCMA
from brisvox.wire.jsontext import (
    MAX_PARAM_VALUE,
    caller_called,
    checked_params,
    kept_text,
    param_text,
    text,
)
from brisvox.wire.mediastream import (
    L16BE,
    PCMU_8K,
    BotTemplates,
    MediaFormat,
    StreamError,
    whole_number,
)

AUTH_HEADER = "x-telnyx-streaming-auth-token"
MAX_ID = 128
FRAME_MS = 20
ALIASES = {"audio/x-mulaw": "PCMU", "audio/x-alaw": "PCMA"}
VERSION = "1.0.0"


L16 = L16BE  # 16-bit linear PCM in network byte order (brisvox.wire.mediastream)


FORMATS: dict[tuple[str, int], MediaFormat] = {
    ("PCMU", 8000): PCMU_8K,
    ("PCMA", 8000): MediaFormat("PCMA", 8000, PCMA, 1),
    ("L16", 8000): MediaFormat("L16", 8000, L16, 2),
    ("L16", 16000): MediaFormat("L16", 16000, L16, 2),
}
DEFAULT_FORMAT = FORMATS["PCMU", 8000]
TAKEN = "PCMU or PCMA at 8000 Hz, L16 at 8000 or 16000 Hz, mono"


def media_format(fmt: Any) -> MediaFormat:
    """The format of ``start.media_format`` (absent: PCMU 8 kHz); raises :class:`StreamError`."""
    if fmt is None:
        return DEFAULT_FORMAT
    if type(fmt) is not dict:
        raise StreamError("bad_media_format", f"media_format must be an object ({TAKEN})")
    enc, rate, channels = fmt.get("encoding", "PCMU"), fmt.get("sample_rate", 8000), fmt.get("channels", 1)
    rate = whole_number(rate, "media_format.sample_rate")
    channels = whole_number(channels, "media_format.channels", 2)
    found = FORMATS.get((ALIASES.get(enc, enc), rate)) if type(enc) is str and type(rate) is int else None
    if found is None or channels != 1:
        shown = f"{str(enc)[:16]} {str(rate)[:8]} Hz x{str(channels)[:4]}"
        raise StreamError("bad_media_format", f"unsupported media format {shown} (brisvox takes {TAKEN})")
    return found


@dataclass(frozen=True, slots=True)
class Start:
    """What a bot keeps of ``start``; a field is None when absent (or dropped: ``dropped``
    counts the ids, numbers and parameters dropped as malformed)."""

    stream_id: str
    format: MediaFormat = DEFAULT_FORMAT
    call_control_id: str | None = None
    call_session_id: str | None = None
    user_id: str | None = None
    client_state: str | None = None
    caller: str | None = None  # start.from
    called: str | None = None  # start.to
    params: dict[str, str] | None = None  # custom_parameters
    dropped: int = 0

    @property
    def numbers(self) -> tuple[str, str]:
        """(caller, called): ``from``/``to``, else the From/To (or caller/called) custom
        parameters; "" when absent."""
        return caller_called(self.params, self.caller, self.called)

    @property
    def ids(self) -> dict[str, str]:
        """The stream's ids by their Telnyx names (stream_id first)."""
        ids = {"stream_id": self.stream_id}
        for k in ("call_control_id", "call_session_id", "user_id", "client_state"):
            v = getattr(self, k)
            if v is not None:
                ids[k] = v
        return ids


def parse_start(msg: dict[str, Any]) -> Start:
    """The ``start`` message (a dict whose event is ``start``); raises :class:`StreamError`."""
    start = msg.get("start")
    if type(start) is not dict:
        raise StreamError("bad_start", "start without a start object")
    sid = msg.get("stream_id") or start.get("stream_id")
    if type(sid) is not str or param_text(sid, MAX_ID) is None or not sid or '"' in sid or "\\" in sid:
        raise StreamError("bad_start", "start without a valid stream_id")
    fmt = media_format(start.get("media_format"))
    dropped = 0
    kept: dict[str, str | None] = {}
    for key, limit in (("call_control_id", MAX_ID), ("call_session_id", MAX_ID), ("user_id", MAX_ID),
                       ("client_state", MAX_PARAM_VALUE), ("from", MAX_PARAM_VALUE), ("to", MAX_PARAM_VALUE)):
        kept[key], d = kept_text(start.get(key), limit)
        dropped += d
    params, d = checked_params(start.get("custom_parameters"))
    return Start(sid, fmt, kept["call_control_id"], kept["call_session_id"], kept["user_id"],
                 kept["client_state"], kept["from"], kept["to"], params, dropped + d)


def error_info(msg: dict[str, Any]) -> tuple[str, str]:
    """(code, title) of an ``error`` frame, bounded; "" for what is absent or malformed."""
    err = msg.get("error", msg.get("payload"))
    if type(err) is not dict:
        return "", ""
    code, title = (param_text(err.get(k), 32) for k in ("code", "title"))
    return code or "", title or ""


# --- Telnyx -> bot (what the client and the tests send as Telnyx) ---------------------------

MEDIA_HEAD = '{{"event":"media","sequence_number":"{}","media":{{"track":"inbound","chunk":"{}","timestamp":"{}","payload":"'


class TelnyxStream:
    """Builds the messages Telnyx sends for one stream (mutable counters; one per call):
    ``sequence_number`` from 1 over every message after ``connected``, ``media.chunk`` from 1,
    ``media.timestamp`` in milliseconds since the stream started, all strings."""

    def __init__(self, index: int = 0, tag: str = "bench", *, stream_id: str = "",
                 call_control_id: str = "", fmt: MediaFormat = DEFAULT_FORMAT) -> None:
        self.stream_id = stream_id or f"{tag}-{index:06d}-5f1c-4b21-89a4-9e1819c043bc"
        self.call_control_id = call_control_id or f"v3:{tag}{index:06d}"
        self.format = fmt
        self.media_tail = f'"}},"stream_id":"{self.stream_id}"}}'
        self._seq = 0
        self._chunk = 0

    def _next_seq(self) -> str:
        self._seq += 1
        return str(self._seq)

    @staticmethod
    def connected(token: str = "") -> str:
        msg: dict[str, Any] = {"event": "connected", "version": VERSION}
        if token:
            msg["connected"] = {AUTH_HEADER: token}
        return text(msg)

    def start(self, custom: dict[str, str] | None = None, caller: str = "", called: str = "") -> str:
        start: dict[str, Any] = {"user_id": "3e6f995f-85f7-4705-9741-53b116d28237",
                                 "call_control_id": self.call_control_id,
                                 "call_session_id": f"session-{self.stream_id}"}
        if caller:
            start["from"] = caller
        if called:
            start["to"] = called
        start["custom_parameters"] = custom or {}
        start["media_format"] = {"encoding": self.format.encoding, "sample_rate": self.format.rate, "channels": 1}
        return text({"event": "start", "sequence_number": self._next_seq(), "start": start,
                     "stream_id": self.stream_id})

    def media(self, payload_b64: str) -> str:
        """One media message of ``payload_b64`` (base64 audio in the stream's format, 20 ms)."""
        self._chunk += 1
        chunk = self._chunk
        return MEDIA_HEAD.format(self._next_seq(), chunk, (chunk - 1) * FRAME_MS) + payload_b64 + self.media_tail

    def mark(self, name: str) -> str:
        return text({"event": "mark", "sequence_number": self._next_seq(), "stream_id": self.stream_id,
                     "mark": {"name": name}})

    def dtmf(self, digit: str) -> str:
        return text({"event": "dtmf", "sequence_number": self._next_seq(), "stream_id": self.stream_id,
                     "dtmf": {"digit": digit}})

    def error(self, code: str, title: str, detail: str = "") -> str:
        return text({"event": "error", "sequence_number": self._next_seq(), "stream_id": self.stream_id,
                     "error": {"code": code, "title": title, "detail": detail}})

    def stop(self) -> str:
        return text({"event": "stop", "sequence_number": self._next_seq(),
                     "stop": {"user_id": "3e6f995f-85f7-4705-9741-53b116d28237",
                              "call_control_id": self.call_control_id},
                     "stream_id": self.stream_id})


# --- bot -> Telnyx ---------------------------------------------------------------------------

class BotStream(BotTemplates):
    """Builds the messages a bot sends on one stream (UTF-8 bytes; the same for every stream:
    the documented bot frames carry no id)."""

    __slots__ = ()
    media_prefix = b'{"event":"media","media":{"payload":"'
    clear = b'{"event":"clear"}'
    mark_prefix = b'{"event":"mark","mark":{"name":'

