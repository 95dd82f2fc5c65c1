"""Tool specs, the per-call registry, and what a tool receives (docs/TOOLS.md).

Owns :class:`ToolSpec` / :class:`ToolKind`, :class:`ToolRegistry` (with its
:class:`RegistryError` rejections), the tool calling convention (an async
callable ``(args, ctx) -> dict | str`` that may raise :class:`ToolError`),
:class:`ToolContext` (with the call's :class:`~.call_info.CallInfo`),
:class:`IdempotencyKey` and :class:`CancelToken` (a turn's cancellation).

Invariants:

* A registered tool has a valid name (1-64 of ``[A-Za-z0-9_-]``), a positive
  timeout, a compiled offline schema with ``"type": "object"``; ``confirm``
  and ``repeatable`` only on SideEffect tools. A rejected tool is not added.
* ``specs()`` is in name order (deterministic LLM requests).
* Registering a tool with ``confirm=True`` adds the built-in
  ``confirm_pending`` tool; the name is reserved.
* ``IdempotencyKey.digest()`` is FNV-1a 64 over a fixed encoding of
  (session, epoch, call id): stable across processes and releases.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from brisvox.agent.tool_engine.call_info import NO_CALL, CallInfo
from brisvox.agent.tool_engine.schema import CompiledSchema, SchemaCompileError

DEFAULT_TOOL_TIMEOUT = 5.0
DEFAULT_FILLER_AFTER = 0.7
CONFIRM_TOOL_NAME = "confirm_pending"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


class ToolKind(enum.Enum):
    READ_ONLY = "read_only"
    SIDE_EFFECT = "side_effect"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool, and how the engine runs it.

    ``timeout``: seconds the caller waits (a SideEffect call keeps running past
    it). ``filler_after``: the tool's filler delay (None opts out of fillers).
    ``confirm``: the call is held until the user confirms (SideEffect only).
    ``repeatable``: an identical call may repeat in later responses of a turn
    (SideEffect only; ReadOnly tools may always repeat).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    kind: ToolKind
    timeout: float = DEFAULT_TOOL_TIMEOUT
    filler_after: float | None = DEFAULT_FILLER_AFTER
    confirm: bool = False
    repeatable: bool = False

    def with_timeout(self, timeout: float) -> ToolSpec:
        return replace(self, timeout=timeout)

    def with_filler_after(self, filler_after: float | None) -> ToolSpec:
        return replace(self, filler_after=filler_after)

    def with_confirm(self, confirm: bool = True) -> ToolSpec:
        return replace(self, confirm=confirm)

    def with_repeatable(self, repeatable: bool = True) -> ToolSpec:
        return replace(self, repeatable=repeatable)

    @property
    def side_effect(self) -> bool:
        return self.kind is ToolKind.SIDE_EFFECT


class ToolError(Exception):
    """A tool's own failure; ``message`` is shown to the model (tool_failed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- cancellation ----------------------------------------------------------------------


class CancelToken:
    """A turn's cancellation: cancelled once, observed by callbacks or ``wait()``.

    ``child()`` makes a token cancelled with its parent (a call's token ->
    an epoch's token). Callbacks run synchronously inside :meth:`cancel`;
    they must not raise.
    """

    __slots__ = ("_cancelled", "_callbacks", "_next", "_unlink")

    def __init__(self) -> None:
        self._cancelled = False
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._unlink: Callable[[], None] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def is_cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        callbacks = list(self._callbacks.values())
        self._callbacks.clear()
        if self._unlink is not None:
            self._unlink()
            self._unlink = None
        for cb in callbacks:
            cb()

    def add_callback(self, cb: Callable[[], None]) -> int:
        """Run ``cb`` at cancellation (at once if already cancelled). Returns a handle."""
        if self._cancelled:
            cb()
            return -1
        self._next += 1
        self._callbacks[self._next] = cb
        return self._next

    def remove_callback(self, handle: int) -> None:
        self._callbacks.pop(handle, None)

    def child(self) -> CancelToken:
        c = CancelToken()
        if self._cancelled:
            c._cancelled = True
            return c
        h = self.add_callback(c.cancel)
        c._unlink = lambda: self.remove_callback(h)
        return c

    async def wait(self) -> None:
        if self._cancelled:
            return
        import asyncio

        fut = asyncio.get_running_loop().create_future()

        def _wake() -> None:
            if not fut.done():
                fut.set_result(None)

        h = self.add_callback(_wake)
        try:
            await fut
        finally:
            self.remove_callback(h)


