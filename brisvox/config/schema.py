"""The one validator of every configuration table: pydantic v2 dataclasses, strict, closed.

Owns the rules every config section (``brisvoxd.toml``: daemon, worker, gateway and agent
sections) and every agent file (:mod:`brisvox.config.agent_file`) follows. A section is
declared once, as a class::

    @section
    class RestartPolicy:
        backoff_max_s: float = Field(30.0, ge=0.0, le=3600.0)

and parsed with ``from_table(RestartPolicy, table, "daemon.restart")``. The rules:

* Strict types, as TOML writes them (``nan`` and ``inf`` are refused): ``bool`` is never a number, an integer is a
  ``float`` but a float is never an ``int``, a string is never a number;
  arrays become tuples (the dataclass stays frozen), tables become nested sections.
* Closed: a key that is not a field is an error ("unknown key", naming the keys known there);
  a field without a default is required.
* Bounds and formats are pydantic constraints (``Field(ge=, le=, pattern=, max_length=)``,
  ``Literal``); cross-key checks live in the class (``__post_init__`` or a validator) and raise
  :class:`ConfigError` naming the key relative to the class, which :func:`from_table` prefixes
  with the enclosing keys.
* Every failure becomes one :class:`ConfigError` whose ``key`` is the dotted path
  (``websocket.routes[0].path``) and whose message reads the same whatever the rule
  ("expected an integer, got 'x'", "must be >= 1, got 0"); :func:`problems` returns all of
  them (agent files report every problem at once).

The table is validated in pydantic's JSON mode (``validate_json`` of the table's JSON text):
in Python mode a strict dataclass field accepts only an instance, never a table. TOML dates
and times are not configuration values anywhere and are refused before that.

Constructing a section in code (``SipConfig(port=5070)``) runs the same constraints, leniently
typed (a list becomes a tuple); user input only ever goes through :func:`from_table`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import typing_extensions
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass
from pydantic.dataclasses import is_pydantic_dataclass

from brisvox.config.errors import ConfigError

__all__ = ["Field", "ConfigError", "section", "from_table", "problems", "failures", "adapter", "json_text"]

T = TypeVar("T")

# extra keys forbidden everywhere; strictness is asked for per validation (see the module doc)
SECTION_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN and inf are no setting


@typing_extensions.dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, Field))
def section(cls: type[T]) -> type[T]:
    """Declare a config table: a frozen, slotted pydantic dataclass that forbids unknown keys."""
    return _pydantic_dataclass(frozen=True, slots=True, config=SECTION_CONFIG)(cls)  # type: ignore[return-value]


@functools.cache
def adapter(cls: Any) -> TypeAdapter[Any]:
    """The (cached) validator of a section class."""
    if not (isinstance(cls, type) and is_pydantic_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a config section (declare it with @section)")
    return TypeAdapter(cls)


def _dates(value: Any, key: str) -> Iterator[ConfigError]:
    if isinstance(value, (datetime.date, datetime.time)):
        yield ConfigError(key, f"a TOML date or time is not a configuration value, got {value}")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _dates(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _dates(v, f"{key}[{i}]")


def json_text(table: Mapping[str, Any]) -> str:
    """The table as JSON text for pydantic's JSON mode (a TOML date: ConfigError keyed within the table)."""
    for e in _dates(dict(table), ""):
        raise e
    return json.dumps(table, allow_nan=True)


def _join(where: str, key: str) -> str:
    if not key:
        return where
    if not where:
        return key.lstrip(".")
    return f"{where}{key}" if key.startswith("[") else f"{where}.{key}"


def _dotted(where: str, loc: Sequence[Any]) -> str:
    key = where
    for part in loc:
        key = _join(key, f"[{part}]" if isinstance(part, int) else str(part))
    return key


def _fields_at(cls: Any, loc: Sequence[Any]) -> list[str] | None:
    """Field names of the section reached by following ``loc`` from ``cls`` (None: not a section)."""
    t: Any = cls
    for part in loc:
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            hints = typing.get_type_hints(t)
            if part not in hints:
                return None
            t = hints[part]
        else:
            args = [a for a in typing.get_args(t) if a is not type(None) and a is not Ellipsis]
            t = args[-1] if args else None
        while typing.get_origin(t) is typing.Annotated:
            t = typing.get_args(t)[0]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if typing.get_origin(t) in (typing.Union, types.UnionType) and len(args) == 1:
            t = args[0]
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return [f.name for f in dataclasses.fields(t) if f.init]
    return None


