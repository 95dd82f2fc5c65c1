"""Typed, strict parsing of TOML tables into frozen dataclasses.

Owns the rules every config section follows, so each section parser is one
line (``return from_table(cls, table, where)``):

* every key of the table must be a field of the dataclass, else
  :class:`ConfigError` naming ``<where>.<key>`` ("unknown key");
* a missing key takes the field default; a field without a default is required;
* values are checked against the annotation: ``bool``, ``int``, ``float``
  (an integer is accepted), ``str``, ``Literal[...]``, ``list[T]`` /
  ``tuple[T, ...]`` (returned as a tuple, so the dataclass stays hashable and
  frozen), ``dict[str, T]``, ``X | None``, and a nested dataclass (a sub-table,
  parsed recursively with ``<where>.<key>``);
* bounds come from field metadata made with :func:`opt` (``min``, ``max``,
  ``choices``); ``bool`` is never accepted where a number is expected.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from brisvox.config.errors import ConfigError

T = TypeVar("T")


def opt(
    default: Any = dataclasses.MISSING,
    *,
    min: float | None = None,  # noqa: A002 - reads naturally at the call site
    max: float | None = None,  # noqa: A002
    choices: tuple[Any, ...] | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with validation metadata for :func:`from_table`."""
    meta = {"min": min, "max": max, "choices": choices}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def _convert(t: Any, value: Any, key: str) -> Any:
    if t is Any:
        return value
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(t)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ConfigError as e:
                errors.append(e.message)
        raise ConfigError(key, "; ".join(errors) or f"expected {_type_name(t)}")
    if origin is typing.Literal:
        allowed = typing.get_args(t)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise ConfigError(key, f"expected one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    if origin in (list, tuple) or t in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(key, f"expected an array, got {type(value).__name__}")
        args = typing.get_args(t)
        inner = args[0] if args else Any
        return tuple(_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or t is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {type(value).__name__}")
        args = typing.get_args(t)
        inner = args[1] if len(args) == 2 else Any
        return {str(k): _convert(inner, v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(t) and isinstance(t, type):
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {type(value).__name__}")
        return from_table(t, value, key)
    if t is bool:
        if type(value) is bool:
            return value
        raise ConfigError(key, f"expected true or false, got {value!r}")
    if t is int:
        if type(value) is int:
            return value
        raise ConfigError(key, f"expected an integer, got {value!r}")
    if t is float:
        if type(value) in (int, float):
            return float(value)
        raise ConfigError(key, f"expected a number, got {value!r}")
    if t is str:
        if type(value) is str:
            return value
        raise ConfigError(key, f"expected a string, got {value!r}")
    raise TypeError(f"{key}: unsupported config field type {t!r}")


def _check_bounds(f: dataclasses.Field[Any], value: Any, key: str) -> None:
    meta = f.metadata
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(key, f"expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if lo is not None and value < lo:
            raise ConfigError(key, f"must be >= {lo}, got {value!r}")
        if hi is not None and value > hi:
            raise ConfigError(key, f"must be <= {hi}, got {value!r}")


def from_table(cls: type[T], table: Mapping[str, Any] | None, where: str) -> T:
    """Build ``cls`` from a TOML table; raise :class:`ConfigError` naming the key."""
    table = dict(table or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(k for k in table if k not in fields)
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key (known keys of [{where}]: {known})")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(key, "required key is missing")
            continue
        value = _convert(hints[name], table[name], key)
        _check_bounds(f, value, key)
        kwargs[name] = value
    try:
        obj = cls(**kwargs)
    except ConfigError as e:  # __post_init__ cross-field checks
        raise ConfigError(e.key if e.key.startswith(where) else f"{where}.{e.key}", e.message) from None
    return obj
