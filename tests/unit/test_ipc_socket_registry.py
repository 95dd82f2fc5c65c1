"""ipc's registry of the sockets it opened (``ipc.bus.SOCKETS``) and the exit it serves.

* every socket made by ``make_socket`` is registered with its type, the endpoints
  ``bind``/``connect`` gave it and where it was made, until it is closed; a shadow
  context's sockets count for the context it shadows;
* a socket deliberately left open on an asyncio shadow context is NAMED in the child's
  "did not terminate" warning;
* an agent process that exits cleanly leaves no socket open and terminates its context
  with no warning, even when a Topology push (a worker or gateway ready) lands after its
  links were closed: the push used to open a DEALER on the shadow context that nobody
  closed, and the process's ZeroMQ term then waited for it."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from ipc.bus import SOCKETS, bind, connect, describe_open, make_socket

HERE = f"{Path(__file__).parent.name}/{Path(__file__).name}"


def _runtime(tmp: Path, role: str = "agent") -> Any:
    from brisvox.config.daemon import DaemonConfig
    from brisvox.daemon.child import ChildSpec, ForkedChildRuntime

    return ForkedChildRuntime(ChildSpec(role=role, index=0, config=DaemonConfig(), runtime_dir=tmp,
                                        instance="t", parent_pid=os.getpid(), main_ref="x:y"))


def test_a_socket_is_registered_with_its_type_endpoints_and_maker(short_tmp: Path) -> None:
    ctx = zmq.Context()
    other = zmq.Context()
    try:
        inbox = make_socket(ctx, zmq.ROUTER)
        bind(inbox, f"ipc://{short_tmp}/in.sock")
        shadow = zmq.asyncio.Context.shadow(ctx.underlying)
        dealer = make_socket(shadow, zmq.DEALER)
        connect(dealer, f"ipc://{short_tmp}/peer.sock")
        elsewhere = make_socket(other, zmq.PAIR)
        got = {s.kind: s for s in SOCKETS.still_open(ctx)}
        assert set(got) == {"ROUTER", "DEALER"}  # the shadow's DEALER counts; the other context's PAIR not
        assert got["ROUTER"].endpoints == (f"bind ipc://{short_tmp}/in.sock",)
        assert got["DEALER"].endpoints == (f"connect ipc://{short_tmp}/peer.sock",)
        assert got["DEALER"].created_by.startswith(HERE + ":")
        assert got["DEALER"].created_by.endswith(" test_a_socket_is_registered_with_its_type_endpoints_and_maker")
        assert f"DEALER connect ipc://{short_tmp}/peer.sock made at {HERE}:" in describe_open(ctx)
        dealer.close(0)
        assert [s.kind for s in SOCKETS.still_open(ctx)] == ["ROUTER"]
        inbox.close(0)
        assert SOCKETS.still_open(ctx) == [] and describe_open(ctx) == "none registered"
        elsewhere.close(0)
    finally:
        ctx.destroy(linger=0)
        other.destroy(linger=0)


def test_the_exit_warning_names_the_socket_left_open(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    rt = _runtime(short_tmp)
    shadow = zmq.asyncio.Context.shadow(rt.zmq_context().underlying)
    leaked = make_socket(shadow, zmq.DEALER)  # deliberately never closed before the exit
    connect(leaked, f"ipc://{short_tmp}/nobody.sock")
    with caplog.at_level("WARNING"):
        rt.close(timeout=0.5)
    msgs = [r.getMessage() for r in caplog.records if "did not terminate" in r.getMessage()]
    assert len(msgs) == 1, msgs
    assert f"sockets still open: DEALER connect ipc://{short_tmp}/nobody.sock made at {HERE}:" in msgs[0]
    assert "test_the_exit_warning_names_the_socket_left_open" in msgs[0]
    leaked.close(0)


def test_an_agent_that_exits_cleanly_leaves_no_socket_and_no_warning(short_tmp: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from brisvox.agent.host.config import AgentsConfig, CallsConfig
    from brisvox.agent.host.process import AgentProcess

    rt = _runtime(short_tmp)
    rt.topology = [{"role": "worker", "index": 0, "pid": 1, "state": "ready"}]
    rt.topology_seq = 1
    ctx = rt.zmq_context()
    proc = AgentProcess(rt, AgentsConfig(), CallsConfig(), None)
    late = [{"role": "worker", "index": 0, "pid": 1, "state": "ready"},
            {"role": "worker", "index": 1, "pid": 2, "state": "ready"},
            {"role": "gateway", "index": 0, "pid": 3, "state": "ready"}]

    async def main() -> None:
        run = asyncio.get_running_loop().create_task(proc.run())
        for _ in range(500):  # ready within 5 s
            if rt.is_ready:
                break
            await asyncio.sleep(0.01)
        assert {s.kind for s in SOCKETS.still_open(ctx)} == {"ROUTER", "DEALER"}  # inbox, worker-0 link
        rt._begin_stop("test", False, 0.0)
        async with asyncio.timeout(5):
            assert await run == 0
        for cb in rt._topology_cbs:
            rt._call(cb, late)  # a push after the links closed, before the loop ends
        await asyncio.sleep(0.05)

    try:
        asyncio.run(main())
    finally:
        gc.unfreeze()  # the agent froze the collector's view of everything alive at its start
    assert SOCKETS.still_open(ctx) == []
    with caplog.at_level(logging.WARNING):
        rt.close(timeout=1.0)
    assert not [r for r in caplog.records if "did not terminate" in r.getMessage()]
