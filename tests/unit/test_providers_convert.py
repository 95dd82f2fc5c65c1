"""Pure pieces of the provider adapters: the SSE parser and the three vendors' message shapes.

* SSE: events split at every byte (CRLF split between chunks, UTF-8 split
  inside a character) parse like whole ones; comments are counted; an
  unterminated event is pending, never dispatched; the size bound raises.
* OpenAI: one ``tool`` message per result with the wire id of its call
  (the provider's id when there is one); null content for a tools-only turn.
* Anthropic: tool results are ``tool_result`` blocks of ONE user message,
  a user text after them joins it, mid-conversation system rows become user
  notes, brisvox ids are sanitized to the allowed alphabet, thinking blocks
  are echoed first.
* Gemini: ``parametersJsonSchema``, functionResponse parts of ONE user
  content (non-object results wrapped, errors under ``error``), thought
  signatures echoed per call and on the text part.
"""

from __future__ import annotations

import orjson
import pytest

from brisvox.providers import convert_anthropic, convert_gemini, convert_openai
from brisvox.providers.base import LlmMessage, LlmRequest, LlmTool, LlmToolCall
from brisvox.providers.sse import SseError, SseEvent, SseParser

STREAM = ("data: {\"a\": \"Zürich ☃\"}\r\n\r\n"
          ": keep-alive\n\n"
          "event: message_stop\ndata: line1\ndata: line2\n\n"
          "id: 7\rdata: cr-only\r\r").encode()


def test_sse_whole_and_split_agree() -> None:
    whole = SseParser().feed(STREAM)
    p = SseParser()
    split: list[SseEvent] = []
    for i in range(len(STREAM)):
        split += p.feed(STREAM[i : i + 1])
    assert whole == split == [SseEvent('{"a": "Zürich ☃"}'), SseEvent("line1\nline2", "message_stop"),
                              SseEvent("cr-only", "message", "7")]
    assert p.comments == 1 and not p.pending()


def test_sse_unterminated_event_is_pending() -> None:
    p = SseParser()
    assert p.feed(b"data: {\"half\": tr") == []
    assert p.pending()


def test_sse_bound() -> None:
    p = SseParser(max_event=100)
    with pytest.raises(SseError) as e:
        p.feed(b"data: " + b"x" * 200)
    assert e.value.kind == "oversized"
    p2 = SseParser(max_event=100)
    with pytest.raises(SseError):
        for _ in range(20):
            p2.feed(b"data: 0123456789\n")


CALLS = (LlmToolCall("t1.0", "get_weather", '{"city":"Paris"}', "call_abc"),
         LlmToolCall("t1.1", "get_weather", '{"city":"Rome"}', "", '{"thoughtSignature":"sig-2"}'))
MSGS = (
    LlmMessage("system", "be brief"),
    LlmMessage("user", "weather?"),
    LlmMessage("assistant", "", CALLS, provider_data='{"anthropic_thinking":[{"type":"thinking","thinking":"hm","signature":"S"}]}'),
    LlmMessage("tool", '{"temp":18}', call_id="t1.0", name="get_weather"),
    LlmMessage("tool", '{"error":"timeout"}', call_id="t1.1", name="get_weather", is_error=True),
    LlmMessage("system", "late note: booking BK-1 done"),
    LlmMessage("user", "thanks"),
)
TOOLS = (LlmTool("get_weather", "weather", {"type": "object", "properties": {"city": {"type": "string"}}}),)


