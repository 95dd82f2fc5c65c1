"""The native brisvox WebSocket protocol (``/ws``): every message, both directions.

Owns the JSON control messages of docs/PROTOCOL.md "Native brisvox
protocol" (audio is binary PCM16 little-endian mono at the call's rate and
needs no builder):

* client -> gateway (built by :class:`NativeStream`: the ``brisvox call``
  client, the simulator's caller, the tests; parsed by the gateway with
  :func:`event_name`, :func:`parse_start`, :func:`mark_name`,
  :func:`parse_dtmf`): ``start`` (rate, params, marks, events), ``mark`` (echo
  mode), ``dtmf`` (digit, duration_ms), ``stop``.
* gateway -> client (built by the module functions :func:`started`,
  :func:`mark`, :data:`CLEAR`, :func:`dtmf`, :func:`transfer`, :func:`error`,
  :func:`stop`, :func:`call_event`; parsed by clients with :func:`server_message`):
  ``started``, ``mark``, ``clear``, ``dtmf`` (digits the agent pressed), ``transfer``,
  ``error``, ``stop``, and ``call_event`` (only to a client whose ``start`` said
  ``"events": true``: the call's transcript lines, turn latencies and tool calls).

A client's messages are ``str`` (a client library sends a str as a text
frame); the gateway's are UTF-8 ``bytes`` (it writes its frames itself). The
parsers take the decoded JSON value and raise :class:`NativeError`.

Invariants:

* A :class:`NativeError` is either recoverable (``close`` 0: the gateway
  answers an ``error`` message with ``code`` and the call goes on) or fatal
  (``close`` is the WebSocket close code, e.g. 1003 for a rate not offered).
  ``code`` is the stable label of the error message and of the counters.
* :func:`parse_start` accepts only a rate among the offered ``rates``
  (a subset of :data:`RATES`), a ``marks`` mode of release or echo, an
  ``events`` flag that is a boolean when present, and
  bounds the parameters (:func:`brisvox.wire.jsontext.checked_params`: a
  malformed or oversized one is dropped and counted in ``Start.dropped``).

Signed tokens (the credential a browser holds instead of the gateway's
``native_secret``): ``base64url(payload) "." base64url(HMAC-SHA256(secret,
payload))``, unpadded, where ``payload`` is the compact JSON object
``{"agent": name, "exp": unix seconds, "iat": unix seconds, "jti": id,
"aud": audience, "params": {...}}`` (``params`` optional; ``aud`` optional,
"" = the routes, ``"playground"`` = the playground's own route only).
:func:`sign_token` builds one, :func:`open_token` checks one:
it never raises anything but :class:`TokenError`, compares the MAC in
constant time before it parses the payload, and refuses a token longer than
``MAX_TOKEN_CHARS``, a payload without a string ``agent``, integers ``exp``
and ``iat`` and a string ``jti`` of 8..64 characters (the id a gateway
remembers to refuse a replay), and an ``exp`` not after ``now``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from brisvox.wire.dtmf import DIGITS
from brisvox.wire.jsontext import bounded_params, checked_params, data, text

RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)  # every rate the protocol knows
FRAME_MS = 20
MARK_MODES = ("release", "echo")


class NativeError(ValueError):
    """A client message the gateway refuses (see module invariants)."""

    def __init__(self, code: str, message: str, close: int = 0) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.close = close


# --- client -> gateway ------------------------------------------------------------------


class NativeStream:
    """Builds a client's messages for one call (``marks``: None leaves the gateway's default,
    release; ``params`` None sends none)."""

    def __init__(self, rate: int, params: dict[str, str] | None = None, marks: str | None = None,
                 events: bool = False) -> None:
        self.rate = rate
        self.params = params
        self.marks = marks
        self.events = events

    def start(self) -> str:
        msg: dict[str, Any] = {"event": "start", "rate": self.rate}
        if self.params is not None:
            msg["params"] = self.params
        if self.marks is not None:
            msg["marks"] = self.marks
        if self.events:
            msg["events"] = True
        return text(msg)

    @staticmethod
    def mark(name: str) -> str:
        """Echo mode: the client played up to the mark ``name``."""
        return text({"event": "mark", "name": name})

    @staticmethod
    def dtmf(digit: str, duration_ms: int | None = None) -> str:
        msg: dict[str, Any] = {"event": "dtmf", "digit": digit}
        if duration_ms is not None:
            msg["duration_ms"] = duration_ms
        return text(msg)

    @staticmethod
    def stop() -> str:
        return '{"event":"stop"}'


@dataclass(frozen=True, slots=True)
class Start:
    """What the gateway keeps of ``start``."""

    rate: int
    marks_echo: bool  # marks: "echo" (the client echoes each mark) rather than "release"
    params: dict[str, str] | None = None  # None when absent or not an object
    dropped: int = 0  # parameters dropped as malformed or oversized
    events: bool = False  # the client asked for the call's events (call_event messages)


def event_name(msg: Any) -> str:
    """The event of a decoded client message; raises :class:`NativeError` (bad_message)."""
    if type(msg) is not dict or type(msg.get("event")) is not str:
        raise NativeError("bad_message", "expected a JSON object with an event")
    return msg["event"]


def parse_start(msg: dict[str, Any], rates: tuple[int, ...] = RATES) -> Start:
    """The ``start`` message; ``rates`` are the rates this gateway offers."""
    rate = msg.get("rate")
    if type(rate) is not int or rate not in rates:
        raise NativeError("bad_rate", f"rate must be one of {list(rates)}", close=1003)
    marks = msg.get("marks", "release")
    if marks not in MARK_MODES:
        raise NativeError("bad_start", "marks must be release or echo")
    events = msg.get("events", False)
    if type(events) is not bool:
        raise NativeError("bad_start", "events must be true or false")
    params, dropped = checked_params(msg.get("params"))
    return Start(rate, marks == "echo", params, dropped, events)


def mark_name(msg: dict[str, Any]) -> str:
    name = msg.get("name")
    if type(name) is not str:
        raise NativeError("bad_mark", "mark needs a name")
    return name


def parse_dtmf(msg: dict[str, Any]) -> tuple[str, int]:
    """``(digit upper case, duration in ms)`` of a ``dtmf`` message (duration 0 when absent or bad)."""
    digit = msg.get("digit")
    dur = msg.get("duration_ms", 0)
    if type(digit) is not str or len(digit) != 1 or digit.upper() not in DIGITS:
        raise NativeError("bad_dtmf", "digit must be one of 0-9 * # A-D")
    return digit.upper(), dur if type(dur) is int and dur >= 0 else 0


# --- gateway -> client ------------------------------------------------------------------

CLEAR = b'{"event":"clear"}'


def started(call_id: str, rate: int, agent: str, frame_ms: int = FRAME_MS) -> bytes:
    return data({"event": "started", "call_id": call_id, "rate": rate, "frame_ms": frame_ms, "agent": agent})


def mark(name: str) -> bytes:
    """Echo mode: sent right after the frame that reaches the mark."""
    return b'{"event":"mark","name":' + encode_basestring(name).encode() + b"}"  # jsontext.quote, inlined


def dtmf(digits: str) -> bytes:
    """The agent asks the client to play ``digits``."""
    return data({"event": "dtmf", "digits": digits})


def transfer(target: str) -> bytes:
    return data({"event": "transfer", "target": target})


def error(code: str, message: str) -> bytes:
    return data({"event": "error", "code": code, "message": message})


def stop(reason: str) -> bytes:
    return data({"event": "stop", "reason": reason})


CALL_EVENTS = ("user_turn", "bot_turn", "turn_metrics", "tool_call")  # the names a call_event carries


def call_event(name: str, fields: dict[str, Any]) -> bytes:
    """One event of the call (``name`` one of :data:`CALL_EVENTS`); ``fields`` are flat
    (the sender bounds them) and never override ``event`` or ``name``."""
    return data({**fields, "event": "call_event", "name": name})


@dataclass(frozen=True, slots=True)
class ServerMessage:
    """One decoded gateway message; the fields its event does not carry are left empty.
    ``event`` is ``invalid`` for something that is not an object with an event."""

    event: str
    call_id: str = ""  # started
    rate: int = 0  # started
    frame_ms: int = 0  # started
    agent: str = ""  # started
    name: str = ""  # mark
    digits: str = ""  # dtmf
    target: str = ""  # transfer
    code: str = ""  # error
    message: str = ""  # error
    reason: str = ""  # stop
    fields: dict[str, Any] | None = None  # call_event: the whole message (name among them)


def server_message(msg: Any) -> ServerMessage:
    """Read one decoded gateway message (never raises)."""
    if type(msg) is not dict or type(msg.get("event")) is not str:
        return ServerMessage("invalid")
    ev = msg["event"]
    if ev == "started":
        rate, frame_ms = msg.get("rate"), msg.get("frame_ms")
        return ServerMessage(ev, call_id=str(msg.get("call_id", "")), agent=str(msg.get("agent", "")),
                             rate=rate if type(rate) is int else 0,
                             frame_ms=frame_ms if type(frame_ms) is int else 0)
    if ev == "mark":
        return ServerMessage(ev, name=str(msg.get("name", "")))
    if ev == "dtmf":
        return ServerMessage(ev, digits=str(msg.get("digits", "")))
    if ev == "transfer":
        return ServerMessage(ev, target=str(msg.get("target", "")))
    if ev == "error":
        return ServerMessage(ev, code=str(msg.get("code")), message=str(msg.get("message", "")))
    if ev == "stop":
        return ServerMessage(ev, reason=str(msg.get("reason") or ""))
    if ev == "call_event":
        return ServerMessage(ev, name=str(msg.get("name", "")), fields=dict(msg))
    return ServerMessage(ev)


# --- signed tokens ----------------------------------------------------------------------

MAX_TOKEN_CHARS = 4096
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


class TokenError(ValueError):
    """A token :func:`open_token` refuses: ``kind`` is ``bad_token`` or ``expired``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class Token:
    """What a valid token grants: one agent until ``exp``, with these call parameters; issued
    at ``iat``, named ``jti`` (once), for the audience ``aud`` ("": the routes)."""

    agent: str
    exp: int
    params: dict[str, str] | None = None
    iat: int = 0
    jti: str = ""
    aud: str = ""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(part: str) -> bytes:
    if not _B64URL.fullmatch(part):
        raise TokenError("bad_token", "not base64url")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise TokenError("bad_token", "not base64url") from None


