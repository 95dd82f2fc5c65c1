"""The worker as a real process: bad input, the job lane, a clean stop; and as a brisvoxd child.

* Standalone (``python -m workers.process``): every kind of bad request gets
  a typed ErrorReply and the worker keeps serving the good call (VAD events,
  a Smart Turn result from its job lane); SIGTERM ends it cleanly.
* Under brisvoxd (real worker role, minimal gateway/agent): the workers warm
  their models before they report ready; a worker killed with SIGKILL is
  replaced by the supervisor, its calls move to the other worker, and the
  replacement serves new calls.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.asyncio

from bench.harness.daemon import Daemon, write_config
from ipc.bus import endpoint, make_socket
from ipc.codec import decode, encode
from ipc.frames import (
    AttachCall,
    Attached,
    ErrorReply,
    SmartTurnRequest,
    SmartTurnResult,
    WorkerTick,
)
from ipc.ring import SHM_DIR, ring_name
from ipc.tick_events import from_wire
from ipc.worker_client import WorkerClient
from workers.harness import Feeder, WorkerProc, close_rings, create_call_rings

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


def _fixture(name: str, rate: int):
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod.load(name, rate)


class Sub:
    """A bare DEALER subscriber (sync), to send malformed and hostile frames."""

    def __init__(self, ep: str) -> None:
        self.ctx = zmq.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=b"agent-7")
        self.sock.connect(ep)
        self.cid = 0
        self.ticks: list[WorkerTick] = []

    def request(self, frame, timeout: float = 3.0):
        self.cid += 1
        self.sock.send(encode(frame, cid=self.cid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                f = decode(self.sock.recv())
                if isinstance(f, WorkerTick):
                    self.ticks.append(f)
                else:
                    return f
        raise TimeoutError(f"no reply to {frame.TYPE}")

    def collect(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                f = decode(self.sock.recv())
                if isinstance(f, WorkerTick):
                    self.ticks.append(f)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def test_bad_input_gets_typed_errors_and_the_worker_keeps_serving(short_tmp, shm_clean):
    inst = shm_clean
    audio, entry = _fixture("turn_complete", 8000)
    ep = endpoint(short_tmp, "w0")
    proc = WorkerProc(0, ep, max_calls=8)
    rings = {}
    junk = SHM_DIR / ring_name(inst, "junk", "in")
    sub = None
    feeder = None
    try:
        proc.start()
        sub = Sub(ep)
        rings = create_call_rings(inst, "good", 8000, 16000, seconds=8.0)
        wrong = create_call_rings(inst, "wrong", 16000, 16000, seconds=1.0)
        junk.write_bytes(b"\x13" * 8192)
        junk.chmod(0o600)  # attach checks the mode before the magic

        def attach(call_id: str, rate: int = 8000):
            return sub.request(AttachCall(call_id=call_id, subscriber="agent-7", instance=inst,
                                          call_rate=rate, tts_rate=16000))

        r = attach("junk")
        assert isinstance(r, ErrorReply) and r.kind == "bad_ring" and "magic" in r.detail
        r = attach("wrong")
        assert isinstance(r, ErrorReply) and r.kind == "bad_rate"
        r = attach("missing")
        assert isinstance(r, ErrorReply) and r.kind == "bad_ring"
        far = time.monotonic_ns() + 5 * 10**9
        r = sub.request(SmartTurnRequest(call_id="nobody", end_pos=16000, deadline_ns=far))
        assert isinstance(r, ErrorReply) and r.kind == "unknown_call"
        sub.sock.send(b"\x00\x01 garbage")
        sub.sock.send(b'{"type": "smart_turn", "call_id": "good"}')
        assert isinstance(attach("good"), Attached)
        r = sub.request(SmartTurnRequest(call_id="good", end_pos=10**15, deadline_ns=far))
        assert isinstance(r, ErrorReply) and r.kind == "bad_range"
        # still serving: VAD events for the good call, and a Smart Turn verdict from the job lane
        feeder = Feeder([rings["in"].name], audio, 8000, seconds=len(audio) / 8000, workdir=short_tmp)
        feeder.start()
        sub.collect(len(audio) / 8000 + 0.3)
        evs = [from_wire(e) for t in sub.ticks for e in t.events]
        assert [e.KIND for e in evs] == ["start", "stop"]
        stop = evs[1]
        r = sub.request(SmartTurnRequest(call_id="good", end_pos=stop.at, deadline_ns=time.monotonic_ns() + 10**9))
        assert isinstance(r, SmartTurnResult) and r.probability > 0.5
        for name in [ring_name(inst, "wrong", k) for k in ("in", "in16", "tts", "out")]:
            (SHM_DIR / name).unlink(missing_ok=True)
        for r_ in wrong.values():
            r_.close()
        # a clean stop on SIGTERM
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.proc is not None and proc.proc.wait(5) == 0
        assert not Path(ep[len("ipc://"):]).exists()
    finally:
        if sub is not None:
            sub.close()
        if feeder is not None:
            feeder.stop()
        proc.stop()
        junk.unlink(missing_ok=True)
        close_rings(rings)


def test_workers_under_brisvoxd_warm_up_fail_over_and_come_back(short_tmp):
    cfg = write_config(short_tmp, workers=2, agents=1, extra="\n[workers]\nmax_calls = 32\n")
    minimal = "gateway=brisvox.daemon.minimal:main,agent=brisvox.daemon.minimal:main"
    d = Daemon(short_tmp, config=cfg, env={"BRISVOX_TEST_ROLE_MAIN": minimal}, real_roles=True).start()
    rings = {}
    try:
        snap = d.wait_ready(timeout=30)
        workers = {c["index"]: c for c in snap["children"] if c["role"] == "worker"}
        assert set(workers) == {0, 1}
        assert all(c["endpoints"]["inbox"] == endpoint(d.run_dir, f"worker-{i}") for i, c in workers.items())
        inst = snap["daemon"]["instance"]
        for i in range(6):
            rings[f"c{i}"] = create_call_rings(inst, f"c{i}", 8000, 16000, seconds=4.0)
        asyncio.run(_failover_under_daemon(d, inst, workers, rings))
        d.command("stop")
        assert d.wait_exit() == 0
    finally:
        for r in rings.values():
            close_rings(r)
        d.close()


async def _failover_under_daemon(d: Daemon, inst: str, workers: dict, rings: dict) -> None:
    ctx = zmq.asyncio.Context()
    eps = {i: endpoint(d.run_dir, f"worker-{i}") for i in workers}
    client = WorkerClient(ctx, "agent-9", eps)
    await client.start()
    try:
        for call_id in rings:
            await client.attach(call_id, inst, 8000, 16000)
        assert len(client.workers[0].calls) == 3 and len(client.workers[1].calls) == 3
        # the workers report their load to the supervisor
        snap = d.wait_for(lambda s: sum(c["calls"] for c in s["children"] if c["role"] == "worker") == 6,
                          5.0, "worker call counts")
        old = d.child(snap, "worker-0")["pid"]
        os.kill(old, signal.SIGKILL)
        # the supervisor's Topology push, as an agent process would get it
        snap = d.wait_for(lambda s: d.child(s, "worker-0")["pid"] != old, 5.0, "worker-0 replaced")
        client.on_topology([{"role": "worker", "index": 0, "state": "exited"}])
        await asyncio.sleep(0.2)
        assert sorted(client.workers[1].calls) == sorted(rings) and client.counters["reattaches"] == 3
        for r in rings.values():
            r["in"].write(np.zeros(1600, dtype=np.int16))
        await asyncio.sleep(0.3)
        assert all(client.calls[c].in16_pos > 0 for c in rings)
        snap = d.wait_for(lambda s: d.child(s, "worker-0")["state"] == "ready", 30.0, "worker-0 ready again")
        client.on_topology([{"role": "worker", "index": 0, "state": "ready"}])
        await client.detach("c0")
        link = await client.attach("c0", inst, 8000, 16000)  # the least loaded worker is the new one
        assert link.worker == 0
    finally:
        await client.close()
        ctx.term()


def test_a_missing_model_stops_the_daemon_with_one_clear_error(short_tmp):
    empty = short_tmp / "no-models"
    empty.mkdir()
    cfg = write_config(short_tmp, workers=1, agents=1, extra=f'\n[models]\ndir = "{empty}"\n')
    minimal = "gateway=brisvox.daemon.minimal:main,agent=brisvox.daemon.minimal:main"
    d = Daemon(short_tmp, config=cfg, env={"BRISVOX_TEST_ROLE_MAIN": minimal}, real_roles=True).start()
    try:
        assert d.wait_exit(30) == 2  # a config-class failure: the daemon stops, no restart loop
        logs = d.logs()
        assert "brisvox models install" in logs and "silero_vad" in logs
    finally:
        d.close()
