"""Where a spoken filler enters the context, per provider format, on virtual time (the runner rig).

The filler is its own round and enters the context once no call is open: right before the
next assistant message, or when the turn is settled. So the request built after the tool
results ends on the results (never on the filler: an assistant prefill, which Anthropic
rejects), in every converter's format; and the filler before the answer is ONE assistant
turn of the next requests (roles alternate; a Gemini function call follows a function
response; an Anthropic assistant turn starts with its thinking).
"""

from __future__ import annotations

from typing import Any

import pytest

from brisvox.agent.conversation.context import AssistantMessage, ToolMessage, UserMessage
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.providers import convert_anthropic, convert_gemini, convert_openai
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmMessage,
    LlmRequest,
    LlmToolCall,
    TextDelta,
    ToolCallDelta,
)
from tests.providers_fakes.runner_rig import Rig, ToolLog, scenario_registry
from tests.unit.test_speculation_runner import Llm, run, settle

FILLER = "One moment, please."
FORMATS = ("openai", "anthropic", "gemini")


def weather_call(city: str, cid: str) -> list[Any]:
    return [ToolCallDelta(0, id=cid, name="get_weather", arguments=f'{{"city": "{city}"}}'), Done("tool_calls")]


def answer(req: LlmRequest, n: int) -> list[Any]:
    if n == 0:
        return [TextDelta("Let me check."), *weather_call("Paris", "c0")]
    if n == 1:
        return [TextDelta("It is 18 degrees."), Done()]
    return [TextDelta("Bye."), Done()]


def another_call(req: LlmRequest, n: int) -> list[Any]:
    if n == 0:
        return [TextDelta("Let me check."), *weather_call("Paris", "c0")]
    if n == 1:
        return weather_call("Rome", "c1")  # the answer to the first result is another call
    if n == 2:
        return [TextDelta("Paris 18, Rome 24."), Done()]
    return [TextDelta("Bye."), Done()]


def fails_after_the_tool(req: LlmRequest, n: int) -> list[Any]:
    if n == 0:
        return [TextDelta("Let me check."), *weather_call("Paris", "c0")]
    if n == 1:
        return [LlmError("bad_request", "400", retryable=False)]
    return [TextDelta("Bye."), Done()]


def _rig(llm: Llm) -> Rig:
    rig = Rig(llm, scenario_registry(ToolLog(), weather_delay=1.0), filler=FillerConfig(enabled=True, delay=0.2))
    rig.book.apply = lambda ctx: ctx.validate()  # type: ignore[method-assign]  # no TTS here: all played whole
    return rig


def wire_rows(fmt: str, req: LlmRequest) -> list[dict[str, Any]]:
    if fmt == "openai":
        return convert_openai.messages(req.messages)
    if fmt == "anthropic":
        return convert_anthropic.convert(req.messages)[1]
    return convert_gemini.convert(req.messages)[1]


def ends_on_results(fmt: str, rows: list[dict[str, Any]]) -> bool:
    last = rows[-1]
    if fmt == "openai":
        return last["role"] == "tool"
    if fmt == "anthropic":
        return last["role"] == "user" and all(b["type"] == "tool_result" for b in last["content"])
    return last["role"] == "user" and all("functionResponse" in p for p in last["parts"])


def roles(fmt: str, rows: list[dict[str, Any]]) -> list[str]:
    return [r["role"] for r in rows]


