"""A compiled fast path for the common subset of JSON Schema used by tool arguments.

Owns the speed of argument validation. ``jsonschema`` interprets a schema at
every call (a new validator object per nested schema), which costs about
10 us for a two-property object and tens of milliseconds for an array of
2,000 objects at the argument cap. Tool schemas almost always use a small
subset of draft 2020-12; this module compiles that subset once, at
registration, into nested closures that check an instance and report at
most ``limit`` errors as ``(path, reason)``.

Invariants:

* Supported keywords: type, enum, const, properties, required,
  additionalProperties, items, minItems, maxItems, uniqueItems, minLength,
  maxLength, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum,
  minProperties, maxProperties, boolean subschemas, and the annotations
  (title, description, default, examples, format, $comment, deprecated,
  readOnly, writeOnly, $schema, $defs). Format is an annotation, as in
  jsonschema without a format checker.
* Any other keyword (``$ref``, ``anyOf``, ``prefixItems``, ...) makes
  :func:`compile_fast` return None: the caller falls back to jsonschema for
  the whole schema. Unknown keywords are never silently ignored.
* Verdicts equal jsonschema's for every supported schema (property-tested
  against it): JSON equality for enum/const/uniqueItems (1 == 1.0,
  true != 1), Python ``re.search`` for patterns, code points for lengths.
* A compiled check stops as soon as ``limit`` errors were found.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


def canon(v: Any) -> Any:
    """A hashable key with JSON equality (1 == 1.0, True != 1, key order ignored)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("n", v)
    if isinstance(v, float):
        return ("n", int(v)) if v.is_integer() else ("n", v)
    if isinstance(v, str):
        return ("s", v)
    if v is None:
        return ("z",)
    if isinstance(v, list | tuple):
        return ("a", tuple(canon(x) for x in v))
    if isinstance(v, dict):
        return ("o", frozenset((k, canon(x)) for k, x in v.items()))
    return ("?", repr(v))

Path = tuple[Any, ...]
Errors = list[tuple[Path, str]]
Check = Callable[[Any, Path, Errors, int], None]

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "format", "$comment", "deprecated",
    "readOnly", "writeOnly", "$schema", "$defs", "contentMediaType", "contentEncoding",
})
_SUPPORTED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties", "maxProperties",
}) | _ANNOTATIONS


class _Unsupported(Exception):
    pass


