"""One dispatch table per role (frame class -> handler), checked against the protocol.

Every frame in ``ipc/frames.py`` names who receives it (``@frame(tag, to=...)``);
each role's table must handle exactly the frames its receiver is documented to
get, so a new frame without a handler (or a handler for a frame nobody sends)
fails here. A frame without a handler is counted and logged once per type.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from ipc import frames
from ipc.codec import DecodeGuard, decode, encode, frame_receivers, received_by


def test_every_frame_names_known_receivers():
    receivers = frame_receivers()
    assert len(receivers) == len(frames.frame_types())
    for cls, to in receivers.items():
        assert to and set(to) <= set(frames.RECEIVERS), (cls.__name__, to)
        if "reply" in to:  # an answer is only ever matched to its request, never dispatched
            assert to == ("reply",), cls.__name__
    # every receiver but "reply" has a table (the gateway's is tested in test_gateway_seam.py)
    assert {r for to in receivers.values() for r in to} == set(frames.RECEIVERS)


def test_received_by_names_what_each_receiver_gets():
    assert received_by("child") == {frames.Ping, frames.Topology, frames.Shutdown, frames.Reload}
    assert frames.OutUtterance in received_by("subscriber") and frames.OutUtterance in received_by("gateway")
    assert received_by("nobody") == frozenset()


# -- the agent process ------------------------------------------------------------------


def _agent() -> Any:
    from brisvox.agent.host.config import AgentsConfig, CallsConfig
    from brisvox.agent.host.process import AgentProcess

    p = AgentProcess(SimpleNamespace(index=0), AgentsConfig(), CallsConfig(), None)
    replies: list[tuple[str, Any, Any]] = []
    p.links = SimpleNamespace(guard=DecodeGuard("agent-0 links"),
                              reply=lambda peer, f, cid: replies.append((peer, f, cid)))
    return p, replies


def test_every_frame_the_agent_process_receives_has_a_handler():
    p, _ = _agent()
    assert set(p.handlers) == received_by("agent")


def test_the_agent_counts_frames_without_a_handler_and_of_unknown_calls(caplog):
    p, replies = _agent()
    with caplog.at_level(logging.WARNING):
        p._on_frame(frames.Ping(seq=1, sent_ns=0), "gateway-0", None)
        p._on_frame(frames.Ping(seq=2, sent_ns=0), "gateway-0", None)
    assert p.links.guard.errors == {"unexpected_type": 2}
    assert sum("unexpected ping frame on agent-0 links" in r.message for r in caplog.records) == 1
    p._on_frame(frames.Cleared(call_id="gone", epoch=1, position=0, applied_ns=0), "gateway-0", None)
    p._on_frame(frames.Dtmf(call_id="gone", digit="1", duration_ms=100, at_ns=0), "gateway-0", None)
    assert p.counters["unknown_call_frames"] == 2
    p._on_frame(frames.CallEnd(call_id="gone", reason="bye", ended_ns=0), "gateway-0", 7)
    assert replies == [("gateway-0", frames.CallEnded(call_id="gone", reason="unknown call"), 7)]


# -- the inference worker ---------------------------------------------------------------


def test_every_frame_the_worker_receives_has_a_handler():
    # what a worker process imports (every handler registered); the table needs no model
    from workers.core import Worker, WorkerModels

    w = Worker(0, "ipc:///nonexistent", WorkerModels(silero=Path("x"), smart_turn=None))
    try:
        assert set(w.dispatch.handlers) == received_by("worker")
    finally:
        w.close()


# -- the worker client (every subscriber) -----------------------------------------------


def test_every_frame_the_worker_client_receives_has_a_handler():
    from ipc.worker_client import WorkerClient

    c = WorkerClient(None, "agent-0", {})  # type: ignore[arg-type]  # the table needs no socket
    assert set(c.handlers) == received_by("subscriber")


# -- the supervisor: child channel and command plane ------------------------------------


class FakeRouter:
    """A ROUTER's NOBLOCK receive/send, from a list of (identity, payload)."""

    def __init__(self, incoming: list[tuple[bytes, bytes]]) -> None:
        self.incoming = list(incoming)
        self.sent: list[list[bytes]] = []

    def recv_multipart(self, flags: int = 0) -> list[bytes]:
        if not self.incoming:
            raise zmq.Again()
        return list(self.incoming.pop(0))

    def send_multipart(self, parts: list[bytes], flags: int = 0) -> None:
        self.sent.append(parts)


def _child_table(tmp_path: Path) -> Any:
    from brisvox.config.daemon import DaemonConfig
    from brisvox.daemon.child_table import ChildTable

    cfg = DaemonConfig()
    return ChildTable(lambda: cfg, tmp_path, os.getpid())


def test_every_frame_the_supervisor_receives_from_children_has_a_handler(tmp_path):
    assert set(_child_table(tmp_path).child_frame_handlers()) == received_by("supervisor")


