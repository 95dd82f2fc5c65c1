"""Streaming assembly of one LLM response into text and tool calls.

Owns the provider-neutral :class:`ResponseAssembler`: adapters feed it text,
response provider data and tool-call fragments (keyed by ``index``);
:meth:`ResponseAssembler.finish` parses once and returns a :class:`Response`.

Invariants:

* Nothing is parsed while streaming; JSON may split anywhere.
* ``id``/``name`` of a call: the first non-empty value wins; a different later
  non-empty value is an :class:`AssembleError` and the WHOLE delta is not
  applied. Empty strings count as absent.
* Buffered bytes never exceed ``max_bytes`` (default 256 KiB): text,
  arguments, ids and names at their UTF-8 size, provider data at its
  serialized size, and 64 bytes per new call slot. A delta over the cap is an
  error and is not applied.
* At most ``max_calls`` (default 32) call slots; a fragment that would open one
  more is ``too_many_calls`` and is not applied; open slots still accept.
* A call with no name, invalid JSON or a non-object becomes an
  :class:`InvalidCall` (answered with :meth:`InvalidCall.error_result`);
  valid siblings still assemble.
* ``cancel()`` and ``finish()`` consume the assembler: a cancelled response
  yields nothing, and a second use raises :class:`RuntimeError`.
* Ids are minted at ``finish`` with :meth:`Context.next_tool_call_ids`, in
  index order; push the response's assistant message before finishing the
  next response of the same epoch.

Cost: ``finish`` is linear in the buffered bytes (orjson); run it off the
event loop for responses near the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import AssistantMessage, Context, ToolCall, ToolMessage

DEFAULT_MAX_BYTES = 256 * 1024
DEFAULT_MAX_CALLS = 32
SLOT_COST = 64
UNKNOWN_TOOL_NAME = "unknown_tool"


class AssembleError(ValueError):
    """A delta that was refused (and not applied). ``kind``: ``conflicting_id``,
    ``conflicting_name``, ``conflicting_call_provider_data``,
    ``conflicting_response_provider_data``, ``too_large``, ``too_many_calls``,
    ``bad_index``, ``bad_provider_data``, ``bad_fragment``."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class CallError:
    """Why a call could not be assembled: ``missing_name``, ``bad_json`` or ``not_object``."""

    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class InvalidCall:
    """A call the assembler could not parse; it still has an id and is answered."""

    id: str
    name: str | None
    raw: str
    error: CallError
    provider_id: str | None = None
    provider_data: Any = None

    def error_result(self) -> ToolMessage:
        body = te.error_body(te.INVALID_TOOL_CALL, self.name or UNKNOWN_TOOL_NAME, self.error.detail)
        return ToolMessage(self.id, body, True)

    def recorded_call(self) -> ToolCall:
        """How the call is recorded in the assistant message: its name (or
        ``unknown_tool``) with ``{}`` arguments, provider data verbatim."""
        return ToolCall(self.id, self.name or UNKNOWN_TOOL_NAME, {}, self.provider_id, self.provider_data)


Assembled = ToolCall | InvalidCall


@dataclass(frozen=True, slots=True)
class Response:
    """A finished response: text, calls in index order, response provider data."""

    text: str
    calls: tuple[Assembled, ...]
    provider_data: Any = None

    def tool_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]

    def invalid_calls(self) -> list[InvalidCall]:
        return [c for c in self.calls if isinstance(c, InvalidCall)]

    def assistant_message(self) -> AssistantMessage | None:
        """The assistant message for the context, or None when there is no text
        and no call (provider data alone does not count)."""
        if not self.calls and not self.text.strip():
            return None
        calls = tuple(c if isinstance(c, ToolCall) else c.recorded_call() for c in self.calls)
        return AssistantMessage(self.text, calls, self.provider_data)


class _Slot:
    __slots__ = ("id", "name", "parts", "provider_data")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.parts: list[str] = []
        self.provider_data: Any = None


def _nbytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "replace"))


def _json_size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError) as e:
        raise AssembleError("bad_provider_data", str(e)) from None


