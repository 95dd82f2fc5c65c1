"""ResponseAssembler: fragments, conflicts, caps, invalid calls, cancel,
the recorded assistant message and the id rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.agent.conversation.assemble import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CALLS,
    SLOT_COST,
    AssembleError,
    InvalidCall,
    ResponseAssembler,
)
from brisvox.agent.conversation.context import Context, ToolCall, UserMessage


def ctx() -> Context:
    return Context([UserMessage("u")])


def test_text_in_order_and_interleaved_fragments_of_two_calls():
    a = ResponseAssembler()
    a.push_text("Let me ")
    a.push_tool_call(1, id="b", name="second", arguments='{"x"')
    a.push_tool_call(0, id="a", name="first", arguments='{"ci')
    a.push_text("check.")
    a.push_tool_call(1, arguments=': 2}')
    a.push_tool_call(0, arguments='ty": "Ro')
    a.push_tool_call(0, arguments='me"}')
    r = a.finish(3, ctx())
    assert r.text == "Let me check."
    assert [(c.id, c.name, c.arguments, c.provider_id) for c in r.calls] == [
        ("t3.0", "first", {"city": "Rome"}, "a"), ("t3.1", "second", {"x": 2}, "b")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), max_size=6), st.data())
def test_json_may_split_anywhere(cuts, data):
    args = {"s": 'quote " back\\slash é \u00e9 \\u escapes', "n": -12.5e3, "a": [1, {"b": None}]}
    raw = orjson.dumps(args).decode()
    points = sorted({min(c, len(raw)) for c in cuts})
    parts = [raw[i:j] for i, j in zip([0, *points], [*points, len(raw)], strict=True)]
    a = ResponseAssembler()
    a.push_tool_call(0, name="t")
    for p in parts:
        a.push_tool_call(0, arguments=p)
    assert a.finish(1, ctx()).calls[0].arguments == args


def test_id_and_name_may_arrive_on_any_fragment_and_empty_counts_as_absent():
    a = ResponseAssembler()
    a.push_tool_call(0, id="", name="", arguments="{")
    a.push_tool_call(0, id="call_1", name="", arguments="}")
    a.push_tool_call(0, id="", name="look")
    a.push_tool_call(0, id="call_1", name="look")  # the same value again is fine
    c = a.finish(1, ctx()).calls[0]
    assert (c.name, c.provider_id, c.arguments) == ("look", "call_1", {})


@pytest.mark.parametrize("field,kind", [("id", "conflicting_id"), ("name", "conflicting_name")])
def test_a_conflicting_id_or_name_is_an_error_and_the_delta_is_not_applied(field, kind):
    a = ResponseAssembler()
    a.push_tool_call(0, id="a", name="n", arguments='{"x":')
    before = a.buffered_bytes
    with pytest.raises(AssembleError) as e:
        a.push_tool_call(0, **{field: "other"}, arguments="999")
    assert e.value.kind == kind and a.buffered_bytes == before
    a.push_tool_call(0, arguments="1}")
    c = a.finish(1, ctx()).calls[0]
    assert c.arguments == {"x": 1} and c.provider_id == "a" and c.name == "n"


def test_nothing_is_parsed_while_streaming():
    a = ResponseAssembler()
    a.push_tool_call(0, name="n", arguments="{{{{ not json")  # no error before finish
    r = a.finish(1, ctx())
    assert isinstance(r.calls[0], InvalidCall) and r.calls[0].error.kind == "bad_json"


def test_empty_or_blank_arguments_mean_empty_object():
    a = ResponseAssembler()
    a.push_tool_call(0, name="n")
    a.push_tool_call(1, name="m", arguments="  \n ")
    r = a.finish(1, ctx())
    assert [c.arguments for c in r.calls] == [{}, {}]


def test_invalid_calls_are_answered_and_valid_siblings_assemble():
    a = ResponseAssembler()
    a.push_tool_call(0, arguments="{}")  # no name
    a.push_tool_call(1, name="bad", arguments="{oops")
    a.push_tool_call(2, name="arr", arguments="[1, 2]")
    a.push_tool_call(3, name="ok", arguments='{"a": 1}')
    r = a.finish(2, ctx())
    kinds = [c.error.kind if isinstance(c, InvalidCall) else None for c in r.calls]
    assert kinds == ["missing_name", "bad_json", "not_object", None]
    res = r.calls[0].error_result()
    b = orjson.loads(res.content)
    assert res.is_error and res.call_id == "t2.0" and b["error"] == "invalid tool call" and b["tool"] == "unknown_tool"
    assert orjson.loads(r.calls[1].error_result().content)["tool"] == "bad"


def test_assistant_message_records_invalid_calls_and_provider_data_verbatim():
    a = ResponseAssembler()
    a.push_text("Hmm.")
    a.push_provider_data({"signature": "abc"})
    a.push_tool_call(0, id="p0", arguments="{}", provider_data={"thought": "s0"})
    a.push_tool_call(1, id="p1", name="look", arguments="{bad", provider_data={"thought": "s1"})
    a.push_tool_call(2, id="p2", name="ok", arguments='{"q": 1}')
    r = a.finish(4, ctx())
    msg = r.assistant_message()
    assert msg.text == "Hmm." and msg.provider_data == {"signature": "abc"}
    assert [(c.id, c.name, c.arguments, c.provider_id, c.provider_data) for c in msg.tool_calls] == [
        ("t4.0", "unknown_tool", {}, "p0", {"thought": "s0"}),
        ("t4.1", "look", {}, "p1", {"thought": "s1"}),
        ("t4.2", "ok", {"q": 1}, "p2", None),
    ]
    c = Context([UserMessage("u"), msg])
    c.extend(x.error_result() for x in r.invalid_calls())
    from brisvox.agent.conversation.context import ToolMessage

    c.push(ToolMessage("t4.2", "r"))
    c.validate()


def test_assistant_message_is_none_without_text_and_calls_even_with_provider_data():
    a = ResponseAssembler()
    a.push_provider_data({"sig": 1})
    assert a.finish(1, ctx()).assistant_message() is None


def test_provider_data_conflicts_are_errors_and_not_applied():
    a = ResponseAssembler()
    a.push_provider_data({"a": 1})
    a.push_provider_data({"a": 1})
    with pytest.raises(AssembleError) as e:
        a.push_provider_data({"a": 2})
    assert e.value.kind == "conflicting_response_provider_data"
    a.push_tool_call(0, name="n", provider_data="x")
    with pytest.raises(AssembleError) as e:
        a.push_tool_call(0, arguments='{"z":1}', provider_data="y")
    assert e.value.kind == "conflicting_call_provider_data"
    r = a.finish(1, ctx())
    assert r.provider_data == {"a": 1} and r.calls[0].provider_data == "x" and r.calls[0].arguments == {}


def test_byte_cap_slot_cost_and_provider_data_charged_at_serialized_size():
    a = ResponseAssembler.with_max_bytes(200)
    a.push_tool_call(0, arguments="x" * 100)
    assert a.buffered_bytes == SLOT_COST + 100
    with pytest.raises(AssembleError) as e:
        a.push_tool_call(0, arguments="y" * 37)  # 164 + 37 = 201
    assert e.value.kind == "too_large" and a.buffered_bytes == 164
    a.push_tool_call(0, arguments="y" * 36)
    assert a.buffered_bytes == 200
    b = ResponseAssembler.with_max_bytes(100)
    b.push_provider_data({"k": "v" * 10})  # {"k":"vvvvvvvvvv"} = 18 bytes
    assert b.buffered_bytes == 18
    b.push_text("é")
    assert b.buffered_bytes == 20


def test_empty_fragments_cannot_grow_the_buffer_forever():
    a = ResponseAssembler.with_max_bytes(64 * 4)
    for i in range(4):
        a.push_tool_call(i)
    for _ in range(10_000):
        a.push_tool_call(0)  # an open slot: free, and stores nothing
    with pytest.raises(AssembleError) as e:
        a.push_tool_call(4)
    assert e.value.kind == "too_large"
    assert all(not s.parts for s in a._slots.values())


def test_call_cap_refuses_new_slots_but_open_calls_still_accept():
    a = ResponseAssembler.with_limits(DEFAULT_MAX_BYTES, 2)
    a.push_tool_call(0, name="a")
    a.push_tool_call(1, name="b")
    with pytest.raises(AssembleError) as e:
        a.push_tool_call(2, name="c")
    assert e.value.kind == "too_many_calls"
    a.push_tool_call(1, arguments='{"k": 1}')
    assert len(a.finish(1, ctx()).calls) == 2
    assert DEFAULT_MAX_CALLS == 32 and DEFAULT_MAX_BYTES == 256 * 1024


def test_cancel_yields_nothing_and_consumes_the_assembler():
    a = ResponseAssembler()
    a.push_text("hello")
    a.push_tool_call(0, name="n")
    a.cancel()
    with pytest.raises(RuntimeError):
        a.finish(1, ctx())
    with pytest.raises(RuntimeError):
        a.push_text("more")
    b = ResponseAssembler()
    b.finish(1, ctx())
    with pytest.raises(RuntimeError):
        b.finish(1, ctx())


def test_ids_come_from_the_context_and_two_unpushed_responses_collide():
    c = ctx()
    r1 = _one_call(c)
    r2 = _one_call(c)
    assert r1.calls[0].id == r2.calls[0].id == "t1.0"
    c.push(r1.assistant_message())
    from brisvox.agent.conversation.context import ContextError, ToolMessage

    c.push(ToolMessage("t1.0", "x"))
    c.push(r2.assistant_message())
    with pytest.raises(ContextError):
        c.validate()
    # pushed first, the next response gets the next id
    c2 = ctx()
    c2.push(_one_call(c2).assistant_message())
    c2.push(ToolMessage("t1.0", "x"))
    assert _one_call(c2).calls[0].id == "t1.1"


def _one_call(c: Context):
    a = ResponseAssembler()
    a.push_tool_call(0, name="n")
    return a.finish(1, c)


@dataclass(frozen=True)
class _TD:
    text: str


@dataclass(frozen=True)
class _TCD:
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    provider_data: Any = None


@dataclass(frozen=True)
class _PD:
    value: Any


def test_push_accepts_provider_layer_deltas():
    a = ResponseAssembler()
    for d in (_TD("hi"), _TCD(0, "c", "n", "{}"), _PD({"s": 1})):
        a.push(d)
    r = a.finish(1, ctx())
    assert r.text == "hi" and isinstance(r.calls[0], ToolCall) and r.provider_data == {"s": 1}


@pytest.mark.parametrize("index", [-1, "0", 1.5, True])
def test_bad_index_is_refused(index):
    with pytest.raises(AssembleError) as e:
        ResponseAssembler().push_tool_call(index, name="n")  # type: ignore[arg-type]
    assert e.value.kind == "bad_index"


def test_ten_thousand_fragments_of_one_call_within_the_cap():
    raw = orjson.dumps({"s": "a" * 9_994}).decode()
    a = ResponseAssembler()
    a.push_tool_call(0, name="n")
    for ch in raw:
        a.push_tool_call(0, arguments=ch)
    assert len(raw) >= 10_000
    assert a.finish(1, ctx()).calls[0].arguments["s"] == "a" * 9_994