def _mac(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), payload, hashlib.sha256).digest()


def sign_token(secret: str, agent: str, exp: int, params: dict[str, str] | None = None, *,
               iat: int | None = None, jti: str | None = None, aud: str = "") -> str:
    """A token for ``agent`` valid until ``exp`` (unix seconds), issued at ``iat`` (default:
    now), named ``jti`` (default: 16 random characters), for ``aud``, keyed with ``secret``."""
    issued = int(time.time()) if iat is None else int(iat)
    body: dict[str, Any] = {"agent": agent, "exp": int(exp), "iat": issued,
                            "jti": secrets.token_urlsafe(12) if jti is None else jti}
    if aud:
        body["aud"] = aud
    if params:
        body["params"] = {str(k): str(v) for k, v in params.items()}
    payload = data(body)
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def open_token(secret: str, token: str, now: float) -> Token:
    """The grant of ``token`` if ``secret`` signed it and it has not expired at ``now``."""
    if not secret or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise TokenError("bad_token", "not a token")
    head, sig = token.split(".")
    payload, mac = _unb64(head), _unb64(sig)
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        raise TokenError("bad_token", "bad signature")
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        raise TokenError("bad_token", "payload is not JSON") from None
    if type(body) is not dict or type(body.get("agent")) is not str or type(body.get("exp")) is not int \
            or type(body.get("iat")) is not int or type(body.get("jti")) is not str \
            or not 8 <= len(body["jti"]) <= 64 or type(body.get("aud", "")) is not str:
        raise TokenError("bad_token", "payload needs agent, exp, iat and jti")
    if body["exp"] <= now:
        raise TokenError("expired", "token expired")
    return Token(body["agent"], body["exp"], bounded_params(body.get("params")), body["iat"], body["jti"],
                 body.get("aud", ""))
