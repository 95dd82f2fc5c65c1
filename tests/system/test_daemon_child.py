"""ChildRuntime against a fake supervisor: handshake, ping/pong, topology, shutdown, failures.

The test process plays the supervisor: it already has a ZeroMQ context and a
bound ROUTER when it forks (the restart case), so these tests also prove the
child does not touch its parent's context or sockets.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import zmq

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.child import ChildSpec, spawn
from brisvox.runtime import exitcodes
from ipc.bus import bind, endpoint, make_socket
from ipc.codec import decode, encode
from ipc.frames import ChildEvent, ErrorReply, Hello, Ping, Pong, Shutdown, ShutdownAck, Topology

pytestmark = pytest.mark.system


def wait_exit(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    return None


class FakeSupervisor:
    def __init__(self, runtime_dir):
        self.ctx = zmq.Context()
        self.router = make_socket(self.ctx, zmq.ROUTER)
        bind(self.router, endpoint(runtime_dir, "supervisor"))
        self.runtime_dir = runtime_dir
        self.pids: list[int] = []

    def spawn(self, main_ref: str, role: str = "worker", index: int = 1) -> int:
        spec = ChildSpec(role=role, index=index, config=DaemonConfig(), runtime_dir=self.runtime_dir,
                         instance="test", parent_pid=os.getpid(), main_ref=main_ref)
        pid = spawn(spec)
        self.pids.append(pid)
        return pid

    def recv(self, timeout: float = 5.0, want: type | None = None):
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.router.poll(int(left * 1000) + 1):
                break
            ident, data = self.router.recv_multipart()
            f = decode(data)
            if want is None or isinstance(f, want):
                return ident, f
        raise AssertionError(f"no {want.__name__ if want else 'frame'} within {timeout}s")

    def send(self, ident: bytes, frame) -> None:
        self.router.send_multipart([ident, encode(frame)])

    def close(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.router.close(0)
        self.ctx.term()


@pytest.fixture
def sup(short_tmp):
    s = FakeSupervisor(short_tmp)
    yield s
    s.close()


@pytest.mark.serial_light  # main-loop beat age under 1 s
def test_handshake_ping_topology_and_acknowledged_shutdown(sup, short_tmp):
    pid = sup.spawn("tests.system.daemon_roles:topology_echo")
    ident, hello = sup.recv(want=Hello)
    assert ident == f"worker-1:{pid}".encode()
    assert hello.ok and hello.role == "worker" and hello.index == 1 and hello.pid == pid
    assert hello.endpoints == {"inbox": endpoint(short_tmp, "worker-1")}

    sup.send(ident, Ping(seq=7, sent_ns=time.monotonic_ns()))
    _, pong = sup.recv(want=Pong)
    assert pong.seq == 7 and 0 <= pong.beat_ms < 1000

    rows = [{"role": "worker", "index": 1, "pid": pid, "state": "ready"}]
    sup.send(ident, Topology(children=rows, seq=1))
    _, ev = sup.recv(want=ChildEvent)
    assert ev.kind == "topology" and ev.data == {"rows": rows}

    # the child's own inbox serves requests and counts garbage without dying
    dealer = make_socket(sup.ctx, zmq.DEALER, identity=b"test-0")
    dealer.connect(hello.endpoints["inbox"])
    dealer.send(b"\xff not a frame")
    dealer.send(encode(Ping(seq=1, sent_ns=0), cid=42))
    assert dealer.poll(5000)
    reply = decode(dealer.recv())
    assert isinstance(reply, ErrorReply) and reply.kind == "unsupported"
    dealer.close(0)
    time.sleep(0.3)  # one loop turn so the report includes the garbage
    sup.send(ident, Ping(seq=8, sent_ns=0))
    _, pong = sup.recv(want=Pong)
    assert pong.stats["decode_errors"] == {"malformed": 1}
    assert pong.stats["requests"] == 1

    sup.send(ident, Shutdown(reason="test", grace_s=5.0, drain=True))
    _, ack = sup.recv(want=ShutdownAck)
    assert ack.pid == pid
    _, ev = sup.recv(want=ChildEvent)
    assert ev.kind == "stopping" and ev.detail == "test" and ev.data == {"drain": True}
    assert wait_exit(pid, 5.0) == 0
    assert not os.path.exists(short_tmp / "worker-1.sock")


def test_garbage_on_the_control_channel_is_counted(sup):
    pid = sup.spawn("brisvox.daemon.minimal:main")
    ident, _ = sup.recv(want=Hello)
    sup.router.send_multipart([ident, b"garbage"])
    sup.router.send_multipart([ident, b'{"type":"nope"}'])
    sup.send(ident, Ping(seq=1, sent_ns=0))
    _, pong = sup.recv(want=Pong)
    assert pong.stats["decode_errors"] == {"malformed": 1, "unknown_type": 1}
    os.kill(pid, signal.SIGTERM)
    assert wait_exit(pid, 5.0) == 0


def test_boot_crash_sends_failed_hello_and_exits_boot_code(sup):
    pid = sup.spawn("tests.system.daemon_roles:crash_at_boot")
    _, hello = sup.recv(want=Hello)
    assert not hello.ok and "deliberate boot crash" in hello.error
    assert wait_exit(pid, 5.0) == exitcodes.BOOT


def test_config_error_names_the_key_and_exits_2(sup):
    pid = sup.spawn("tests.system.daemon_roles:config_error", role="gateway", index=0)
    _, hello = sup.recv(want=Hello)
    assert not hello.ok and "gateway.test_key" in hello.error
    assert wait_exit(pid, 5.0) == exitcodes.CONFIG


def test_unloadable_main_is_a_boot_failure(sup):
    pid = sup.spawn("tests.system.no_such_module:main")
    _, hello = sup.recv(want=Hello)
    assert not hello.ok and "no_such_module" in hello.error
    assert wait_exit(pid, 5.0) == exitcodes.BOOT


def test_sigterm_stops_gracefully_and_a_second_one_exits_at_once(sup):
    pid = sup.spawn("brisvox.daemon.minimal:main")
    sup.recv(want=Hello)
    os.kill(pid, signal.SIGTERM)
    assert wait_exit(pid, 5.0) == 0

    pid = sup.spawn("tests.system.daemon_roles:ignore_shutdown")
    sup.recv(want=Hello)
    os.kill(pid, signal.SIGTERM)
    assert wait_exit(pid, 0.5) is None  # its main ignores the stop request
    os.kill(pid, signal.SIGTERM)
    assert wait_exit(pid, 5.0) == exitcodes.SIGNAL_BASE + signal.SIGTERM


def test_wedged_main_loop_shows_in_pong_beat_age(sup):
    pid = sup.spawn("tests.system.daemon_roles:hang_after_ready")
    ident, _ = sup.recv(want=Hello)
    time.sleep(1.2)
    sup.send(ident, Ping(seq=1, sent_ns=0))
    _, pong = sup.recv(want=Pong)
    assert pong.beat_ms >= 1000
    os.kill(pid, signal.SIGKILL)
    assert wait_exit(pid, 5.0) == -signal.SIGKILL
