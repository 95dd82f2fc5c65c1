"""A pacer tick gives way to control frames: every SLICE calls it polls the inbox, so a Clear
that arrives while a long tick runs is handled before the rest of the calls, not after them
(the barge-in decision -> Clear path under load). Real ZeroMQ sockets for the inbox poll."""

from __future__ import annotations

import asyncio
import time

import zmq

from brisvox.gateway.core.pacer import SLICE, Pacer
from brisvox.gateway.metrics import GatewayMetrics
from ipc.bus import connect, make_socket
from ipc.codec import encode
from ipc.frames import Clear
from ipc.links import Links


def test_a_tick_polls_the_inbox_after_every_slice_of_calls():
    served: list[str] = []
    polled_at: list[int] = []
    pacer = Pacer(GatewayMetrics(), on_actions=lambda c, a: None, on_report=lambda calls: None,
                  between=lambda: polled_at.append(len(served)))
    n = SLICE * 2 + 5
    pacer.calls = {f"c{i}": object() for i in range(n)}  # type: ignore[misc]
    pacer.service = lambda call, now, grid=None, on_grid=True: served.append(call)  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    try:
        pacer._loop = loop
        pacer._scheduled = loop.time()
        pacer._tick()
        pacer.stop()
    finally:
        loop.close()
    assert len(served) == n
    assert polled_at == [SLICE, 2 * SLICE]  # mid-tick, between slices; none after the last call


def test_poll_inbox_handles_a_waiting_frame_without_the_loop_and_is_idle_when_empty(tmp_path):
    ctx = zmq.Context()
    got: list[tuple[object, str]] = []
    links = Links(ctx, "gateway-0", lambda f, sender, cid: got.append((f, sender)))
    loop = asyncio.new_event_loop()
    endpoint = f"ipc://{tmp_path}/inbox"
    dealer = make_socket(ctx, zmq.DEALER, identity=b"agent-0")
    try:
        links.start(loop, endpoint)  # the loop never runs: only poll_inbox can read
        links.poll_inbox()
        assert got == []
        connect(dealer, endpoint)
        dealer.send(encode(Clear(call_id="c1", epoch=3, sent_ns=time.monotonic_ns())))
        deadline = time.monotonic() + 5.0
        while not got and time.monotonic() < deadline:
            links.poll_inbox()
            time.sleep(0.005)
        assert [(type(f).__name__, getattr(f, "call_id", None), s) for f, s in got] == [("Clear", "c1", "agent-0")]
        links.poll_inbox()
        assert len(got) == 1  # read once
    finally:
        dealer.close(0)
        links.close()
        loop.close()
        ctx.term()


def test_the_callers_audio_path_polls_the_inbox_at_most_once_a_millisecond():
    """A burst of carrier reads in one loop iteration (100 calls' frames) gives way to a Clear:
    ``audio_in`` polls the inbox when the last poll is INBOX_POLL_NS old, and only then."""
    from types import SimpleNamespace

    import numpy as np

    from brisvox.gateway.config import GatewaySettings
    from brisvox.gateway.core.gateway_core import INBOX_POLL_NS, GatewayCore

    core = GatewayCore(GatewaySettings(), instance="t", listeners={}, dialers={})
    try:
        written: list[int] = []
        polls: list[int] = []
        core.lifecycle = SimpleNamespace(audio_in=lambda call, pcm, rate, wire, gap: written.append(len(pcm)))  # type: ignore[assignment]
        core.links.poll_inbox = lambda: polls.append(len(written))  # type: ignore[method-assign]
        frame = np.zeros(160, np.int16)
        t0 = time.monotonic_ns()
        for _ in range(50):
            core.audio_in(None, frame, 8000)  # type: ignore[arg-type]
        burst_ns = time.monotonic_ns() - t0
        assert len(written) == 50
        if burst_ns < INBOX_POLL_NS:  # the burst took less than the poll gap (always, unless the host stalled)
            assert polls == [1]  # polled after the first frame was written, not again within the millisecond
        time.sleep(INBOX_POLL_NS / 1e9 * 1.5)
        core.audio_in(None, frame, 8000)  # type: ignore[arg-type]
        assert polls[-1] == 51  # a frame a millisecond later polls again, after its own write
    finally:
        core.links.close()
        core.ctx.term()
