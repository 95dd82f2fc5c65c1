"""The injected clock: every timeout and every timestamp in a call goes through it.

Owns the notion of "now" for asyncio code. :class:`LoopClock` reads the running
event loop's time, so the same code runs on the real clock in the daemon and on
virtual time under :class:`brisvox.sim.vloop.VirtualEventLoop` in the
simulation suite, with no other change.

Invariants:

* ``now()`` is monotonic seconds (float); it never goes backwards.
* ``sleep_until(t)`` returns at or after ``t`` and never earlier.
* ``timeout(d)`` is ``asyncio.timeout`` on the same clock: a deadline on
  virtual time in the sim, on the loop's monotonic clock in the daemon.
* Cross-process timestamps are not this clock: they use
  ``time.monotonic_ns()`` (see ``ipc/frames.py``).
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def sleep_until(self, deadline: float) -> None: ...

    def timeout(self, seconds: float | None) -> asyncio.Timeout: ...


class LoopClock:
    """Clock of the running asyncio loop (real or virtual)."""

    __slots__ = ()

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while (left := deadline - loop.time()) > 0:  # noqa: ASYNC110 (a deadline, not a flag)
            await asyncio.sleep(left)

    def timeout(self, seconds: float | None) -> asyncio.Timeout:
        return asyncio.timeout(seconds)

    def timeout_at(self, deadline: float | None) -> asyncio.Timeout:
        return asyncio.timeout_at(deadline)


CLOCK = LoopClock()