def test_openai_shape() -> None:
    b = convert_openai.body(LlmRequest(MSGS, TOOLS, max_tokens=9), "m", max_tokens_field="max_completion_tokens")
    ms = b["messages"]
    assert ms[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "t1.1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]}
    assert [m for m in ms if m["role"] == "tool"] == [
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp":18}'},
        {"role": "tool", "tool_call_id": "t1.1", "content": '{"error":"timeout"}'}]
    assert ms[5] == {"role": "system", "content": "late note: booking BK-1 done"}
    assert b["max_completion_tokens"] == 9 and b["tools"][0]["function"]["parameters"]["type"] == "object"


def test_anthropic_shape() -> None:
    system, ms = convert_anthropic.convert(MSGS)
    assert system == "be brief"
    assert [m["role"] for m in ms] == ["user", "assistant", "user"]
    asst = ms[1]["content"]
    assert asst[0] == {"type": "thinking", "thinking": "hm", "signature": "S"}
    assert asst[1] == {"type": "tool_use", "id": "call_abc", "name": "get_weather", "input": {"city": "Paris"}}
    assert asst[2]["id"] == "t1_1"  # '.' is not allowed in a tool_use id
    last = ms[2]["content"]
    assert [b["type"] for b in last] == ["tool_result", "tool_result", "text", "text"]
    assert last[0] == {"type": "tool_result", "tool_use_id": "call_abc", "content": '{"temp":18}'}
    assert last[1]["tool_use_id"] == "t1_1" and last[1]["is_error"] is True
    assert last[2]["text"].startswith("[note] late note") and last[3]["text"] == "thanks"
    b = convert_anthropic.body(LlmRequest(MSGS, TOOLS, tool_choice="required"), "m", 512)
    assert b["tools"][0]["input_schema"]["type"] == "object" and b["tool_choice"] == {"type": "any"}
    assert b["max_tokens"] == 512


def test_gemini_shape() -> None:
    b = convert_gemini.body(LlmRequest(MSGS, TOOLS, max_tokens=20), {"thinking_budget": 0})
    assert b["systemInstruction"] == {"parts": [{"text": "be brief"}]}
    decl = b["tools"][0]["functionDeclarations"][0]
    assert "parametersJsonSchema" in decl and "parameters" not in decl
    model = b["contents"][1]
    assert model["role"] == "model"
    assert model["parts"][0] == {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_abc"}}
    assert model["parts"][1]["thoughtSignature"] == "sig-2"
    user = b["contents"][2]
    assert user["role"] == "user"
    fr = [p["functionResponse"] for p in user["parts"] if "functionResponse" in p]
    assert fr == [{"name": "get_weather", "response": {"temp": 18}, "id": "call_abc"},
                  {"name": "get_weather", "response": {"error": {"error": "timeout"}}}]
    assert b["generationConfig"] == {"maxOutputTokens": 20, "thinkingConfig": {"thinkingBudget": 0}}


def test_gemini_text_signature_and_plain_results() -> None:
    msgs = (LlmMessage("user", "hi"), LlmMessage("assistant", "Hello", provider_data='{"textSignature":"T"}'),
            LlmMessage("user", "x"), LlmMessage("assistant", "", (LlmToolCall("t2.0", "n", "{}"),)),
            LlmMessage("tool", "plain text result", call_id="t2.0", name="n"))
    _, contents = convert_gemini.convert(msgs)
    assert contents[1]["parts"] == [{"text": "Hello", "thoughtSignature": "T"}]
    assert contents[-1]["parts"] == [{"functionResponse": {"name": "n", "response": {"result": "plain text result"}}}]
    assert orjson.dumps(contents)  # serializable


GREETED = [LlmMessage("system", "be brief"), LlmMessage("assistant", "Hello, how can I help?"),
           LlmMessage("user", "a table for two")]


def test_a_greeting_first_gets_a_user_turn_before_it_on_anthropic_and_gemini() -> None:
    _, ms = convert_anthropic.convert(GREETED)
    assert [m["role"] for m in ms] == ["user", "assistant", "user"]
    assert ms[0]["content"] == [{"type": "text", "text": convert_anthropic.CALL_OPENED}]
    assert ms[1]["content"] == [{"type": "text", "text": "Hello, how can I help?"}]
    _, cs = convert_gemini.convert(GREETED)
    assert [c["role"] for c in cs] == ["user", "model", "user"]
    assert cs[0]["parts"] == [{"text": convert_gemini.CALL_OPENED}]
    # a conversation that starts with the caller is left as it is
    _, plain = convert_anthropic.convert(MSGS)
    assert plain[0]["content"][0] == {"type": "text", "text": "weather?"}
