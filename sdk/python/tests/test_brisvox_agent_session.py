"""Commands (acked, refused, unanswered), tools.set, events only when subscribed, the hang-up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_brisvox import SECRET, FakeBrisvox, Gathered, run

from brisvox_agent import (
    Agent,
    CommandError,
    CommandRefused,
    CommandTimeout,
    Event,
    Session,
    ToolContext,
)


def make_agent(events: Gathered) -> Agent:
    agent = Agent(secret=SECRET, port=0, command_timeout=0.5)

    @agent.tool(kind="side_effect")
    async def act(ctx: ToolContext, what: str) -> Any:
        """Send one command into the call."""
        s = ctx.session
        try:
            if what == "say":
                await s.say("One moment please.")
            elif what == "note":
                await s.note("The caller is a gold member.")
            elif what == "transfer":
                await s.transfer("+4930123456")
            elif what == "end_call":
                await s.end_call("done")
            elif what == "too_long":
                await s.say("x" * 1001)
        except CommandTimeout as e:
            return {"timeout": e.command}
        except CommandRefused as e:
            return {"refused": e.error, "command": e.command}
        except CommandError as e:
            return {"error": e.error}
        return {"ok": what}

    @agent.tool(kind="read_only")
    async def narrow(ctx: ToolContext) -> str:
        """Offer only act from now on."""
        with pytest.raises(ValueError):
            await ctx.session.set_tools(["nope"])
        await ctx.session.set_tools(["act"])
        return "narrowed"

    @agent.on("user_turn")
    async def heard(session: Session, event: Event) -> None:
        events.add(event)

    @agent.on("tool_outcome")
    async def outcome(session: Session, event: Event) -> None:
        events.add(event)
        raise RuntimeError("a handler that raises does not end anything")

    return agent


async def _command(fake: FakeBrisvox) -> dict[str, Any]:
    return await fake.expect("command")


def test_commands_round_trip_with_their_acks() -> None:
    async def main() -> None:
        async with make_agent(Gathered()) as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "act", {"what": "say"})
            cmd = await _command(fake)
            assert (cmd["name"], cmd["text"]) == ("say", "One moment please.")
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": True})
            assert (await fake.expect("tool.result"))["result"] == {"ok": "say"}

            await fake.call("r2", "act", {"what": "transfer"})
            cmd = await _command(fake)
            assert (cmd["name"], cmd["target"]) == ("transfer", "+4930123456")
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": False,
                             "error": "not a transfer target"})
            assert (await fake.expect("tool.result"))["result"] == {
                "refused": "not a transfer target", "command": "transfer"}

            await fake.call("r3", "act", {"what": "note"})
            cmd = await _command(fake)
            assert cmd["name"] == "note"
            await fake.send({"type": "error", "code": "rate_limited", "message": "20/s", "ref": cmd["id"]})
            assert (await fake.expect("tool.result"))["result"]["refused"] == "rate_limited: 20/s"

            await fake.call("r4", "act", {"what": "end_call"})
            cmd = await _command(fake)
            assert (cmd["name"], cmd["reason"]) == ("end_call", "done")
            # no ack: bounded by command_timeout
            assert (await fake.expect("tool.result"))["result"] == {"timeout": "end_call"}
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": True})  # late: ignored

            await fake.call("r5", "act", {"what": "too_long"})
            assert "error" in (await fake.expect("tool.result"))["result"]
            await fake.close()

    run(main)


def test_commands_wait_for_session_ready() -> None:
    async def main() -> None:
        async with make_agent(Gathered()) as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer(ready=False)
            await fake.call("r1", "act", {"what": "say"})
            await fake.silent(0.2)  # not before session.ready
            await fake.send({"type": "session.ready", "tools": ["act"],
                             "refused": [{"name": "narrow", "error": "collides"}]})
            cmd = await _command(fake)
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": True})
            assert (await fake.expect("tool.result"))["result"] == {"ok": "say"}
            s = agent.sessions["sess-1"]
            assert s.registered == ("act",) and s.refused[0]["name"] == "narrow"
            await fake.close()

    run(main)


def test_set_tools_narrows_the_offer() -> None:
    async def main() -> None:
        async with make_agent(Gathered()) as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "narrow")
            assert await fake.expect("tools.set") == {"type": "tools.set", "names": ["act"]}
            assert (await fake.expect("tool.result"))["result"] == "narrowed"
            await fake.close()

    run(main)


def test_events_are_subscribed_and_dispatched_only_when_handled() -> None:
    async def main() -> None:
        events = Gathered()
        async with make_agent(events) as agent:
            fake = FakeBrisvox(agent.url)
            accept = await fake.offer()
            assert accept["subscribe"] == ["tool_outcome", "user_turn"]
            await fake.send({"type": "event", "name": "bot_turn", "epoch": 3, "text": "For two?"})
            await fake.send({"type": "event", "name": "user_turn", "epoch": 3, "text": "a table for two"})
            await fake.send({"type": "event", "name": "tool_outcome", "call_id": "t3.0",
                             "tool": "act", "outcome": "ok"})
            await fake.send({"type": "event", "name": "user_turn", "epoch": 4, "text": "at eight"})
            await fake.send({"type": "event", "name": 5})
            assert (await fake.expect("error"))["code"] == "bad_message"
            await events.reach(3)
            assert [(e.name, e.epoch, e.text) for e in events if e.name == "user_turn"] == [
                ("user_turn", 3, "a table for two"), ("user_turn", 4, "at eight")]
            assert [(e.tool, e.outcome, e.call_id) for e in events if e.name == "tool_outcome"] == [
                ("act", "ok", "t3.0")]
            assert all(e.name != "bot_turn" for e in events)
            # the hang-up (not subscribed here) closes the connection gracefully, from the service
            await fake.send({"type": "event", "name": "hangup", "reason": "caller_hangup"})
            assert fake.ws is not None
            await asyncio.wait_for(fake.ws.wait_closed(), 3)
            assert fake.ws.close_code == 1000
            assert "sess-1" not in agent.sessions

    run(main)


def test_hangup_handler_runs_before_the_close_and_commands_are_then_refused() -> None:
    async def main() -> None:
        agent = make_agent(Gathered())
        seen: list[tuple[str | None, bool]] = []
        sessions: list[Session] = []

        @agent.on("hangup")
        async def bye(session: Session, event: Event) -> None:
            sessions.append(session)
            await asyncio.sleep(0.2)  # brisvox has closed by now: the handler still finishes
            seen.append((event.reason, session.live))

        async with agent:
            fake = FakeBrisvox(agent.url)
            accept = await fake.offer()
            assert "hangup" in accept["subscribe"]
            await fake.send({"type": "event", "name": "hangup", "reason": "caller_hangup"})
            await fake.close()  # as brisvox does, right after the hang-up
            await asyncio.sleep(0.4)
            assert seen == [("caller_hangup", False)]
            with pytest.raises(CommandError):
                await sessions[0].say("too late")

    run(main)


def test_dial_returns_what_the_ack_names_and_a_refusal_raises() -> None:
    agent = Agent(secret=SECRET, port=0, command_timeout=0.5)

    @agent.tool(kind="side_effect")
    async def call_back(ctx: ToolContext, via: str) -> Any:
        """Dial the caller back."""
        try:
            d = await ctx.session.dial("+4930123456", agent="callback", via=via, timeout=2.0)
        except CommandRefused as e:
            return {"refused": e.error}
        return {"via": d.via, "call_id": d.call_id, "call_sid": d.call_sid, "status": d.status,
                "times": [d.ringing_at_ms, d.progress_at_ms, d.answered_at_ms]}

    async def main() -> None:
        async with agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            await fake.call("r1", "call_back", {"via": "sip"})
            cmd = await _command(fake)
            assert {k: cmd[k] for k in ("name", "target", "agent", "via")} == {
                "name": "dial", "target": "+4930123456", "agent": "callback", "via": "sip"}
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": True, "via": "sip", "call_id": "c9",
                             "ringing_at_ms": 120, "answered_at_ms": 2300, "progress_at_ms": "soon"})
            assert (await fake.expect("tool.result"))["result"] == {"via": "sip", "call_id": "c9", "call_sid": "",
                                                                    "status": "", "times": [120, None, 2300]}
            await fake.call("r2", "call_back", {"via": "twilio"})
            cmd = await _command(fake)
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": True, "via": "twilio",
                             "call_sid": "CA1", "status": "queued"})
            assert (await fake.expect("tool.result"))["result"] == {"via": "twilio", "call_id": "", "call_sid": "CA1",
                                                                    "status": "queued", "times": [None, None, None]}
            await fake.call("r3", "call_back", {"via": "sip"})
            cmd = await _command(fake)
            await fake.send({"type": "command.ack", "id": cmd["id"], "ok": False, "error": "not a dial target"})
            assert (await fake.expect("tool.result"))["result"] == {"refused": "not a dial target"}
            with pytest.raises(CommandError):  # refused before anything is sent
                await Session(agent, "s", None, resume=False, local_tools=()).dial("+49", via="pigeon")  # type: ignore[arg-type]
            await fake.close()

    run(main)