def _kind(value: Any) -> str:
    return {dict: "table", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "nothing"}.get(type(value), type(value).__name__)


_EXPECTED = {
    "int_type": "expected an integer", "int_from_float": "expected an integer", "int_parsing": "expected an integer",
    "float_type": "expected a number", "float_parsing": "expected a number",
    "bool_type": "expected true or false", "bool_parsing": "expected true or false",
    "string_type": "expected a string", "finite_number": "expected a finite number",
    "tuple_type": "expected an array", "list_type": "expected an array", "set_type": "expected an array",
    "dict_type": "expected a table", "dataclass_type": "expected a table", "dataclass_exact_type": "expected a table",
    "model_type": "expected a table", "model_attributes_type": "expected a table",
}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "less_than_equal": ("<=", "le"),
           "greater_than": (">", "gt"), "less_than": ("<", "lt")}


def _key_parts(key: str) -> list[str | int]:
    """``"routes[0].path"`` -> ``["routes", 0, "path"]``."""
    return [int(i) if i else name for i, name in re.findall(r"\[(\d+)\]|([^.\[\]]+)", key)]


def _message(err: Mapping[str, Any], cls: Any, where: str) -> tuple[list[str | int], str]:
    """(key parts below ``where``, message) of one pydantic error."""
    loc = [p for p in err["loc"] if p != "[key]"]  # a dict key's own error: keyed by the key
    typ, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if typ == "value_error" and isinstance(ctx.get("error"), ConfigError):
        inner: ConfigError = ctx["error"]
        return [*loc, *_key_parts(inner.key)], inner.message
    if typ in ("extra_forbidden", "unexpected_keyword_argument"):
        known = _fields_at(cls, loc[:-1])
        table = _dotted(where, loc[:-1])
        here = f"of [{table}]" if table and not table.startswith("[") else "here"
        return loc, f"unknown key (known keys {here}: {', '.join(sorted(known or ()))})"
    if typ in ("missing", "missing_argument", "missing_keyword_only_argument"):
        return loc, "required key is missing"
    if typ in _EXPECTED:
        got = f"a {_kind(value)}" if isinstance(value, (dict, list)) else repr(value)
        return loc, f"{_EXPECTED[typ]}, got {got}"
    if typ == "literal_error":
        return loc, f"expected one of {ctx.get('expected', '?').replace(' or ', ', ')}, got {value!r}"
    if typ in _BOUNDS:
        op, name = _BOUNDS[typ]
        return loc, f"must be {op} {ctx.get(name)}, got {value!r}"
    if typ == "string_pattern_mismatch":
        return loc, f"does not match the pattern {ctx.get('pattern')}: {str(value)[:80]!r}"
    if typ in ("string_too_short", "too_short"):
        what = "characters" if typ.startswith("string") else "items"
        return loc, f"at least {ctx.get('min_length')} {what}"
    if typ in ("string_too_long", "too_long"):
        what = "characters" if typ.startswith("string") else "items"
        return loc, f"at most {ctx.get('max_length')} {what}"
    if typ in ("value_error", "assertion_error"):
        return loc, str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return loc, str(err["msg"])


def _validate(cls: Any, table: Mapping[str, Any] | None) -> Any:
    return adapter(cls).validate_json(json_text(dict(table or {})), strict=True)


def failures(cls: Any, table: Mapping[str, Any] | None, where: str = "") -> tuple[Any, list[tuple[list[str | int], str]]]:
    """Validate ``table`` as ``cls``: (the section or None, every failure as (key parts, message))."""
    try:
        return _validate(cls, table), []
    except ValidationError as e:
        out: list[tuple[list[str | int], str]] = []
        for err in e.errors(include_url=False):
            parts, msg = _message(err, cls, where)
            if (parts, msg) not in out:
                out.append((parts, msg))
        return None, out
    except ConfigError as e:  # a TOML date, found before pydantic runs
        return None, [(_key_parts(e.key), e.message)]


def problems(cls: Any, table: Mapping[str, Any] | None, where: str = "") -> tuple[Any, list[ConfigError]]:
    """Validate ``table`` as ``cls``: (the section or None, every problem as a ConfigError naming its key)."""
    obj, found = failures(cls, table, where)
    return obj, [ConfigError(_dotted(where, parts), msg) for parts, msg in found]


def from_table(cls: type[T], table: Mapping[str, Any] | None, where: str) -> T:
    """Build ``cls`` from a TOML table; raise :class:`ConfigError` naming the (first) key."""
    obj, errs = problems(cls, table, where)
    if errs:
        raise errs[0]
    out: T = obj
    return out
