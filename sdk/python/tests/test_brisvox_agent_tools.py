"""Tool calls: results, errors, cancellation, the concurrency bound, bad frames."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fake_brisvox import SECRET, FakeBrisvox, Gathered, run

from brisvox_agent import MAX_FRAME_BYTES, Agent, ToolContext, ToolError


def make_agent(gate: asyncio.Event | None = None, seen: Gathered | None = None) -> Agent:
    agent = Agent(secret=SECRET, port=0)
    seen = Gathered() if seen is None else seen

    @agent.tool(kind="read_only")
    async def echo(ctx: ToolContext, text: str, times: int = 1) -> dict[str, Any]:
        """Echo a text."""
        seen.add(ctx)
        return {"text": text * times, "caller": ctx.caller, "called": ctx.called,
                "params": dict(ctx.params), "key": ctx.idempotency_key, "epoch": ctx.epoch,
                "call_id": ctx.call_id, "call": ctx.call.call_id}

    @agent.tool(kind="read_only", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})
    async def whole(ctx: ToolContext, args: dict[str, Any]) -> Any:
        """Take the arguments whole."""
        return {"got": args}

    @agent.tool(kind="side_effect")
    async def fail(ctx: ToolContext, how: str) -> None:
        """Fail."""
        if how == "tool":
            raise ToolError("no table left")
        if how == "long":
            raise RuntimeError("x" * 5000)
        raise KeyError("boom")

    @agent.tool(kind="read_only")
    async def wait(ctx: ToolContext) -> str:
        """Wait for the gate."""
        seen.add(ctx)
        assert gate is not None
        await gate.wait()
        return "done"

    @agent.tool(kind="side_effect")
    async def slow_write(ctx: ToolContext) -> str:
        """A SideEffect that finishes even after a cancel."""
        seen.add(ctx)
        assert gate is not None
        await gate.wait()
        return "written"

    @agent.tool(kind="read_only")
    async def not_json(ctx: ToolContext) -> Any:
        """Return something that is not JSON."""
        return object()

    return agent


def test_a_tool_call_is_answered_with_its_result() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "echo", {"text": "ab", "times": 2}, key="k-1", epoch=4, call_id="t4.0")
            res = await fake.expect("tool.result")
            assert res == {"type": "tool.result", "id": "r1", "ok": True, "result": {
                "text": "abab", "caller": "+4930123", "called": "+4930999", "params": {"tier": "gold"},
                "key": "k-1", "epoch": 4, "call_id": "t4.0", "call": "call-1"}}
            await fake.call("r2", "whole", {"a": 1})
            assert (await fake.expect("tool.result"))["result"] == {"got": {"a": 1}}
            await fake.call("r3", "nope")
            res = await fake.expect("tool.result")
            assert res["ok"] is False and "unknown tool" in res["error"]["message"]
            await fake.call("r4", "not_json")
            res = await fake.expect("tool.result")
            assert res["ok"] is False and "not JSON" in res["error"]["message"]
            await fake.close()

    run(main)


def test_a_tool_that_raises_answers_ok_false_with_its_message() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "fail", {"how": "tool"})
            assert await fake.expect("tool.result") == {
                "type": "tool.result", "id": "r1", "ok": False, "error": {"message": "no table left"}}
            await fake.call("r2", "fail", {"how": "key"})
            res = await fake.expect("tool.result")
            assert res["ok"] is False and "boom" in res["error"]["message"]
            await fake.call("r3", "fail", {"how": "long"})
            res = await fake.expect("tool.result")
            assert res["ok"] is False and len(res["error"]["message"]) <= 1000
            await fake.close()

    run(main)


def test_a_result_is_sent_once_per_id() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "echo", {"text": "a"})
            await fake.expect("tool.result")
            await fake.call("r1", "echo", {"text": "a"})
            err = await fake.expect("error")
            assert (err["code"], err["ref"]) == ("bad_message", "r1")
            await fake.silent()
            await fake.close()

    run(main)


def test_cancel_sends_no_result_and_sets_ctx_cancelled() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        seen = Gathered()
        async with make_agent(gate, seen) as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "wait")
            await fake.call("r2", "slow_write")
            await seen.reach(2)
            await fake.send({"type": "tool.cancel", "id": "r1", "reason": "barge_in"})
            await fake.send({"type": "tool.cancel", "id": "r2", "reason": "hangup"})
            await fake.send({"type": "tool.cancel", "id": "r-unknown", "reason": "timeout"})
            await asyncio.sleep(0.05)
            assert all(c.cancelled.is_set() for c in seen)
            assert (seen[0].cancel_reason, seen[1].cancel_reason) == ("barge_in", "hangup")
            gate.set()  # the SideEffect finishes; its result is not sent after the cancel
            await fake.silent(0.3)
            assert not agent.sessions["sess-1"]._link.running  # type: ignore[union-attr]
            await fake.call("r3", "echo", {"text": "still here"})
            assert (await fake.expect("tool.result"))["id"] == "r3"
            await fake.close()

    run(main)


def test_concurrency_is_bounded_per_session() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        async with make_agent(gate) as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            for i in range(33):
                await fake.call(f"r{i}", "wait")
            busy = await fake.expect("tool.result")
            assert busy["id"] == "r32" and busy["ok"] is False and "busy" in busy["error"]["message"]
            gate.set()
            ids = {(await fake.expect("tool.result"))["id"] for _ in range(32)}
            assert ids == {f"r{i}" for i in range(32)}
            await fake.close()

    run(main)


def test_oversized_frames_are_refused_and_the_call_goes_on() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            big = json.dumps({"type": "event", "name": "user_turn", "text": "x" * MAX_FRAME_BYTES})
            await fake.send(big)
            err = await fake.expect("error")
            assert err["code"] == "too_large"
            await fake.send(json.dumps({"type": "tool.call", "text": "\u00e9" * (MAX_FRAME_BYTES // 2)}))
            assert (await fake.expect("error"))["code"] == "too_large"
            await fake.call("r1", "echo", {"text": "a"})
            assert (await fake.expect("tool.result"))["ok"] is True
            await fake.close()

    run(main)


def test_unknown_and_malformed_frames_are_answered_with_errors() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.send({"type": "tool.frobnicate", "id": "x"})
            assert await fake.expect("error") == {"type": "error", "code": "unknown_type",
                                                  "message": "unknown type 'tool.frobnicate'",
                                                  "ref": "tool.frobnicate"}
            for bad in ("not json", "[1, 2]", json.dumps({"type": 7}),
                        json.dumps({"type": "tool.call", "id": "r9", "name": "echo"})):
                await fake.send(bad)
                assert (await fake.expect("error"))["code"] == "bad_message"
            assert fake.ws is not None
            await fake.ws.send(b"\x00binary")
            assert (await fake.expect("error"))["code"] == "bad_message"
            await fake.call("r1", "echo", {"text": "a"})
            assert (await fake.expect("tool.result"))["ok"] is True
            await fake.close()

    run(main)
