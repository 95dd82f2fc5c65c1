"""Context: message model, call ids, ordering rules, interruption, late notes, estimate, JSON."""

from __future__ import annotations

import orjson
import pytest

from brisvox.agent.conversation.context import (
    AssistantMessage,
    CharsPerToken,
    Context,
    ContextError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    make_call_id,
    parse_call_id,
)


def call(cid: str, name: str = "lookup", **args) -> ToolCall:
    return ToolCall(cid, name, dict(args))


def test_call_ids_parse_and_format():
    assert make_call_id(3, 0) == "t3.0"
    assert parse_call_id("t3.12") == (3, 12)
    for bad in ("t3", "3.1", "t03.1", "t3.01", "x3.1", "t3.1 ", "t-1.0", "t.0"):
        assert parse_call_id(bad) is None


def test_ids_count_across_rounds_and_survive_removals():
    ctx = Context([SystemMessage("s"), UserMessage("hi")])
    assert ctx.next_tool_call_ids(4, 2) == ["t4.0", "t4.1"]
    ctx.push(AssistantMessage("", (call("t4.0"), call("t4.1"))))
    ctx.push(ToolMessage("t4.0", "a"))
    ctx.push(ToolMessage("t4.1", "b"))
    assert ctx.next_tool_call_id(4) == "t4.2"
    assert ctx.next_tool_call_id(5) == "t5.0"
    ctx.push(AssistantMessage("", (call("t4.2"),)))
    ctx.push(ToolMessage("t4.2", "c"))
    ctx.validate()
    # A removal (e.g. a cut) never lets an id be minted twice.
    ctx.truncate_to(2)
    assert ctx.next_tool_call_id(4) == "t4.3"


def test_two_responses_finished_against_one_context_collide_and_validate_rejects():
    ctx = Context([UserMessage("hi")])
    a = ctx.next_tool_call_ids(1, 1)
    b = ctx.next_tool_call_ids(1, 1)
    assert a == b
    ctx.push(AssistantMessage("", (call(a[0]),)))
    ctx.push(ToolMessage(a[0], "x"))
    ctx.push(AssistantMessage("", (call(b[0]),)))
    with pytest.raises(ContextError) as e:
        ctx.validate()
    assert e.value.kind == "duplicate_call_id"


def test_valid_context_with_results_in_any_order_and_trailing_open_call():
    ctx = Context([
        SystemMessage("s"),
        UserMessage("book"),
        AssistantMessage("Let me check.", (call("t1.0"), call("t1.1"))),
        ToolMessage("t1.1", "b"),
        ToolMessage("t1.0", "a"),
        AssistantMessage("Done."),
        UserMessage("again"),
        AssistantMessage("", (call("t2.0"),)),
    ])
    ctx.validate()  # the last call is open: the state before execute's results are appended
    assert [c.id for c in ctx.open_tool_calls()] == ["t2.0"]


@pytest.mark.parametrize(
    "msgs,kind",
    [
        ([AssistantMessage("", (call("t1.0"),)), UserMessage("x")], "unanswered_call"),
        ([AssistantMessage("", (call("t1.0"),)), SystemMessage("note")], "unanswered_call"),
        ([AssistantMessage("", (call("t1.0"), call("t1.1"))), ToolMessage("t1.0", "a"), AssistantMessage("x")],
         "unanswered_call"),
        ([ToolMessage("t1.0", "a")], "orphan_result"),
        ([AssistantMessage("", (call("t1.0"),)), ToolMessage("t1.0", "a"), ToolMessage("t1.0", "b")],
         "answered_twice"),
        ([AssistantMessage("", (call("t1.0"),)), UserMessage("u"), ToolMessage("t1.0", "a")], "unanswered_call"),
        ([AssistantMessage("")], "empty_assistant"),
        ([AssistantMessage("  \n")], "empty_assistant"),
        ([AssistantMessage("", (call("t1.0"), call("t1.0")))], "duplicate_call_id"),
        ([AssistantMessage("", (ToolCall("t1.0", "x", [1]),))], "arguments_not_object"),  # type: ignore[arg-type]
        ([AssistantMessage("", (ToolCall("t1.0", ""),))], "missing_tool_name"),
    ],
)
def test_validate_rejects(msgs, kind):
    ctx = Context(msgs)
    with pytest.raises(ContextError) as e:
        ctx.validate()
    assert e.value.kind == kind
    assert not ctx.is_valid()


