"""The booking example: the application key and the per-call idempotency key."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from fake_brisvox import CALL, SECRET, FakeBrisvox, run

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python_agent" / "booking_agent.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("booking_agent_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ARGS = {"name": "Ada", "date": "2025-06-01", "time": "19:00", "people": 2}


def test_the_same_key_twice_books_once_and_the_same_slot_is_already_booked() -> None:
    mod = load()
    store = mod.BookingStore()

    async def main() -> None:
        async with mod.build_agent(SECRET, port=0, store=store, write_delay=0) as agent:
            fake = FakeBrisvox(agent.url)
            accept = await fake.offer()
            tools = {t["name"]: t for t in accept["tools"]}
            assert tools["book_table"]["kind"] == "side_effect"
            assert tools["check_availability"]["kind"] == "read_only"
            avail = tools["check_availability"]["parameters"]["properties"]
            assert avail["time"]["enum"] == list(mod.SLOTS) and avail["people"]["maximum"] == 12

            await fake.call("r1", "book_table", ARGS, key="idem-1")
            first = await fake.expect("tool.result")
            assert first["ok"] and first["result"]["booking"] == "BK-1001"
            assert "already_booked" not in first["result"]
            # the same tool call redelivered (same idempotency key), the name spelled differently
            await fake.call("r2", "book_table", {**ARGS, "name": "Ada L."}, key="idem-1")
            again = await fake.expect("tool.result")
            assert again["result"]["booking"] == "BK-1001" and again["result"]["already_booked"] is True
            assert store.writes == 1

            # another call (another key), the same guest and slot: the existing booking
            other = FakeBrisvox(agent.url, session="sess-2")
            await other.offer()
            await other.call("r1", "book_table", {**ARGS, "name": " ada "}, key="idem-2")
            dup = await other.expect("tool.result")
            assert dup["result"]["booking"] == "BK-1001" and dup["result"]["already_booked"] is True
            assert store.writes == 1

            await other.call("r2", "check_availability", {"date": ARGS["date"], "time": "19:00", "people": 2})
            assert (await other.expect("tool.result"))["result"]["free_tables"] == mod.CAPACITY - 1
            await fake.close()
            await other.close()

    run(main)


def test_a_full_slot_answers_ok_false_and_a_closed_day_refuses_the_call() -> None:
    mod = load()
    store = mod.BookingStore()

    async def main() -> None:
        async with mod.build_agent(SECRET, port=0, store=store, write_delay=0) as agent:
            fake = FakeBrisvox(agent.url)
            await fake.offer()
            for i in range(mod.CAPACITY + 1):
                await fake.call(f"r{i}", "book_table", {**ARGS, "name": f"guest {i}"})
                res = await fake.expect("tool.result")
            assert res["ok"] is False and "no table is free" in res["error"]["message"]
            assert store.writes == mod.CAPACITY
            closed = FakeBrisvox(agent.url, session="sess-closed")
            refuse = await closed.offer(call={**CALL, "params": {"closed": True}})
            assert refuse["type"] == "session.refuse"
            await fake.close()

    run(main)
