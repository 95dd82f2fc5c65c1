"""Every order of a call's ends, on the real gateway core and real shared-memory rings.

A live call (its agent side started through ``start_call``, the bot speaking) meets, in every
order, the transport's end (``T``: ``transport_ended``), the agent's end (``A``: the agent
process's CallEnded frame), the worker's detach (``W``: the call's worker leaves the topology)
and the gateway's stop (``S``: ``GatewayCore.stop``), with the caller's audio and a DTMF digit
arriving in every gap (also after the call was released); and every order of every subset of
them that must end the call: any with the stop (it ends what is left), any without it that
has both sides' ends. Two legs: one that only records a hang-up (the stop's grace expires),
one that reports its end right after one (as a closing WebSocket does). And the echo agent:
its side ends when its worker detached the call (``W``: the echo agent's ``stop`` returns),
with the transport's end and the stop, the same way.

Checked for every case (:func:`check`):

* every ring of the call unlinked exactly once and closed exactly once (the real
  ``Ring.unlink`` / ``Ring.close`` counted), and the call table released it exactly once,
  and only once both sides were done: the transport reported its end and the agent's end came
  (CallEnded; the echo: its worker detached the call), or the stop forced it;
* a stop that finds the transport up hangs the leg up (``shutdown``);
* no call left in the table, every agent's and worker's count back at zero,
  ``calls_ended`` counted once;
* no frame sent over the links for the call once it was released (CallEnd, Dtmf, Playback
  positions, ...), and nothing handed to its leg after the release.

And the check itself can fail: with the machine patched to return a second ``Release`` in
one order, :func:`check` raises (``test_the_checker_catches_a_double_release``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import zmq

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core import call_machine as M
from brisvox.gateway.core.calls import Call
from brisvox.gateway.transports import assemble
from ipc import frames as F
from ipc.ring import Ring

RING_UNLINK, RING_CLOSE = Ring.unlink, Ring.close  # the real ones (counted in each case)
PIPELINE_ENDS, ECHO_ENDS = ("T", "A"), ("T", "W")  # what ends each side by itself


def orders(ends: tuple[str, ...], others: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every order of every choice of the events that ends the call: with the stop (which must
    end what is left), or without it but with both sides' ends."""
    events = (*ends, *others)
    out = []
    for n in range(len(events) + 1):
        for chosen in itertools.combinations(events, n):
            if "S" in chosen or set(ends) <= set(chosen):
                out += list(itertools.permutations(chosen))
    return out


CASES = [(kind, leg, seq)
         for kind, ends, others in (("pipeline", PIPELINE_ENDS, ("W", "S")), ("echo", ECHO_ENDS, ("S",)))
         for leg in ("passive", "prompt") for seq in orders(ends, others)]


class Leg:
    """A transport leg: records what it is handed; ``prompt`` reports its end after a hang-up."""

    transport = "native"
    marks_by_echo = False
    can_send = True

    def __init__(self, trace: Trace, prompt: bool) -> None:
        self.trace = trace
        self.prompt = prompt
        self.host: Any = None
        self.call: Call | None = None

    def _note(self, what: str) -> None:
        if self.trace.released:
            self.trace.leg_after_release.append(what)

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        self._note("audio")
        return True

    def end_spurt(self) -> None:
        pass

    def send_clear(self) -> None:
        self._note("clear")

    def send_mark(self, name: str) -> None:
        self._note("mark")

    def tick_dtmf(self, now: float) -> bool:
        return False

    def send_dtmf(self, digits: str) -> int:
        return 0

    def hangup(self, reason: str) -> None:
        self._note(f"hangup {reason}")
        self.trace.hangups.append(reason)
        if self.prompt:
            asyncio.get_running_loop().call_soon(self.host.transport_ended, self.call, f"closed: {reason}")

    def transfer(self, target: str, done: Any) -> None:
        done(False, "no")

    def send_call_event(self, name: str, fields: dict[str, Any]) -> bool:
        return False

    def poll(self, now: float) -> None:
        pass


class Echo:
    """The echo agent as the lifecycle drives it: its ``stop`` returns once its worker detached
    the call (``W``)."""

    def __init__(self, detached: asyncio.Event) -> None:
        self.detached = detached

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        await self.detached.wait()

    def tick(self, now: float) -> None:
        pass

    def on_dtmf(self, digit: str) -> None:
        pass

    def on_cleared(self, epoch: int, position: int, marks: list[str]) -> None:
        pass

    def on_mark_played(self, name: str, position: int) -> None:
        pass


