"""The campaign runner's counters on /metrics: read from the store in the meter's thread, reported
with the outbound child's stats, rendered by brisvox.daemon.metrics and parsed strictly; the
values follow the rows as they complete; at most 20 campaigns, ended ones for 15 minutes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from brisvox.daemon.metrics import render
from brisvox.outbound.campaign.meter import MAX_CAMPAIGNS, Meter
from brisvox.outbound.campaign.runner import CampaignRunner, DialResult
from brisvox.outbound.campaign.scheduler import Settings
from brisvox.outbound.campaign.store import CampaignStore
from tests.system.daemon_promparse import parse, value
from tests.unit.test_campaign_store import (
    ALL_DAY,
    HoldingDialer,
    csv_rows,
    new_campaign,
    peek,
    until,
)


def scrape(runner: CampaignRunner) -> dict[str, Any]:
    """/metrics as the supervisor renders it from the outbound child's report, parsed strictly."""
    snap = {"daemon": {"uptime_s": 1, "state": "running", "ready": True, "calls": 0}, "children": [
        {"role": "outbound", "index": 0, "name": "outbound-0", "state": "ready",
         "stats": {"campaigns": runner.stats()}}]}
    return parse(render(snap))


def test_the_runners_counters_are_on_metrics_and_follow_the_rows(tmp_path: Path):
    path = tmp_path / "c.db"
    cid = new_campaign(path, 4, max_concurrent=2, max_attempts=2, retry_delay_s=0.05, retry_on=frozenset({"busy"}))
    n = [f"+49301000{i:03d}" for i in range(4)]
    d = HoldingDialer({n[1]: [DialResult(False, error="busy"), DialResult(False, error="refused: gateway full")]},
                      hold=(n[0],))
    runner = CampaignRunner(path, d, poll_s=0.02, live_every_s=0.02, meter_every_s=0.02)
    c = {"campaign": str(cid), "campaign_name": "c1"}

    def v(name: str, **labels: str) -> float:
        return value(scrape(runner), name, **c, **labels)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(runner.run(stop))
        # row 0 rings (held); row 1 busy, then its retry refused; rows 2 and 3 answered
        await until(lambda: peek(path, "SELECT COUNT(*) FROM rows WHERE state = 'done'") == [(3,)], task)
        await until(lambda: v("brisvox_campaign_rows", state="done") == 3, task)
        assert v("brisvox_campaign_rows", state="dialing") == 1
        assert v("brisvox_campaign_rows", state="pending") == 0
        assert v("brisvox_campaign_attempts_total") == 5
        assert v("brisvox_campaign_retries_total") == 1
        assert v("brisvox_campaign_attempt_outcomes_total", outcome="answered") == 2
        assert v("brisvox_campaign_attempt_outcomes_total", outcome="busy") == 1
        assert v("brisvox_campaign_attempt_outcomes_total", outcome="refused") == 1
        assert v("brisvox_campaign_attempt_outcomes_total", outcome="unknown") == 0
        assert v("brisvox_campaign_rows_done", outcome="refused") == 1
        assert v("brisvox_campaign_rows_done", outcome="answered") == 2
        await until(lambda: v("brisvox_campaign_calls_in_flight") == 1, task)  # row 0 still rings
        assert v("brisvox_campaign_dial_rate") == 0.5  # 5 dials in the last 10 s
        assert v("brisvox_campaign_dial_rate_limit") == 100 and v("brisvox_campaign_calls_in_flight_limit") == 2
        assert v("brisvox_campaign_state", state="running") == 1
        st = CampaignStore(path)  # an agent process records its call's AMD verdict
        assert st.record_amd(f"call-{n[2]}", "human")
        st.close()
        d.live_ids.add(f"call-{n[0]}")  # the last row answers and its call stays up; the campaign is done
        d.hold[n[0]].set()
        await until(lambda: v("brisvox_campaign_state", state="done") == 1, task)
        assert v("brisvox_campaign_calls_in_flight") == 1
        d.live_ids.clear()  # the call ends after its campaign did: asked about still
        await until(lambda: v("brisvox_campaign_calls_in_flight") == 0, task)
        assert v("brisvox_campaign_rows", state="done") == 4 and v("brisvox_campaign_rows", state="dialing") == 0
        assert v("brisvox_campaign_attempt_outcomes_total", outcome="answered") == 3
        assert v("brisvox_campaign_rows_done", outcome="answered_human") == 1
        assert v("brisvox_campaign_rows_done", outcome="answered") == 2
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())


def test_a_cancelled_campaign_shows_its_cancelled_rows_then_leaves_and_at_most_20_are_shown(tmp_path: Path):
    path = tmp_path / "c.db"
    st = CampaignStore(path)
    now = time.time()
    for i in range(MAX_CAMPAIGNS + 2):
        st.create(f"c{i}", "echo", "t.csv", Settings(rate=1.0, windows=ALL_DAY), csv_rows(2), now)
    st.set_state("c21", "cancelled", now)
    st.set_state("c0", "cancelled", now)
    meter = Meter(path)

    async def shown(at: float) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in await meter.refresh(at)}

    try:
        got = asyncio.run(shown(now))
        assert len(got) == MAX_CAMPAIGNS and "c0" not in got and "c1" not in got  # the newest 20
        assert got["c21"]["state"] == "cancelled" and got["c21"]["rows"] == {"pending": 0, "dialing": 0,
                                                                             "waiting": 0, "done": 2}
        assert got["c21"]["outcomes"]["cancelled"] == 2 and got["c21"]["attempts"] == 0
        assert got["c20"]["rows"]["pending"] == 2 and got["c20"]["outcomes"]["cancelled"] == 0
        later = asyncio.run(shown(now + 901.0))  # ended 15 minutes ago: gone; an older running one shown
        assert "c21" not in later and "c1" in later and len(later) == MAX_CAMPAIGNS
    finally:
        meter.close()
        st.close()
