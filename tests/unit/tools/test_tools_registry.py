"""Specs, registry rejections, offline schema compilation, bounded validation reports and error fields."""

from __future__ import annotations

import orjson
import pytest

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.tool_engine.registry import (
    CONFIRM_TOOL_NAME,
    RegistryError,
    ToolKind,
    ToolRegistry,
    ToolSpec,
)
from brisvox.agent.tool_engine.schema import CompiledSchema

from .helpers import CITY, OBJ, RO, SE, Probe


def spec(name="t", params=None, kind=RO, **kw) -> ToolSpec:
    return ToolSpec(name, "d", params if params is not None else OBJ, kind, **kw)


# --- schema cases ----------------------------------------------------------------------

NESTED = {
    "type": "object",
    "properties": {
        "party": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}},
                  "required": ["size"]},
    },
    "required": ["party"],
}
LOCAL_REF = {
    "type": "object",
    "$defs": {"day": {"type": "string", "enum": ["mon", "tue"]}},
    "properties": {"day": {"$ref": "#/$defs/day"}},
    "required": ["day"],
}


@pytest.mark.parametrize(
    "schema,args,ok,path",
    [
        (CITY, {"city": "Rome"}, True, None),
        (CITY, {}, False, "(root)"),  # missing required
        (CITY, {"city": 3}, False, "/city"),  # wrong type
        (CITY, {"city": "Rome", "x": 1}, False, "(root)"),  # extra property
        (NESTED, {"party": {"size": 2}}, True, None),
        (NESTED, {"party": {"size": 0}}, False, "/party/size"),  # nested
        (LOCAL_REF, {"day": "mon"}, True, None),
        (LOCAL_REF, {"day": "sun"}, False, "/day"),  # through a local $ref
    ],
)
def test_schema_cases(schema, args, ok, path):
    c = CompiledSchema(schema)
    assert c.is_valid(args) is ok
    issues, truncated = c.check(args)
    assert (not issues) is ok and not truncated
    if not ok:
        assert issues[0]["path"] == path


