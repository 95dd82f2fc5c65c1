"""Tools for simulated calls, with body counters (the exactly-once checks).

Owns :class:`SimTools`: ``get_weather`` (ReadOnly, 0.3 s), ``book_table``
(SideEffect, ``book_seconds``, counts every body run), ``slow_lookup``
(ReadOnly, ``lookup_seconds``). Timing is on the loop clock (virtual in the sim).
"""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.agent.tool_engine.registry import ToolContext, ToolKind, ToolRegistry, ToolSpec

OBJ = {"type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": True}
BOOK = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "people": {"type": "integer"}},
    "required": ["name"],
}


class SimTools:
    def __init__(self, book_seconds: float = 2.5, lookup_seconds: float = 0.3) -> None:
        self.book_seconds = book_seconds
        self.lookup_seconds = lookup_seconds
        self.bodies: dict[str, int] = {"get_weather": 0, "book_table": 0, "slow_lookup": 0}
        self.bookings: list[str] = []

    async def get_weather(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        self.bodies["get_weather"] += 1
        await asyncio.sleep(0.3)
        return {"city": args.get("city", "?"), "sky": "sunny", "celsius": 21}

    async def book_table(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        self.bodies["book_table"] += 1
        await asyncio.sleep(self.book_seconds)
        ref = f"BK-{1000 + len(self.bookings) + 1}"
        self.bookings.append(ref)
        return {"booked": True, "ref": ref, "name": args.get("name")}

    async def slow_lookup(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        self.bodies["slow_lookup"] += 1
        await asyncio.sleep(self.lookup_seconds)
        return {"found": True}

    def registry(self) -> ToolRegistry:
        r = ToolRegistry()
        r.register(ToolSpec("get_weather", "Current weather in a city.", OBJ, ToolKind.READ_ONLY, timeout=3.0), self.get_weather)
        r.register(
            ToolSpec("book_table", "Book a table.", BOOK, ToolKind.SIDE_EFFECT, timeout=5.0), self.book_table
        )
        r.register(
            ToolSpec("slow_lookup", "A slow lookup.", OBJ, ToolKind.READ_ONLY, timeout=8.0), self.slow_lookup
        )
        return r
