"""The subscriber side of the worker lanes: attach calls, receive ticks, survive worker deaths.

Owns, for one subscriber process (an agent process, the gateway's echo agent,
a test or the benchmark), the DEALER link to every inference worker and the
attachment of each of its calls:

* ``attach`` / ``detach`` a call (request/reply with a timeout), Smart Turn
  requests, TTS utterance boundaries and cuts.
* Every :class:`WorkerTick` is split per call: the in16 position and the
  events, typed (``ipc/tick_events.py``), go to ``on_event(call_id, event)``
  / ``on_position(call_id, pos)``; the client tracks whether each call is
  inside speech (a start without its stop) and where that speech started.
* Frames from the workers are dispatched by one table (frame class ->
  handler): ticks, OutUtterance (``on_out_utterance``) and the streamed
  local-job output (``on_job_frame``); any other frame is counted
  (``unexpected_type``) and logged once per type.
* The client is one **incarnation** of its identity (a random id, new with
  every client, so with every process): it says so in a SubscriberHello, the
  first frame on each worker link and again whenever a worker is reported
  ready, and in every AttachCall. A worker that still serves calls of an
  earlier incarnation of the identity (the process was killed and restarted
  under the same name) detaches them at once instead of ticking them until
  it restarts itself. A tick from a worker that names a call this client
  does not have, or that comes while it has no call there (only an earlier
  incarnation's calls make a worker tick an identity), says it again (at
  most once a second per worker): a lost hello heals itself.
* A worker death (``worker_lost(index)``, driven by the supervisor's
  Topology push through :meth:`on_topology`) re-attaches each of its calls to
  the least loaded ready worker with ``speaking_since``; the new worker opens
  with a synthesized stop. With no worker ready, the client synthesizes that
  stop itself (``reason`` "worker_lost") and re-attaches as soon as a worker
  is ready again.

Usage (an agent process; ``rt`` is its ChildRuntime)::

    ctx = zmq.asyncio.Context.shadow(rt.zmq_context())
    client = WorkerClient(ctx, rt.name, {r["index"]: rt.inbox_endpoint("worker", r["index"])
                                         for r in rt.peers("worker")},
                          on_event=actor_router, endpoint_for=lambda i: rt.inbox_endpoint("worker", i))
    await client.start()
    rt.add_topology_callback(lambda rows: loop.call_soon_threadsafe(client.on_topology, rows))
    link = await client.attach(call_id, instance, call_rate, tts_rate, worker=preferred)
    ...  # on_event(call_id, SpeechStart(...) | SpeechStop(...) | ...) per tick event
    r = await client.smart_turn(call_id, stop_event.at, budget_s=0.5)
    await client.detach(call_id)

It speaks only the worker-lane frames of :mod:`ipc.frames`; the Topology
rows it reads are plain dicts (``role``, ``index``, ``state``), so it needs
nothing from ``workers`` or ``brisvox`` (``ipc`` imports no role package).

Invariants: a call is attached to at most one worker at a time, and a tick
from any other worker is ignored for it (a late tick from the dead worker
cannot produce events after the re-attach); every request has a timeout; the
client never re-attaches a call on mere silence from a worker (a wedged but
alive worker would then be a second writer of ``in16``): only a death
reported by the supervisor (or the owner) moves calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from ipc.bus import AsyncRequester, RequestTimeout, connect, make_socket
from ipc.codec import Frame, FrameError, encode, note_unexpected
from ipc.frames import (
    AmdStart,
    AttachCall,
    Attached,
    DetachCall,
    Detached,
    ErrorReply,
    LlmJobDelta,
    OutUtterance,
    SmartTurnCancel,
    SmartTurnRequest,
    SmartTurnResult,
    SubscriberHello,
    TtsCut,
    TtsJobAudio,
    TtsUtterance,
    WorkerTick,
)
from ipc.tick_events import SpeechStart, SpeechStop, TickEvent, from_wire

log = logging.getLogger("brisvox.workers.client")  # the historical name: log filters keep working

READY_WAIT_S = 0.5  # an attach with no worker ready waits this long for one (a Topology in flight)
HELLO_REPEAT_NS = 1_000_000_000  # a hello prompted by foreign ticks, at most this often per worker

EventCb = Callable[[str, TickEvent], Any]


class AttachError(Exception):
    """No worker could take the call (every ready worker refused or timed out)."""


@dataclass
class CallAttachment:
    call_id: str
    instance: str
    call_rate: int
    tts_rate: int
    vad: dict[str, Any] | None
    gateway: str
    worker: int = -1  # -1: not attached (waiting for a ready worker)
    in16_pos: int = 0
    speaking_since: int = -1
    attached_ns: int = 0
    reattaches: int = 0
    ring_key: str = ""  # the call's ring key (CallStart.ring_key), sent in every AttachCall
    denoise: str = "off"  # the agent's `[audio] denoise`, sent in every AttachCall


@dataclass
class WorkerConnection:
    index: int
    endpoint: str
    sock: Any
    req: AsyncRequester
    ready: bool = True
    calls: set[str] = field(default_factory=set)
    last_tick_ns: int = 0
    ticks: int = 0
    hello_ns: int = 0  # when the last SubscriberHello went out on this link


class WorkerClient:
    """One subscriber's links to the inference workers.

    ``endpoints`` maps worker index -> inbox endpoint. ``identity`` is this
    subscriber's DEALER identity (``agent-0``); it must be unique per process.
    ``incarnation`` (random when not given) tells this client from an earlier
    one of the same identity; it must be new for every process.
    Use inside a running asyncio loop: ``await client.start()`` then
    ``attach``/``detach``; ``await client.close()`` at the end.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        identity: str,
        endpoints: dict[int, str],
        on_event: EventCb | None = None,
        on_position: Callable[[str, int], Any] | None = None,
        on_out_utterance: Callable[[OutUtterance], Any] | None = None,
        request_timeout: float = 2.0,
        endpoint_for: Callable[[int], str] | None = None,
        on_job_frame: Callable[[Frame], Any] | None = None,
        incarnation: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.identity = identity
        self.incarnation = incarnation or secrets.token_hex(8)
        self.endpoints = dict(endpoints)
        self.endpoint_for = endpoint_for  # inbox of a worker first seen in a Topology push
        self.on_event = on_event
        self.on_position = on_position
        self.on_job_frame = on_job_frame  # streamed local-job output (LlmJobDelta, TtsJobAudio)
        self.on_out_utterance = on_out_utterance
        self.request_timeout = request_timeout
        self.workers: dict[int, WorkerConnection] = {}
        self.calls: dict[str, CallAttachment] = {}
        self.counters = {"ticks": 0, "stale_ticks": 0, "reattaches": 0, "local_stops": 0,
                         "attach_failures": 0, "bad_events": 0, "unexpected_type": 0,
                         "hellos": 0, "hello_failed": 0}
        self.closed = False  # after close(): no link is made again (a late Topology push opens nothing)
        self._pending_reattach: set[str] = set()
        self._became_ready = asyncio.Event()  # set (and replaced) when a worker turns ready
        self._unexpected: set[str] = set()  # frame types without a handler, already logged
        # the dispatch of frames from the workers (replies are matched to their requests first)
        self.handlers: dict[type[Frame], Callable[[Any], None]] = {
            WorkerTick: self._on_tick,
            OutUtterance: self._on_out_utterance,
            LlmJobDelta: self._on_job_frame,
            TtsJobAudio: self._on_job_frame,
        }

    # -- links ---------------------------------------------------------------

    async def start(self) -> None:
        for index, ep in self.endpoints.items():
            self._link(index, ep)

    def _link(self, index: int, ep: str, hello: bool = True) -> WorkerConnection:
        if self.closed:
            raise RuntimeError("the worker client is closed")
        sock = make_socket(self.ctx, zmq.DEALER, identity=self.identity.encode())
        sock.setsockopt(zmq.RECONNECT_IVL, 20)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        connect(sock, ep)
        req = AsyncRequester(sock, f"{self.identity}<-worker-{index}", on_frame=self._on_frame)
        req.start()
        link = WorkerConnection(index, ep, sock, req)
        self.workers[index] = link
        if hello:
            self._hello(link)
        return link

    def _hello(self, link: WorkerConnection) -> None:
        """Say which incarnation this identity is (never waits: a full or broken link is
        counted, and the next AttachCall, which carries the incarnation too, says it)."""
        try:
            fut = link.sock.send(encode(SubscriberHello(incarnation=self.incarnation)), zmq.NOBLOCK)
        except zmq.ZMQError:
            self.counters["hello_failed"] += 1
            return
        link.hello_ns = time.monotonic_ns()
        self.counters["hellos"] += 1
        if isinstance(fut, asyncio.Future):  # zmq.asyncio reports a NOBLOCK failure on the future
            fut.add_done_callback(self._hello_sent)

    def _hello_sent(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.counters["hellos"] -= 1
            self.counters["hello_failed"] += 1

    async def close(self) -> None:
        """Close every link. The sockets are closed even when this is cancelled or a
        requester's close fails (an open socket of a shadow context would hold the
        process's ZeroMQ term at exit); afterwards no link is made again."""
        self.closed = True
        links = list(self.workers.values())
        self.workers.clear()
        try:
            for link in links:
                await link.req.close()
        finally:
            for link in links:
                link.sock.close(0)

    # -- topology --------------------------------------------------------------

    def on_topology(self, rows: Iterable[dict[str, Any]]) -> None:
        """Apply a Topology push (call on the loop: ``loop.call_soon_threadsafe``).

        ready: new attaches may go there (calls waiting for a worker are
        re-attached); starting: not yet; exited/failed: the process is gone,
        its calls are re-attached at once; stopping: the process still runs,
        so each call is detached from it first and then attached elsewhere
        (never two writers of a call's in16).
        """
        if self.closed:
            return  # a push that lands while the owner shuts down must not open a link
        loop = asyncio.get_running_loop()
        for row in rows:
            if row.get("role") != "worker":
                continue
            index = int(row.get("index", -1))
            state = row.get("state")
            link = self.workers.get(index)
            if link is None:
                if state != "ready" or self.endpoint_for is None:
                    continue
                link = self._link(index, self.endpoint_for(index), hello=False)  # hello when ready
                link.ready = False
            if state == "ready" and not link.ready:
                link.ready = True
                self._hello(link)
                self._became_ready.set()
                self._became_ready = asyncio.Event()
                loop.create_task(self._retry_unattached())
            elif state == "starting":
                link.ready = False
            elif state in ("exited", "failed") and (link.ready or link.calls):
                loop.create_task(self.worker_lost(index))
            elif state == "stopping" and (link.ready or link.calls):
                loop.create_task(self.worker_stopping(index))

    def ready_workers(self) -> list[int]:
        return [i for i, w in self.workers.items() if w.ready]

    def _pick(self, exclude: set[int] | None = None) -> list[int]:
        """Ready workers, least loaded (by this subscriber's calls) first."""
        cands = [w for w in self.workers.values() if w.ready and w.index not in (exclude or set())]
        cands.sort(key=lambda w: (len(w.calls), w.index))
        return [w.index for w in cands]

    # -- requests ----------------------------------------------------------------

    async def _request(self, index: int, frame: Frame, wait_s: float | None = None) -> Frame:
        return await self.workers[index].req.request(frame, wait_s or self.request_timeout)

    async def attach(
        self,
        call_id: str,
        instance: str,
        call_rate: int,
        tts_rate: int,
        worker: int | None = None,
        vad: dict[str, Any] | None = None,
        gateway: str = "",
        ring_key: str = "",
        denoise: str = "off",
    ) -> CallAttachment:
        """Attach a call, preferring ``worker``; falls over to other ready workers.

        With no worker ready it waits up to ``READY_WAIT_S`` for one. Raises
        :class:`AttachError` (with the last error) when none took it.
        A refusal that is about the call itself (bad_ring, bad_rate,
        bad_params) is not retried elsewhere.
        """
        link = CallAttachment(call_id, instance, call_rate, tts_rate, vad, gateway, ring_key=ring_key,
                              denoise=denoise)
        self.calls[call_id] = link
        order = self._pick()
        if not order:  # the gateway may have seen a worker turn ready a moment before this process
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(READY_WAIT_S):
                    await self._became_ready.wait()
            order = self._pick()
        if worker is not None and worker in order:
            order.remove(worker)
            order.insert(0, worker)
        try:
            await self._attach_to(link, order)
        except AttachError:
            self.calls.pop(call_id, None)
            raise
        return link

    async def _attach_to(self, link: CallAttachment, order: list[int]) -> None:
        last = "no ready worker"
        for index in order:
            frame = AttachCall(call_id=link.call_id, subscriber=self.identity, instance=link.instance,
                               call_rate=link.call_rate, tts_rate=link.tts_rate,
                               speaking_since=link.speaking_since, vad=link.vad, gateway=link.gateway,
                               incarnation=self.incarnation, ring_key=link.ring_key, denoise=link.denoise)
            # tentatively ours before the request: the worker's first tick can be
            # processed before this coroutine resumes, and must not look stale
            link.worker = index
            try:
                reply = await self._request(index, frame)
            except RequestTimeout:
                link.worker = -1
                # the worker may still attach it: take it back, so two workers never
                # write this call's in16 (the detach follows the attach on one socket)
                with contextlib.suppress(TimeoutError):
                    await self._send(index, DetachCall(call_id=link.call_id))
                last = f"worker-{index}: attach timed out"
                self.counters["attach_failures"] += 1
                continue
            if isinstance(reply, Attached):
                link.in16_pos = max(link.in16_pos, reply.in16_pos)
                link.attached_ns = time.monotonic_ns()
                self.workers[index].calls.add(link.call_id)
                return
            link.worker = -1
            self.counters["attach_failures"] += 1
            if isinstance(reply, ErrorReply):
                last = f"worker-{index}: {reply.kind}: {reply.detail}"
                if reply.kind in ("bad_ring", "bad_rate", "bad_params"):
                    break
            else:
                last = f"worker-{index}: unexpected {reply.TYPE}"
        raise AttachError(last)

    async def detach(self, call_id: str) -> None:
        link = self.calls.pop(call_id, None)
        self._pending_reattach.discard(call_id)
        if link is None or link.worker < 0:
            return
        w = self.workers.get(link.worker)
        if w is None:
            return
        w.calls.discard(call_id)
        if w.ready:
            try:
                await self._request(link.worker, DetachCall(call_id=call_id))
            except RequestTimeout:
                log.warning("detach of %s from worker-%d timed out", call_id, link.worker)

    async def smart_turn(self, call_id: str, end_pos: int, budget_s: float) -> SmartTurnResult | ErrorReply:
        """Score the 8 s of in16 ending at ``end_pos``. The worker answers ``expired``
        if the job could not start within ``budget_s``; the reply is awaited a little longer."""
        link = self.calls.get(call_id)
        if link is None or link.worker < 0:
            return ErrorReply(kind="unattached", call_id=call_id)
        deadline = time.monotonic_ns() + int(budget_s * 1e9)
        try:
            reply = await self._request(link.worker, SmartTurnRequest(call_id=call_id, end_pos=end_pos,
                                                                      deadline_ns=deadline), budget_s + 1.5)
        except RequestTimeout:
            return ErrorReply(kind="timeout", call_id=call_id, detail="no reply from the worker")
        if isinstance(reply, SmartTurnResult | ErrorReply):
            return reply
        return ErrorReply(kind="unexpected", call_id=call_id, detail=reply.TYPE)

    async def smart_turn_cancel(self, call_id: str, end_pos: int) -> None:
        """The analysis ending at ``end_pos`` can no longer change the turn: the worker drops
        it if it is still queued (its request is then answered ``cancelled``)."""
        link = self.calls.get(call_id)
        if link is not None and link.worker >= 0:
            await self._send(link.worker, SmartTurnCancel(call_id=call_id, end_pos=end_pos))

    async def _send(self, index: int, frame: Frame) -> None:
        async with asyncio.timeout(self.request_timeout):
            await self.workers[index].req.send(frame)

    async def tts_utterance(self, call_id: str, utterance: int, epoch: int, tts_pos: int) -> None:
        """Utterance ``utterance`` of ``epoch`` starts at ``tts_pos`` of the tts ring (send it
        before writing the utterance's first sample); the worker answers OutUtterance."""
        link = self.calls.get(call_id)
        if link is not None and link.worker >= 0:
            await self._send(link.worker,
                             TtsUtterance(call_id=call_id, utterance=utterance, epoch=epoch, tts_pos=tts_pos))

    async def tts_cut(self, call_id: str, epoch: int, tts_pos: int) -> None:
        """Barge-in: drop tts audio of ``epoch`` (and older) before ``tts_pos``."""
        link = self.calls.get(call_id)
        if link is not None and link.worker >= 0:
            await self._send(link.worker, TtsCut(call_id=call_id, epoch=epoch, tts_pos=tts_pos))

    async def amd_start(self, call_id: str, in16_pos: int, max_wait_ms: int, leave_message: bool) -> None:
        """The dialled call was answered at ``in16_pos``: its worker classifies the opening."""
        link = self.calls.get(call_id)
        if link is not None and link.worker >= 0:
            await self._send(link.worker, AmdStart(call_id=call_id, in16_pos=in16_pos, max_wait_ms=max_wait_ms,
                                                   leave_message=leave_message))

    # -- worker death ----------------------------------------------------------

    async def worker_lost(self, index: int) -> None:
        """Re-attach every call of a dead worker elsewhere (fresh VAD state)."""
        w = self.workers.get(index)
        if w is None:
            return
        w.ready = False
        moved = [self.calls[c] for c in sorted(w.calls) if c in self.calls]
        w.calls.clear()
        for link in moved:
            link.worker = -1
        await asyncio.gather(*(self._reattach(link, exclude={index}) for link in moved))

    async def worker_stopping(self, index: int) -> None:
        """A worker is shutting down (drain, memory restart): move its calls gracefully to a
        ready worker; with none ready they stay (a draining worker serves its calls until they
        detach or its grace ends; then :meth:`worker_lost` applies)."""
        w = self.workers.get(index)
        if w is None:
            return
        w.ready = False
        if not self._pick({index}):  # nowhere to go (a drain of the whole daemon): it serves them to their end
            return

        async def move(call_id: str) -> None:
            link = self.calls.get(call_id)
            if link is None or link.worker != index:
                return
            try:
                reply = await self._request(index, DetachCall(call_id=call_id))
            except RequestTimeout:
                return  # still attached there: it moves when the process is reported gone
            if not isinstance(reply, Detached):
                return
            w.calls.discard(call_id)
            link.worker = -1
            await self._reattach(link, exclude={index})

        await asyncio.gather(*(move(c) for c in sorted(w.calls)))

    async def _reattach(self, link: CallAttachment, exclude: set[int]) -> None:
        order = self._pick(exclude)
        try:
            if not order:
                raise AttachError("no ready worker")
            await self._attach_to(link, order)
            link.reattaches += 1
            self.counters["reattaches"] += 1
        except AttachError as e:
            log.warning("call %s: re-attach failed (%s); waiting for a ready worker", link.call_id, e)
            self._pending_reattach.add(link.call_id)
            if link.speaking_since >= 0:
                self.counters["local_stops"] += 1
                ev = SpeechStop(call_id=link.call_id, pos=max(link.speaking_since, link.in16_pos),
                                at=link.in16_pos, ns=time.monotonic_ns(), reason="worker_lost")
                link.speaking_since = -1
                self._deliver(link.call_id, ev)

    async def _retry_unattached(self) -> None:
        todo = [self.calls[c] for c in sorted(self._pending_reattach) if c in self.calls]
        self._pending_reattach.clear()
        await asyncio.gather(*(self._reattach(link, exclude=set()) for link in todo))

    # -- inbound -----------------------------------------------------------------

    def _deliver(self, call_id: str, ev: TickEvent) -> None:
        if self.on_event is not None:
            self.on_event(call_id, ev)

    def _on_frame(self, frame: Frame) -> None:
        handler = self.handlers.get(type(frame))
        if handler is None:
            note_unexpected(self.counters, self._unexpected, f"{self.identity}<-workers", frame)
        else:
            handler(frame)

    def _on_out_utterance(self, frame: OutUtterance) -> None:
        if self.on_out_utterance is not None:
            self.on_out_utterance(frame)

    def _on_job_frame(self, frame: Frame) -> None:
        if self.on_job_frame is not None:
            self.on_job_frame(frame)

    def _on_tick(self, t: WorkerTick) -> None:
        self.counters["ticks"] += 1
        w = self.workers.get(t.worker)
        foreign = False  # the tick names a call this client does not have
        calls = self.calls
        worker = t.worker
        on_position = self.on_position
        for call_id, pos in t.positions.items():
            link = calls.get(call_id)
            if link is None or link.worker != worker:
                foreign = foreign or link is None
                continue
            link.in16_pos = pos
            if on_position is not None:
                on_position(call_id, pos)
        if w is not None:
            now = time.monotonic_ns()
            w.last_tick_ns = now
            w.ticks += 1
            if (foreign or not w.calls) and now - w.hello_ns >= HELLO_REPEAT_NS:
                self._hello(w)  # the worker serves calls of an earlier incarnation of this identity
        for row in t.events:
            try:
                ev = from_wire(row)
            except FrameError as e:
                self.counters["bad_events"] += 1
                if self.counters["bad_events"] == 1:
                    log.warning("dropped a bad event from worker-%d: %s", t.worker, e)
                continue
            call_id = ev.call_id
            link = calls.get(call_id)
            if link is None or link.worker != t.worker:
                self.counters["stale_ticks"] += 1
                continue
            if isinstance(ev, SpeechStart):
                link.speaking_since = ev.pos
            elif isinstance(ev, SpeechStop):
                link.speaking_since = -1
            self._deliver(call_id, ev)
