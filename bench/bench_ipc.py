"""IPC costs: the audio ring per 20 ms frame, and a control-frame round trip between processes.

Figures:

* ring write + read of one 20 ms frame (320 samples at 16 kHz, 160 at 8 kHz),
  one writer and one reader cursor in the same process: the per-frame cost a
  worker pays on each ring it serves (target <= 10 us).
* control-frame round trip: a Ping encoded with a correlation id, sent over a
  DEALER to a ROUTER in another process over ``ipc://``, decoded, answered with a
  Pong, decoded again (target <= 100 us median; p99 reported).
* codec: encode + decode of a WorkerTick carrying 8 calls (what a worker sends
  each tick per subscriber).
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time

import numpy as np

Row = tuple[str, float, str, str]


def _ring_cost(frame: int, rate: int, n: int) -> float:
    from ipc.ring import Ring, instance_id, ring_name

    ring = Ring.create(ring_name(instance_id(), f"bench{rate}", "in"), 1 << 15, rate)
    try:
        rd = ring.reader(0)
        data = (np.arange(frame) % 1000).astype(np.int16)
        for _ in range(1000):  # warm-up
            ring.write(data)
            rd.read(frame)
        batches = []
        for _ in range(5):  # median of 5 batches: robust to a noisy shared machine
            t0 = time.perf_counter()
            for _ in range(n // 5):
                ring.write(data)
                rd.read(frame)
            batches.append((time.perf_counter() - t0) / (n // 5) * 1e6)
        return statistics.median(batches)
    finally:
        ring.close()
        ring.unlink()


def _echo_server(ep: str) -> None:
    import zmq

    from ipc.bus import bind, make_socket
    from ipc.codec import decode_env, encode
    from ipc.frames import Ping, Pong

    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.ROUTER)
    bind(sock, ep)
    while True:
        ident, data = sock.recv_multipart()
        f, cid = decode_env(data)
        if not isinstance(f, Ping):
            break
        sock.send_multipart([ident, encode(Pong(seq=f.seq, sent_ns=f.sent_ns), cid=cid)])
    sock.close(0)
    ctx.term()


def _round_trip(n: int) -> tuple[float, float]:
    d = tempfile.mkdtemp(prefix="bvb", dir="/tmp")
    from ipc.bus import endpoint

    ep = endpoint(d, "bench")
    pid = os.fork()  # before this process makes any ZeroMQ context
    if pid == 0:
        code = 1
        try:
            _echo_server(ep)
            code = 0
        finally:
            os._exit(code)
    import zmq

    from ipc.bus import make_socket
    from ipc.codec import decode_env, encode
    from ipc.frames import Command, Ping

    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(ep)
    try:
        samples = []
        for i in range(n + 200):
            t0 = time.perf_counter_ns()
            sock.send(encode(Ping(seq=i, sent_ns=t0), cid=i))
            if not sock.poll(5000):
                raise TimeoutError("no reply from the echo process")
            f, cid = decode_env(sock.recv())
            if cid != i:
                raise RuntimeError("correlation id mismatch")
            if i >= 200:  # the first ones include connection set-up
                samples.append((time.perf_counter_ns() - t0) / 1000)
        sock.send(encode(Command(name="quit")))
        samples.sort()
        return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]
    finally:
        sock.close(0)
        ctx.term()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        if os.path.exists(os.path.join(d, "bench.sock")):
            os.unlink(os.path.join(d, "bench.sock"))
        os.rmdir(d)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _codec_cost(n: int) -> float:
    from ipc.codec import decode, encode
    from ipc.frames import WorkerTick
    from ipc.tick_events import SpeechStart, to_wire

    start = SpeechStart(call_id="call-0001", pos=1_234_000, at=1_234_512, ns=1)
    tick = WorkerTick(worker=1, seq=123456, positions={f"call-{i:04d}": 1_234_567 + i for i in range(8)},
                      events=[to_wire(start)], sent_ns=1)
    t0 = time.perf_counter()
    for _ in range(n):
        decode(encode(tick))
    return (time.perf_counter() - t0) / n * 1e6


def run(quick: bool = False) -> list[Row]:
    n = 5_000 if quick else 100_000
    rt = 500 if quick else 10_000
    med, p99 = _round_trip(rt)
    return [
        ("ring write+read, 20 ms frame at 16 kHz (320 samples)", _ring_cost(320, 16000, n), "us", "<= 10 us"),
        ("ring write+read, 20 ms frame at 8 kHz (160 samples)", _ring_cost(160, 8000, n), "us", "<= 10 us"),
        ("control frame round trip, 2 processes, ipc://, median", med, "us", "<= 100 us"),
        ("control frame round trip, 2 processes, ipc://, p99", p99, "us", "report"),
        ("codec encode+decode, WorkerTick with 8 calls", _codec_cost(n // 5), "us", "report"),
    ]