def test_the_child_channel_dispatches_and_counts_frames_without_a_handler(caplog, tmp_path):
    from brisvox.daemon.slots import Slot

    t = _child_table(tmp_path)
    slot = Slot("worker", 0)
    slot.on_spawn(4242, 0.0)
    t.slots = [slot]
    ident = b"worker-0:4242"
    t.chan = FakeRouter([
        (ident, encode(frames.Pong(seq=1, sent_ns=0, calls=3, beat_ms=12))),
        (ident, encode(frames.ShutdownAck(pid=4242))),
        (ident, encode(frames.ChildEvent(kind="k", detail="d"))),
        (ident, encode(frames.Ping(seq=1, sent_ns=0))),
        (ident, encode(frames.Ping(seq=2, sent_ns=0))),
    ])
    with caplog.at_level(logging.WARNING):
        t.recv_children(5.0)
    assert (slot.last_pong_at, slot.calls, slot.beat_ms, slot.acked, slot.events["k"]) == (5.0, 3, 12, True, 1)
    assert t.chan_guard.errors == {"unexpected_type": 2}
    assert sum("unexpected ping frame on supervisor" in r.message for r in caplog.records) == 1


def test_a_boot_error_that_arrives_after_the_exit_is_kept_by_that_slot_only(tmp_path):
    from brisvox.daemon.slots import Slot, State

    t = _child_table(tmp_path)
    slot, other = Slot("worker", 0), Slot("worker", 1)
    slot.on_spawn(4242, 0.0)
    other.on_spawn(4343, 0.0)
    slot.state = State.FAILED  # the exit was applied before the error frame was read
    t.slots = [slot, other]
    t.chan = FakeRouter([
        (b"worker-0:4242", encode(frames.Hello(role="worker", index=0, pid=4242, ok=False, error="boom"))),
        (b"worker-0:4242", encode(frames.Hello(role="worker", index=0, pid=4242, ok=False, error="again"))),
        (b"worker-1:4242", encode(frames.Hello(role="worker", index=1, pid=4242, ok=False, error="forged"))),
        (b"worker-0:9999", encode(frames.Hello(role="worker", index=0, pid=9999, ok=False, error="stale"))),
    ])
    t.recv_children(1.0)
    assert (slot.error, slot.state, other.error) == ("boom", State.FAILED, "")
    assert t.chan_guard.errors == {"unknown_peer": 2}


def test_every_frame_the_command_plane_receives_has_a_handler():
    from brisvox.daemon.command_plane import CommandPlane

    assert set(CommandPlane(lambda name, args: None).control_frame_handlers()) == received_by("control")


def test_the_command_plane_answers_every_frame_and_counts_the_unexpected():
    from brisvox.daemon.command_plane import CommandPlane

    cp = CommandPlane(lambda name, args: frames.CommandReply(ok=True, data={"name": name}))
    cp.control = FakeRouter([(b"cli", encode(frames.Command(name="status"), cid=1)),
                             (b"cli", encode(frames.Ping(seq=1, sent_ns=0), cid=2))])
    cp.recv_control(0.0)
    ok, refused = (frames.decode_env(parts[1]) for parts in cp.control.sent)
    assert ok == (frames.CommandReply(ok=True, data={"name": "status"}), 1)
    assert isinstance(refused[0], frames.CommandReply) and not refused[0].ok and refused[1] == 2
    assert cp.control_guard.errors == {"unexpected_type": 1}


# -- every child's control thread -------------------------------------------------------


@pytest.fixture
def child_rt(tmp_path: Path) -> Any:
    from brisvox.config.daemon import DaemonConfig
    from brisvox.daemon.child import ChildSpec, ForkedChildRuntime

    rt = ForkedChildRuntime(ChildSpec(role="worker", index=0, config=DaemonConfig(), runtime_dir=tmp_path,
                                instance="t", parent_pid=os.getppid(), main_ref="x:main"))
    yield rt
    rt.close()


def test_every_frame_a_child_receives_from_the_supervisor_has_a_handler(child_rt):
    assert set(child_rt.control_frame_handlers()) == received_by("child")


def test_the_child_control_handlers_answer_and_apply(child_rt):
    sent: list[bytes] = []
    sock = SimpleNamespace(send=lambda data, flags=0: sent.append(data))
    seen: list[list[dict[str, Any]]] = []
    child_rt.add_topology_callback(seen.append)
    h = child_rt.control_frame_handlers()
    h[frames.Ping](sock, frames.Ping(seq=9, sent_ns=1))
    pong = decode(sent[-1])
    assert isinstance(pong, frames.Pong) and (pong.seq, pong.sent_ns, pong.beat_ms) == (9, 1, -1)
    rows = [{"role": "worker", "index": 0, "pid": 1, "state": "ready"}]
    h[frames.Topology](sock, frames.Topology(children=rows, seq=3))
    h[frames.Topology](sock, frames.Topology(children=[], seq=2))  # older: ignored
    assert seen == [rows] and child_rt.topology == rows
    reloads: list[str] = []
    child_rt.add_reload_callback(reloads.append)
    h[frames.Reload](sock, frames.Reload(path="/etc/brisvox/brisvoxd.toml", seq=1))
    h[frames.Reload](sock, frames.Reload(path="/old.toml", seq=1))  # the same reload again: applied once
    assert reloads == ["/etc/brisvox/brisvoxd.toml"]
    h[frames.Shutdown](sock, frames.Shutdown(reason="test", grace_s=1.0, drain=True))
    assert decode(sent[-1]) == frames.ShutdownAck(pid=child_rt.pid)
    assert child_rt.stopping.is_set() and child_rt.drain and child_rt.stop_reason == "test"
