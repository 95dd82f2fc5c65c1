"""The agent protocol's messages (docs/AGENT_PROTOCOL.md, version 1): parsed, bounded, built.

Owns the frozen dataclasses of what the agent service sends (:class:`Accept`,
:class:`Refuse`, :class:`ToolResult`, :class:`ToolsSet`, :class:`Command`), the ONE
dispatch table from a frame's ``type`` to its parser (:data:`PARSERS`), the checks of a
tool declaration (:func:`decl_spec`: a :class:`ToolDecl` -> a
:class:`~brisvox.agent.tool_engine.registry.ToolSpec` or the reason it is refused), the
handshake signature (:func:`sign`, :func:`verify`) and the JSON text of every frame
brisvox sends (:func:`encode` and the builders).

Invariants:

* :func:`parse` never raises anything but :class:`BadFrame` (code, message, ref), whose
  ``code`` is one of :data:`ERROR_CODES`; it refuses a binary frame, a frame over
  :data:`MAX_FRAME_BYTES`, text that is not a JSON object, a missing or mistyped field
  and an unknown type. A parsed message holds only bounded values (ids at most 64
  characters, at most :data:`MAX_TOOLS` declarations; a command's text is bounded by the
  frame: its handler refuses one over :data:`MAX_TEXT` with ``ok: false``).
* Every text brisvox sends is one JSON object with a string ``type``.
* The handshake is ``t=<unix s>,n=<nonce>,v2=<hex>`` with ``v2 = HMAC-SHA256(secret,
  "v2.<t>.<n>.<session>")``: the timestamp and a fresh random nonce (128 bits, per dial)
  are inside what is signed, so a service that remembers the nonces of the last
  :data:`MAX_SKEW` seconds (the SDKs do) refuses a captured handshake replayed;
  :func:`verify` accepts a ``t`` at most :data:`MAX_SKEW` seconds away and compares in
  constant time (stateless: the nonce memory is the service's).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.agent.tool_engine.registry import ToolKind, ToolSpec
from brisvox.agent.tool_engine.schema import CompiledSchema, SchemaCompileError

VERSION = 1
MAX_FRAME_BYTES = 1 << 20
MAX_TOOLS = 64
MAX_WAITING = 32
MAX_TEXT = 1000
MAX_ID = 64
MAX_TIMEOUT_MS = 30000
OFFER_TIMEOUT = 5.0
MAX_SKEW = 30  # the services' clock window (seconds, either side): a handshake older than this is refused
NONCE = re.compile(r"^[0-9a-f]{16,64}$")
COMMAND_RATE = 20.0
COMMAND_BURST = 40
EVENTS = frozenset({"user_turn", "bot_turn", "tool_outcome", "hangup"})
COMMANDS = frozenset({"say", "note", "transfer", "end_call", "dial"})
DIAL_VIA = frozenset({"sip", "twilio"})
DIAL_TIMES = ("ringing_at_ms", "progress_at_ms", "answered_at_ms")  # a SIP dial's ack: ms after its INVITE
ERROR_CODES = frozenset({"bad_message", "too_large", "unknown_type", "unknown_id", "late", "invalid_tool",
                         "rate_limited", "not_live"})
SIGNATURE_HEADER = "X-Brisvox-Signature"
SESSION_HEADER = "X-Brisvox-Session"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


class BadFrame(ValueError):
    """A frame refused with a typed ``error`` (``code`` in :data:`ERROR_CODES`)."""

    def __init__(self, code: str, message: str, ref: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.ref = code, message[:200], ref[:MAX_ID]


@dataclass(frozen=True, slots=True)
class ToolDecl:
    name: str
    description: str
    parameters: Any
    kind: str
    timeout_ms: Any
    filler_after_ms: Any = None
    repeatable: bool = False
    confirm: bool = False


@dataclass(frozen=True, slots=True)
class Accept:
    session: str
    tools: tuple[ToolDecl, ...]
    subscribe: frozenset[str]
    refused: tuple[tuple[str, str], ...] = ()  # (name, error): declarations malformed beyond a ToolDecl


@dataclass(frozen=True, slots=True)
class Refuse:
    session: str
    reason: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    id: str
    ok: bool
    result: Any = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class ToolsSet:
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Command:
    id: str
    name: str
    text: str = ""
    target: str = ""
    reason: str = ""
    agent: str = ""  # dial: the agent that runs the new call ("": the gateway's default)
    via: str = ""  # dial: "sip" (default) or "twilio"
    trunk: str = ""  # dial over SIP: the [[sip.trunks]] entry to dial through ("": [sip] trunk)


Inbound = Accept | Refuse | ToolResult | ToolsSet | Command


# -- parsing ------------------------------------------------------------------------------

def _str(d: Mapping[str, Any], key: str, ref: str, *, limit: int = MAX_ID, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str):
        raise BadFrame("bad_message", f"{key} must be a string", ref)
    if len(v) > limit:
        raise BadFrame("too_large", f"{key} is longer than {limit} characters", ref)
    return v


def _accept(d: Mapping[str, Any]) -> Accept:
    tools = d.get("tools", [])
    sub = d.get("subscribe", [])
    if not isinstance(tools, list) or not isinstance(sub, list):
        raise BadFrame("bad_message", "tools and subscribe must be arrays", "session.accept")
    if len(tools) > MAX_TOOLS:
        raise BadFrame("invalid_tool", f"at most {MAX_TOOLS} tools per session", "session.accept")
    decls: list[ToolDecl] = []
    refused: list[tuple[str, str]] = []
    for t in tools:
        name = t.get("name") if isinstance(t, dict) else None
        if not isinstance(t, dict) or not isinstance(name, str):
            refused.append((str(name)[:MAX_ID] if name is not None else "", "a declaration is an object with a name"))
            continue
        desc = t.get("description", "")
        decls.append(ToolDecl(name[:200], desc if isinstance(desc, str) else "", t.get("parameters"),
                              str(t.get("kind", "")), t.get("timeout_ms"), t.get("filler_after_ms"),
                              t.get("repeatable", False) is True, t.get("confirm", False) is True))
    unknown = [s for s in sub if s not in EVENTS]
    if unknown:
        raise BadFrame("bad_message", f"unknown events {unknown!r:.80}", "session.accept")
    return Accept(_str(d, "session", "session.accept", limit=128, default=""), tuple(decls), frozenset(sub),
                  tuple(refused))


def _refuse(d: Mapping[str, Any]) -> Refuse:
    return Refuse(_str(d, "session", "session.refuse", limit=128, default=""),
                  _str(d, "reason", "session.refuse", limit=200, default=""))


def _result(d: Mapping[str, Any]) -> ToolResult:
    rid = _str(d, "id", "tool.result")
    ok = d.get("ok")
    if not isinstance(ok, bool):
        raise BadFrame("bad_message", "ok must be true or false", rid)
    if ok:
        return ToolResult(rid, True, d.get("result"))
    err = d.get("error")
    msg = err.get("message") if isinstance(err, dict) else err
    return ToolResult(rid, False, None, str(msg if msg is not None else "the tool failed")[:512])


def _tools_set(d: Mapping[str, Any]) -> ToolsSet:
    names = d.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(names) > MAX_TOOLS:
        raise BadFrame("bad_message", f"names must be an array of at most {MAX_TOOLS} strings", "tools.set")
    return ToolsSet(tuple(names))


def _command(d: Mapping[str, Any]) -> Command:
    cid = _str(d, "id", "command")
    name = _str(d, "name", cid)
    if name not in COMMANDS:
        raise BadFrame("bad_message", f"unknown command {name!r}", cid)
    return Command(cid, name, _str(d, "text", cid, limit=MAX_FRAME_BYTES, default=""),  # bounded by its ack
                   _str(d, "target", cid, limit=256, default=""), _str(d, "reason", cid, limit=200, default=""),
                   _str(d, "agent", cid, default=""), _str(d, "via", cid, limit=16, default=""),
                   _str(d, "trunk", cid, limit=32, default=""))


PARSERS: dict[str, Callable[[Mapping[str, Any]], Inbound]] = {
    "session.accept": _accept,
    "session.refuse": _refuse,
    "tool.result": _result,
    "tools.set": _tools_set,
    "command": _command,
}


def parse(data: str | bytes) -> Inbound:
    """One frame of the agent service, or :class:`BadFrame`."""
    if not isinstance(data, str):
        raise BadFrame("bad_message", "binary frames are not part of the protocol")
    if len(data) > MAX_FRAME_BYTES // 4 and len(data.encode("utf-8", "replace")) > MAX_FRAME_BYTES:
        raise BadFrame("too_large", f"a frame is at most {MAX_FRAME_BYTES} bytes")
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise BadFrame("bad_message", "not JSON") from None
    if not isinstance(d, dict):
        raise BadFrame("bad_message", "a frame is a JSON object")
    kind = d.get("type")
    if not isinstance(kind, str):
        raise BadFrame("bad_message", "a frame has a string type")
    fn = PARSERS.get(kind)
    if fn is None:
        raise BadFrame("unknown_type", f"unknown type {kind[:64]!r}", kind)
    return fn(d)


# -- declarations -------------------------------------------------------------------------

def _ms(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def decl_spec(d: ToolDecl) -> ToolSpec | str:
    """The spec a declaration registers as, or why it is refused (``invalid_tool`` text)."""
    if not _NAME.match(d.name):
        return "invalid name: 1 to 64 ASCII letters, digits, '_' or '-'"
    kind = {"read_only": ToolKind.READ_ONLY, "side_effect": ToolKind.SIDE_EFFECT}.get(d.kind)
    if kind is None:
        return "kind must be read_only or side_effect"
    timeout = _ms(d.timeout_ms)
    if timeout is None or not 1 <= timeout <= MAX_TIMEOUT_MS:
        return f"timeout_ms must be 1..{MAX_TIMEOUT_MS}"
    filler = _ms(d.filler_after_ms) if d.filler_after_ms is not None else None
    if d.filler_after_ms is not None and (filler is None or not 0 <= filler <= MAX_TIMEOUT_MS):
        return f"filler_after_ms must be null or 0..{MAX_TIMEOUT_MS}"
    if kind is ToolKind.READ_ONLY and (d.confirm or d.repeatable):
        return "confirm and repeatable are for side_effect tools"
    if not isinstance(d.parameters, dict) or d.parameters.get("type") != "object":
        return "parameters must be a JSON Schema with \"type\": \"object\""
    try:
        CompiledSchema(d.parameters)
    except SchemaCompileError as e:
        return f"invalid schema: {str(e)[:200]}"
    return ToolSpec(d.name, d.description[:1024], d.parameters, kind, timeout / 1000.0,
                    None if filler is None else filler / 1000.0, d.confirm, d.repeatable)


# -- signing ------------------------------------------------------------------------------

def signature(secret: str, session: str, t: int, nonce: str) -> str:
    return hmac.new(secret.encode(), f"v2.{t}.{nonce}.{session}".encode(), hashlib.sha256).hexdigest()


def sign(secret: str, session: str, now: float, nonce: str | None = None) -> dict[str, str]:
    """The handshake headers of ``session`` at unix time ``now``, with a fresh random nonce
    (every dial, a re-dial too: a service remembers the nonces it accepted)."""
    t = int(now)
    n = secrets.token_hex(16) if nonce is None else nonce
    return {SIGNATURE_HEADER: f"t={t},n={n},v2={signature(secret, session, t, n)}", SESSION_HEADER: session}


def verify(secret: str, session: str, header: str, now: float) -> bool:
    """The stateless part of the service's check (the SDKs also refuse a nonce seen within the window)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    t_text, nonce = parts.get("t", ""), parts.get("n", "")
    if not t_text.isdigit() or len(t_text) > 12 or not NONCE.match(nonce):
        return False
    t = int(t_text)
    if abs(now - t) > MAX_SKEW:
        return False
    return hmac.compare_digest(parts.get("v2", ""), signature(secret, session, t, nonce))


