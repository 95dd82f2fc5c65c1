"""A table-booking agent service in Python (the remote twin of examples/booking_tools.py).

Run it, then name it in an agent file's ``[agent_link]`` (docs/AGENT_PROTOCOL.md)::

    export BRISVOX_AGENT_SECRET=...            # the same secret as the agent file's secret_env
    pip install -e sdk/python                  # or PYTHONPATH=sdk/python/src
    python -m examples.python_agent.booking_agent --port 9100 --secret-env BRISVOX_AGENT_SECRET

Tools:

* ``check_availability(date, time, people)`` -- ReadOnly (schema derived from the type
  hints): brisvox may run it speculatively and cancels it at a barge-in.
* ``book_table(name, date, time, people)`` -- SideEffect (schema given explicitly). brisvox
  guarantees that ONE tool call never runs twice in a call, but a call can be delivered
  to the service again (a re-dial after a dropped connection), and brisvox does not know
  the business rule "one booking per guest and slot". Both are enforced here, where the
  effect lives: the application key ``sha256(name, date, time)`` is unique in the store
  (a unique constraint in a real database, or a booking API's Idempotency-Key), so a
  second booking for the same guest and slot returns the EXISTING booking with
  ``already_booked: true``, across calls and turns; and ``ctx.idempotency_key`` (stable
  across redeliveries of one tool call) is recorded with it, so a redelivered call is
  recognised even if the guest's details were spelled differently the second time.

The store is in memory, shared by every call of the process (a stand-in for the
database); ``STORE.clear()`` resets it in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

try:
    import brisvox_agent  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e sdk/python`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))

from brisvox_agent import Agent, Event, Refuse, Session, ToolContext, ToolError

log = logging.getLogger("booking_agent")

SLOTS = ("17:00", "18:00", "19:00", "20:00", "21:00")
Slot = Literal["17:00", "18:00", "19:00", "20:00", "21:00"]
CAPACITY = 4  # tables per slot
DATE = {"pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}
PEOPLE = {"minimum": 1, "maximum": 12}


@dataclass
class BookingStore:
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)  # application key -> booking
    by_call: dict[str, str] = field(default_factory=dict)  # ctx.idempotency_key -> application key
    next_id: int = 1001
    writes: int = 0

    def clear(self) -> None:
        self.by_key.clear()
        self.by_call.clear()
        self.next_id = 1001
        self.writes = 0

    def taken(self, date: str, time: str) -> int:
        return sum(1 for b in self.by_key.values() if b["date"] == date and b["time"] == time)

    def book(self, app_key: str, call_key: str, name: str, date: str, time: str, people: int) -> dict[str, Any]:
        # No await in here: on one event loop the check and the write are one step (a
        # database does the same with a unique constraint in one transaction).
        if call_key in self.by_call:  # the same tool call delivered again
            return {**self.by_key[self.by_call[call_key]], "already_booked": True}
        if app_key in self.by_key:  # the same guest and slot, from any call or turn
            self.by_call[call_key] = app_key
            return {**self.by_key[app_key], "already_booked": True}
        if self.taken(date, time) >= CAPACITY:
            raise ToolError(f"no table is free at {time} on {date}; offer another time")
        booking = {"booking": f"BK-{self.next_id}", "name": name, "date": date, "time": time,
                   "people": people}
        self.next_id += 1
        self.writes += 1
        self.by_key[app_key] = booking
        self.by_call[call_key] = app_key
        return dict(booking)


STORE = BookingStore()


def app_key(name: str, date: str, time: str) -> str:
    return hashlib.sha256(f"{name.strip().lower()}|{date}|{time}".encode()).hexdigest()


BOOK_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 80},
                   "date": {"type": "string", **DATE},
                   "time": {"type": "string", "enum": list(SLOTS)},
                   "people": {"type": "integer", **PEOPLE}},
    "required": ["name", "date", "time", "people"],
    "additionalProperties": False,
}


def build_agent(secret: str, *, host: str = "127.0.0.1", port: int = 9100, path: str = "/brisvox",
                store: BookingStore = STORE, write_delay: float = 0.1) -> Agent:
    agent = Agent(secret=secret, host=host, port=port, path=path)

    @agent.tool(kind="read_only", timeout_ms=3000)
    async def check_availability(ctx: ToolContext, date: Annotated[str, DATE], time: Slot,
                                 people: Annotated[int, PEOPLE]) -> dict[str, Any]:
        """Whether a table is free on a date (YYYY-MM-DD) at a time."""
        await asyncio.sleep(0.05)  # the lookup of a real system
        free = CAPACITY - store.taken(date, time)
        return {"date": date, "time": time, "free_tables": max(0, free)}

    @agent.tool(kind="side_effect", timeout_ms=5000, filler_after_ms=1000, parameters=BOOK_SCHEMA,
                description="Book a table for a guest. Ask for the name, date, time and party size first.")
    async def book_table(ctx: ToolContext, name: str, date: str, time: str, people: int) -> dict[str, Any]:
        await asyncio.sleep(write_delay)  # the write of a real system
        return store.book(app_key(name, date, time), ctx.idempotency_key, name, date, time, int(people))

    @agent.on_session
    async def decide(session: Session) -> None:
        if session.call.params.get("closed") in (True, "true", "1"):
            raise Refuse("the restaurant is closed today")
        log.info("call %s from %s to %s", session.call.call_id, session.call.caller, session.call.called)

    @agent.on("tool_outcome")
    async def outcome(session: Session, event: Event) -> None:
        log.info("call %s: %s -> %s", session.call.call_id, event.tool, event.outcome)

    @agent.on("hangup")
    async def hangup(session: Session, event: Event) -> None:
        log.info("call %s ended: %s", session.call.call_id, event.reason)

    return agent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9100)
    ap.add_argument("--path", default="/brisvox")
    ap.add_argument("--secret-env", default="BRISVOX_AGENT_SECRET",
                    help="the environment variable that holds the shared secret")
    args = ap.parse_args(argv)
    secret = os.environ.get(args.secret_env)
    if not secret:
        print(f"booking_agent: set {args.secret_env} to the agent link's shared secret", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = build_agent(secret, host=args.host, port=args.port, path=args.path)
    try:
        asyncio.run(_serve(agent))
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(agent: Agent) -> None:
    """Serve until SIGTERM or SIGINT, then close the server (open calls are closed too)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await agent.serve()


if __name__ == "__main__":
    sys.exit(main())