def _is_integer(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return isinstance(v, float) and v.is_integer()


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def compile_fast(schema: Any) -> Check | None:
    """A check for ``schema``, or None when it uses a keyword outside the subset."""
    try:
        return _node(schema)
    except _Unsupported:
        return None


def _node(schema: Any) -> Check:
    if schema is True:
        return lambda inst, path, out, limit: None
    if schema is False:
        def never(inst: Any, path: Path, out: Errors, limit: int) -> None:
            out.append((path, f"False schema does not allow {_short(inst)}"))
        return never
    if not isinstance(schema, dict):
        raise _Unsupported
    if not set(schema) <= _SUPPORTED:
        raise _Unsupported
    checks: list[Check] = []
    for key in schema:  # keyword order, like jsonschema
        if key in _ANNOTATIONS:
            continue
        c = _keyword(key, schema[key], schema)
        if c is not None:
            checks.append(c)
    if len(checks) == 1:
        return checks[0]

    def all_of(inst: Any, path: Path, out: Errors, limit: int) -> None:
        for c in checks:
            c(inst, path, out, limit)
            if len(out) >= limit:
                return
    return all_of


def _keyword(key: str, value: Any, schema: dict[str, Any]) -> Check | None:  # noqa: C901 - one branch per keyword
    if key == "type":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in _TYPES for n in names):
            raise _Unsupported
        preds = [_TYPES[n] for n in names]
        label = repr(value) if isinstance(value, str) else repr(names)
        if len(preds) == 1:
            pred = preds[0]

            def type1(inst: Any, path: Path, out: Errors, limit: int) -> None:
                if not pred(inst):
                    out.append((path, f"{_short(inst)} is not of type {label}"))
            return type1

        def typen(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if not any(p(inst) for p in preds):
                out.append((path, f"{_short(inst)} is not of type {label}"))
        return typen
    if key == "enum":
        if not isinstance(value, list):
            raise _Unsupported
        allowed = {canon(v) for v in value}

        def enum(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if canon(inst) not in allowed:
                out.append((path, f"{_short(inst)} is not one of {_short(value)}"))
        return enum
    if key == "const":
        want = canon(value)

        def const(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if canon(inst) != want:
                out.append((path, f"{_short(value)} was expected"))
        return const
    if key == "properties":
        if not isinstance(value, dict):
            raise _Unsupported
        props = [(k, _node(v)) for k, v in value.items()]

        def properties(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if not isinstance(inst, dict):
                return
            for k, c in props:
                if k in inst:
                    c(inst[k], (*path, k), out, limit)
                    if len(out) >= limit:
                        return
        return properties
    if key == "required":
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            raise _Unsupported
        names = list(value)

        def required(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if not isinstance(inst, dict):
                return
            for k in names:
                if k not in inst:
                    out.append((path, f"{k!r} is a required property"))
                    if len(out) >= limit:
                        return
        return required
    if key == "additionalProperties":
        known = set(schema.get("properties", {}) or {})
        if value is False:
            def no_extra(inst: Any, path: Path, out: Errors, limit: int) -> None:
                if isinstance(inst, dict):
                    extra = [k for k in inst if k not in known]
                    if extra:
                        listed = ", ".join(repr(k) for k in extra[:5])
                        out.append((path, f"Additional properties are not allowed ({listed} "
                                          f"{'was' if len(extra) == 1 else 'were'} unexpected)"))
            return no_extra
        sub = _node(value)

        def extra_schema(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if not isinstance(inst, dict):
                return
            for k, v in inst.items():
                if k not in known:
                    sub(v, (*path, k), out, limit)
                    if len(out) >= limit:
                        return
        return extra_schema
    if key == "items":
        sub = _node(value)

        def items(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if not isinstance(inst, list):
                return
            for i, v in enumerate(inst):
                sub(v, (*path, i), out, limit)
                if len(out) >= limit:
                    return
        return items
    if key in ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _Unsupported
        n = value
        kind = {"minItems": list, "maxItems": list, "minLength": str, "maxLength": str,
                "minProperties": dict, "maxProperties": dict}[key]
        is_min = key.startswith("min")
        what = {list: "items", str: "characters", dict: "properties"}[kind]

        def length(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if isinstance(inst, kind):
                size = len(inst)
                if (size < n) if is_min else (size > n):
                    out.append((path, f"{_short(inst)} has {'fewer' if is_min else 'more'} than {n} {what}"))
        return length
    if key == "uniqueItems":
        if not isinstance(value, bool):
            raise _Unsupported
        if not value:
            return None

        def unique(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if not isinstance(inst, list):
                return
            seen: set[Any] = set()
            for v in inst:
                c = canon(v)
                if c in seen:
                    out.append((path, "the array has non-unique elements"))
                    return
                seen.add(c)
        return unique
    if key == "pattern":
        if not isinstance(value, str):
            raise _Unsupported
        try:
            rx = re.compile(value)
        except re.error:
            raise _Unsupported from None

        def pattern(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if isinstance(inst, str) and rx.search(inst) is None:
                out.append((path, f"{_short(inst)} does not match {value!r}"))
        return pattern
    if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if not _is_number(value):
            raise _Unsupported
        bound = value
        if key == "minimum":
            def minimum(inst: Any, path: Path, out: Errors, limit: int) -> None:
                if _is_number(inst) and inst < bound:
                    out.append((path, f"{_short(inst)} is less than the minimum of {bound!r}"))
            return minimum
        if key == "maximum":
            def maximum(inst: Any, path: Path, out: Errors, limit: int) -> None:
                if _is_number(inst) and inst > bound:
                    out.append((path, f"{_short(inst)} is greater than the maximum of {bound!r}"))
            return maximum
        if key == "exclusiveMinimum":
            def xmin(inst: Any, path: Path, out: Errors, limit: int) -> None:
                if _is_number(inst) and inst <= bound:
                    out.append((path, f"{_short(inst)} is less than or equal to the minimum of {bound!r}"))
            return xmin

        def xmax(inst: Any, path: Path, out: Errors, limit: int) -> None:
            if _is_number(inst) and inst >= bound:
                out.append((path, f"{_short(inst)} is greater than or equal to the maximum of {bound!r}"))
        return xmax
    raise _Unsupported
