"""The gateway owns the choice of worker for every call and counts calls per worker truly.

A pipeline call's CallStart names the least-loaded worker by the gateway's
count of ALL its live calls (not only echo calls, which used to be the only
ones counted, so every pipeline call was hinted to worker 0); the count
follows the agent when another worker took the call (CallAccepted.worker),
when a call was re-attached after its worker was lost (the OutUtterance's
sender), and goes back down when calls end, never below zero. Real call
table and rings; the agent process is a stub behind ``Links.request``.
"""

from __future__ import annotations

import asyncio
import os

from brisvox.gateway.config import GatewaySettings
from brisvox.gateway.core.gateway_core import GatewayCore
from brisvox.gateway.transports import assemble
from ipc import frames as F


class Leg:
    transport = "twilio"
    marks_by_echo = True
    can_send = True

    def __init__(self) -> None:
        self.hung: list[str] = []

    def hangup(self, reason: str) -> None:
        self.hung.append(reason)


def make_core(taken_by: dict[int, int] | None = None) -> tuple[GatewayCore, list[F.CallStart]]:
    """``taken_by``: request number -> the worker that took that call instead of the hinted one."""
    core = assemble(GatewaySettings(), instance=f"wl{os.getpid()}")
    core.loop = asyncio.get_running_loop()
    core.peer_load.agents.update({"agent-0": 0, "agent-1": 0})
    core.peer_load.workers.update({0: 0, 1: 0})
    starts: list[F.CallStart] = []
    sent: list[F.Frame] = []

    async def request(peer: str, frame: F.Frame, wait_s: float) -> F.Frame:
        assert isinstance(frame, F.CallStart)
        starts.append(frame)
        w = (taken_by or {}).get(len(starts) - 1, frame.worker)  # the agent attaches where told
        return F.CallAccepted(call_id=frame.call_id, worker=w)

    core.links.request = request  # type: ignore[method-assign]
    core.links.send = lambda peer, frame, cid=None: sent.append(frame) or True  # type: ignore[method-assign]
    return core, starts


async def start_calls(core: GatewayCore, n: int) -> list:
    calls = []
    for _ in range(n):
        call = core.admit("twilio", "bench", 8000)
        core.start_call(call, Leg(), lambda ok, why: None)
        await asyncio.sleep(0)
        calls.append(call)
    await asyncio.gather(*list(core._tasks))
    return calls


def end_all(core: GatewayCore) -> None:
    for call in list(core.table.calls.values()):
        core.transport_ended(call, "test")
        core._on_frame(F.CallEnded(call_id=call.call_id, reason="bye"), call.agent_proc, None)


async def _pipeline_calls_are_spread_and_counted() -> None:
    core, starts = make_core()
    try:
        calls = await start_calls(core, 5)
        assert [s.worker for s in starts] == [0, 1, 0, 1, 0]  # hinted by the count of live calls
        assert core.peer_load.workers == {0: 3, 1: 2}
        assert [c.worker for c in calls] == [0, 1, 0, 1, 0]
        core.transport_ended(calls[1], "bye")
        core._on_frame(F.CallEnded(call_id=calls[1].call_id, reason="bye"), calls[1].agent_proc, None)
        assert core.peer_load.workers == {0: 3, 1: 1}
        more = await start_calls(core, 1)
        assert starts[-1].worker == 1 and more[0].worker == 1
    finally:
        end_all(core)
    assert core.peer_load.workers == {0: 0, 1: 0}
    assert len(core.table) == 0


