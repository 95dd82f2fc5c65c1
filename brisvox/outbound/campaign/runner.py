"""The campaign service: polls the store, plans with the scheduler, dials through a :class:`Dialer`.

:class:`CampaignRunner` runs every ``running`` campaign of one SQLite file
(:class:`~.store.CampaignStore`) until ``stop`` is set. The CLI changes the
file from another process (start, pause, resume, cancel); the runner sees it
at its next poll (``poll_s``).

Invariants:

* One runner per file (:class:`~.store.RunnerLock`); at its start it recovers
  the attempts a killed runner left without outcome (:meth:`~.store.CampaignStore.recover`:
  ``unknown``, never re-dialled).
* Each attempt is committed before :meth:`Dialer.dial` is called and its
  outcome after it returns (:mod:`.store`); a dial that gives no verdict in
  ``ring + DIAL_MARGIN_S`` seconds (or raises) is ``unknown``: whether the
  INVITE went out is not known.
* A campaign's calls in flight (dials waiting for their verdict, plus its
  answered calls the gateway still carries: :meth:`Dialer.live`, asked at
  most every ``live_every_s``; when the gateway does not say, the last known
  set stands) never exceed its ``max_concurrent``; starts are spaced by its
  rate (:func:`~.scheduler.plan`).
* The store is used from the runner's loop only (each call one short
  transaction); the dials run concurrently (a task each, the real dialer's
  blocking request in a thread).
* No attempt is begun while :meth:`Dialer.ready` says no (the daemon not running, its
  gateway not answering): a dial that could not be sent is not recorded as made
  (it would end ``unknown``); the answer holds for ``ready_every_s``.
* A campaign whose planning fails (a row's time zone this host's tzdata does not
  know) is skipped, logged at most once a minute; the others go on.
* A done row's ``campaign.row.done`` (``on_row_done``: awaited, True once the event is
  committed to the outbox) is marked in the store only then; what is not marked (the
  runner killed in between, a row recovered ``unknown``, a refused send) is sent again at
  the next start, or the next ``renotify_every_s``, under the same event id
  (:func:`~brisvox.outbound.webhooks.campaign_events.row_event_id`): every done row's event
  reaches the outbox at least once, one event after deduplication by id.
* A cancelled campaign's rows that the cancel ended (``cancelled``, or a row waiting for a
  retry: its last attempt's outcome) are done and unnotified in the store, as a row whose
  event was refused: the runner sends their events at its next renotify, at once when it
  sees a campaign leave ``running``/``paused``, batch after batch while batches fill and
  succeed; a row whose dial was in flight at the cancel is ended by that dial (its real
  outcome, one event). A runner without ``on_row_done`` marks those rows notified instead
  (:meth:`~.store.CampaignStore.mark_all_notified`: no event is owed where none is sent).
* The counters ``/metrics`` shows (``stats()["by_campaign"]``) are read in the meter's thread
  (:class:`~.meter.Meter`), at most every ``meter_every_s``, never on this loop; the calls in
  flight are this runner's own count: its answered calls are asked about (``live``) for
  every campaign that has some, paused and ended ones too, until the gateway no longer
  carries them.
* On ``stop`` no new dial starts; the dials in flight get ``drain_s`` to finish,
  then are cancelled (their attempts stay without outcome: ``unknown`` at the
  next start).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from brisvox.outbound.campaign.meter import Meter
from brisvox.outbound.campaign.outcomes import ANSWERED, UNKNOWN, classify
from brisvox.outbound.campaign.scheduler import plan
from brisvox.outbound.campaign.store import Attempt, Campaign, CampaignStore, DoneRow, RunnerLock
from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.outbound.campaign")
DIAL_MARGIN_S = 45.0  # past the ring: Timer B (32 s) and the agent side's start
DEFAULT_RING_S = 600.0  # ring_timeout_s 0: the gateway's [sip] dial_ring_timeout_s, at most this
LIVE_HORIZON_S = 3600.0  # answered calls older than this are not asked about after a restart
RENOTIFY_EVERY_S = 5.0  # rows whose event could not be committed are sent again this often
RENOTIFY_BATCH = 500
METER_EVERY_S = 5.0  # /metrics' campaign counters are read from the store this often


@dataclass(frozen=True, slots=True)
class DialResult:
    """A dial's verdict: answered (``ok``, the gateway's ``call_id``) or the gateway's reason."""

    ok: bool
    call_id: str = ""
    error: str = ""


class Dialer(Protocol):
    """Places calls (:class:`~.dialer.GatewayDialer`: the running daemon's gateway)."""

    async def dial(self, target: str, agent: str, ring_timeout_s: float,
                   params: Mapping[str, str] | None = None, via: str = "sip") -> DialResult:
        """Call ``target`` with ``agent`` and the call parameters ``params`` (the row's variables),
        through ``via`` (the campaign's); return once answered or failed."""
        ...

    async def live(self, call_ids: Collection[str]) -> set[str] | None:
        """Which of ``call_ids`` are still calls; None when that cannot be told now."""
        ...

    async def ready(self) -> bool:
        """Does the gateway answer now? (No attempt is begun while it does not.)"""
        ...


