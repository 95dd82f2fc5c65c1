"""The conversation context of one call: messages, tool-call ids, ordering rules.

Owns the provider-neutral message model (docs/TOOLS.md):
``System | User | Assistant {text, tool_calls,
provider_data} | Tool {call_id, content, is_error}``, the stable internal
tool-call ids ``t<epoch>.<seq>``, the ordering rules (:meth:`Context.validate`),
the closing of open calls at an interruption, late SideEffect results as
system notes, the token estimate and the JSON form.

Invariants (checked by :meth:`Context.validate`):

* every tool call is answered exactly once, after its assistant message and
  before any other message (system included); results may come in any order
  among themselves; calls of the LAST message may still be open (the state
  between pushing a response and appending its execution);
* call ids are unique in the context; arguments are JSON objects;
* no empty assistant message (no call and only whitespace text).

Ids: ``seq`` counts every call of a turn (epoch) across tool rounds and
restarts; :meth:`Context.next_tool_call_ids` mints from the calls already in
the context (a high-water mark that survives removals), so the idempotency
key (session, epoch, call id) never maps two calls to one result. Two
responses finished against the same context before either is pushed get the
same ids, and :meth:`validate` rejects the second push.

The context never awaits and is never shared across threads; the call actor
owns it and mutates it only when no round task is alive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from brisvox.agent.conversation import tool_errors as te

_CALL_ID = re.compile(r"t(0|[1-9][0-9]{0,17})\.(0|[1-9][0-9]{0,17})\Z")


def make_call_id(epoch: int, seq: int) -> str:
    """The internal id of call ``seq`` of turn ``epoch``: ``t<epoch>.<seq>``."""
    return f"t{epoch}.{seq}"


def parse_call_id(call_id: str) -> tuple[int, int] | None:
    """``(epoch, seq)`` of an internal id, or None for any other text."""
    m = _CALL_ID.match(call_id)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2))


# --- messages --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of an assistant message.

    ``id`` is the internal id (``t<epoch>.<seq>``); ``provider_id`` the id the
    provider sent (None if none); ``arguments`` a JSON object (dict);
    ``provider_data`` the call's opaque round-trip value (None if none).
    """

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    provider_id: str | None = None
    provider_data: Any = None


@dataclass(frozen=True, slots=True)
class SystemMessage:
    content: str
    role: str = field(default="system", init=False)


@dataclass(frozen=True, slots=True)
class UserMessage:
    content: str
    role: str = field(default="user", init=False)


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    provider_data: Any = None
    role: str = field(default="assistant", init=False)

    def is_empty(self) -> bool:
        """No call and no text but whitespace: not allowed in a valid context."""
        return not self.tool_calls and not self.text.strip()


@dataclass(frozen=True, slots=True)
class ToolMessage:
    call_id: str
    content: str
    is_error: bool = False
    role: str = field(default="tool", init=False)


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage


class ContextError(ValueError):
    """A context that breaks an ordering rule. ``kind`` is a stable label, ``index``
    the offending message (or -1)."""

    def __init__(self, kind: str, index: int, detail: str) -> None:
        super().__init__(f"{kind} at message {index}: {detail}")
        self.kind = kind
        self.index = index
        self.detail = detail


# --- late notes ------------------------------------------------------------------------


def late_tool_result_text(call_id: str, tool: str, content: str, is_error: bool) -> str:
    """The text of a late SideEffect result note (same text for interruptions,
    timeouts and dropped executions)."""
    what = "failed or has an unknown outcome" if is_error else "finished"
    return (
        f"Late tool result: the call {call_id} ({te.bound(tool, te.MAX_TOOL_BYTES)}) was answered "
        f"as interrupted or timed out, but it kept running and has now {what}. "
        f"Do not repeat it. Its result: {te.clean_text(content)}"
    )


def late_tool_result_note(call_id: str, tool: str, content: str, is_error: bool) -> SystemMessage:
    return SystemMessage(late_tool_result_text(call_id, tool, content, is_error))


INTERRUPTED_DETAIL = (
    "the call was interrupted before its result reached you; if it changes something, "
    "a note with its outcome follows"
)


# --- token estimate --------------------------------------------------------------------


class TokenEstimator(Protocol):
    def message_tokens(self, msg: Message) -> int: ...


@dataclass(frozen=True, slots=True)
class CharsPerToken:
    """Default estimate: UTF-8 bytes / ``bytes_per_token`` + ``per_message`` per message.

    Counted bytes: the text or content, and for each tool call its name, its
    arguments as JSON and its provider id. Provider data is not counted.
    """

    bytes_per_token: int = 4
    per_message: int = 4

    def message_tokens(self, msg: Message) -> int:
        return _message_bytes(msg) // self.bytes_per_token + self.per_message


