"""The loop-stall probe: lateness, stall counts, the stack of the code that blocked the loop, /metrics."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from brisvox.daemon.metrics import render
from brisvox.runtime.loop_probe import LoopProbe
from tests.system.daemon_promparse import parse, value


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lateness_is_counted_as_a_stall_over_50_ms_and_logged_over_250_ms_rate_limited(caplog):
    clock = FakeClock()
    p = LoopProbe("gateway-0", clock=clock, log_interval_s=30.0, cpu_wait=lambda: 0.0)
    caplog.set_level(logging.WARNING, logger="brisvox.loop")
    for late in (0.0, 0.01, 0.049, 0.06, 0.3, 0.4):
        p.owe(clock.t)
        clock.t += late
        assert abs(p.paid() - late) < 1e-9
        clock.t += 1.0
    assert p.paid() == 0.0  # nothing owed: nothing measured
    p.owe(clock.t + 1.0)
    assert p.paid(clock.t) == 0.0  # early is on time, never negative
    assert (p.stalls, p.long_stalls) == (3, 2)
    assert p.max_lag_s == pytest.approx(0.4)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "gateway-0: event loop stalled 300 ms" in lines[0]  # the second: rate-limited
    snap = p.snapshot()
    assert snap["lag"]["count"] == 7 and snap["log_suppressed"] == 1
    assert snap["stalls"] == 3 and snap["long_stalls"] == 2


def test_a_stall_spent_waiting_for_a_cpu_is_the_hosts_and_says_so():
    clock = FakeClock()
    waits = iter([0.0, 0.07, 0.2, 0.0])  # what the thread waited for a CPU before each paid
    p = LoopProbe("agent-0", clock=clock, cpu_wait=lambda: next(waits))
    for late in (0.06, 0.1, 0.3, 0.3):
        p.owe(clock.t)
        clock.t += late
        p.paid()
        clock.t += 60.0  # past the log interval: every long stall logs
    # 0.06 with no wait: the loop's; 0.1 with 0.07 waited: the host's (0.03 left);
    # 0.3 with 0.2 waited: 0.1 left, the loop's; 0.3 with none: the loop's
    assert (p.stalls, p.host_stalls) == (4, 1)
    snap = p.snapshot()
    assert snap["stalls"] == 4 and snap["host_stalls"] == 1


def test_the_default_cpu_wait_reads_the_threads_schedstat_when_the_kernel_has_it():
    import os
    import threading

    p = LoopProbe("x")
    first = p.cpu_wait()
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    if not os.path.exists(path):
        assert first == 0.0 and p._sched_fd == -1
        return
    assert p._sched_fd >= 0 and first >= 0.0
    assert 0.0 <= p.cpu_wait() < 1.0  # since the last read: a delta, not the thread's total
    p.close()
    assert p._sched_fd == -1


def block_the_loop_in_a_named_function(seconds: float) -> None:
    time.sleep(seconds)  # stands for any blocking call made on the loop


def test_the_watchdog_logs_the_stack_of_the_function_that_blocked_the_asyncio_loop(caplog):
    caplog.set_level(logging.WARNING, logger="brisvox.loop")

    async def main() -> LoopProbe:
        p = LoopProbe("agent-0").start()
        task = asyncio.get_running_loop().create_task(p.run())
        await asyncio.sleep(0.2)
        block_the_loop_in_a_named_function(0.08)  # a stall, not long enough for a stack
        await asyncio.sleep(0.1)
        block_the_loop_in_a_named_function(0.5)
        await asyncio.sleep(0.1)
        task.cancel()
        p.close()
        return p

    p = asyncio.run(main())
    assert p.stalls == 2 and p.long_stalls == 1 and p.stacks == 1
    assert 0.4 < p.max_lag_s < 0.6
    (line,) = [r.getMessage() for r in caplog.records]
    assert "agent-0: event loop stalled" in line
    stack = line.split("it was running:\n", 1)[1]
    assert "in block_the_loop_in_a_named_function" in stack and "time.sleep(seconds)" in stack
    assert stack.rstrip().splitlines()[-1].strip() == "time.sleep(seconds)  # stands for any blocking call made on the loop"


def test_a_poll_loop_turn_is_probed_from_its_wake_up_to_its_next_wait_and_the_stack_is_its_own(caplog):
    """The supervisor's driver: owe when the poll returns, paid when the turn ends."""
    caplog.set_level(logging.WARNING, logger="brisvox.loop")
    p = LoopProbe("supervisor").start()
    try:
        for seconds in (0.0, 0.3):
            p.owe(time.monotonic())
            block_the_loop_in_a_named_function(seconds)
            p.paid()
            time.sleep(0.1)  # waiting in the poll: nothing owed
    finally:
        p.close()
    assert p.long_stalls == 1 and p.stacks == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "in block_the_loop_in_a_named_function" in line
    assert "test_a_poll_loop_turn_is_probed" in line  # the caller's frame too