class CampaignRunner:
    """See the module docstring. ``clock``: epoch seconds (calling hours are wall-clock hours)."""

    def __init__(self, db_path: str | Path, dialer: Dialer, *, poll_s: float = 0.25, drain_s: float = 30.0,
                 live_every_s: float = 1.0, ready_every_s: float = 1.0,
                 clock: Callable[[], float] = time.time,
                 on_row_done: Callable[[DoneRow], Awaitable[bool]] | None = None,
                 renotify_every_s: float = RENOTIFY_EVERY_S, meter_every_s: float = METER_EVERY_S) -> None:
        self.db_path = Path(db_path)
        self.dialer = dialer
        self.poll_s = poll_s
        self.drain_s = drain_s
        self.live_every_s = live_every_s
        self.ready_every_s = ready_every_s
        self._ready_until = -1e18
        self._limited = LogLimiter(log)
        self.clock = clock
        self.on_row_done = on_row_done  # campaign.row.done: True once committed (see the module docstring)
        self.renotify_every_s = renotify_every_s
        self._renotify_at = -1e18
        self.notified = 0
        self.recovered = 0
        self._dialing: dict[int, set[asyncio.Task[None]]] = {}
        self._answered: dict[int, set[str]] = {}
        self._live_asked: dict[int, float] = {}
        self._kick = asyncio.Event()
        self._open: set[int] = set()  # the campaigns running or paused at the last tick
        self._names: dict[int, str] = {}
        self.meter_every_s = meter_every_s
        self._meter: Meter | None = None
        self._meter_task: asyncio.Task[object] | None = None
        self._meter_at = -1e18

    def stats(self) -> dict[str, object]:
        """Attempts recovered as unknown at the start, dials in flight now, row events sent; and
        ``by_campaign``: the meter's last snapshot, each with its calls in flight now (dials
        waiting for their verdict plus answered calls still up)."""
        shown = [{**c, "in_flight": len(self._dialing.get(c["id"], ())) + len(self._answered.get(c["id"], ()))}
                 for c in (self._meter.snapshot if self._meter is not None else ())]
        return {"recovered": self.recovered, "dialing": sum(len(ts) for ts in self._dialing.values()),
                "rows_notified": self.notified, "by_campaign": shown}

    async def run(self, stop: asyncio.Event) -> None:
        lock = RunnerLock(self.db_path)
        lock.acquire()
        store = CampaignStore(self.db_path)
        try:
            self.recovered = store.recover(self.clock(), notified=self.on_row_done is None)
            if self.recovered:
                log.warning("campaign runner: %d attempt(s) interrupted by the last stop are now unknown "
                            "(not dialled again)", self.recovered)
            if self.on_row_done is None:
                store.mark_all_notified(self.clock())  # what a cancel ended while no runner ran
            since = self.clock() - LIVE_HORIZON_S
            for c in store.campaigns(("running", "paused")):
                self._answered[c.id] = set(store.answered_calls(c.id, since))
                self._open.add(c.id)
            self._meter = Meter(self.db_path)
            while not stop.is_set():
                wake = await self._tick(store)
                delay = self.poll_s if wake is None else min(self.poll_s, max(0.0, wake - self.clock()))
                self._kick.clear()
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._kick.wait())]
                try:
                    await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            await self._drain()
            if self._meter_task is not None:
                self._meter_task.cancel()
            if self._meter is not None:
                self._meter.close()
            store.close()
            lock.release()

    async def _tick(self, store: CampaignStore) -> float | None:
        wake: float | None = None
        self._meter_tick()
        open_now = store.campaigns(("running", "paused"))
        opened = {c.id for c in open_now}
        ended, self._open = self._open - opened, opened
        if ended and self.on_row_done is None:
            store.mark_all_notified(self.clock())
        if self.on_row_done is not None and (ended or time.monotonic() >= self._renotify_at):
            self._renotify_at = time.monotonic() + self.renotify_every_s
            batch = store.unnotified(RENOTIFY_BATCH)
            if await self._notify(store, batch) == RENOTIFY_BATCH:  # a full batch all sent: more may wait
                self._renotify_at = -1e18
                wake = self.clock()
        for c in open_now:
            self._names[c.id] = c.name
            if c.state != "running":
                await self._live(c.id, c.name, self.clock())  # its calls still count (resume, /metrics)
                continue
            now = self.clock()
            tasks = self._dialing.setdefault(c.id, set())
            live = await self._live(c.id, c.name, now)
            try:
                p = plan(now, c.settings, in_flight=len(tasks) + live, last_started=store.last_started(c.id),
                         due=store.due(c.id, now))
            except (ValueError, KeyError) as e:  # ZoneInfoNotFoundError is a KeyError
                self._limited(f"plan_{c.id}", "campaign %s: cannot plan: %s", c.name, e)
                continue
            store.defer(p.defer)
            if p.dial and not await self._ready():
                self._limited("gateway", "campaign runner: the gateway does not answer; no dial starts until it does")
                wake = now + self.ready_every_s if wake is None else min(wake, now + self.ready_every_s)
                continue
            for row_id in p.dial:
                att = store.begin_attempt(row_id, self.clock())  # committed: from here it may be dialled
                if att is not None:
                    t = asyncio.ensure_future(self._dial(store, c, att))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
            if p.wake_at is not None:
                wake = p.wake_at if wake is None else min(wake, p.wake_at)
            nxt = store.next_due_at(c.id)
            if nxt is not None and nxt > now:
                wake = nxt if wake is None else min(wake, nxt)
            if not tasks and store.finish_if_done(c.id, now):
                log.info("campaign %s: every row is done", c.name)
        for cid in [i for i, calls in self._answered.items() if calls and i not in opened]:  # ended, calls up
            await self._live(cid, self._names.get(cid, str(cid)), self.clock())
        return wake

    async def _ready(self) -> bool:
        now = self.clock()
        if now < self._ready_until:
            return True
        try:
            ok = await asyncio.wait_for(self.dialer.ready(), timeout=10.0)
        except (TimeoutError, OSError):
            ok = False
        if ok:
            self._ready_until = now + self.ready_every_s
        return ok

    async def _live(self, cid: int, name: str, now: float) -> int:
        """How many of the campaign's answered calls are still up (asked at most every live_every_s)."""
        calls = self._answered.setdefault(cid, set())
        if calls and now - self._live_asked.get(cid, -1e18) >= self.live_every_s:
            self._live_asked[cid] = now
            try:
                still = await asyncio.wait_for(self.dialer.live(set(calls)), timeout=10.0)
            except (TimeoutError, OSError) as e:
                self._limited("live", "campaign %s: cannot ask the gateway for its calls: %s", name, e)
                still = None
            if still is not None:
                calls.intersection_update(still)
        return len(calls)

    async def _dial(self, store: CampaignStore, c: Campaign, att: Attempt) -> None:
        ring = c.settings.ring_timeout_s
        limit = (ring or DEFAULT_RING_S) + DIAL_MARGIN_S
        call_id = ""
        try:
            res = await asyncio.wait_for(self.dialer.dial(att.number, att.agent, ring, att.variables, c.settings.via),
                                         timeout=limit)
            outcome, detail, call_id = classify(res.ok, res.error), res.error or "answered", res.call_id
        except TimeoutError as e:
            outcome, detail = UNKNOWN, str(e)[:200] or f"no verdict from the dialer within {limit:g} s"
        except Exception as e:  # noqa: BLE001  (a dialer's failure is the attempt's outcome, not the runner's)
            outcome, detail = UNKNOWN, f"dialer error: {type(e).__name__}: {e}"[:200]
        final = None
        try:
            final = store.finish_attempt(att, outcome, detail, call_id, self.clock(),
                                         notified=self.on_row_done is None)
        except sqlite3.Error as e:  # the file locked past its busy timeout, the disk full: unknown at the next start
            log.error("campaign %s: cannot record attempt %d of %s (%s): %s", c.name, att.n, att.number, outcome, e)
        if final is not None and self.on_row_done is not None:
            await self._notify(store, store.unnotified(1, [att.row_id]))
        if outcome == ANSWERED and call_id:
            self._answered.setdefault(c.id, set()).add(call_id)
        self._kick.set()

    def _meter_tick(self) -> None:
        """Start a refresh of the /metrics counters when one is due and none runs."""
        if self._meter is None or (self._meter_task is not None and not self._meter_task.done()):
            return
        if time.monotonic() >= self._meter_at:
            self._meter_at = time.monotonic() + self.meter_every_s
            self._meter_task = asyncio.ensure_future(self._meter.refresh(self.clock()))

    async def _notify(self, store: CampaignStore, rows: list[DoneRow]) -> int:
        """Send the rows' events (at once: the outbox writer commits them in one transaction);
        mark those committed (the rest: at the next renotify). How many were marked."""
        assert self.on_row_done is not None
        on_row_done = self.on_row_done

        async def one(row: DoneRow) -> bool:
            try:
                return bool(await on_row_done(row))
            except Exception:  # noqa: BLE001 - an event's producer never fails the dial's bookkeeping
                log.exception("campaign %s: the row's done event failed", row.campaign)
                return False

        oks = await asyncio.gather(*(one(row) for row in rows))
        done = [row.row_id for row, ok in zip(rows, oks, strict=True) if ok]
        if done:
            try:
                store.mark_notified(done, self.clock())
                self.notified += len(done)
            except sqlite3.Error as e:  # sent again later, the same event
                log.error("campaign runner: cannot mark %d row event(s) sent: %s", len(done), e)
                return 0
        return len(done)

    async def _drain(self) -> None:
        tasks = [t for ts in self._dialing.values() for t in ts]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.drain_s)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
            log.warning("campaign runner: %d dial(s) still waiting at the stop: unknown at the next start",
                        len(pending))