# -- outbound -----------------------------------------------------------------------------

def encode(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj).decode()


def offer(session: str, call: Mapping[str, Any], local_tools: list[str], resume: bool) -> str:
    return encode({"type": "session.offer", "v": VERSION, "session": session, "resume": resume,
                   "call": dict(call), "local_tools": local_tools})


def ready(registered: list[str], refused: list[tuple[str, str]]) -> str:
    return encode({"type": "session.ready", "tools": registered,
                   "refused": [{"name": n, "error": e} for n, e in refused]})


def tool_call(rid: str, call_id: str, name: str, args: Any, key: str, epoch: int, deadline_ms: int) -> str:
    return encode({"type": "tool.call", "id": rid, "call_id": call_id, "name": name, "arguments": args,
                   "idempotency_key": key, "epoch": epoch, "deadline_ms": deadline_ms})


def tool_cancel(rid: str, reason: str) -> str:
    return encode({"type": "tool.cancel", "id": rid, "reason": reason})


def event(name: str, **fields: Any) -> str:
    return encode({"type": "event", "name": name, **fields})


def ack(cid: str, ok: bool, error: str = "", **data: str | int) -> str:
    """``command.ack``; ``data``: what the command made (a dial's ``call_id`` or ``call_sid``, a SIP
    dial's :data:`DIAL_TIMES`)."""
    return encode({"type": "command.ack", "id": cid, "ok": ok, **data, **({"error": error} if error else {})})


def error(code: str, message: str, ref: str = "") -> str:
    assert code in ERROR_CODES, code
    return encode({"type": "error", "code": code, "message": message, "ref": ref})
