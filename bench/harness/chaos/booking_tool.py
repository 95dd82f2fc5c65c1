"""The chaos agents' ``book_table``: a SideEffect tool that POSTs to the run's booking API.

Named in the chaos agent files as ``tool_modules =
["bench.harness.chaos.booking_tool:tools"]`` (or ``:slow_tools``, whose
bookings the API answers after 3 s). The API's address comes from
``BRISVOX_CHAOS_BOOKING_URL`` (the daemon's environment, inherited by the
agent processes). Each POST carries ``Idempotency-Key:
ctx.idempotency_key().hex()`` -- the engine's (session, epoch, call id) key --
so the API can count bodies per key: a redelivery of one tool call would
show up as a second body under the same key, a second booking of one call
as a second key of the same session.

Invariants: one HTTP request per run of the tool, on a fresh loopback
connection, bounded by the tool's timeout (the engine's) and by
``HTTP_TIMEOUT_S``; the result is the API's JSON (``booking``,
``already_booked``); a refused or broken request raises ToolError.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import urlparse

import orjson

from brisvox.agent.tool_engine.registry import Tool, ToolContext, ToolError, ToolKind, ToolSpec

HTTP_TIMEOUT_S = 10.0

SPEC = ToolSpec(
    "book_table", "Book a table for a guest (name, date YYYY-MM-DD, time HH:MM, party size).",
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 80},
                                      "date": {"type": "string"}, "time": {"type": "string"},
                                      "people": {"type": "integer", "minimum": 1, "maximum": 12}},
     "required": ["name", "date", "time", "people"], "additionalProperties": False},
    ToolKind.SIDE_EFFECT, timeout=5.0, filler_after=None,
)


async def post_booking(path: str, args: dict[str, Any], key: str) -> Any:
    base = urlparse(os.environ.get("BRISVOX_CHAOS_BOOKING_URL", ""))
    if not base.hostname or not base.port:
        raise ToolError("the booking API is not configured (BRISVOX_CHAOS_BOOKING_URL)")
    body = orjson.dumps(args)
    head = (f"POST {path} HTTP/1.1\r\nHost: {base.hostname}:{base.port}\r\nContent-Type: application/json\r\n"
            f"Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    async with asyncio.timeout(HTTP_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(base.hostname, base.port)
        try:
            writer.write(head + body)
            await writer.drain()
            status = (await reader.readline()).split(b" ", 2)
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            data = b""
            while True:  # chunked
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                data += await reader.readexactly(size)
                await reader.readline()
        finally:
            writer.close()
    if len(status) < 2 or status[1] != b"200":
        raise ToolError(f"the booking API answered {status[1:2]!r}")
    return orjson.loads(data)


def _tool(path: str) -> Tool:
    async def book_table(args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            return await post_booking(path, args, ctx.idempotency_key().hex())
        except (OSError, TimeoutError, ValueError) as e:
            raise ToolError(f"the booking API failed: {type(e).__name__}") from None

    return book_table


def tools() -> list[tuple[ToolSpec, Tool]]:
    return [(SPEC, _tool("/bookings"))]


def slow_tools() -> list[tuple[ToolSpec, Tool]]:
    return [(SPEC, _tool("/slow/bookings"))]