def test_interrupt_pending_closes_open_calls_in_issue_order():
    ctx = Context([UserMessage("u"), AssistantMessage("ok", (call("t1.0", "a"), call("t1.1", "b"), call("t1.2", "c")))])
    ctx.push(ToolMessage("t1.1", "done"))
    assert ctx.interrupt_pending_tool_calls() == 2
    ctx.validate()
    tail = ctx.messages[-2:]
    assert [m.call_id for m in tail] == ["t1.0", "t1.2"]
    body = orjson.loads(tail[0].content)
    assert tail[0].is_error and body["error"] == "interrupted" and body["tool"] == "a"
    assert ctx.interrupt_pending_tool_calls() == 0
    ctx.push(UserMessage("next"))
    ctx.validate()


def test_late_result_is_a_system_note_and_refused_while_a_call_is_open():
    ctx = Context([UserMessage("u"), AssistantMessage("", (call("t1.0", "book"),))])
    with pytest.raises(ContextError):
        ctx.push_late_tool_result("t1.0", "book", "BK-1", False)
    ctx.interrupt_pending_tool_calls()
    ctx.push_late_tool_result("t1.0", "book", '{"booking":"BK-1"}', False)
    note = ctx[-1]
    assert isinstance(note, SystemMessage)
    assert "t1.0" in note.content and "book" in note.content and "BK-1" in note.content
    ctx.push(UserMessage("next"))
    ctx.validate()


def test_token_estimate_is_bytes_over_four_plus_four_per_message():
    ctx = Context([SystemMessage("x" * 40), UserMessage("é" * 10)])  # 40 bytes, 20 bytes
    assert ctx.estimate_tokens() == (40 // 4 + 4) + (20 // 4 + 4)
    assert ctx.estimate_tokens(CharsPerToken(2, 0)) == 20 + 10
    with_call = Context([AssistantMessage("", (ToolCall("t1.0", "ab", {"k": 1}),))])
    # name 2 + id 4 + '{"k":1}' 7 = 13 bytes
    assert with_call.estimate_tokens() == 13 // 4 + 4


def test_json_round_trip_preserves_everything_and_validity():
    ctx = Context([
        SystemMessage("s"),
        UserMessage("ü"),
        AssistantMessage("t", (ToolCall("t1.0", "n", {"a": [1, {"b": None}]}, "call_9", {"sig": "x"}),),
                         {"reasoning": "abc"}),
        ToolMessage("t1.0", "{}", True),
    ])
    ctx.validate()
    rows = ctx.to_json()
    assert rows[0] == {"role": "system", "content": "s"}
    assert rows[2]["tool_calls"][0]["provider_id"] == "call_9"
    back = Context.loads(ctx.dumps())
    assert back.messages == ctx.messages
    back.validate()
    assert back.next_tool_call_id(1) == "t1.1"


@pytest.mark.parametrize(
    "rows",
    [
        {"role": "user"},
        [{"role": "wizard", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "assistant", "text": "", "tool_calls": [{"id": "t1.0", "name": "x", "arguments": "[]"}]}],
        [{"role": "tool", "call_id": "t1.0", "content": "x", "is_error": "yes"}],
    ],
)
def test_json_form_rejects_bad_rows(rows):
    with pytest.raises(ContextError):
        Context.from_json(rows)


def test_tool_call_lookup():
    ctx = Context([AssistantMessage("", (call("t1.0", "a"),)), ToolMessage("t1.0", "x")])
    assert ctx.tool_call("t1.0").name == "a"
    assert ctx.tool_call("t9.9") is None
