"""Give a role's freed memory back to the kernel once it has no call left.

Owns :func:`release_memory` and :class:`IdleTrim`. After a peak of calls a
process keeps the heap pages the calls' objects freed (glibc keeps freed
chunks in its arenas; CPython's collector may not have run for the last
cycles), so its resident size stays at the peak's high-water mark. When the
last call of a role ends, that memory is given back: a full garbage
collection, then glibc ``malloc_trim(0)`` (which returns every free page of
every arena to the kernel, not only the top of the heap).

Invariants:

* It only runs while the role has no call: the collection and the trim
  cost milliseconds that no call's loop or tick may pay. :class:`IdleTrim`
  runs it ``delay_s`` after the count of calls dropped to zero, once per
  idle period (a call arriving first cancels it); :class:`ThreadIdleTrim`
  does the same from the worker's tick thread, which has no loop.
* Without glibc (``malloc_trim`` missing) only the collection runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _trim = getattr(_libc, "malloc_trim", None)
except OSError:  # pragma: no cover - not glibc
    _libc, _trim = None, None


def release_memory() -> bool:
    """A full collection, then ``malloc_trim(0)``; True when the trim gave memory back."""
    gc.collect()
    if _trim is None:
        return False
    return bool(_trim(0))


def freeze_startup_heap() -> None:
    """Move everything alive once a role is ready (modules, schemas, numpy, zmq: about 46,000
    tracked objects in an agent process) out of the cyclic collector's reach, so a full
    collection scans only what the calls allocated (about 3,000 tracked objects per live call
    in an agent; at 100 calls in one agent process a full collection still pauses the loop
    80-190 ms, which is why the benchmark runs two agent processes: docs/BENCHMARKS.md). Every
    role calls it once, after its ready: the agents, the gateway and the workers (whose tick
    thread's pause is every call's). Garbage at that moment is collected first, so nothing
    collectable is frozen."""
    gc.collect()
    gc.freeze()


class IdleTrim:
    """Run :func:`release_memory` ``delay_s`` after a role's last call ended (see the module
    docstring). ``note(calls)`` after every change of the number of calls."""

    __slots__ = ("delay_s", "_handle", "runs")

    def __init__(self, delay_s: float = 2.0) -> None:
        self.delay_s = delay_s
        self._handle: asyncio.TimerHandle | None = None
        self.runs = 0

    def note(self, calls: int) -> None:
        if calls > 0:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            return
        if self._handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a role driven by hand in a test): nothing to schedule on
                return
            self._handle = loop.call_later(self.delay_s, self._run)

    def _run(self) -> None:
        self._handle = None
        self.runs += 1
        release_memory()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class ThreadIdleTrim:
    """The worker's variant (its tick thread has no loop): :meth:`poll` from the thread's
    own periodic step; the release runs once per idle period, ``delay_s`` into it."""

    __slots__ = ("delay_s", "_since", "_done", "runs")

    def __init__(self, delay_s: float = 2.0) -> None:
        self.delay_s = delay_s
        self._since: float | None = None
        self._done = False
        self.runs = 0

    def poll(self, calls: int, now: float) -> None:
        if calls > 0:
            self._since, self._done = None, False
            return
        if self._since is None:
            self._since = now
        elif not self._done and now - self._since >= self.delay_s:
            self._done = True
            self.runs += 1
            release_memory()
