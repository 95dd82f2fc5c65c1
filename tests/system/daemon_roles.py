"""Test-only role mains for the supervisor tests (selected with BRISVOX_TEST_ROLE_MAIN).

Each one misbehaves in one specific way, so a test can check how the
supervisor copes. Never registered in brisvox/daemon/roles.py.
"""

from __future__ import annotations

import time

from brisvox.config.errors import ConfigError
from brisvox.daemon.minimal import main as minimal_main
from brisvox.runtime.child_runtime import ChildRuntime


def crash_at_boot(rt: ChildRuntime) -> int:
    raise RuntimeError("deliberate boot crash")


def config_error(rt: ChildRuntime) -> int:
    raise ConfigError("gateway.test_key", "deliberately invalid for the test")


def topology_echo(rt: ChildRuntime) -> int:
    """Minimal main that reports every Topology it receives as a ChildEvent."""
    def on_topology(rows: list[dict]) -> None:
        summary = " ".join(f"{r['role']}-{r['index']}:{r['state']}:{r['pid']}" for r in rows)
        rt.event("topology", summary, {"rows": rows})

    rt.add_topology_callback(on_topology)
    rt.add_shutdown_callback(lambda: rt.event("stopping", rt.stop_reason, {"drain": rt.drain}))
    return minimal_main(rt)


def hang_after_ready(rt: ChildRuntime) -> int:
    """Ready, then the main loop wedges: pongs keep coming but the heartbeat ages."""
    rt.ready()
    while True:
        time.sleep(1)


def ignore_shutdown(rt: ChildRuntime) -> int:
    """Ready and beating, but never looks at rt.stopping (needs SIGTERM/SIGKILL)."""
    rt.ready()
    while True:
        rt.heartbeat()
        time.sleep(0.05)


def slow_boot(rt: ChildRuntime) -> int:
    """Takes 0.7 s before its handshake (READY=1 must wait for it)."""
    time.sleep(0.7)
    return minimal_main(rt)
