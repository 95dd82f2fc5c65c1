"""The campaign runner's counters for ``/metrics``, read from the store off the runner's loop.

Owns :class:`Meter`: one thread (a single-worker executor) with its own connection to the
store, where :meth:`Meter.refresh` reads the campaigns ``/metrics`` shows
(:meth:`~.store.CampaignStore.metered`) and their tallies
(:meth:`~.store.CampaignStore.tallies`: rows by state, done rows by outcome as ``status``
shows them, attempts made and by outcome, retries; the start rate over the last 10 s as
``status`` computes it). :mod:`brisvox.daemon.metrics` renders them as the
``brisvox_campaign_*`` families (docs/OBSERVABILITY.md, "Campaigns").

Invariants:

* The runner's loop never runs these queries (a campaign of 100 000 rows takes a few tenths
  of a second to count, which would delay its dial starts): they run in the meter's thread,
  one refresh at a time, each awaited with a timeout; the runner's ``stats`` give the last
  refresh that finished.
* Bounded label cardinality: at most :data:`MAX_CAMPAIGNS` campaigns are shown, newest
  first: every ``running`` or ``paused`` one, and those that ended (``cancelled``,
  ``done``) within the last :data:`ENDED_KEEP_S`, so an ended campaign's last counts are
  scraped before its series go.
* Every shown campaign has every row state, row outcome and attempt outcome (0 when none),
  so an alert has a series before the first row is counted.
* The counts are the store's (they survive a runner restart); a failed refresh keeps the
  last snapshot and is logged at most once a minute.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from brisvox.outbound.campaign.outcomes import ATTEMPT_OUTCOMES, SHOWN
from brisvox.outbound.campaign.scheduler import rate_over
from brisvox.outbound.campaign.store import CampaignStore
from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.outbound.campaign")
MAX_CAMPAIGNS = 20
ENDED_KEEP_S = 900.0
ROW_STATES = ("pending", "dialing", "waiting", "done")
RATE_WINDOW_S = 10.0
REFRESH_TIMEOUT_S = 30.0


class Meter:
    """See the module docstring. ``refresh`` from one event loop; ``close`` once."""

    def __init__(self, db_path: str | Path) -> None:
        self.db_path = Path(db_path)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="campaign-meter")
        self._store: CampaignStore | None = None  # the thread's own connection (opened there)
        self._limited = LogLimiter(log)
        self.snapshot: list[dict[str, Any]] = []
        self.refreshes = 0
        self.failures = 0

    async def refresh(self, now: float) -> list[dict[str, Any]]:
        """Read the shown campaigns' tallies in the meter's thread; the new snapshot (the last one
        when the read fails or takes longer than :data:`REFRESH_TIMEOUT_S`)."""
        loop = asyncio.get_running_loop()
        try:
            self.snapshot = await asyncio.wait_for(loop.run_in_executor(self._pool, self._read, now),
                                                   timeout=REFRESH_TIMEOUT_S)
            self.refreshes += 1
        except Exception as e:  # noqa: BLE001 - the file locked, the disk gone: the metrics wait, the dials do not
            self.failures += 1
            self._limited("meter", "campaign metrics: cannot read the store: %s", e)
        return self.snapshot

    def _read(self, now: float) -> list[dict[str, Any]]:  # the meter's thread
        if self._store is None:
            self._store = CampaignStore(self.db_path)
        st = self._store
        out = []
        for c in st.metered(now - ENDED_KEEP_S, MAX_CAMPAIGNS):
            t = st.tallies(c.id)
            out.append({
                "id": c.id, "name": c.name, "state": c.state, "rate_cap": c.settings.rate,
                "max_concurrent": c.settings.max_concurrent,
                "rows": {s: t["states"].get(s, 0) for s in ROW_STATES},
                "outcomes": {o: t["outcomes"].get(o, 0) for o in SHOWN},
                "attempts": t["attempts"], "retries": t["retries"],
                "attempt_outcomes": {o: t["attempt_outcomes"].get(o, 0) for o in ATTEMPT_OUTCOMES},
                "rate": round(rate_over(st.started_since(c.id, now - RATE_WINDOW_S), now, RATE_WINDOW_S), 3),
            })
        return out

    def _close_store(self) -> None:  # the meter's thread
        if self._store is not None:
            self._store.close()
            self._store = None

    def close(self) -> None:
        """Close the thread's connection and end the thread (a refresh under way finishes first,
        in the thread; this does not wait for it)."""
        self._pool.submit(self._close_store)
        self._pool.shutdown(wait=False)