def _message_bytes(msg: Message) -> int:
    if isinstance(msg, AssistantMessage):
        n = len(msg.text.encode("utf-8", "replace"))
        for c in msg.tool_calls:
            n += len(c.name) + len(c.id) + len(_dumps_args(c.arguments))
        return n
    if isinstance(msg, ToolMessage):
        return len(msg.content.encode("utf-8", "replace")) + len(msg.call_id)
    return len(msg.content.encode("utf-8", "replace"))


def _dumps_args(args: Any) -> bytes:
    try:
        return orjson.dumps(args)
    except (TypeError, orjson.JSONEncodeError):
        return b"{}"


# --- the context -----------------------------------------------------------------------


class Context:
    """An ordered list of messages with the seed's ordering rules.

    Mutate it only through its methods: the call-id high-water marks follow
    every push, replace and removal.
    """

    __slots__ = ("_messages", "_seq_hw")

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._messages: list[Message] = []
        self._seq_hw: dict[int, int] = {}
        for m in messages:
            self.push(m)

    # -- access
    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, index: int) -> Message:
        return self._messages[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._messages)

    @property
    def messages(self) -> tuple[Message, ...]:
        return tuple(self._messages)

    def copy(self) -> Context:
        """An independent copy with the same call-id high-water marks (ids minted from
        the copy are the ids the original would mint)."""
        c = Context()
        c._messages = list(self._messages)
        c._seq_hw = dict(self._seq_hw)
        return c

    # -- mutation
    def push(self, msg: Message) -> None:
        """Append ``msg`` (not validated: call :meth:`validate`)."""
        self._note_ids(msg)
        self._messages.append(msg)

    def extend(self, msgs: Iterable[Message]) -> None:
        for m in msgs:
            self.push(m)

    def insert(self, index: int, msg: Message) -> None:
        self._note_ids(msg)
        self._messages.insert(index, msg)

    def replace(self, index: int, msg: Message) -> None:
        self._note_ids(msg)
        self._messages[index] = msg

    def remove(self, index: int) -> Message:
        """Remove and return message ``index``; its call ids are never minted again."""
        return self._messages.pop(index)

    def truncate_to(self, length: int) -> None:
        """Drop every message from ``length`` on."""
        del self._messages[length:]

    def _note_ids(self, msg: Message) -> None:
        if isinstance(msg, AssistantMessage):
            for c in msg.tool_calls:
                parsed = parse_call_id(c.id)
                if parsed is not None:
                    ep, seq = parsed
                    if seq + 1 > self._seq_hw.get(ep, 0):
                        self._seq_hw[ep] = seq + 1

    # -- ids
    def next_tool_call_id(self, epoch: int) -> str:
        """The id the next call of turn ``epoch`` gets (nothing is reserved)."""
        return make_call_id(epoch, self._seq_hw.get(epoch, 0))

    def next_tool_call_ids(self, epoch: int, n: int) -> list[str]:
        """Ids for ``n`` new calls of turn ``epoch``, in order (nothing is reserved)."""
        base = self._seq_hw.get(epoch, 0)
        return [make_call_id(epoch, base + i) for i in range(n)]

    # -- rules
    def validate(self) -> None:
        """Raise :class:`ContextError` when an ordering rule is broken."""
        seen: set[str] = set()
        open_calls: dict[str, int] = {}
        for i, msg in enumerate(self._messages):
            if isinstance(msg, ToolMessage):
                if msg.call_id not in open_calls:
                    kind = "answered_twice" if msg.call_id in seen else "orphan_result"
                    raise ContextError(kind, i, f"result for {msg.call_id!r} answers no open call")
                del open_calls[msg.call_id]
                continue
            if open_calls:
                first = next(iter(open_calls))
                raise ContextError(
                    "unanswered_call", i, f"call {first!r} has no result before this message"
                )
            if isinstance(msg, AssistantMessage):
                if msg.is_empty():
                    raise ContextError("empty_assistant", i, "assistant message without text or calls")
                for c in msg.tool_calls:
                    if not c.id:
                        raise ContextError("missing_call_id", i, "a tool call without an id")
                    if not c.name:
                        raise ContextError("missing_tool_name", i, f"call {c.id!r} has no name")
                    if not isinstance(c.arguments, dict):
                        raise ContextError("arguments_not_object", i, f"call {c.id!r}")
                    if c.id in seen:
                        raise ContextError("duplicate_call_id", i, f"call id {c.id!r} is used twice")
                    seen.add(c.id)
                    open_calls[c.id] = i
            elif not isinstance(msg, SystemMessage | UserMessage):
                raise ContextError("unknown_message", i, type(msg).__name__)

    def is_valid(self) -> bool:
        try:
            self.validate()
        except ContextError:
            return False
        return True

    def open_tool_calls(self) -> list[ToolCall]:
        """The calls of the last assistant message with calls that have no result
        yet, in issue order (empty when the context is past them)."""
        answered: set[str] = set()
        for i in range(len(self._messages) - 1, -1, -1):
            msg = self._messages[i]
            if isinstance(msg, ToolMessage):
                answered.add(msg.call_id)
                continue
            if isinstance(msg, AssistantMessage) and msg.tool_calls:
                return [c for c in msg.tool_calls if c.id not in answered]
            return []
        return []

    def has_open_tool_calls(self) -> bool:
        return bool(self.open_tool_calls())

    def interrupt_pending_tool_calls(self) -> int:
        """Close every open call with an ``interrupted`` error result, in issue
        order, so the next turn is valid. Returns how many were closed."""
        pending = self.open_tool_calls()
        for c in pending:
            self.push(ToolMessage(c.id, te.error_body(te.INTERRUPTED, c.name, INTERRUPTED_DETAIL), True))
        return len(pending)

    def push_late_tool_result(self, call_id: str, tool: str, content: str, is_error: bool = False) -> None:
        """Report a SideEffect result that arrived after its call was answered, as a
        system note. Raises :class:`ContextError` while a call is open (a note must
        never separate a call from its result)."""
        if self.has_open_tool_calls():
            raise ContextError("call_open", len(self._messages), "close the open calls first")
        self.push(late_tool_result_note(call_id, tool, content, is_error))

    def tool_call(self, call_id: str) -> ToolCall | None:
        """The call with ``call_id`` (latest first), or None."""
        for msg in reversed(self._messages):
            if isinstance(msg, AssistantMessage):
                for c in msg.tool_calls:
                    if c.id == call_id:
                        return c
        return None

    # -- size
    def estimate_tokens(self, estimator: TokenEstimator | None = None) -> int:
        est = estimator or DEFAULT_ESTIMATOR
        return sum(est.message_tokens(m) for m in self._messages)

    # -- JSON form
    def to_json(self) -> list[dict[str, Any]]:
        return [message_to_json(m) for m in self._messages]

    def dumps(self) -> bytes:
        return orjson.dumps(self.to_json())

    @classmethod
    def from_json(cls, rows: Sequence[Any]) -> Context:
        """Build a context from its JSON form (raises ContextError on a bad row).
        The result is not validated: call :meth:`validate`."""
        if not isinstance(rows, list | tuple):
            raise ContextError("bad_json", -1, "the context is a JSON array of messages")
        return cls(message_from_json(r, i) for i, r in enumerate(rows))

    @classmethod
    def loads(cls, data: bytes | str) -> Context:
        try:
            rows = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ContextError("bad_json", -1, str(e)) from None
        return cls.from_json(rows)