def test_every_roles_probe_is_on_metrics_with_its_role_and_index():
    def entry(stalls: int, longs: int, lags: list[float]) -> dict:
        clock = FakeClock()
        p = LoopProbe("x", clock=clock, cpu_wait=lambda: 0.0)
        for v in lags:
            p.owe(clock.t)
            clock.t += v
            p.paid()
        assert (p.stalls, p.long_stalls) == (stalls, longs)
        return p.snapshot()

    snap = {"daemon": {"uptime_s": 1.0, "state": "running", "ready": True, "calls": 0,
                       "loop": entry(0, 0, [0.001])},
            "children": [
                {"role": "gateway", "index": 0, "name": "gateway-0", "state": "ready",
                 "stats": {"loop": entry(1, 0, [0.07, 0.002]), "sent": 3}},
                {"role": "agent", "index": 1, "name": "agent-1", "state": "ready",
                 "stats": {"loop": entry(2, 1, [0.06, 0.3])}},
                {"role": "worker", "index": 0, "name": "worker-0", "state": "ready",
                 "stats": {"loop": {"lag": "bad", "stalls": 1, "host_stalls": 0, "long_stalls": 0, "max_lag_s": 0.0}}},
                {"role": "worker", "index": 1, "name": "worker-1", "state": "starting", "stats": None}]}
    fams = parse(render(snap))
    assert fams["brisvox_loop_stalls_total"]["type"] == "counter"
    assert fams["brisvox_loop_lag_seconds"]["type"] == "histogram"
    assert value(fams, "brisvox_loop_stalls_total", role="gateway", index="0", cause="loop") == 1
    assert value(fams, "brisvox_loop_stalls_total", role="gateway", index="0", cause="host") == 0
    assert value(fams, "brisvox_loop_stalls_total", role="agent", index="1", cause="loop") == 2
    assert value(fams, "brisvox_loop_long_stalls_total", role="agent", index="1") == 1
    assert value(fams, "brisvox_loop_stalls_total", role="supervisor", index="0", cause="loop") == 0
    assert value(fams, "brisvox_loop_lag_max_seconds", role="agent", index="1") == pytest.approx(0.3)
    assert value(fams, "brisvox_loop_lag_seconds_count", role="gateway", index="0") == 2
    assert value(fams, "brisvox_loop_lag_seconds_bucket", role="gateway", index="0", le="0.05") == 1
    labelled = {dict(lb).get("role") for (_, lb) in fams["brisvox_loop_stalls_total"]["samples"]}
    assert labelled == {"supervisor", "gateway", "agent"}  # the malformed and the missing entries: no series
    assert not [k for k in fams["brisvox_child_stat"]["samples"] if "loop" in str(k)]  # typed, not flattened
    assert value(fams, "brisvox_child_stat", role="gateway", index="0", stat="sent") == 3
