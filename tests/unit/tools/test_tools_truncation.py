"""apply_truncation: kept / truncated / removed, tool pairs retained, errors leave the context."""

from __future__ import annotations

import pytest

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.conversation.truncation import (
    Truncation,
    TruncationError,
    TruncationOutcome,
    apply_truncation,
)


def base() -> Context:
    return Context([UserMessage("hi"), AssistantMessage("Hello there. How can I help?")])


def test_heard_in_full_is_kept():
    ctx = base()
    assert apply_truncation(ctx, 1, Truncation("Hello there. How can I help?", in_full=True)) is TruncationOutcome.KEPT
    assert ctx[1].text == "Hello there. How can I help?"
    ctx.validate()


def test_prefix_is_truncated_with_trailing_whitespace_trimmed():
    ctx = base()
    assert apply_truncation(ctx, 1, Truncation("Hello there. ")) is TruncationOutcome.TRUNCATED
    assert ctx[1].text == "Hello there."
    ctx.validate()


def test_unsent_tail_of_a_partial_message_is_cut_even_when_heard_in_full():
    ctx = Context([UserMessage("u"), AssistantMessage("One moment, please and")])
    assert apply_truncation(ctx, 1, Truncation("One moment,", in_full=True)) is TruncationOutcome.TRUNCATED
    assert ctx[1].text == "One moment,"


@pytest.mark.parametrize("heard", ["", "   "])
def test_nothing_heard_removes_a_message_without_calls(heard):
    ctx = Context([UserMessage("u"), AssistantMessage("   Not heard")])
    assert apply_truncation(ctx, 1, Truncation(heard)) is TruncationOutcome.REMOVED
    assert len(ctx) == 1
    ctx.validate()


def test_a_message_with_calls_is_retained_when_nothing_is_heard():
    ctx = Context([
        UserMessage("u"),
        AssistantMessage("Let me check that.", (ToolCall("t1.0", "lookup", {}),)),
        ToolMessage("t1.0", "r"),
        AssistantMessage("It is sunny."),
    ])
    # Last round first, as the runner walks.
    assert apply_truncation(ctx, 3, Truncation.nothing()) is TruncationOutcome.REMOVED
    assert apply_truncation(ctx, 1, Truncation("Let ")) is TruncationOutcome.TRUNCATED
    assert ctx[1].text == "Let" and ctx[1].tool_calls[0].id == "t1.0"
    ctx.validate()
    assert apply_truncation(ctx, 1, Truncation("")) is TruncationOutcome.TRUNCATED
    assert ctx[1].text == "" and len(ctx) == 3
    ctx.validate()
    # Applying again changes nothing.
    assert apply_truncation(ctx, 1, Truncation("")) is TruncationOutcome.KEPT


def test_provider_data_is_kept_on_a_cut():
    ctx = Context([UserMessage("u"), AssistantMessage("abc def", (), {"sig": 1})])
    apply_truncation(ctx, 1, Truncation("abc"))
    assert ctx[1].provider_data == {"sig": 1}


def test_removal_takes_orphan_results_with_it():
    # A context built from pieces where a removed message had answered calls
    # (constructed directly; apply_truncation itself never removes a message with calls).
    from brisvox.agent.conversation.truncation import _remove_with_orphans

    msg = AssistantMessage("x", (ToolCall("t1.0", "a", {}),))
    ctx = Context([UserMessage("u"), msg, ToolMessage("t1.0", "r"), UserMessage("v")])
    _remove_with_orphans(ctx, 1, msg)
    assert [m.role for m in ctx] == ["user", "user"]
    ctx.validate()


@pytest.mark.parametrize(
    "index,heard,kind",
    [(5, "", "no_such_message"), (-1, "", "no_such_message"), (0, "", "not_assistant"), (1, "Hello here", "not_a_prefix")],
)
def test_errors_leave_the_context_unchanged(index, heard, kind):
    ctx = base()
    before = ctx.messages
    with pytest.raises(TruncationError) as e:
        apply_truncation(ctx, index, Truncation(heard))
    assert e.value.kind == kind
    assert ctx.messages == before
