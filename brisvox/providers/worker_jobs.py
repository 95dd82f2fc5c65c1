"""The actor side of the local model jobs: requests to the call's inference worker and their streams.

Owns :class:`JobChannel` (what the local providers need) and its production
implementation :class:`WorkerJobChannel` over the agent process's
:class:`ipc.worker_client.WorkerClient`:

* ``request(frame, timeout)``: request/reply to the worker the call is
  attached to NOW (after a re-attach, the new one); no worker, or no reply in
  time, is a ProviderError (``connect`` / ``timeout``).
* ``send(frame)``: fire-and-forget (JobCancel), never awaited by the caller.
* ``listen(call_id, job, callback)``: streamed frames of one job
  (LlmJobDelta, TtsJobAudio, keyed by ``(call_id, job)``) go to the callback;
  returns the unsubscribe function. Frames of unknown jobs (late output of a
  cancelled job) are counted in ``unrouted`` and dropped.
* ``next_job()``: a job id unique in the process.
* ``in16_pos(call_id)``: the newest in16 position the worker reported (the
  local Whisper session's estimate when the stage gives no audio spans).
* ``warmed``: the (worker, kind) pairs already warmed in this process, so a
  model warm-up job runs once per worker, not once per call.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, Protocol

from brisvox.providers.base import ProviderError
from ipc.bus import RequestTimeout
from ipc.codec import Frame

JobCallback = Callable[[Frame], None]


class JobChannel(Protocol):
    warmed: set[tuple[int, str]]

    def worker_of(self, call_id: str) -> int: ...

    async def request(self, frame: Frame, timeout: float) -> Frame: ...  # noqa: ASYNC109

    def send(self, frame: Frame) -> None: ...

    def listen(self, call_id: str, job: int, cb: JobCallback) -> Callable[[], None]: ...

    def next_job(self) -> int: ...

    def in16_pos(self, call_id: str) -> int: ...


class JobRouter:
    """Listener table shared by channel implementations."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, int], JobCallback] = {}
        self._ids = itertools.count(1)
        self.unrouted = 0
        self.warmed: set[tuple[int, str]] = set()

    def next_job(self) -> int:
        return next(self._ids)

    def listen(self, call_id: str, job: int, cb: JobCallback) -> Callable[[], None]:
        key = (call_id, job)
        self._listeners[key] = cb
        return lambda: self._listeners.pop(key, None) and None

    def deliver(self, frame: Frame) -> None:
        key = (getattr(frame, "call_id", ""), getattr(frame, "job", -1))
        cb = self._listeners.get(key)
        if cb is None:
            self.unrouted += 1
            return
        cb(frame)


class WorkerJobChannel(JobRouter):
    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client
        prev = client.on_job_frame
        if prev is None:
            client.on_job_frame = self.deliver
        else:
            def both(frame: Frame) -> None:
                prev(frame)
                self.deliver(frame)

            client.on_job_frame = both
        self._tasks: set[asyncio.Task[None]] = set()

    def worker_of(self, call_id: str) -> int:
        link = self.client.calls.get(call_id)
        return -1 if link is None else int(link.worker)

    def in16_pos(self, call_id: str) -> int:
        link = self.client.calls.get(call_id)
        return 0 if link is None else int(link.in16_pos)

    async def request(self, frame: Frame, timeout: float) -> Frame:  # noqa: ASYNC109
        w = self.worker_of(getattr(frame, "call_id", ""))
        link = self.client.workers.get(w)
        if w < 0 or link is None or not link.ready:
            raise ProviderError("connect", "the call has no inference worker")
        try:
            reply: Frame = await link.req.request(frame, timeout)
            return reply
        except RequestTimeout:
            raise ProviderError("timeout", f"{frame.TYPE}: no reply from worker-{w} within {timeout:g}s") from None

    def send(self, frame: Frame) -> None:
        link = self.client.workers.get(self.worker_of(getattr(frame, "call_id", "")))
        if link is None:
            return
        t = asyncio.get_running_loop().create_task(link.req.send(frame))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