# --- per-call context --------------------------------------------------------------------

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """(session, epoch, call id): the key of one SideEffect execution."""

    session: str
    epoch: int
    call: str

    def encoded(self) -> bytes:
        """``len(session):session|epoch|call`` in UTF-8 (unambiguous)."""
        s = self.session.encode("utf-8", "replace")
        return b"%d:%s|%d|%s" % (len(s), s, self.epoch, self.call.encode("utf-8", "replace"))

    def digest(self) -> int:
        """Stable FNV-1a 64-bit value of the key, for logs and provider headers.
        Distinct keys may share a digest: key your own store on the whole key."""
        return fnv1a64(self.encoded())

    def hex(self) -> str:
        return f"{self.digest():016x}"


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool receives next to its arguments. ``call`` is the id of this tool call
    (``t<epoch>.<seq>``); ``cancel`` is the turn's token (a SideEffect tool usually
    ignores it: it runs to completion); ``call_info`` the phone call's metadata
    (caller, called, transport ids, parameters: :class:`CallInfo`, empty when unknown)."""

    session: str
    epoch: int
    call: str
    cancel: CancelToken = field(default_factory=CancelToken)
    tool: str = ""
    call_info: CallInfo = NO_CALL

    def idempotency_key(self) -> IdempotencyKey:
        return IdempotencyKey(self.session, self.epoch, self.call)


Tool = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]


# --- registry ---------------------------------------------------------------------------


class RegistryError(ValueError):
    """A rejected registration. ``kind``: ``invalid_name``, ``duplicate``,
    ``reserved_name``, ``zero_timeout``, ``invalid_filler_after``,
    ``confirm_needs_side_effect``, ``repeatable_needs_side_effect``,
    ``invalid_schema``."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    spec: ToolSpec
    tool: Tool
    schema: CompiledSchema


CONFIRM_SPEC = ToolSpec(
    name=CONFIRM_TOOL_NAME,
    description=(
        "Run an action the user has confirmed. Call it only when the user clearly agreed, "
        "in their reply to your question, to the action you described; pass the call_id "
        "the action's confirmation_required result gave you. Never call it on your own."
    ),
    parameters={
        "type": "object",
        "properties": {"call_id": {"type": "string", "minLength": 1, "maxLength": 64}},
        "required": ["call_id"],
        "additionalProperties": False,
    },
    kind=ToolKind.SIDE_EFFECT,
    filler_after=None,
)


async def _confirm_placeholder(args: dict[str, Any], ctx: ToolContext) -> Any:
    raise ToolError("confirm_pending is handled by the tool engine")


class ToolRegistry:
    """The tools one call may use. Register at setup; read-only afterwards."""

    __slots__ = ("_tools",)

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    def register(self, spec: ToolSpec, tool: Tool) -> None:
        """Add ``tool`` under ``spec`` or raise :class:`RegistryError` (nothing added)."""
        if not isinstance(spec.name, str) or not _NAME.match(spec.name):
            raise RegistryError("invalid_name", "1 to 64 ASCII letters, digits, '_' or '-'")
        if spec.name == CONFIRM_TOOL_NAME:
            raise RegistryError("reserved_name", CONFIRM_TOOL_NAME)
        if spec.name in self._tools:
            raise RegistryError("duplicate", spec.name)
        if not isinstance(spec.timeout, int | float) or not spec.timeout > 0 or math.isinf(spec.timeout):
            raise RegistryError("zero_timeout", spec.name)
        if spec.filler_after is not None and not (spec.filler_after >= 0 and math.isfinite(spec.filler_after)):
            raise RegistryError("invalid_filler_after", spec.name)
        if spec.kind is not ToolKind.SIDE_EFFECT:
            if spec.confirm:
                raise RegistryError("confirm_needs_side_effect", spec.name)
            if spec.repeatable:
                raise RegistryError("repeatable_needs_side_effect", spec.name)
        try:
            schema = CompiledSchema(spec.parameters)
        except SchemaCompileError as e:
            raise RegistryError("invalid_schema", str(e)) from None
        self._tools[spec.name] = RegisteredTool(spec, tool, schema)
        if spec.confirm:
            self._add_confirm_tool()

    def require_confirmation(self, name: str) -> None:
        """Turn the confirmation gate on for a registered SideEffect tool (an
        agent definition's ``confirm_tools``)."""
        entry = self._tools.get(name)
        if entry is None or name == CONFIRM_TOOL_NAME:
            raise RegistryError("invalid_name", f"no tool {name!r} to confirm")
        if entry.spec.kind is not ToolKind.SIDE_EFFECT:
            raise RegistryError("confirm_needs_side_effect", name)
        self._tools[name] = RegisteredTool(entry.spec.with_confirm(True), entry.tool, entry.schema)
        self._add_confirm_tool()

    def _add_confirm_tool(self) -> None:
        if CONFIRM_TOOL_NAME not in self._tools:
            self._tools[CONFIRM_TOOL_NAME] = RegisteredTool(
                CONFIRM_SPEC, _confirm_placeholder, CompiledSchema(CONFIRM_SPEC.parameters)
            )

    def get(self, name: str) -> RegisteredTool | None:
        return self._tools.get(name)

    def spec(self, name: str) -> ToolSpec | None:
        entry = self._tools.get(name)
        return entry.spec if entry else None

    def specs(self) -> list[ToolSpec]:
        return [self._tools[n].spec for n in sorted(self._tools)]

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def is_empty(self) -> bool:
        return not self._tools
