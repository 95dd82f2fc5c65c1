"""Hostile input: refused within the caps, no exception escapes the engine."""

from __future__ import annotations

import orjson
import pytest

from brisvox.agent.conversation.assemble import AssembleError, InvalidCall, ResponseAssembler
from brisvox.agent.conversation.context import Context, ToolCall, UserMessage

from .helpers import RO, SE, Conv, Probe, body, engine, kind, registry

UNIQUE = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
PATTERN = {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string", "pattern": "^(a|b)+$"}}}}


def test_200_kib_unique_items_through_the_assembler_is_refused_without_running(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(t=(RO, tool, {"parameters": UNIQUE})))
        conv = Conv(eng)
        raw = orjson.dumps({"xs": [{"k": i % 7} for i in range(200 * 1024 // 8 + 10)]}).decode()
        assert len(raw) > 200 * 1024
        ex = await conv.run(("t", raw))
        assert kind(ex.results[0]) == "arguments_too_large" and tool.count == 0

    vrun(main)


def test_unique_items_at_the_cap_is_validated_quickly_and_refused(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(t=(RO, tool, {"parameters": UNIQUE})))
        xs = [{} for _ in range(5000)]  # 15 KiB of identical objects
        assert len(orjson.dumps({"xs": xs})) <= 16 * 1024
        ex = await eng.execute([ToolCall("t1.0", "t", {"xs": xs})], 1)
        assert kind(ex.results[0]) == "invalid_arguments" and tool.count == 0
        ex.mark_delivered()
        ok = [{"i": i} for i in range(1500)]
        ex = await eng.execute([ToolCall("t1.1", "t", {"xs": ok})], 1)
        assert not ex.results[0].is_error
        ex.mark_delivered()

    vrun(main)


def test_pattern_array_at_the_cap_reports_bounded_issues(vrun):
    async def main():
        eng = engine(registry(t=(RO, Probe(), {"parameters": PATTERN})))
        xs = ["ab" * 5 + "c"] * 1100
        ex = await eng.execute([ToolCall("t1.0", "t", {"xs": xs})], 1)
        b = body(ex.results[0])
        assert b["error"] == "invalid_arguments" and len(b["issues"]) == 5 and b["truncated"] is True
        assert len(ex.results[0].content.encode()) < 4096
        ex.mark_delivered()

    vrun(main)


@pytest.mark.parametrize("depth", [50, 300, 2000])
def test_deep_nesting_is_refused_without_an_exception(vrun, depth):
    async def main():
        tool = Probe()
        eng = engine(registry(t=(RO, tool, {}), s=(SE, tool, {})))
        conv = Conv(eng)
        raw = '{"a":' + "[" * depth + "]" * depth + "}"
        ex = await conv.run(("t", raw), ("s", raw))
        for m in ex.results:
            if depth <= 50:
                assert not m.is_error
            else:
                assert kind(m) in ("invalid tool call", "invalid_arguments")
        if depth > 50:
            assert tool.count == 0

    vrun(main)


def test_deeply_nested_arguments_built_directly_are_refused(vrun):
    async def main():
        v: object = {}
        for _ in range(400):
            v = {"a": v}
        eng = engine(registry(t=(RO, Probe(), {}), s=(SE, Probe(), {})))
        ex = await eng.execute([ToolCall("t1.0", "t", v), ToolCall("t1.1", "s", v)], 1)  # type: ignore[arg-type]
        assert [kind(m) for m in ex.results] == ["invalid_arguments"] * 2
        ex.mark_delivered()

    vrun(main)


def test_invalid_utf8_in_names_and_arguments(vrun):
    async def main():
        eng = engine(registry(t=(RO, Probe(), {})))
        ctx = Context([UserMessage("u")])
        a = ResponseAssembler()
        a.push_tool_call(0, name="bad\udcffname", arguments="{}")
        a.push_tool_call(1, name="t", arguments='{"s": "\udcff"}')
        a.push_tool_call(2, name=b"\xff\xfe".decode("utf-8", "surrogateescape"), arguments="{}")
        r = a.finish(1, ctx)
        ctx.push(r.assistant_message())
        ex = await eng.execute(r.calls, 1)
        assert [kind(m) for m in ex.results] == ["unknown_tool", "invalid tool call", "unknown_tool"]
        for m in ex.results:
            m.content.encode("utf-8")
        ex.append_to(ctx)
        ctx.validate()
        # a direct ToolCall with surrogates in its arguments is refused too
        ex = await eng.execute([ToolCall("t1.3", "t", {"s": "\ud800"})], 1)
        assert kind(ex.results[0]) == "invalid_arguments"
        ex.mark_delivered()

    vrun(main)


def test_ten_thousand_fragments_of_one_call_end_to_end(vrun):
    async def main():
        tool = Probe()
        eng = engine(registry(t=(SE, tool, {})))
        ctx = Context([UserMessage("u")])
        a = ResponseAssembler()
        a.push_tool_call(0, id="c", name="t")
        raw = orjson.dumps({"s": "z" * 20_000}).decode()
        step = len(raw) // 10_000 + 1
        n = 0
        for i in range(0, len(raw), step):
            a.push_tool_call(0, arguments=raw[i:i + step])
            n += 1
        for _ in range(10_000 - n):
            a.push_tool_call(0, arguments="")
        r = a.finish(1, ctx)
        ctx.push(r.assistant_message())
        ex = await eng.execute(r.calls, 1)
        assert kind(ex.results[0]) == "arguments_too_large" and tool.count == 0
        ex.append_to(ctx)
        ctx.validate()

    vrun(main)


def test_fragments_over_the_byte_cap_are_refused_by_the_assembler():
    a = ResponseAssembler()
    a.push_tool_call(0, name="t")
    with pytest.raises(AssembleError):
        for _ in range(300):
            a.push_tool_call(0, arguments="x" * 1024)
    assert a.buffered_bytes <= 256 * 1024


def test_a_tool_returning_garbage_or_hostile_names_never_raise(vrun):
    async def main():
        async def weird(args, ctx):
            return {1, 2}  # not JSON

        eng = engine(registry(w=(RO, weird, {}), s=(SE, weird, {})))
        ex = await eng.execute([ToolCall("t1.0", "w", {}), ToolCall("t1.1", "s", {}),
                                ToolCall("t1.2", "x" * 10_000, {}), ToolCall("t1.3", "", {}),
                                InvalidCall("t1.4", None, "", __import__("brisvox.agent.conversation.assemble").agent.conversation.assemble.CallError("missing_name", "x"))], 1)
        assert [kind(m) for m in ex.results] == ["tool_failed", "tool_failed", "unknown_tool", "unknown_tool",
                                                 "invalid tool call"]
        assert len(body(ex.results[2])["tool"].encode()) <= 64
        ex.mark_delivered()

    vrun(main)


def test_tools_raising_timeout_or_cancelled_errors_themselves_do_not_escape(vrun):
    async def main():
        import asyncio

        async def raises_timeout(args, ctx):
            raise TimeoutError("my own io timed out")

        async def raises_cancelled(args, ctx):
            raise asyncio.CancelledError()

        eng = engine(registry(a=(RO, raises_timeout, {}), b=(RO, raises_cancelled, {}),
                              c=(SE, raises_timeout, {}), d=(SE, raises_cancelled, {})))
        ex = await eng.execute([ToolCall(f"t1.{i}", n, {}) for i, n in enumerate("abcd")], 1)
        assert [kind(m) for m in ex.results] == ["tool_failed", "tool_failed", "unknown_outcome", "unknown_outcome"]
        ex.mark_delivered()
        one = await eng.execute([ToolCall("t1.9", "b", {})], 1)  # inline path (a single call)
        assert kind(one.results[0]) == "tool_failed"
        one.mark_delivered()

    vrun(main)