@dataclass
class Trace:
    """What happened to one call, as the checker reads it."""

    kind: str = ""
    call_id: str = ""
    delivered: list[str] = field(default_factory=list)  # what happened so far ("t": the transport ended)
    at_release: tuple[str, ...] = ()  # ... when the call was released
    hangups: list[str] = field(default_factory=list)  # the leg's
    shutdown_while_up: bool = False  # the stop came while the transport side was up
    ring_names: list[str] = field(default_factory=list)
    unlinks: Counter[str] = field(default_factory=Counter)
    closes: Counter[str] = field(default_factory=Counter)
    table_releases: int = 0
    released: bool = False
    frames_after_release: list[str] = field(default_factory=list)
    leg_after_release: list[str] = field(default_factory=list)
    calls_left: int = -1
    agent_counts: dict[str, int] = field(default_factory=dict)
    worker_counts: dict[int, int] = field(default_factory=dict)
    calls_ended: int = 0


def check(t: Trace) -> None:
    """The invariants of one case (an AssertionError names the first one broken)."""
    assert len(t.ring_names) == 4, f"the call has rings {t.ring_names}"
    for name in t.ring_names:
        assert t.unlinks[name] == 1, f"ring {name} unlinked {t.unlinks[name]} times"
        assert t.closes[name] == 1, f"ring {name} closed {t.closes[name]} times"
    assert t.table_releases == 1, f"the call was released {t.table_releases} times"
    agent_end = "A" if t.kind == "pipeline" else "W"
    assert "S" in t.at_release or {"t", agent_end} <= set(t.at_release), \
        f"released after {t.at_release}: one side was not done"
    assert not t.shutdown_while_up or "shutdown" in t.hangups, "the stop did not hang the call up"
    assert t.calls_left == 0, f"{t.calls_left} call(s) left in the table"
    assert t.calls_ended == 1, f"calls_ended counted {t.calls_ended} times"
    assert all(n == 0 for n in t.agent_counts.values()), f"agent counts {t.agent_counts}"
    assert all(n == 0 for n in t.worker_counts.values()), f"worker counts {t.worker_counts}"
    assert not t.frames_after_release, f"frames for the released call: {t.frames_after_release}"
    assert not t.leg_after_release, f"handed to the leg after the release: {t.leg_after_release}"


def topology(worker: bool) -> list[dict[str, Any]]:
    return [{"role": "agent", "index": 0, "state": "ready"},
            {"role": "worker", "index": 0, "state": "ready" if worker else "exited"}]


