"""Restart policy and health verdicts of the supervisor (pure state, no processes)."""

from __future__ import annotations

import signal

from brisvox.config.daemon import RestartPolicy
from brisvox.daemon.slots import Slot, State, StormTracker, hung_reason, memory_verdict, on_exit
from brisvox.runtime import exitcodes

POLICY = RestartPolicy(backoff_initial_s=0.1, backoff_max_s=1.0, backoff_reset_s=60.0, boot_failures_max=3,
                       storm_restarts=100, storm_window_s=60.0, storm_delay_s=10.0)


def booted(slot: Slot, now: float, pid: int = 10) -> None:
    slot.on_spawn(pid, now)
    slot.on_ready(now, None)


def test_crash_after_ready_restarts_with_doubling_backoff_capped():
    s, storm = Slot("worker", 1), StormTracker()
    delays = []
    for i in range(6):
        booted(s, i * 1.0)
        d = on_exit(s, -signal.SIGKILL, i * 1.0 + 0.5, POLICY, storm)
        assert d.action == "restart" and not d.boot_failure
        assert s.state is State.EXITED and s.next_start_at == i * 1.0 + 0.5 + d.delay_s
        delays.append(round(d.delay_s, 3))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert s.restarts == 5 and s.incarnations == 6
    assert s.last_exit == "killed by SIGKILL"


def test_backoff_resets_after_a_long_healthy_run():
    s, storm = Slot("agent", 0), StormTracker()
    for i in range(3):
        booted(s, i)
        on_exit(s, 1, i + 0.1, POLICY, storm)
    assert s.backoff_s == 0.4
    booted(s, 10.0)
    d = on_exit(s, 1, 10.0 + 61.0, POLICY, storm)
    assert d.delay_s == 0.1


def test_boot_failures_in_a_row_mark_the_slot_failed():
    s, storm = Slot("worker", 0), StormTracker()
    s.on_spawn(1, 0.0)
    assert on_exit(s, exitcodes.BOOT, 0.1, POLICY, storm).action == "restart"
    s.on_spawn(2, 0.2)
    s.error = "boom"  # Hello ok=False
    assert on_exit(s, exitcodes.BOOT, 0.3, POLICY, storm).boot_failure
    s.on_spawn(3, 0.4)
    d = on_exit(s, -signal.SIGSEGV, 0.5, POLICY, storm)
    assert d.action == "failed" and s.state is State.FAILED and s.next_start_at is None
    assert s.boot_failures == 3


def test_a_successful_boot_resets_the_boot_failure_count():
    s, storm = Slot("worker", 0), StormTracker()
    for t in (0.0, 1.0):
        s.on_spawn(1, t)
        on_exit(s, exitcodes.BOOT, t + 0.1, POLICY, storm)
    booted(s, 2.0)
    assert s.boot_failures == 0
    on_exit(s, 1, 3.0, POLICY, storm)
    s.on_spawn(2, 4.0)
    assert on_exit(s, exitcodes.BOOT, 4.1, POLICY, storm).action == "restart"


def test_config_error_exit_is_reported_and_not_restarted():
    s = Slot("gateway", 0)
    s.on_spawn(1, 0.0)
    d = on_exit(s, exitcodes.CONFIG, 0.1, POLICY, StormTracker())
    assert d.action == "config_error" and s.next_start_at is None


def test_retired_slot_is_not_restarted():
    s = Slot("worker", 0)
    booted(s, 0.0)
    s.retired = True
    assert on_exit(s, 0, 1.0, POLICY, StormTracker()).action == "retired"
    assert s.next_start_at is None


def test_restart_storm_damps_every_restart():
    policy = RestartPolicy(backoff_initial_s=0.1, storm_restarts=3, storm_window_s=10.0, storm_delay_s=5.0)
    storm = StormTracker()
    slots = [Slot("worker", i) for i in range(5)]
    delays = []
    for i, s in enumerate(slots):
        booted(s, float(i) * 0.1, pid=100 + i)
        delays.append(on_exit(s, 1, float(i) * 0.1 + 0.05, policy, storm).delay_s)
    assert delays[:3] == [0.1, 0.1, 0.1] and delays[3:] == [5.0, 5.0]
    # outside the window the storm is over
    s = slots[0]
    booted(s, 100.0)
    assert on_exit(s, 1, 100.1, policy, storm).delay_s < 5.0


def test_hung_reasons():
    s = Slot("agent", 0)
    booted(s, 0.0)
    s.last_pong_at = 0.0
    assert hung_reason(s, 1.0, 5.0, 10.0) is None
    assert "no pong" in hung_reason(s, 5.5, 5.0, 10.0)
    s.last_pong_at = 5.4
    s.beat_ms = 10_500
    assert "heartbeat" in hung_reason(s, 5.5, 5.0, 10.0)
    s.state = State.STARTING
    assert hung_reason(s, 100.0, 5.0, 10.0) is None


def test_memory_verdicts():
    mib = 1 << 20
    assert memory_verdict(None, 1, 2) == "ok"
    assert memory_verdict(100 * mib, 0, 0) == "ok"
    assert memory_verdict(100 * mib, 50, 0) == "warn"
    assert memory_verdict(100 * mib, 50, 99) == "limit"
    assert memory_verdict(100 * mib, 0, 200) == "ok"


