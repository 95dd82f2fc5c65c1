"""Argument schemas of tools: compiled once, offline, validated with bounded reports.

Owns the JSON Schema side of argument validation: a tool's ``parameters``
(draft 2020-12) are compiled once at registration; arguments are checked in
the engine's planning step.

Invariants:

* Compilation never touches the network: the validator's registry has no
  retrieval, and every ``$ref`` is resolved at compile time, so a remote
  ``$ref`` is refused at registration while a local ``#/$defs/...`` works.
* ``uniqueItems`` is hash based (linear), not the quadratic pairwise scan, so
  a hostile array at the argument cap stays cheap.
* Schemas within the common subset run on the compiled fast path of
  :mod:`brisvox.agent.tool_engine.fastschema` (same verdicts); any other schema runs
  on jsonschema.
* A report has at most :data:`~brisvox.agent.conversation.tool_errors.MAX_ISSUES` issues
  ``{path, reason}`` with bounded fields, plus ``truncated`` when more exist.
* No exception escapes :meth:`CompiledSchema.check`: a validator failure on a
  pathological value (recursion) is reported as an issue.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.tool_engine.fastschema import Check, Errors, canon, compile_fast


class SchemaCompileError(ValueError):
    pass


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = canon(item)
        if key in seen:
            yield ValidationError("the array has non-unique elements")
            return
        seen.add(key)


_Validator = validators.extend(Draft202012Validator, {"uniqueItems": _unique_items})


def _refs(node: Any, out: list[str], depth: int = 0) -> None:
    if depth > 64:
        raise SchemaCompileError("the schema nests deeper than 64 levels")
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("$ref", "$dynamicRef") and isinstance(v, str):
                out.append(v)
            else:
                _refs(v, out, depth + 1)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out, depth + 1)


def _pointer(path: Any) -> str:
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else "(root)"


class CompiledSchema:
    """A tool's compiled argument schema."""

    __slots__ = ("schema", "_validator", "_fast")

    def __init__(self, schema: dict[str, Any]) -> None:
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise SchemaCompileError('parameters must be a schema with "type": "object"')
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as e:
            raise SchemaCompileError(f"invalid schema: {e.message}") from None
        refs: list[str] = []
        _refs(schema, refs)
        resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
        for ref in refs:
            try:
                resolver.lookup(ref)
            except Unresolvable:
                raise SchemaCompileError(f"$ref {ref[:100]!r} does not resolve offline") from None
            except Exception as e:  # a malformed pointer, ...
                raise SchemaCompileError(f"$ref {ref[:100]!r}: {type(e).__name__}") from None
        self.schema = schema
        self._validator = _Validator(schema, registry=Registry())
        self._fast: Check | None = compile_fast(schema)

    @property
    def compiled_fast(self) -> bool:
        """Whether the schema runs on the compiled fast path (else jsonschema)."""
        return self._fast is not None

    def is_valid(self, args: Any) -> bool:
        try:
            if self._fast is not None:
                errs: Errors = []
                self._fast(args, (), errs, 1)
                return not errs
            return bool(self._validator.is_valid(args))
        except RecursionError:
            return False

    def check(self, args: Any) -> tuple[list[dict[str, str]], bool]:
        """``(issues, truncated)``: at most MAX_ISSUES bounded issues; empty when valid."""
        if self._fast is not None:
            errs: Errors = []
            try:
                self._fast(args, (), errs, te.MAX_ISSUES + 1)
            except RecursionError:
                return [te.issue("(root)", "the arguments nest too deeply to validate")], False
            issues = [te.issue(_pointer(p), r) for p, r in errs[: te.MAX_ISSUES]]
            return issues, len(errs) > te.MAX_ISSUES
        if self.is_valid(args):
            return [], False
        out: list[dict[str, str]] = []
        try:
            for err in self._validator.iter_errors(args):
                if len(out) == te.MAX_ISSUES:
                    return out, True
                out.append(te.issue(_pointer(err.absolute_path), err.message))
        except RecursionError:
            out.append(te.issue("(root)", "the arguments nest too deeply to validate"))
        except Exception as e:  # never let a validator failure escape planning
            out.append(te.issue("(root)", f"the arguments could not be validated ({type(e).__name__})"))
        if not out:
            out.append(te.issue("(root)", "the arguments do not match the schema"))
        return out, False
