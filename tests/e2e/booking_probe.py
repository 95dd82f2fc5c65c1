"""The booking tools of ``examples/booking_tools.py`` as the e2e tests' agent loads them, observable.

Loaded by the agent process (``tool_modules = ["tests.e2e.booking_probe:tools"]``
in the test's agent file). ``tools()`` returns the example's own specs and
tools (the SAME store and idempotency guard), with ``book_table`` wrapped to

* wait ``BRISVOX_E2E_BOOK_DELAY_S`` seconds first while the store holds no
  booking yet (creating a booking is slow, finding an existing one is not),
  so a barge-in lands while the first side effect is in flight, and
* after each run, write the store's own counters to the JSON file named by
  ``BRISVOX_E2E_BOOKING_STATE``: ``writes`` (bookings the store created),
  ``bookings`` (what it holds) and ``runs`` (one row per execution: the
  engine's idempotency key and whether the store answered "already booked").

The test process reads that file: the store lives in the agent process.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from brisvox.agent.tool_engine.registry import Tool, ToolContext, ToolSpec
from examples import booking_tools as bt

_RUNS: list[dict[str, Any]] = []


def _dump() -> None:
    path = os.environ.get("BRISVOX_E2E_BOOKING_STATE", "")
    if not path:
        return
    with bt.STORE.lock:
        state = {"writes": bt.STORE.writes, "bookings": list(bt.STORE.by_key.values()), "runs": list(_RUNS)}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


async def book_table(args: dict[str, Any], ctx: ToolContext) -> Any:
    delay = float(os.environ.get("BRISVOX_E2E_BOOK_DELAY_S", "0") or 0)
    if delay > 0 and bt.STORE.writes == 0:
        await asyncio.sleep(delay)
    key = ctx.idempotency_key()
    try:
        result = await bt.book_table(args, ctx)
    except Exception as e:
        _RUNS.append({"key": f"{key.session}|{key.epoch}|{key.call}", "error": type(e).__name__})
        _dump()
        raise
    _RUNS.append({"key": f"{key.session}|{key.epoch}|{key.call}", "already_booked": bool(result.get("already_booked"))})
    _dump()
    return result


def tools() -> list[tuple[ToolSpec, Tool]]:
    return [(bt.CHECK, bt.check_availability), (bt.BOOK, book_table)]