class ResponseAssembler:
    """Buffers one response's deltas; parses once at :meth:`finish`."""

    __slots__ = ("max_bytes", "max_calls", "_text", "_slots", "_bytes", "_provider_data", "_done")

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_calls: int = DEFAULT_MAX_CALLS) -> None:
        self.max_bytes = max_bytes
        self.max_calls = max_calls
        self._text: list[str] = []
        self._slots: dict[int, _Slot] = {}
        self._bytes = 0
        self._provider_data: Any = None
        self._done = False

    @classmethod
    def with_max_bytes(cls, max_bytes: int) -> ResponseAssembler:
        return cls(max_bytes, DEFAULT_MAX_CALLS)

    @classmethod
    def with_limits(cls, max_bytes: int, max_calls: int) -> ResponseAssembler:
        return cls(max_bytes, max_calls)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def _live(self) -> None:
        if self._done:
            raise RuntimeError("the assembler was finished or cancelled")

    def _charge(self, n: int) -> None:
        if self._bytes + n > self.max_bytes:
            raise AssembleError("too_large", f"{self._bytes + n} bytes over the cap of {self.max_bytes}")

    # -- feeding
    def push(self, delta: Any) -> None:
        """Feed a delta object: one with ``index`` is a tool-call fragment, one with
        ``value`` response provider data, one with ``text`` text (the provider
        layer's TextDelta / ToolCallDelta / ProviderData fit)."""
        if hasattr(delta, "index"):
            self.push_tool_call(
                delta.index,
                getattr(delta, "id", "") or "",
                getattr(delta, "name", "") or "",
                getattr(delta, "arguments", "") or "",
                getattr(delta, "provider_data", None),
            )
        elif hasattr(delta, "value"):
            self.push_provider_data(delta.value)
        elif hasattr(delta, "text"):
            self.push_text(delta.text)
        else:
            raise AssembleError("bad_fragment", type(delta).__name__)

    def push_text(self, text: str) -> None:
        self._live()
        if not text:
            return
        n = _nbytes(text)
        self._charge(n)
        self._text.append(text)
        self._bytes += n

    def push_provider_data(self, value: Any) -> None:
        """Response provider data, sent whole (first value wins; a different later
        value is refused)."""
        self._live()
        if value is None:
            return
        if self._provider_data is not None:
            if self._provider_data != value:
                raise AssembleError("conflicting_response_provider_data")
            return
        n = _json_size(value)
        self._charge(n)
        self._provider_data = value
        self._bytes += n

    def push_tool_call(
        self,
        index: int,
        id: str = "",  # noqa: A002 - the wire name
        name: str = "",
        arguments: str = "",
        provider_data: Any = None,
    ) -> None:
        self._live()
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise AssembleError("bad_index", repr(index)[:32])
        for field_name, v in (("id", id), ("name", name), ("arguments", arguments)):
            if not isinstance(v, str):
                raise AssembleError("bad_fragment", f"{field_name} must be text")
        slot = self._slots.get(index)
        cost = 0
        if slot is None:
            if len(self._slots) >= self.max_calls:
                raise AssembleError("too_many_calls", f"more than {self.max_calls} calls in one response")
            cost += SLOT_COST
        if id and slot is not None and slot.id and slot.id != id:
            raise AssembleError("conflicting_id", f"call {index}")
        if name and slot is not None and slot.name and slot.name != name:
            raise AssembleError("conflicting_name", f"call {index}")
        new_pd = False
        if provider_data is not None:
            if slot is not None and slot.provider_data is not None:
                if slot.provider_data != provider_data:
                    raise AssembleError("conflicting_call_provider_data", f"call {index}")
            else:
                new_pd = True
                cost += _json_size(provider_data)
        set_id = bool(id) and (slot is None or not slot.id)
        set_name = bool(name) and (slot is None or not slot.name)
        if set_id:
            cost += _nbytes(id)
        if set_name:
            cost += _nbytes(name)
        if arguments:
            cost += _nbytes(arguments)
        self._charge(cost)
        # Everything checked: apply.
        if slot is None:
            slot = self._slots[index] = _Slot()
        if set_id:
            slot.id = id
        if set_name:
            slot.name = name
        if new_pd:
            slot.provider_data = provider_data
        if arguments:
            slot.parts.append(arguments)
        self._bytes += cost

    # -- ending
    def cancel(self) -> None:
        """Drop the response: nothing is yielded, the assembler cannot be used again."""
        self._done = True
        self._text.clear()
        self._slots.clear()

    def finish(self, epoch: int, ctx: Context) -> Response:
        """Parse the buffered calls once and mint their ids (index order)."""
        self._live()
        self._done = True
        order = sorted(self._slots)
        ids = ctx.next_tool_call_ids(epoch, len(order))
        calls: list[Assembled] = []
        for cid, index in zip(ids, order, strict=True):
            calls.append(_parse_slot(cid, self._slots[index]))
        text = "".join(self._text)
        return Response(text, tuple(calls), self._provider_data)


def _parse_slot(cid: str, slot: _Slot) -> Assembled:
    raw = "".join(slot.parts)
    pid = slot.id or None
    name = slot.name or None
    if name is None:
        return InvalidCall(cid, None, raw, CallError("missing_name", "the tool call has no name"), pid, slot.provider_data)
    if not raw.strip():
        return ToolCall(cid, name, {}, pid, slot.provider_data)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        err = CallError("bad_json", f"the arguments are not valid JSON ({e})")
        return InvalidCall(cid, name, raw, err, pid, slot.provider_data)
    if not isinstance(value, dict):
        kind = type(value).__name__
        err = CallError("not_object", f"the arguments must be a JSON object, not {_json_kind(kind)}")
        return InvalidCall(cid, name, raw, err, pid, slot.provider_data)
    return ToolCall(cid, name, value, pid, slot.provider_data)


def _json_kind(py: str) -> str:
    return {"list": "an array", "str": "a string", "int": "a number", "float": "a number",
            "bool": "a boolean", "NoneType": "null"}.get(py, py)