DEFAULT_ESTIMATOR = CharsPerToken()


def message_to_json(m: Message) -> dict[str, Any]:
    """Serde form: ``{"role": ..., ...}``; absent optional fields are omitted."""
    if isinstance(m, AssistantMessage):
        out: dict[str, Any] = {"role": "assistant", "text": m.text}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                row: dict[str, Any] = {"id": c.id, "name": c.name, "arguments": c.arguments}
                if c.provider_id is not None:
                    row["provider_id"] = c.provider_id
                if c.provider_data is not None:
                    row["provider_data"] = c.provider_data
                calls.append(row)
            out["tool_calls"] = calls
        if m.provider_data is not None:
            out["provider_data"] = m.provider_data
        return out
    if isinstance(m, ToolMessage):
        return {"role": "tool", "call_id": m.call_id, "content": m.content, "is_error": m.is_error}
    return {"role": m.role, "content": m.content}


def _str(row: dict[str, Any], key: str, i: int, default: str | None = None) -> str:
    v = row.get(key, default)
    if not isinstance(v, str):
        raise ContextError("bad_json", i, f"{key!r} must be a string")
    return v


def message_from_json(row: Any, i: int = -1) -> Message:
    if not isinstance(row, dict):
        raise ContextError("bad_json", i, "a message is a JSON object")
    role = row.get("role")
    if role == "system":
        return SystemMessage(_str(row, "content", i))
    if role == "user":
        return UserMessage(_str(row, "content", i))
    if role == "tool":
        is_error = row.get("is_error", False)
        if not isinstance(is_error, bool):
            raise ContextError("bad_json", i, "'is_error' must be a boolean")
        return ToolMessage(_str(row, "call_id", i), _str(row, "content", i), is_error)
    if role == "assistant":
        calls_raw = row.get("tool_calls", [])
        if not isinstance(calls_raw, list):
            raise ContextError("bad_json", i, "'tool_calls' must be an array")
        calls = []
        for c in calls_raw:
            if not isinstance(c, dict):
                raise ContextError("bad_json", i, "a tool call is a JSON object")
            args = c.get("arguments", {})
            if not isinstance(args, dict):
                raise ContextError("arguments_not_object", i, "arguments must be a JSON object")
            pid = c.get("provider_id")
            if pid is not None and not isinstance(pid, str):
                raise ContextError("bad_json", i, "'provider_id' must be a string")
            calls.append(ToolCall(_str(c, "id", i), _str(c, "name", i), args, pid, c.get("provider_data")))
        return AssistantMessage(_str(row, "text", i, ""), tuple(calls), row.get("provider_data"))
    raise ContextError("bad_json", i, f"unknown role {role!r}")
