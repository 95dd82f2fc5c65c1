"""JSON Schema from Python type hints, and arguments back into the hinted types.

Supported: ``str``, ``int``, ``float``, ``bool``, ``list[X]``, ``tuple[X, ...]``,
``dict[str, X]``, ``Literal[...]``, ``Optional[X]`` / ``X | None``, an ``Enum``, a
``TypedDict`` or a dataclass (an object), ``Any`` (no constraint), and
``Annotated[X, ...]`` whose string metadata is the description and whose dict metadata is
merged into the schema (``Annotated[int, {"minimum": 1}]``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import operator
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

_NONE = type(None)
_SCALARS: dict[type, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}


class SchemaError(TypeError):
    """A type hint this module cannot turn into a JSON Schema."""


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _json_type(value: Any) -> str | None:
    for py, name in _SCALARS.items():
        if type(value) is py:
            return name
    return "null" if value is None else None


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    t = out.get("type")
    if isinstance(t, str):
        out["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        out["type"] = [*t, "null"]
    elif t is None and out:
        return {"anyOf": [out, {"type": "null"}]}
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    return out


def _split_optional(tp: Any) -> tuple[Any, bool]:
    """(X, True) for Optional[X] / X | None; (tp, False) otherwise."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not _NONE]
        if len(args) < len(get_args(tp)):
            inner: Any = functools.reduce(operator.or_, args)
            return inner, True
    return tp, False


def schema_of(tp: Any) -> dict[str, Any]:
    """The JSON Schema of one type hint."""
    origin = get_origin(tp)
    if origin is typing.Annotated:
        base, *meta = get_args(tp)
        out = schema_of(base)
        for m in meta:
            if isinstance(m, str):
                out["description"] = m
            elif isinstance(m, Mapping):
                out.update(m)
        return out
    if tp is Any or tp is inspect.Parameter.empty or tp is object:
        return {}
    if tp is _NONE or tp is None:
        return {"type": "null"}
    inner, optional = _split_optional(tp)
    if optional:
        return _nullable(schema_of(inner))
    if origin in (Union, types.UnionType):
        return {"anyOf": [schema_of(a) for a in get_args(tp)]}
    if origin is Literal:
        values = list(get_args(tp))
        kinds = {_json_type(v) for v in values}
        out = {"enum": values}
        if len(kinds) == 1 and None not in kinds:
            out = {"type": kinds.pop(), "enum": values}
        return out
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        kinds = {_json_type(v) for v in values}
        if None in kinds:
            raise SchemaError(f"enum {tp.__name__}: values must be str, int, float or bool")
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin in (list, Sequence, set, frozenset) or tp in (list, set, frozenset):
        args = get_args(tp)
        out = {"type": "array"}
        if args:
            out["items"] = schema_of(args[0])
        if origin in (set, frozenset) or tp in (set, frozenset):
            out["uniqueItems"] = True
        return out
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": schema_of(args[0])}
        return {"type": "array", "prefixItems": [schema_of(a) for a in args],
                "minItems": len(args), "maxItems": len(args)}
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        args = get_args(tp)
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = schema_of(args[1])
        return out
    if _is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        keys = sorted(getattr(tp, "__required_keys__", ()))
        return _object({k: schema_of(_strip_required(v)) for k, v in hints.items()}, keys,
                       inspect.getdoc(tp) if tp.__doc__ else None)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp, include_extras=True)
        props: dict[str, Any] = {}
        required: list[str] = []
        for f in dataclasses.fields(tp):
            hint = hints.get(f.name, Any)
            props[f.name] = schema_of(hint)
            no_default = (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            if no_default and not _split_optional(hint)[1]:
                required.append(f.name)
        doc = tp.__doc__ if tp.__doc__ and not tp.__doc__.startswith(tp.__name__ + "(") else None
        return _object(props, required, inspect.cleandoc(doc) if doc else None)
    raise SchemaError(f"no JSON Schema for the type hint {tp!r}")


def _strip_required(tp: Any) -> Any:
    if get_origin(tp) in (typing.Required, typing.NotRequired):
        return get_args(tp)[0]
    return tp


def _object(props: dict[str, Any], required: list[str], description: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    if description:
        out["description"] = description
    return out


def parameters_schema(fn: Callable[..., Any], skip: int = 1) -> tuple[dict[str, Any], bool, Any]:
    """(schema, whole, hint) of a tool function's arguments after the first ``skip``.

    ``whole`` is True when the function takes the arguments as ONE value (``args: dict``,
    a TypedDict or a dataclass named ``args``); ``hint`` is that value's type hint.
    """
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[skip:]
    hints = typing.get_type_hints(fn, include_extras=True)
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
    if len(named) == 1 and len(params) == 1:
        p = named[0]
        hint = hints.get(p.name, Any)
        base = get_args(hint)[0] if get_origin(hint) is typing.Annotated else hint
        plain = base in (dict, Mapping) or get_origin(base) in (dict, Mapping)
        if plain or _is_typeddict(base) or (p.name == "args" and (
                base is Any or (dataclasses.is_dataclass(base) and isinstance(base, type)))):
            if plain or base is Any:
                return {"type": "object", "properties": {}}, True, base
            return schema_of(base), True, base
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in named:
        hint = hints.get(p.name, Any)
        schema = schema_of(hint)
        if p.default is not p.empty:
            if _json_type(p.default) is not None and p.default is not None:
                schema.setdefault("default", p.default)
        elif not _split_optional(_unannotate(hint))[1]:
            required.append(p.name)
        props[p.name] = schema
    return _object(props, required, None), False, None


def _unannotate(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is typing.Annotated else tp


def coerce(value: Any, tp: Any) -> Any:
    """Arguments (already validated by brisvox) into the hinted types: dataclasses, enums."""
    tp = _unannotate(tp)
    inner, optional = _split_optional(tp)
    if optional:
        return None if value is None else coerce(value, inner)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and isinstance(value, Mapping):
        hints = typing.get_type_hints(tp, include_extras=True)
        names = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: coerce(v, hints.get(k, Any)) for k, v in value.items() if k in names})
    origin = get_origin(tp)
    if origin in (list, Sequence) and isinstance(value, list) and get_args(tp):
        return [coerce(v, get_args(tp)[0]) for v in value]
    return value


def argument_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    return typing.get_type_hints(fn, include_extras=True)
