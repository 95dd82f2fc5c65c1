"""A call whose agent side never starts is released once its transport ends, whatever the
order: the agent process died during CallStart (ConnectionError), timed out, or refused, and
the leg closed inside on_ready or later. It used to stay in the table with its four rings for
good (the transport's end saw the state "starting" and left the release to the start task,
which had already finished). Real call table and rings; the agent process is a stub."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from brisvox.gateway.config import GatewaySettings
from brisvox.gateway.transports import assemble
from ipc import frames as F


class Leg:
    transport = "native"
    marks_by_echo = False
    can_send = True

    def hangup(self, reason: str) -> None:
        pass


def segments(instance: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"brisvox.{instance}.*"))


async def _start(reply: object, close_in_on_ready: bool) -> tuple[int, list[str], dict[str, int]]:
    instance = f"fs{os.getpid()}"
    core = assemble(GatewaySettings(), instance=instance)
    core.loop = asyncio.get_running_loop()
    core.peer_load.agents["agent-1"] = 0
    core.peer_load.workers[0] = 0

    async def request(peer: str, frame: F.Frame, wait_s: float) -> F.Frame:
        if isinstance(reply, BaseException):
            raise reply
        return reply  # type: ignore[return-value]

    core.links.request = request  # type: ignore[method-assign]
    core.links.send = lambda peer, frame, cid=None: True  # type: ignore[method-assign]
    call = core.admit("native", "bench", 8000)
    assert segments(instance)

    def on_ready(ok: bool, why: str) -> None:
        assert not ok
        if close_in_on_ready:
            core.transport_ended(call, "start failed")  # the leg closes at once
        else:
            asyncio.get_running_loop().call_soon(core.transport_ended, call, "start failed")

    core.start_call(call, Leg(), on_ready)
    await asyncio.gather(*list(core._tasks))
    await asyncio.sleep(0.01)
    left = len(core.table), segments(instance), dict(core.metrics.counters)
    for c in list(core.table.calls.values()):
        core.table.release(c)
    return left


@pytest.mark.parametrize("reply", [ConnectionError("agent-1 gone"), TimeoutError(),
                                   F.ErrorReply(kind="full", detail="")], ids=["died", "timeout", "refused"])
@pytest.mark.parametrize("close_in_on_ready", [True, False], ids=["closed-at-once", "closed-later"])
def test_a_call_whose_agent_side_never_started_is_released(shm_clean, reply, close_in_on_ready) -> None:
    n, segs, counters = asyncio.run(_start(reply, close_in_on_ready))
    assert n == 0 and segs == []
    assert counters.get("calls_failed_start") == 1 and counters.get("calls_ended") == 1