async def _the_count_follows_the_worker_that_really_serves_the_call(tmp: str) -> None:
    core, starts = make_core()
    core.router.runtime_dir = tmp
    core.links.start(asyncio.get_running_loop(), None)
    try:
        calls = await start_calls(core, 2)
        assert core.peer_load.workers == {0: 1, 1: 1}
        # worker 1 is lost: its call is no longer counted anywhere ...
        core.update_topology([{"role": "agent", "index": 0, "state": "ready"},
                              {"role": "agent", "index": 1, "state": "ready"},
                              {"role": "worker", "index": 0, "state": "ready"},
                              {"role": "worker", "index": 1, "state": "exited"}])
        assert core.peer_load.workers == {0: 1} and calls[1].worker == -1
        # ... until the worker it was re-attached to announces an utterance for it
        core._on_frame(F.OutUtterance(call_id=calls[1].call_id, utterance=1, epoch=1, out_pos=0), "worker-0", None)
        assert core.peer_load.workers == {0: 2} and calls[1].worker == 0
        # an utterance from the worker already counted changes nothing
        core._on_frame(F.OutUtterance(call_id=calls[0].call_id, utterance=1, epoch=1, out_pos=0), "worker-0", None)
        assert core.peer_load.workers == {0: 2}
    finally:
        end_all(core)
        core.links.close()
    assert core.peer_load.workers == {0: 0}


async def _a_call_the_agent_attached_elsewhere_is_counted_there() -> None:
    core, starts = make_core(taken_by={0: 1})  # the hinted worker refused the first call
    try:
        calls = await start_calls(core, 1)
        assert starts[0].worker == 0  # hinted
        assert calls[0].worker == 1 and core.peer_load.workers == {0: 0, 1: 1}  # counted where it runs
        await start_calls(core, 1)
        assert starts[1].worker == 0  # so the next call goes to the idle worker
    finally:
        end_all(core)
    assert core.peer_load.workers == {0: 0, 1: 0}


def test_pipeline_calls_are_spread_and_counted(shm_clean) -> None:
    asyncio.run(_pipeline_calls_are_spread_and_counted())


def test_the_count_follows_the_worker_that_really_serves_the_call(shm_clean, short_tmp) -> None:
    asyncio.run(_the_count_follows_the_worker_that_really_serves_the_call(str(short_tmp)))


def test_a_call_the_agent_attached_elsewhere_is_counted_there(shm_clean) -> None:
    asyncio.run(_a_call_the_agent_attached_elsewhere_is_counted_there())


async def _a_stopping_agent_keeps_its_calls_and_gets_no_new_one(tmp: str) -> None:
    """A drain (or a scale-down) shows the agent as ``stopping``: its live calls go on (they used
    to be hung up at once, "agent process died"), new calls go to the others, and they are
    hung up only once the process is gone."""
    core, starts = make_core()
    core.router.runtime_dir = tmp
    core.links.start(asyncio.get_running_loop(), None)

    def hung() -> list[tuple[str, str]]:  # the legs' hang-ups
        return [(c.call_id, reason) for c in core.table.calls.values() for reason in c.leg.hung]
    rows = [{"role": "worker", "index": 0, "state": "ready"}, {"role": "worker", "index": 1, "state": "ready"}]
    try:
        calls = await start_calls(core, 2)
        on_1 = [c for c in calls if c.agent_proc == "agent-1"]
        assert len(on_1) == 1
        core.update_topology([*rows, {"role": "agent", "index": 0, "state": "ready"},
                              {"role": "agent", "index": 1, "state": "stopping"}])
        assert hung() == [] and not on_1[0].agent_done and list(core.peer_load.agents) == ["agent-0"]
        more = await start_calls(core, 2)
        assert {c.agent_proc for c in more} == {"agent-0"}  # no new call for the stopping one
        core.update_topology([*rows, {"role": "agent", "index": 0, "state": "ready"},
                              {"role": "agent", "index": 1, "state": "exited"}])
        assert hung() == [(on_1[0].call_id, "agent process died")] and on_1[0].agent_done
    finally:
        end_all(core)
        core.links.close()


def test_a_stopping_agent_keeps_its_calls_and_gets_no_new_one(shm_clean, short_tmp) -> None:
    asyncio.run(_a_stopping_agent_keeps_its_calls_and_gets_no_new_one(str(short_tmp)))
