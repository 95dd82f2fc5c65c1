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


class CampaignService:
    name = "campaigns"

    def __init__(self, cfg: Any) -> None:
        from brisvox.outbound.campaign.dialer import GatewayDialer
        from brisvox.outbound.campaign.runner import CampaignRunner
        from brisvox.runtime.paths import runtime_dir

        c = cfg.section("campaigns")
        self.db = store_path(cfg)
        self.dialer = GatewayDialer(runtime_dir(cfg), trunk=c.trunk)
        self.events = _row_events(cfg)
        self.runner = CampaignRunner(self.db, self.dialer, poll_s=c.poll_s, drain_s=c.drain_s,
                                     on_row_done=self._row_done if self.events is not None else None)

    def _row_done(self, c: Any, att: Any, outcome: str, call_id: str) -> None:
        assert self.events is not None
        self.events.row_done(c.name, att.number, outcome, call_id=call_id or None, agent=att.agent,
                             attempts=att.n, extra={"campaign_id": c.id, "row_id": att.row_id})

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.runner.run(stop)
        finally:
            self.dialer.close()
            if self.events is not None:  # the last rows' events: committed before the role exits
                await asyncio.to_thread(self.events.close, 5.0)

    def stats(self) -> dict[str, Any]:
        return self.runner.stats()


def _row_events(cfg: Any) -> Any:
    """``campaign.row.done`` to the webhooks that want it (None: no webhook is configured)."""
    from brisvox.outbound.webhooks.wanted import webhooks_wanted

    if not webhooks_wanted(cfg):
        return None
    from brisvox.outbound.webhooks.campaign_events import CampaignEvents

    return CampaignEvents(cfg)


def service(rt: Any) -> CampaignService | None:
    """The campaign service (None unless ``[campaigns] enabled``)."""
    return CampaignService(rt.config) if campaigns_wanted(rt.config) else None