def test_topology_row():
    s = Slot("worker", 3)
    booted(s, 0.0, pid=42)
    assert s.row() == {"role": "worker", "index": 3, "pid": 42, "state": "ready"}
    assert s.name == "worker-3"


def test_topology_row_carries_what_the_incarnation_measured_and_a_new_one_starts_clean():
    from ipc.codec import decode, encode
    from ipc.frames import Hello

    hello = decode(encode(Hello(role="worker", index=1, pid=7, endpoints={"inbox": "ipc:///x"},
                                measured={"smart_turn_ms": 27.5})))
    s = Slot("worker", 1)
    s.on_spawn(7, 0.0)
    s.on_ready(1.0, hello.endpoints, {**hello.measured, "bad": "x", "flag": True})  # numbers only
    assert s.row()["measured"] == {"smart_turn_ms": 27.5}
    s.on_spawn(8, 2.0)  # the next incarnation has measured nothing yet
    assert "measured" not in s.row()
    s.on_ready(3.0, None)
    assert "measured" not in s.row()


def test_a_topology_for_a_closed_loop_reaches_no_one_and_logs_nothing(tmp_path, caplog):
    """A Topology that arrives while a role's loop is closing (its peers are stopping too) is
    dropped quietly; an open loop gets the rows through call_soon_threadsafe."""
    import asyncio
    import os

    from brisvox.config.daemon import DaemonConfig
    from brisvox.daemon.child import ChildSpec, ForkedChildRuntime

    rt = ForkedChildRuntime(ChildSpec(role="gateway", index=0, config=DaemonConfig(), runtime_dir=tmp_path,
                                instance="t", parent_pid=os.getpid(), main_ref="x:y"))
    got: list[list[dict]] = []
    loop = asyncio.new_event_loop()
    rt.add_topology_callback(got.append, loop=loop)
    rows = [{"role": "agent", "index": 0, "pid": 1, "state": "ready"}]
    for cb in rt._topology_cbs:
        rt._call(cb, rows)
    loop.run_until_complete(asyncio.sleep(0))
    assert got == [rows]
    loop.close()
    with caplog.at_level("ERROR"):
        for cb in rt._topology_cbs:
            rt._call(cb, rows)
    assert got == [rows] and not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_socket_left_open_on_a_shadow_context_cannot_hold_the_exit(tmp_path, caplog):
    """ZeroMQ's term() waits for every socket of the context; one made through an asyncio
    shadow and never closed (seen: an agent stuck at exit after calls) is bounded by close()."""
    import os
    import time

    import zmq
    import zmq.asyncio

    from brisvox.config.daemon import DaemonConfig
    from brisvox.daemon.child import ChildSpec, ForkedChildRuntime

    rt = ForkedChildRuntime(ChildSpec(role="agent", index=0, config=DaemonConfig(), runtime_dir=tmp_path,
                                instance="t", parent_pid=os.getpid(), main_ref="x:y"))
    shadow = zmq.asyncio.Context.shadow(rt.zmq_context().underlying)
    leaked = shadow.socket(zmq.DEALER)  # never closed
    leaked.connect("ipc://" + str(tmp_path / "nobody.sock"))
    t0 = time.monotonic()
    with caplog.at_level("WARNING"):
        rt.close(timeout=0.5)
    assert time.monotonic() - t0 < 2.0
    assert any("did not terminate" in r.getMessage() for r in caplog.records)
    leaked.close(0)


def test_a_topology_pushed_before_the_callback_is_registered_is_replayed(tmp_path):
    """Seen in a fresh clone: the agent read ``rt.topology``, the worker's ``ready`` push landed,
    then the agent registered its callback: it never learnt of the worker and refused the first
    call (``no_worker``). Registration now replays what was received, under the push lock."""
    import asyncio
    import os
    from types import SimpleNamespace

    from brisvox.config.daemon import DaemonConfig
    from brisvox.daemon.child import ChildSpec, ForkedChildRuntime
    from ipc import frames

    rt = ForkedChildRuntime(ChildSpec(role="agent", index=0, config=DaemonConfig(), runtime_dir=tmp_path,
                                instance="t", parent_pid=os.getpid(), main_ref="x:y"))
    push = rt.control_frame_handlers()[frames.Topology]
    sock = SimpleNamespace(send=lambda data, flags=0: None)
    plain: list[list[dict]] = []
    rt.add_topology_callback(plain.append)  # nothing received yet: nothing replayed
    assert plain == []
    ready = [{"role": "worker", "index": 0, "pid": 1, "state": "ready"}]
    push(sock, frames.Topology(children=ready, seq=1))
    loop = asyncio.new_event_loop()
    try:
        on_loop: list[list[dict]] = []
        rt.add_topology_callback(on_loop.append, loop=loop)  # registered after the push
        late: list[list[dict]] = []
        rt.add_topology_callback(late.append)
        loop.run_until_complete(asyncio.sleep(0))
        assert on_loop == [ready] and late == [ready] and plain == [ready]
        gone = [{"role": "worker", "index": 0, "pid": 1, "state": "exited"}]
        push(sock, frames.Topology(children=gone, seq=2))
        loop.run_until_complete(asyncio.sleep(0))
        assert on_loop == [ready, gone] and late == [ready, gone]
    finally:
        loop.close()
        rt.close(timeout=0.5)
