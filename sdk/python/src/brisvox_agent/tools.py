"""Tool declarations (what ``session.accept`` carries) and the context a tool runs with."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._schema import argument_hints, coerce, parameters_schema

if TYPE_CHECKING:
    from .session import Session

Kind = Literal["read_only", "side_effect"]
KINDS: tuple[str, ...] = ("read_only", "side_effect")
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
MAX_TIMEOUT_MS = 30_000
ToolFn = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class CallInfo:
    """The call a session belongs to, from ``session.offer``."""

    call_id: str
    agent: str | None = None
    transport: str | None = None
    caller: str | None = None
    called: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_offer(cls, call: Mapping[str, Any], session: str) -> CallInfo:
        def text(k: str) -> str | None:
            v = call.get(k)
            return v if isinstance(v, str) else None

        params = call.get("params")
        return cls(call_id=text("call_id") or session, agent=text("agent"),
                   transport=text("transport"), caller=text("caller"), called=text("called"),
                   params=dict(params) if isinstance(params, Mapping) else {})


@dataclass
class ToolContext:
    """What a tool receives first: the call, the tool call's identity, cancellation, commands.

    ``call_id`` is the TOOL call's id in the conversation (``"t3.0"``); the phone call's
    id is ``call.call_id``. ``idempotency_key`` is stable across redeliveries of the same
    tool call: record it where the effect lives.
    """

    session: Session
    id: str
    tool: str
    call_id: str
    idempotency_key: str
    epoch: int
    deadline_ms: int | None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str | None = None

    @property
    def call(self) -> CallInfo:
        return self.session.call

    @property
    def caller(self) -> str | None:
        return self.session.call.caller

    @property
    def called(self) -> str | None:
        return self.session.call.called

    @property
    def params(self) -> Mapping[str, Any]:
        return self.session.call.params

    @property
    def agent(self) -> str | None:
        return self.session.call.agent

    @property
    def transport(self) -> str | None:
        return self.session.call.transport


@dataclass(frozen=True)
class Tool:
    """One declared tool and the function that runs it."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: Kind
    fn: ToolFn
    timeout_ms: int = 5000
    filler_after_ms: int | None = None
    repeatable: bool = False
    confirm: bool = False
    offer: bool = True
    whole: bool = False  # the function takes the arguments as one value
    whole_hint: Any = None
    hints: Mapping[str, Any] = field(default_factory=dict)

    def declaration(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters,
                "kind": self.kind, "timeout_ms": self.timeout_ms,
                "filler_after_ms": self.filler_after_ms, "repeatable": self.repeatable,
                "confirm": self.confirm}

    async def invoke(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> Any:
        if self.whole:
            return await self.fn(ctx, coerce(dict(arguments), self.whole_hint))
        hints = self.hints
        return await self.fn(ctx, **{k: coerce(v, hints.get(k, Any)) for k, v in arguments.items()})


def make_tool(fn: ToolFn, *, name: str | None, description: str | None, kind: str,
              timeout_ms: int, filler_after_ms: int | None, repeatable: bool, confirm: bool,
              parameters: Mapping[str, Any] | None, offer: bool) -> Tool:
    """A Tool from a decorated function; raises ValueError/TypeError for a bad declaration."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"tool {getattr(fn, '__name__', fn)!r}: must be an `async def f(ctx, ...)`")
    tool_name = name or fn.__name__
    if not NAME_RE.match(tool_name):
        raise ValueError(f"tool name {tool_name!r}: 1 to 64 ASCII letters, digits, '_' or '-'")
    if kind not in KINDS:
        raise ValueError(f"tool {tool_name}: kind must be one of {KINDS}, not {kind!r}")
    if not isinstance(timeout_ms, int) or not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise ValueError(f"tool {tool_name}: timeout_ms must be 1..{MAX_TIMEOUT_MS}")
    if filler_after_ms is not None and (not isinstance(filler_after_ms, int)
                                        or not 0 <= filler_after_ms <= MAX_TIMEOUT_MS):
        raise ValueError(f"tool {tool_name}: filler_after_ms must be None or 0..{MAX_TIMEOUT_MS}")
    if kind == "read_only" and (confirm or repeatable):
        raise ValueError(f"tool {tool_name}: confirm and repeatable are for side_effect tools")
    if len(inspect.signature(fn).parameters) < 1:
        raise TypeError(f"tool {tool_name}: the first parameter is the context (`ctx`)")
    schema, whole, hint = parameters_schema(fn)
    if parameters is not None:
        if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
            raise ValueError(f"tool {tool_name}: parameters must be a JSON Schema of type object")
        schema = dict(parameters)
        if not whole:  # explicit schema and a `**args` or keyword signature: pass keywords
            sig = list(inspect.signature(fn).parameters.values())[1:]
            whole = len(sig) == 1 and sig[0].kind in (sig[0].POSITIONAL_OR_KEYWORD, sig[0].POSITIONAL_ONLY) \
                and sig[0].name == "args"
    doc = description if description is not None else (inspect.getdoc(fn) or "")
    if not doc.strip():
        raise ValueError(f"tool {tool_name}: give a description (or a docstring)")
    return Tool(name=tool_name, description=doc.strip(), parameters=schema, kind=kind,  # type: ignore[arg-type]
                fn=fn, timeout_ms=timeout_ms, filler_after_ms=filler_after_ms,
                repeatable=repeatable, confirm=confirm, offer=offer, whole=whole, whole_hint=hint,
                hints=argument_hints(fn))
