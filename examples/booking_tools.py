"""Example application tools: a table booking with its OWN idempotency guard.

Named in an agent file as ``tool_modules = ["../../examples/booking_tools.py:tools"]``
(configs/agents/booking.toml). ``tools()`` returns ``(ToolSpec, tool)`` pairs:

* ``check_availability(date, time, people)`` -- ReadOnly: may run
  speculatively and is cancelled at a barge-in.
* ``book_table(name, date, time, people)`` -- SideEffect. The engine already
  guarantees that ONE tool call never runs twice in a call (docs/TOOLS.md,
  what "never twice" covers); it does not know the business rule "one booking per
  guest and slot". That rule is enforced here, where the effect lives: the
  application key ``sha256(name, date, time)`` is unique in the store (a
  unique constraint in a real database, or the Idempotency-Key of a booking
  API), and a second booking with the same key returns the EXISTING booking
  with ``already_booked: true``, across calls and turns. The engine's own
  ``ctx.idempotency_key()`` is recorded too: a redelivered call is recognised
  even if the guest's details were spelled differently.

The store is in memory and shared by every call of the process (a stand-in
for the database); ``STORE.clear()`` resets it in tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from brisvox.agent.tool_engine.registry import Tool, ToolContext, ToolError, ToolKind, ToolSpec

SLOTS = ("17:00", "18:00", "19:00", "20:00", "21:00")
CAPACITY = 4  # tables per slot


@dataclass
class BookingStore:
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_call: dict[str, str] = field(default_factory=dict)  # engine idempotency key -> app key
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_id: int = 1001
    writes: int = 0

    def clear(self) -> None:
        with self.lock:
            self.by_key.clear()
            self.by_call.clear()
            self.next_id = 1001
            self.writes = 0

    def taken(self, date: str, time: str) -> int:
        return sum(1 for b in self.by_key.values() if b["date"] == date and b["time"] == time)

    def book(self, app_key: str, call_key: str, name: str, date: str, time: str, people: int) -> dict[str, Any]:
        with self.lock:
            if call_key in self.by_call:  # the same tool call delivered again
                return {**self.by_key[self.by_call[call_key]], "already_booked": True}
            if app_key in self.by_key:  # the same guest and slot, from any call or turn
                self.by_call[call_key] = app_key
                return {**self.by_key[app_key], "already_booked": True}
            if self.taken(date, time) >= CAPACITY:
                raise ToolError(f"no table is free at {time} on {date}; offer another time")
            booking = {"booking": f"BK-{self.next_id}", "name": name, "date": date, "time": time, "people": people}
            self.next_id += 1
            self.writes += 1
            self.by_key[app_key] = booking
            self.by_call[call_key] = app_key
            return dict(booking)


STORE = BookingStore()


def app_key(name: str, date: str, time: str) -> str:
    return hashlib.sha256(f"{name.strip().lower()}|{date}|{time}".encode()).hexdigest()


SLOT_ARGS = {
    "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
    "time": {"type": "string", "enum": list(SLOTS)},
    "people": {"type": "integer", "minimum": 1, "maximum": 12},
}

CHECK = ToolSpec(
    "check_availability", "Whether a table is free on a date (YYYY-MM-DD) at a time.",
    {"type": "object", "properties": SLOT_ARGS, "required": ["date", "time", "people"],
     "additionalProperties": False},
    ToolKind.READ_ONLY, timeout=3.0,
)
BOOK = ToolSpec(
    "book_table", "Book a table for a guest. Ask for the name, date, time and party size first.",
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 80}, **SLOT_ARGS},
     "required": ["name", "date", "time", "people"], "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=5.0, filler_after=1.0,
)


async def check_availability(args: dict[str, Any], ctx: ToolContext) -> Any:
    await asyncio.sleep(0.05)  # the lookup of a real system
    free = CAPACITY - STORE.taken(args["date"], args["time"])
    return {"date": args["date"], "time": args["time"], "free_tables": max(0, free)}


async def book_table(args: dict[str, Any], ctx: ToolContext) -> Any:
    await asyncio.sleep(0.1)  # the write of a real system
    key = ctx.idempotency_key()
    return STORE.book(app_key(args["name"], args["date"], args["time"]),
                      f"{key.session}|{key.epoch}|{key.call}", args["name"], args["date"], args["time"],
                      int(args["people"]))


def tools() -> list[tuple[ToolSpec, Tool]]:
    return [(CHECK, check_availability), (BOOK, book_table)]