def test_unique_items_is_hash_based_with_json_equality():
    c = CompiledSchema({"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}})
    assert c.is_valid({"xs": [1, "1", True, {"a": 1}, {"a": 2}, [1]]})
    assert not c.is_valid({"xs": [1, 1.0]})
    assert not c.is_valid({"xs": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]})
    assert c.is_valid({"xs": [True, 1]})  # true is not 1 in JSON Schema


def test_bounded_validation_report_at_most_five_issues_plus_truncated():
    props = {f"p{i}": {"type": "integer"} for i in range(8)}
    c = CompiledSchema({"type": "object", "properties": props})
    issues, truncated = c.check({f"p{i}": "x" for i in range(8)})
    assert len(issues) == te.MAX_ISSUES and truncated
    issues, truncated = c.check({f"p{i}": "x" for i in range(5)})
    assert len(issues) == 5 and not truncated


@pytest.mark.parametrize("via_ref", [False, True])
def test_issue_path_and_reason_are_bounded(via_ref):
    long_key = "k" * 300
    leaf = {"type": "string", "pattern": "^" + "a" * 300 + "$"}
    schema = {"type": "object", "properties": {long_key: leaf}}
    if via_ref:  # the jsonschema fallback path
        schema = {"type": "object", "$defs": {"leaf": leaf}, "properties": {long_key: {"$ref": "#/$defs/leaf"}}}
    c = CompiledSchema(schema)
    assert c.compiled_fast is not via_ref
    issues, _ = c.check({long_key: "é" * 400})
    path, reason = issues[0]["path"], issues[0]["reason"]
    assert len(path.encode()) <= te.MAX_PATH_BYTES and path.endswith(te.ELLIPSIS)
    assert len(reason.encode()) <= te.MAX_REASON_BYTES and reason.endswith(te.ELLIPSIS)
    assert len(reason.encode()) >= te.MAX_REASON_BYTES - 1
    reason.encode("utf-8")  # a cut inside a multi-byte character leaves valid UTF-8


# --- bounded error fields -------------------------------------------------------------------


def test_error_body_fields_are_bounded_cut_on_characters_and_valid_json():
    body = te.error_body("tool_failed", "n" * 100, "é" * 1000)
    b = orjson.loads(body)
    assert len(b["tool"].encode()) == te.MAX_TOOL_BYTES and b["tool"].endswith(te.ELLIPSIS)
    assert len(b["detail"].encode()) <= te.MAX_DETAIL_BYTES and b["detail"].endswith(te.ELLIPSIS)
    assert len(b["detail"].encode()) >= te.MAX_DETAIL_BYTES - 1  # cut at a 2-byte character boundary
    exact = te.error_body("x", "t" * 64, "d" * 512)
    assert orjson.loads(exact)["detail"] == "d" * 512 and orjson.loads(exact)["tool"] == "t" * 64


def test_error_body_replaces_invalid_utf8_in_names():
    body = te.error_body("unknown_tool", "bad\ud800name", "x")
    assert orjson.loads(body)["tool"] == "bad?name"


def test_cut_utf8_exact():
    assert te.cut_utf8("aé", 2) == ("a", True)
    assert te.cut_utf8("aé", 3) == ("aé", False)
    assert te.bound("abcdef", 4) == "a" + te.ELLIPSIS


# --- registry -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "get_weather", "book-table", "A9_-", "x" * 64])
def test_valid_names_are_accepted(name):
    reg = ToolRegistry()
    reg.register(spec(name), Probe())
    assert reg.spec(name).name == name


@pytest.mark.parametrize("name", ["", "x" * 65, "café", "a b", "a.b", "naïve", "bad\ud800"])
def test_invalid_names_are_rejected(name):
    reg = ToolRegistry()
    with pytest.raises(RegistryError) as e:
        reg.register(spec(name), Probe())
    assert e.value.kind == "invalid_name" and reg.is_empty()


def test_duplicate_keeps_the_first_tool():
    reg = ToolRegistry()
    first, second = Probe(), Probe()
    reg.register(spec("t"), first)
    with pytest.raises(RegistryError) as e:
        reg.register(spec("t", kind=SE), second)
    assert e.value.kind == "duplicate"
    assert reg.get("t").tool is first and reg.spec("t").kind is RO and len(reg) == 1


@pytest.mark.parametrize(
    "s,kind_",
    [
        (spec(timeout=0), "zero_timeout"),
        (spec(timeout=-1), "zero_timeout"),
        (spec(confirm=True), "confirm_needs_side_effect"),
        (spec(repeatable=True), "repeatable_needs_side_effect"),
        (spec(params={"type": "array"}), "invalid_schema"),
        (spec(params={"properties": {}}), "invalid_schema"),
        (spec(params={"type": "object", "properties": {"x": {"type": "nonsense"}}}), "invalid_schema"),
        (spec(params={"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}}),
         "invalid_schema"),
        (spec(params={"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}), "invalid_schema"),
        (spec(name=CONFIRM_TOOL_NAME, kind=SE), "reserved_name"),
        (spec(filler_after=-1.0), "invalid_filler_after"),
    ],
)
def test_registry_rejections_add_nothing(s, kind_):
    reg = ToolRegistry()
    with pytest.raises(RegistryError) as e:
        reg.register(s, Probe())
    assert e.value.kind == kind_ and len(reg) == 0


def test_local_ref_compiles_and_validates_at_registration():
    reg = ToolRegistry()
    reg.register(spec("t", LOCAL_REF), Probe())
    assert reg.get("t").schema.is_valid({"day": "tue"})


def test_specs_in_name_order_and_defaults():
    reg = ToolRegistry()
    for n in ("zeta", "alpha", "mid"):
        reg.register(spec(n), Probe())
    assert [s.name for s in reg.specs()] == ["alpha", "mid", "zeta"]
    s = reg.spec("alpha")
    assert s.timeout == 5.0 and s.filler_after == 0.7 and not s.confirm and not s.repeatable
    assert s.with_timeout(2).timeout == 2 and s.with_filler_after(None).filler_after is None


def test_confirm_tool_adds_the_builtin_confirm_pending_only_when_needed():
    reg = ToolRegistry()
    reg.register(spec("book", kind=SE), Probe())
    assert CONFIRM_TOOL_NAME not in reg
    reg.register(spec("transfer", kind=SE, confirm=True), Probe())
    assert CONFIRM_TOOL_NAME in reg and reg.spec(CONFIRM_TOOL_NAME).kind is ToolKind.SIDE_EFFECT
    reg.require_confirmation("book")
    assert reg.spec("book").confirm
    with pytest.raises(RegistryError):
        reg.require_confirmation("missing")
