"""The handshake: the signature, the clock window, the accept with its declarations, refusals."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import time
from typing import Annotated, Any, Literal, TypedDict

import pytest
from fake_brisvox import CALL, SECRET, FakeBrisvox, run
from websockets.exceptions import InvalidStatus

from brisvox_agent import Agent, Refuse, Session, sign, verify
from brisvox_agent._auth import NONCE_FULL, OLD_SCHEME, REPLAYED, NonceCache


class Guest(TypedDict):
    name: str
    phone: str | None


@dataclasses.dataclass
class Slot:
    """A date and a time."""

    date: str
    time: Literal["18:00", "19:00"]
    flexible: bool = False


def make_agent() -> Agent:
    agent = Agent(secret=SECRET, port=0)

    @agent.tool(kind="read_only", timeout_ms=3000, filler_after_ms=800)
    async def lookup(ctx: Any, date: str, people: int, ratio: float, vip: bool, tags: list[str],
                     time: Literal["18:00", "19:00"], note: str | None = None,
                     guest: Guest | None = None, slot: Slot | None = None,
                     size: Annotated[int, "party size", {"minimum": 1}] = 2) -> dict[str, Any]:
        """Look a table up."""
        return {}

    @agent.tool(name="book_table", description="Book a table.", kind="side_effect",
                parameters={"type": "object", "properties": {"name": {"type": "string"}},
                            "required": ["name"]}, confirm=True)
    async def book(ctx: Any, **args: Any) -> dict[str, Any]:
        return args

    @agent.tool(offer=False)
    async def vip_lounge(ctx: Any, args: dict[str, Any]) -> str:
        """Reserve the lounge (gold callers only)."""
        return "ok"

    @agent.on("user_turn")
    async def heard(session: Session, event: Any) -> None:
        pass

    return agent


def test_sign_and_verify() -> None:
    now = int(time.time())
    assert verify(SECRET, "s", sign(SECRET, "s", now)) is None
    assert verify(SECRET, "s", sign("other", "s", now)) == "bad signature"
    assert verify(SECRET, "other", sign(SECRET, "s", now)) == "bad signature"
    assert verify(SECRET, "s", sign(SECRET, "s", now - 31)) == "stale signature"
    assert verify(SECRET, "s", sign(SECRET, "s", now + 31)) == "stale signature"
    assert verify(SECRET, "s", sign(SECRET, "s", now - 29)) is None
    assert verify(SECRET, "s", "garbage") == "malformed signature"
    assert verify(SECRET, None, sign(SECRET, "s", now)) == "missing session"
    # the nonce is inside what is signed: changing it breaks the signature
    n1 = sign(SECRET, "s", now, nonce="0" * 32)
    assert verify(SECRET, "s", n1.replace("n=" + "0" * 32, "n=" + "1" * 32)) == "bad signature"
    assert verify(SECRET, "s", n1.replace("n=" + "0" * 32, "n=xyz")) == "malformed signature"
    v1 = f"t={now},v1={hmac.new(SECRET.encode(), f'{now}.s'.encode(), hashlib.sha256).hexdigest()}"
    assert verify(SECRET, "s", v1) == OLD_SCHEME  # the replayable v1 of old brisvox versions
    assert sign(SECRET, "s", now) != sign(SECRET, "s", now)  # a fresh nonce each time


def test_a_nonce_is_accepted_once_within_the_window() -> None:
    now = 1_000_000
    cache = NonceCache(window=30, capacity=3)
    h = sign(SECRET, "s", now)
    assert verify(SECRET, "s", h, now=now, nonces=cache) is None
    assert verify(SECRET, "s", h, now=now + 29, nonces=cache) == REPLAYED
    assert verify(SECRET, "s", h, now=now + 31, nonces=cache) == "stale signature"  # out of the window
    # bad signatures are never recorded: without the secret no one fills the cache
    for _ in range(10):
        assert verify(SECRET, "s", sign("wrong", "s", now), now=now, nonces=cache) == "bad signature"
    assert len(cache) == 1
    cache.admit("b" * 32, now, now)
    cache.admit("c" * 32, now, now)
    assert len(cache) == 3
    assert verify(SECRET, "s", sign(SECRET, "s", now), now=now + 1, nonces=cache) == NONCE_FULL  # fail closed
    assert verify(SECRET, "s", sign(SECRET, "s", now + 31), now=now + 31, nonces=cache) is None  # the old ones left
    assert len(cache) == 1


def test_accept_declares_the_tools_with_schemas_from_the_hints() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url)
            accept = await fake.offer()
            assert accept["type"] == "session.accept" and accept["session"] == "sess-1"
            assert accept["subscribe"] == ["user_turn"]
            tools = {t["name"]: t for t in accept["tools"]}
            assert set(tools) == {"lookup", "book_table"}  # vip_lounge: offer=False
            lookup = tools["lookup"]
            assert lookup["description"] == "Look a table up."
            assert (lookup["kind"], lookup["timeout_ms"], lookup["filler_after_ms"]) == ("read_only", 3000, 800)
            assert (lookup["repeatable"], lookup["confirm"]) == (False, False)
            p = lookup["parameters"]
            assert p["type"] == "object" and p["additionalProperties"] is False
            assert p["required"] == ["date", "people", "ratio", "vip", "tags", "time"]
            props = p["properties"]
            assert props["date"] == {"type": "string"}
            assert props["people"] == {"type": "integer"}
            assert props["ratio"] == {"type": "number"}
            assert props["vip"] == {"type": "boolean"}
            assert props["tags"] == {"type": "array", "items": {"type": "string"}}
            assert props["time"] == {"type": "string", "enum": ["18:00", "19:00"]}
            assert props["note"] == {"type": ["string", "null"]}
            assert props["size"] == {"type": "integer", "description": "party size", "minimum": 1, "default": 2}
            guest = props["guest"]["anyOf"][0] if "anyOf" in props["guest"] else props["guest"]
            assert guest["properties"]["name"] == {"type": "string"}
            assert guest["required"] == ["name", "phone"]
            slot = props["slot"]
            assert slot["type"] == ["object", "null"]
            assert slot["required"] == ["date", "time"] and slot["description"] == "A date and a time."
            assert slot["properties"]["flexible"] == {"type": "boolean"}
            book = tools["book_table"]
            assert book["kind"] == "side_effect" and book["confirm"] is True
            assert book["parameters"]["required"] == ["name"]
            await fake.close()

    run(main)


def test_bad_signature_is_refused_with_401() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url, secret="wrong")
            with pytest.raises(InvalidStatus) as e:
                await fake.connect()
            assert e.value.response.status_code == 401
            with pytest.raises(InvalidStatus) as e:
                await FakeBrisvox(agent.url).connect(headers={})
            assert e.value.response.status_code == 401

    run(main)


def test_stale_timestamp_is_refused_with_401() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            for t in (int(time.time()) - 31, int(time.time()) + 40):
                with pytest.raises(InvalidStatus) as e:
                    await FakeBrisvox(agent.url).connect(t=t)
                assert e.value.response.status_code == 401
            assert agent.handshakes_refused == {"stale signature": 2}

    run(main)


def test_a_replayed_handshake_is_refused_with_401_and_counted() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            captured = sign(SECRET, "sess-1")
            first = FakeBrisvox(agent.url)
            await first.connect(signature=captured)
            accept = await first.offer()
            assert accept["type"] == "session.accept"
            with pytest.raises(InvalidStatus) as e:
                await FakeBrisvox(agent.url).connect(signature=captured)
            assert e.value.response.status_code == 401 and REPLAYED.encode() in e.value.response.body
            assert agent.handshakes_refused == {REPLAYED: 1}
            second = FakeBrisvox(agent.url, session="sess-2")  # a fresh handshake is fine
            assert (await second.offer())["type"] == "session.accept"

    run(main)


def test_on_session_refuses_or_adds_tools() -> None:
    async def main() -> None:
        agent = make_agent()
        seen: list[Session] = []

        @agent.on_session
        async def decide(session: Session) -> list[str] | None:
            seen.append(session)
            if session.call.params.get("closed"):
                raise Refuse("closed today")
            return ["vip_lounge"] if session.call.params.get("tier") == "gold" else None

        async with agent:
            fake = FakeBrisvox(agent.url, session="s-closed")
            refuse = await fake.offer(call={**CALL, "params": {"closed": True}})
            assert refuse == {"type": "session.refuse", "session": "s-closed", "reason": "closed today"}
            await fake.ws.wait_closed()  # type: ignore[union-attr]
            assert "s-closed" not in agent.sessions

            gold = FakeBrisvox(agent.url, session="s-gold")
            accept = await gold.offer()
            assert {t["name"] for t in accept["tools"]} == {"lookup", "book_table", "vip_lounge"}
            s = seen[-1]
            assert (s.call.caller, s.call.called, s.call.transport, s.call.agent) == \
                ("+4930123", "+4930999", "twilio", "booking")
            assert s.local_tools == ("end_call",)
            await gold.close()

    run(main)


def test_an_offer_for_another_session_than_the_signed_one_is_refused() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            fake = FakeBrisvox(agent.url, session="signed")
            await fake.connect()
            fake.session = "other"
            answer = await fake.offer()
            assert answer["type"] == "session.refuse"

    run(main)


def test_a_redial_resumes_the_session() -> None:
    async def main() -> None:
        async with make_agent() as agent:
            first = FakeBrisvox(agent.url, session="s-r")
            await first.offer()
            agent.sessions["s-r"].state["n"] = 1
            await first.close()
            again = FakeBrisvox(agent.url, session="s-r")
            accept = await again.offer(resume=True)
            assert accept["type"] == "session.accept"
            assert agent.sessions["s-r"].state == {"n": 1} and agent.sessions["s-r"].resume
            await again.close()

    run(main)


def test_bad_declarations_are_refused_where_they_are_written() -> None:
    agent = Agent(secret=SECRET, port=0)

    async def f(ctx: Any) -> None:
        """A tool."""

    for kwargs in ({"name": "bad name"}, {"kind": "write"}, {"timeout_ms": 0}, {"timeout_ms": 30001},
                   {"filler_after_ms": -1}, {"kind": "read_only", "confirm": True},
                   {"kind": "read_only", "repeatable": True},
                   {"parameters": {"type": "array"}}, {"description": ""}):
        with pytest.raises(ValueError):
            agent.tool(**kwargs)(f)
    with pytest.raises(TypeError):
        agent.tool(lambda ctx: None)  # type: ignore[type-var]
    agent.tool(kind="side_effect", confirm=True, repeatable=True)(f)
    with pytest.raises(ValueError):
        agent.tool(f)  # declared twice
    with pytest.raises(ValueError):
        agent.on("dtmf")
    with pytest.raises(ValueError):
        Agent(secret="")
