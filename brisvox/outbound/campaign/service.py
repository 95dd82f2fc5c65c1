"""The campaign runner as a service of the ``outbound`` role (brisvox/outbound/process.py).

Owns :class:`CampaignService`: the :class:`~brisvox.outbound.campaign.runner.CampaignRunner`
over the daemon's store (``[campaigns] db``) with a
:class:`~brisvox.outbound.campaign.dialer.GatewayDialer` to the daemon's own gateway; made by
:func:`service` only when ``[campaigns] enabled``. The role restarts with the supervisor's
policy when it dies; the store's recovery (an attempt without its outcome is ``unknown``,
never dialled again) makes a restart, or a ``kill -9``, dial no row twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.outbound.campaign.config import campaigns_wanted, store_path
from brisvox.outbound.campaign.store import DoneRow


class CampaignService:
    name = "campaigns"

    def __init__(self, cfg: Any) -> None:
        from brisvox.outbound.campaign.dialer import GatewayDialer
        from brisvox.outbound.campaign.runner import CampaignRunner
        from brisvox.runtime.paths import runtime_dir

        c = cfg.section("campaigns")
        self.db = store_path(cfg)
        self.dialer = GatewayDialer(runtime_dir(cfg), trunk=c.trunk)
        self.events = row_events(cfg)
        self.runner = CampaignRunner(self.db, self.dialer, poll_s=c.poll_s, drain_s=c.drain_s,
                                     on_row_done=self.events.row_done if self.events is not None else None)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.runner.run(stop)
        finally:
            self.dialer.close()
            if self.events is not None:  # the last rows' events: committed before the role exits
                await asyncio.to_thread(self.events.close, 5.0)

    def stats(self) -> dict[str, Any]:
        return self.runner.stats()


class RowEvents:
    """A runner's ``on_row_done``: a done row's ``campaign.row.done``, under its row's event id."""

    def __init__(self, events: Any) -> None:
        self.events = events  # CampaignEvents

    async def row_done(self, row: DoneRow) -> bool:
        from brisvox.outbound.webhooks.campaign_events import row_event_id

        return bool(await self.events.row_settled(
            row.campaign, row.number, row.outcome, call_id=row.call_id or None, agent=row.agent,
            attempts=row.attempts, extra={"campaign_id": row.campaign_id, "row_id": row.row_id},
            event_id=row_event_id(row.campaign_created_at, row.campaign_id, row.row_id)))

    def close(self, timeout: float = 5.0) -> bool:
        return bool(self.events.close(timeout))


def row_events(cfg: Any) -> RowEvents | None:
    """``campaign.row.done`` to the webhooks that want it (None: no webhook is configured)."""
    from brisvox.outbound.webhooks.wanted import webhooks_wanted

    if not webhooks_wanted(cfg):
        return None
    from brisvox.outbound.webhooks.campaign_events import CampaignEvents

    return RowEvents(CampaignEvents(cfg))


def service(rt: Any) -> CampaignService | None:
    """The campaign service (None unless ``[campaigns] enabled``)."""
    return CampaignService(rt.config) if campaigns_wanted(rt.config) else None