def _turns(script: Any, *texts: str) -> tuple[list[LlmRequest], list[Any], list[Any], Rig]:
    async def main() -> tuple[list[LlmRequest], list[Any], list[Any], Rig]:
        llm = Llm(script=script)
        snaps = []
        async with _rig(llm) as rig:
            for i, t in enumerate(texts, 1):
                await rig.turn(i, t)
                snaps.append(list(rig.snapshot))
                await settle(0.1)
            return llm.requests, snaps, list(rig.runner.ctx.messages), rig
    return run(main)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_request_after_a_filler_ends_on_the_tool_result_and_the_filler_joins_the_answer(fmt: str) -> None:
    reqs, snaps, ctx, rig = _turns(answer, "the weather in Paris", "thanks")
    assert rig.runner.st.fillers == 1 and len(reqs) == 3
    # the request right after the results: they are its last message, the filler is not in it
    after_tool = reqs[1]
    assert after_tool.messages[-1].role == "tool"
    assert [m.text for m in after_tool.messages if m.role == "assistant"] == ["Let me check."]
    assert ends_on_results(fmt, wire_rows(fmt, after_tool))
    # the context: the filler right before the answer, each with its round's index in the book
    assert snaps[0] == ctx[:6]
    assert [type(m).__name__ for m in ctx[:6]] == ["SystemMessage", "UserMessage", "AssistantMessage",
                                                   "ToolMessage", "AssistantMessage", "AssistantMessage"]
    assert (ctx[4], ctx[5]) == (AssistantMessage(FILLER), AssistantMessage("It is 18 degrees."))
    assert [(r.round, r.msg_index) for r in rig.book.rounds.values() if r.epoch == 1] == [(0, 2), (1, 4), (2, 5)]
    # the next turn's request ends on the user, the filler and the answer are one assistant turn
    rows = wire_rows(fmt, reqs[2])
    if fmt == "openai":
        assert roles(fmt, rows) == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert rows[4] == {"role": "assistant", "content": "One moment, please. It is 18 degrees."}
    elif fmt == "anthropic":
        assert roles(fmt, rows) == ["user", "assistant", "user", "assistant", "user"]
        assert rows[3]["content"] == [{"type": "text", "text": FILLER}, {"type": "text", "text": "It is 18 degrees."}]
    else:
        assert roles(fmt, rows) == ["user", "model", "user", "model", "user"]
        assert rows[3]["parts"] == [{"text": FILLER}, {"text": "It is 18 degrees."}]
    assert rows[-1] == wire_rows(fmt, LlmRequest(messages=(LlmMessage("user", "thanks"),)))[-1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_filler_before_another_tool_call_keeps_every_request_ending_on_a_result(fmt: str) -> None:
    reqs, _, ctx, rig = _turns(another_call, "Paris and Rome")
    assert rig.runner.st.fillers == 2 and len(reqs) == 3
    for req in reqs[1:]:  # both requests after a tool round
        assert req.messages[-1].role == "tool"
        assert ends_on_results(fmt, wire_rows(fmt, req))
    # round 0 text+call, its result, filler 1, the second call, its result, filler 2, the answer
    kinds = [(type(m).__name__, getattr(m, "text", "")) for m in ctx[2:]]
    assert kinds == [("AssistantMessage", "Let me check."), ("ToolMessage", ""), ("AssistantMessage", FILLER),
                     ("AssistantMessage", ""), ("ToolMessage", ""), ("AssistantMessage", FILLER),
                     ("AssistantMessage", "Paris 18, Rome 24.")]
    rows = wire_rows(fmt, reqs[2])  # filler 1 and the second call are one assistant turn
    if fmt == "openai":
        assert roles(fmt, rows) == ["system", "user", "assistant", "tool", "assistant", "tool"]
        assert rows[4]["content"] == FILLER and [c["id"] for c in rows[4]["tool_calls"]] == ["c1"]
    elif fmt == "anthropic":
        assert roles(fmt, rows) == ["user", "assistant", "user", "assistant", "user"]
        assert [b["type"] for b in rows[3]["content"]] == ["text", "tool_use"] and rows[3]["content"][0]["text"] == FILLER
    else:
        assert roles(fmt, rows) == ["user", "model", "user", "model", "user"]
        assert rows[3]["parts"][0] == {"text": FILLER} and rows[3]["parts"][1]["functionCall"]["name"] == "get_weather"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_filler_enters_when_the_turn_settles_after_a_failed_answer(fmt: str) -> None:
    reqs, snaps, ctx, rig = _turns(fails_after_the_tool, "the weather in Paris", "hello?")
    assert rig.runner.st.fillers == 1 and rig.runner.st.errors == 1
    # the turn ended with the filler as its last message (entered before LlmResponseEnded)
    assert snaps[0][-2:] == [ctx[3], AssistantMessage(FILLER)] and isinstance(ctx[3], ToolMessage)
    assert reqs[1].messages[-1].role == "tool"
    assert ends_on_results(fmt, wire_rows(fmt, reqs[1]))
    last = wire_rows(fmt, reqs[2])[-1]
    assert last["role"] == "user"
    assert isinstance(ctx[5], UserMessage) and ctx[5].content == "hello?"


def test_an_anthropic_assistant_turn_merged_from_a_filler_starts_with_the_answers_thinking() -> None:
    thinking = '{"anthropic_thinking": [{"type": "thinking", "thinking": "t", "signature": "s"}]}'
    msgs = (LlmMessage("user", "q"), LlmMessage("assistant", "Let me check.", (LlmToolCall("t1.0", "f", "{}", "tu_1"),)),
            LlmMessage("tool", "{}", call_id="t1.0", name="f"), LlmMessage("assistant", FILLER),
            LlmMessage("assistant", "", (LlmToolCall("t1.1", "f", "{}", "tu_2"),), provider_data=thinking),
            LlmMessage("tool", "{}", call_id="t1.1", name="f"))
    _, rows = convert_anthropic.convert(msgs)
    assert [r["role"] for r in rows] == ["user", "assistant", "user", "assistant", "user"]
    assert [b["type"] for b in rows[3]["content"]] == ["thinking", "text", "tool_use"]
    assert rows[3]["content"][1] == {"type": "text", "text": FILLER}


def test_no_request_of_a_filler_turn_ends_on_an_assistant_message() -> None:
    reqs, _, _, _ = _turns(another_call, "Paris and Rome", "thanks")
    assert [r.messages[-1].role for r in reqs] == ["user", "tool", "tool", "user"]
