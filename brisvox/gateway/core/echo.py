"""The echo agent: plays the caller's audio back after a delay (operator line test).

Owns the built-in agent that serves a call routed to the agent ``echo`` (and
any call while no agent process is up). It exercises the whole audio path
without any model:

* through a worker (``[gateway] echo_use_workers`` and a ready worker):
  ``in`` -> worker resampling -> ``in16`` -> echo -> ``tts`` (16 kHz) ->
  worker resampling -> ``out`` -> pacer. The echo attaches the call to the
  worker itself (subscriber = the gateway) and announces its utterances with
  TtsUtterance; the worker's OutUtterance opens the epoch gate;
* directly (no worker configured or reachable): ``in`` -> echo -> ``out``.

Line-test features: a mark every ``echo_mark_ms`` of output (Twilio peers
echo them; SIP/native marks are reported on release), and any DTMF digit
clears the playback (a barge-in test: the caller hears the echo stop, then
resume after the delay). Counts are in the call's stats.

Invariants: the echo is the single writer of the ring it feeds (``tts`` via
a worker, ``out`` directly); the ``out`` ring always receives the delay as
silence first, so the caller hears their voice ``echo_delay_ms`` later.

It asks the gateway only what :class:`EchoHost` names (the gateway core
implements it): the playout inputs an agent would send as frames, the worker
it runs on, the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from brisvox.gateway.config import GatewayConfig
from brisvox.gateway.core.calls import Call
from brisvox.gateway.metrics import GatewayMetrics
from ipc.ring import RingReader
from ipc.worker_client import AttachError, WorkerClient

log = logging.getLogger("brisvox.gateway.core.echo")

MAX_MOVE_S = 1.0  # at most this much audio moved per tick (bounds the work of one tick)


class EchoHost(Protocol):
    """What the echo agent asks of the gateway core."""

    @property
    def cfg(self) -> GatewayConfig: ...

    @property
    def instance(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def metrics(self) -> GatewayMetrics: ...

    async def echo_client(self) -> WorkerClient | None: ...

    def set_worker(self, call: Call, index: int) -> None: ...

    def apply_clear(self, call: Call, epoch: int, sent_ns: int = 0, arrival_ns: int = 0,
                    lazy: bool = False) -> None: ...

    def note_utterance(self, call: Call, epoch: int, out_pos: int) -> None: ...

    def add_mark(self, call: Call, name: str, position: int) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...


class EchoAgent:
    def __init__(self, core: EchoHost, call: Call) -> None:
        self.core = core
        self.call = call
        cfg = core.cfg
        self.delay_ms = cfg.echo_delay_ms
        self.mark_ms = cfg.echo_mark_ms
        self.digit_clears = cfg.echo_digit_clears
        self.epoch = 0
        self.utterance = 0
        self.mode = "direct"
        self.src: RingReader | None = None
        self.sink = call.out_ring
        self.sink_rate = call.call_rate
        self.next_mark = 0
        self.mark_seq = 0
        self.marks_played = 0
        self.cleared = 0
        self.moved = 0
        self.client: WorkerClient | None = None

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        client = await self.core.echo_client()
        if client is not None and client.ready_workers() and await self._attach(client):
            return
        self._start_direct()

    def _start_direct(self) -> None:
        """Echo ``in`` straight into ``out`` from the call's first sample."""
        call = self.call
        self.core.set_worker(call, -1)  # no worker serves it
        self.mode = "direct"
        self.src = call.in_ring.reader(0)
        self.sink = call.out_ring
        self.sink_rate = call.call_rate
        start = self.sink.write_pos
        self.sink.write_silence(self.sink_rate * self.delay_ms // 1000)
        self.next_mark = start + self._mark_step()
        self.core.note_utterance(call, self.epoch, start)

    async def _attach(self, client: WorkerClient) -> bool:
        call = self.call
        core = self.core
        try:
            link = await client.attach(call.call_id, core.instance, call.call_rate, call.tts_rate,
                                       worker=call.worker if call.worker >= 0 else None, gateway=core.identity,
                                       ring_key=call.ring_key)
        except AttachError as e:
            log.warning("echo %s: no worker took the call (%s); echoing directly", call.call_id, e)
            core.metrics.inc("echo_attach_failed")
            return False
        self.client = client
        self.mode = "worker"
        core.set_worker(call, link.worker)
        self.src = call.rings["in16"].reader(max(link.in16_pos, 0))
        self.sink = call.rings["tts"]
        self.sink_rate = self.sink.rate
        start = self.sink.write_pos
        await client.tts_utterance(call.call_id, self.utterance, self.epoch, start)
        self.sink.write_silence(self.sink_rate * self.delay_ms // 1000)
        self.next_mark = self._out_pos(start) + self._mark_step()
        core.metrics.inc("echo_via_worker")
        return True

    async def stop(self) -> None:
        if self.client is not None:
            try:
                await self.client.detach(self.call.call_id)
            except Exception:  # detaching is best effort: the worker drops orphans itself
                self.core.metrics.inc("echo_detach_failed")

    # -- per tick (called by the pacer before it releases the call's frames) ----

    def tick(self, now: float) -> None:
        src = self.src
        if src is None:
            return
        res = src.read(int(src.ring.rate * MAX_MOVE_S))
        if len(res.samples):
            self.sink.write(res.samples)
            self.moved += len(res.samples)
        out_w = self._out_pos(self.sink.write_pos)
        step = self._mark_step()
        while out_w >= self.next_mark:
            self.mark_seq += 1
            self.core.add_mark(self.call, f"echo-{self.mark_seq}", self.next_mark)
            self.next_mark += step

    def _mark_step(self) -> int:
        return max(1, self.call.call_rate * self.mark_ms // 1000)

    def _out_pos(self, sink_pos: int) -> int:
        """Approximate out position of a sink position (exact in direct mode)."""
        if self.mode == "direct":
            return sink_pos
        return sink_pos * self.call.call_rate // self.sink_rate

    # -- events -----------------------------------------------------------------

    def on_dtmf(self, digit: str) -> None:
        if self.digit_clears:
            self.clear()

    def clear(self) -> None:
        """Barge-in line test: silence the echo now, resume after the delay."""
        call = self.call
        self.core.apply_clear(call, self.epoch, time.monotonic_ns())
        self.cleared += 1
        self.epoch += 1
        self.utterance += 1
        start = self.sink.write_pos
        if self.mode == "worker" and self.client is not None:
            self.core.spawn(self._worker_cut(self.client, self.epoch - 1, self.utterance, self.epoch, start))
        else:
            self.core.note_utterance(call, self.epoch, start)
        self.sink.write_silence(self.sink_rate * self.delay_ms // 1000)
        self.next_mark = self._out_pos(start) + self._mark_step()

    async def _worker_cut(self, client: WorkerClient, old: int, utterance: int, epoch: int, pos: int) -> None:
        """Drop the worker's pending tts of the old epoch, then announce the new utterance
        (its OutUtterance opens the gateway's epoch gate)."""
        await client.tts_cut(self.call.call_id, old, pos)
        await client.tts_utterance(self.call.call_id, utterance, epoch, pos)

    def on_cleared(self, epoch: int, position: int, marks: list[str]) -> None:
        pass

    def on_mark_played(self, name: str, position: int) -> None:
        self.marks_played += 1

