"""The loop-stall probe's cost (``brisvox/runtime/loop_probe.py``), per probed asyncio loop.

Figures: an otherwise idle asyncio loop runs ``seconds`` with no probe, then with the
probe's task and its watchdog thread at each interval; the process CPU time
(``time.process_time``: every thread) per wall second, minus the bare loop's, is the
probe's cost: microseconds of CPU per second and the share of one core. The last
figure is the cost of ``owe`` + ``paid`` (the timer and poll drivers: once per tick
or per turn), per call pair.

Target: the chosen interval (:data:`brisvox.runtime.loop_probe.INTERVAL_S`) costs
under 0.5 % of a core per process on this shared 2-core host (less on an idle one).
"""

from __future__ import annotations

import asyncio
import time

from brisvox.runtime.loop_probe import INTERVAL_S, LoopProbe

Row = tuple[str, float, str, str]


def _cpu_per_s(seconds: float, interval: float | None) -> float:
    """CPU seconds per wall second of an asyncio loop idle for ``seconds`` (probed at ``interval``)."""

    async def main() -> float:
        probe = LoopProbe("bench", interval_s=interval).start() if interval is not None else None
        task = asyncio.get_running_loop().create_task(probe.run()) if probe is not None else None
        await asyncio.sleep(0.2)  # warm
        c0, w0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        c1, w1 = time.process_time(), time.monotonic()
        if task is not None and probe is not None:
            task.cancel()
            probe.close()
        return (c1 - c0) / (w1 - w0)

    return asyncio.run(main())


def _owe_paid_ns(n: int) -> float:
    p = LoopProbe("bench")
    clock = time.monotonic
    t0 = time.perf_counter_ns()
    for _ in range(n):
        p.owe(clock())
        p.paid()
    return (time.perf_counter_ns() - t0) / n


def run(quick: bool = False) -> list[Row]:
    seconds = 2.0 if quick else 10.0
    bare = min(_cpu_per_s(seconds, None) for _ in range(1 if quick else 2))
    rows: list[Row] = [("idle asyncio loop, no probe", bare * 1e6, "us CPU/s", "")]
    for interval in (0.01, 0.025, 0.05, 0.1):
        cost = max(0.0, _cpu_per_s(seconds, interval) - bare)
        mark = " (chosen)" if interval == INTERVAL_S else ""
        rows.append((f"probe every {interval * 1000:.0f} ms{mark}: CPU above the bare loop", cost * 1e6,
                     "us CPU/s", "< 5000" if mark else ""))
        rows.append((f"probe every {interval * 1000:.0f} ms{mark}: share of one core", cost * 100, "%",
                     "< 0.5" if mark else ""))
    rows.append(("owe + paid (timer and poll drivers), per pair", _owe_paid_ns(20_000 if quick else 200_000), "ns",
                 ""))
    return rows
