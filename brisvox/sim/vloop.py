"""Virtual time for asyncio: time advances only when every task is idle.

Owns the simulation's notion of time. :class:`VirtualEventLoop` is a normal
selector event loop whose ``time()`` is virtual. When the loop would block
waiting for the next timer, it polls real file descriptors without waiting
and, if nothing is ready, jumps virtual time straight to that timer. So a
60-minute call runs in seconds, and ordering is a pure function of the code
and the seeds (deterministic fingerprints).

Invariants:

* Virtual time never moves while any callback is ready: a task that is
  runnable always runs before time advances.
* Virtual time only jumps to the next scheduled timer, never past it.
* A loop with no timers, no ready callbacks and no real I/O is deadlocked:
  ``select`` raises :class:`VirtualDeadlock` instead of hanging the test.
* Real I/O (sockets, pipes) still works but does not advance virtual time;
  tests that mix both should keep real I/O out of the timed path.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualDeadlock(RuntimeError):
    """Every task waits on something that no timer and no I/O will ever wake."""


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualEventLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            # Only the loop's own self-pipe may be registered; nothing can wake us.
            if len(self.get_map()) <= 1:
                raise VirtualDeadlock(f"virtual deadlock at t={self._vloop.time():.6f}s")
            return super().select(None)
        self._vloop._advance(timeout)
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop on virtual time starting at ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        self._vtime = start
        super().__init__(_VirtualSelector(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vtime

    def _advance(self, dt: float) -> None:
        if dt > 0:
            self._vtime += dt


def run_virtual(main: Callable[[], Awaitable[T]], start: float = 0.0) -> T:
    """Run ``main()`` to completion on a fresh virtual loop; close it after."""
    loop = VirtualEventLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
