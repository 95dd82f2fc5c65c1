"""The compiled fast path agrees with jsonschema (draft 2020-12) on every verdict."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from brisvox.agent.tool_engine.fastschema import compile_fast
from brisvox.agent.tool_engine.schema import CompiledSchema

SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 5},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 7}},
     "required": ["city"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 2.5}}},
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": ["integer", "null"]},
                                             "minItems": 1, "maxItems": 3, "uniqueItems": True}}},
    {"type": "object", "properties": {"e": {"enum": [1, "a", None, True, [1, 2], {"k": 1}]},
                                      "c": {"const": {"a": [1, 2.0]}}}},
    {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(a|b)+$"}},
     "additionalProperties": {"type": "boolean"}, "minProperties": 1, "maxProperties": 2},
    {"type": "object", "properties": {"o": {"type": "object", "properties": {"z": False, "y": True},
                                            "required": ["y"]}}},
    {"type": "object", "description": "annotations only", "properties": {"a": {"title": "t", "format": "email"}}},
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.floats(-3, 10, allow_nan=False) | st.text("abc", max_size=6),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from("abcenopxyz") | st.sampled_from(
        ["city", "days", "xs", "k"]), kids, max_size=4),
    max_leaves=12,
)
instances = st.dictionaries(
    st.sampled_from(["city", "days", "n", "xs", "e", "c", "p", "o", "a", "q"]), json_values, max_size=4)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_every_listed_schema_compiles_on_the_fast_path(i):
    assert compile_fast(SCHEMAS[i]) is not None


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(SCHEMAS) - 1), instances)
def test_fast_verdict_equals_jsonschema(i, inst):
    schema = SCHEMAS[i]
    ref = Draft202012Validator(schema).is_valid(inst)
    c = CompiledSchema(schema)
    assert c.is_valid(inst) is ref
    issues, _ = c.check(inst)
    assert (not issues) is ref


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
        {"type": "object", "anyOf": [{"required": ["a"]}]},
        {"type": "object", "properties": {"a": {"prefixItems": [{"type": "string"}]}}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "object", "properties": {"a": {"multipleOf": 0.1}}},
    ],
)
def test_other_keywords_fall_back_to_jsonschema(schema):
    assert compile_fast(schema) is None
    assert not CompiledSchema(schema).compiled_fast
