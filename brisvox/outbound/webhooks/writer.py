"""The outbox's writer thread: events handed over without blocking, committed off the caller's loop.

Owns :class:`OutboxWriter`, one per process that produces events (each agent process;
the outbound role for ``campaign.row.done``). :meth:`OutboxWriter.submit` is what a call's
event loop calls: it puts the event and its targets on a bounded queue
(:data:`QUEUE_MAX`) and returns at once; one daemon thread takes what is queued in batches
and commits each batch in one transaction (:meth:`~brisvox.outbound.webhooks.outbox.Outbox.enqueue`).

Invariants:

* :meth:`submit` never blocks and never raises: a full queue drops the event and counts it
  (``dropped``), with one rate-limited warning line (:class:`~brisvox.runtime.log_limit.LogLimiter`);
  an event with no target is not queued.
* An event counts as accepted by the outbox (``committed``) only once its transaction
  committed (the file is ``synchronous = FULL``): from then on it survives any crash and is
  delivered at least once. Between :meth:`submit` and that commit (a batch period, about a
  millisecond when idle) it lives in this process's memory only; a failed commit counts its
  events in ``failed`` and logs (rate-limited).
* ``on_commit`` (optional, per submit) is called from the writer thread with True after the
  commit, False when it failed: the way a caller that must know (a campaign row) waits.
* :meth:`start` starts the thread (until then events only queue); :meth:`close` commits what is queued (bounded by its timeout), then stops the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from brisvox.outbound.webhooks.events import Event
from brisvox.outbound.webhooks.outbox import Outbox, Target
from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.webhooks.writer")

QUEUE_MAX = 10_000
BATCH_MAX = 500
_STOP = object()

Item = tuple[Event, tuple[Target, ...], Callable[[bool], None] | None]


class OutboxWriter:
    def __init__(self, path: str | Path, queue_max: int = QUEUE_MAX, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self.q: queue.Queue[object] = queue.Queue(maxsize=queue_max)
        self.log_limit = LogLimiter(log)
        self.submitted = 0
        self.committed = 0  # events (not rows) committed
        self.rows = 0
        self.dropped = 0
        self.failed = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="outbox-writer", daemon=True)
                self._thread.start()

    def submit(self, event: Event, targets: Sequence[Target], on_commit: Callable[[bool], None] | None = None) -> bool:
        """Queue ``event`` for ``targets``; False when it was not queued (no target, full, closed)."""
        if not targets:
            return False
        if self._closed:
            self.dropped += 1
            return False
        try:
            self.q.put_nowait((event, tuple(targets), on_commit))
        except queue.Full:
            self.dropped += 1
            self.log_limit("outbox_full", "webhook outbox queue full (%d): %s %s dropped", self.q.maxsize,
                           event.type, event.id)
            return False
        self.submitted += 1
        return True

    def _run(self) -> None:
        try:
            outbox = Outbox(self.path)
        except Exception as e:  # noqa: BLE001 - every event after this is counted as failed
            log.error("webhook outbox %s cannot be opened: %s", self.path, e)
            outbox = None
        stop = False
        while not stop:
            item = self.q.get()
            batch: list[Item] = []
            if item is _STOP:
                stop = True
            else:
                batch.append(item)  # type: ignore[arg-type]
            while len(batch) < BATCH_MAX:
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    continue
                batch.append(nxt)  # type: ignore[arg-type]
            if batch:
                self._commit(outbox, batch)
        if outbox is not None:
            outbox.close()

    def _commit(self, outbox: Outbox | None, batch: list[Item]) -> None:
        ok = False
        if outbox is not None:
            try:
                self.rows += outbox.enqueue(((e, t) for e, ts, _ in batch for t in ts), self.clock())
                ok = True
            except Exception as e:  # noqa: BLE001 - counted, logged, the thread goes on
                self.log_limit("outbox_commit", "webhook outbox commit of %d events failed: %s", len(batch), e,
                               level=logging.ERROR)
        events = sum(1 for _, ts, _ in batch if ts)  # a flush marker has no target
        if ok:
            self.committed += events
        else:
            self.failed += events
        for _, _, cb in batch:
            if cb is not None:
                try:
                    cb(ok)
                except Exception:  # noqa: BLE001 - a caller's callback never stops the writer
                    log.exception("outbox on_commit callback failed")

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything submitted so far is committed (or failed); False on timeout."""
        done = threading.Event()
        if self._thread is None:
            return self.q.empty()
        try:
            self.q.put((Event("", "", 0.0, b""), (), lambda ok: done.set()), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> bool:
        """Commit what is queued, then stop the thread; False when it did not finish within ``timeout``."""
        self._closed = True
        t = self._thread
        if t is None:
            return True
        try:
            self.q.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        t.join(timeout)
        return not t.is_alive()

    def stats(self) -> dict[str, int]:
        return {"submitted": self.submitted, "committed": self.committed, "rows": self.rows,
                "dropped": self.dropped, "failed": self.failed, "queued": self.q.qsize()}