async def run_case(kind: str, leg_kind: str, seq: tuple[str, ...], instance: str, runtime_dir: str,
                   monkeypatch: pytest.MonkeyPatch) -> Trace:
    t = Trace(kind=kind)
    ctx = zmq.Context()
    settings = GatewaySettings(GatewayConfig(max_calls=4, ring_seconds=1.0), SipConfig(enabled=False),
                               WebSocketConfig(enabled=False))
    core = assemble(settings, instance=instance, ctx=ctx, runtime_dir=runtime_dir)

    # the real releases, counted: the rings' unlink and close, the table's release
    unlink, close, release = RING_UNLINK, RING_CLOSE, core.table.release

    def counted_unlink(ring: Ring) -> None:
        t.unlinks[ring.name] += 1
        unlink(ring)

    def counted_close(ring: Ring) -> None:
        t.closes[ring.name] += 1
        close(ring)

    def counted_release(call: Call) -> bool:
        if call.call_id == t.call_id:
            t.table_releases += 1
            t.released = True
            t.at_release = tuple(t.delivered)
        return release(call)

    monkeypatch.setattr(Ring, "unlink", counted_unlink)
    monkeypatch.setattr(Ring, "close", counted_close)
    monkeypatch.setattr(core.table, "release", counted_release)
    transport_ended = core.transport_ended

    def noted_transport_end(call: Call, reason: str) -> None:  # the test's T, or the leg's own
        t.delivered.append("t")
        transport_ended(call, reason)

    monkeypatch.setattr(core, "transport_ended", noted_transport_end)

    # what the core sends over its links: nothing for the call once it is released
    def note(frame: F.Frame) -> None:
        names = getattr(frame, "call_id", None), *(getattr(frame, "positions", None) or {})
        if t.released and t.call_id in names:
            t.frames_after_release.append(type(frame).__name__)

    async def request(peer: str, frame: F.Frame, timeout: float) -> F.Frame:
        note(frame)
        return F.CallAccepted(call_id=getattr(frame, "call_id", ""), worker=0)

    def send(peer: str, frame: F.Frame, cid: int | str | None = None) -> bool:
        note(frame)
        return True

    monkeypatch.setattr(core.links, "request", request)
    monkeypatch.setattr(core.links, "send", send)
    monkeypatch.setattr(core.links, "reply", send)
    detached = asyncio.Event()
    core.lifecycle.make_builtin = lambda call: Echo(detached)
    stopped = False
    try:
        await core.start()
        core.update_topology(topology(worker=True))
        call = core.admit("native", "echo" if kind == "echo" else "bench", 8000)
        t.call_id = call.call_id
        t.ring_names = [r.name for r in call.rings.values()]
        leg = Leg(t, prompt=leg_kind == "prompt")
        leg.host, leg.call = core, call
        ready: list[bool] = []
        core.start_call(call, leg, lambda ok, why: ready.append(ok))
        await asyncio.gather(*list(core._tasks))
        assert ready == [True] and call.state == M.ACTIVE
        assert call.worker == 0  # the least loaded worker, counted
        pcm = np.full(160, 100, dtype=np.int16)
        call.out_ring.write(np.full(800, 7, dtype=np.int16))
        core.note_utterance(call, 1, 0)  # the bot speaks while the call ends

        for ev in seq:
            core.audio_in(call, pcm, 8000, 160)
            core.dtmf_in(call, "5", 100)
            if ev in "AW":
                t.delivered.append(ev)
            if ev == "T":
                core.transport_ended(call, "bye")
            elif ev == "A":
                core._on_frame(F.CallEnded(call_id=call.call_id, reason="bye"), "agent-0", None)
            elif ev == "W":
                if kind == "echo":
                    detached.set()
                else:
                    core.update_topology(topology(worker=False))
            elif ev == "S":
                t.shutdown_while_up = "t" not in t.delivered
                t.delivered.append("S")
                await core.stop(grace_s=0.03)
                stopped = True
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        core.audio_in(call, pcm, 8000, 160)
        await asyncio.sleep(0.03)  # the spawned stops, a pacer tick or two
        if not stopped:
            t.calls_left = len(core.table)  # the ends alone released it
            await core.stop(grace_s=0.03)
        else:
            t.calls_left = len(core.table)
        t.agent_counts = dict(core.peer_load.agents)
        t.worker_counts = dict(core.peer_load.workers)
        t.calls_ended = core.metrics.counters.get("calls_ended", 0)
    finally:
        for c in list(core.table.calls.values()):
            release(c)
        core.links.close()
        ctx.term()
    return t


@pytest.mark.parametrize("kind,leg,seq", CASES, ids=[f"{k}-{leg}-{''.join(s)}" for k, leg, s in CASES])
def test_every_order_of_the_ends_releases_the_call_once(shm_clean, short_tmp, monkeypatch, kind, leg, seq):
    check(asyncio.run(run_case(kind, leg, seq, shm_clean, str(short_tmp), monkeypatch)))


def test_the_cases_cover_every_order():
    # with the stop: every order of every subset of the other three (1 + 3*2 + 3*6 + 24), without
    # it: both ends, with or without the worker's detach (2 + 6); the echo: 1 + 2*2 + 6, and 2
    assert len(orders(PIPELINE_ENDS, ("W", "S"))) == 49 + 8 and len(orders(ECHO_ENDS, ("S",))) == 11 + 2
    assert len(CASES) == 2 * 57 + 2 * 13


def test_the_checker_catches_a_double_release(shm_clean, short_tmp, monkeypatch):
    """The machine patched to return ``Release`` twice when the agent's CallEnded ends the call:
    the rings are still unlinked once (the table refuses a second release), but the check
    fails on the table's count."""
    honest = M._HANDLERS[M.AgentEnded]

    def twice(machine: M.CallMachine, event: M.AgentEnded) -> tuple[M.Action, ...]:
        out = honest(machine, event)
        return (*out, M.Release()) if M.Release() in out else out

    monkeypatch.setitem(M._HANDLERS, M.AgentEnded, twice)
    trace = asyncio.run(run_case("pipeline", "passive", ("T", "A", "W", "S"), shm_clean, str(short_tmp),
                                 monkeypatch))
    with pytest.raises(AssertionError, match="released 2 times"):
        check(trace)
    monkeypatch.setitem(M._HANDLERS, M.AgentEnded, honest)
    check(asyncio.run(run_case("pipeline", "passive", ("T", "A", "W", "S"), shm_clean, str(short_tmp),
                               monkeypatch)))
