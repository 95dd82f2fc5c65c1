"""``campaign.row.done``: the webhook a campaign runner sends when one row of its list is settled.

Owns :class:`CampaignEvents`, made once by the campaign service of the outbound role (or any
other producer in that process) with the daemon configuration. :meth:`CampaignEvents.row_done`
routes the event to the daemon's ``[[webhooks]]`` that list ``campaign.row.done`` and to those
of the row's agent file, and hands it to this process's outbox writer
(:class:`~brisvox.outbound.webhooks.writer.OutboxWriter`; never blocks);
:meth:`CampaignEvents.row_done_committed` awaits the commit, for a runner that marks the row
done only once its event is durable. The data::

    {"campaign": str, "row": str | int, "outcome": str, "call_id": str | null,
     "agent": str | null, "attempts": int, ...extra}

Invariants: no endpoint wants it -> nothing is queued and ``row_done`` returns False (as a
full queue does: counted by the writer); an event over the body limit raises ValueError.
A runner gives each row's event the id :func:`row_event_id` (its campaign and row): sent
again after a crash, it is the same event (the outbox inserts an (event, endpoint) pair
once, a receiver deduplicates by id).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

from brisvox.outbound.webhooks.config import DAEMON_SCOPE, agent_scope
from brisvox.outbound.webhooks.courier import Endpoints
from brisvox.outbound.webhooks.events import make_event
from brisvox.outbound.webhooks.outbox import Target, outbox_path
from brisvox.outbound.webhooks.writer import OutboxWriter

log = logging.getLogger("brisvox.webhooks.campaign")
EVENT = "campaign.row.done"
_NAMESPACE = uuid.UUID("6f1d0c57-43a5-4c8e-9a3e-2b9e1f0c7d41")


def row_event_id(campaign_created_at: float, campaign_id: int, row_id: int) -> str:
    """The event id of a row's ``campaign.row.done``: the same for every send of it."""
    return "evt_" + uuid.uuid5(_NAMESPACE, f"{campaign_created_at!r}:{campaign_id}:{row_id}").hex


class CampaignEvents:
    def __init__(self, cfg: Any, writer: OutboxWriter | None = None, state_dir: str | Path | None = None) -> None:
        if writer is None:
            from brisvox.runtime.paths import state_dir as default_state_dir

            writer = OutboxWriter(outbox_path(state_dir if state_dir is not None else default_state_dir(cfg)))
            writer.start()
        self.writer = writer
        self.endpoints = Endpoints(cfg)

    def targets(self, agent: str | None) -> list[Target]:
        out = [Target(DAEMON_SCOPE, url) for url, ep in self.endpoints.daemon.items() if EVENT in ep.settings.events]
        if agent:
            out += [Target(agent_scope(agent), url) for url, ep in self.endpoints.agent_endpoints(agent).items()
                    if EVENT in ep.settings.events]
        return out

    def row_done(self, campaign: str, row: str | int, outcome: str, *, call_id: str | None = None,
                 agent: str | None = None, attempts: int = 0, extra: dict[str, Any] | None = None,
                 on_commit: Any = None, event_id: str | None = None) -> bool:
        """Queue the event (False: no endpoint wants it, or the writer's queue is full)."""
        event = make_event(EVENT, {**(extra or {}), "campaign": campaign, "row": row, "outcome": outcome,
                                   "call_id": call_id, "agent": agent, "attempts": attempts}, event_id=event_id)
        return self.writer.submit(event, self.targets(agent), on_commit)

    async def row_done_committed(self, campaign: str, row: str | int, outcome: str, timeout: float = 10.0,
                                 **kw: Any) -> bool:
        """:meth:`row_done`, then wait (at most ``timeout``) until it is committed; True once it is."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()

        def settle(ok: bool) -> None:
            if not fut.done():
                fut.set_result(ok)

        def done(ok: bool) -> None:  # the writer thread
            loop.call_soon_threadsafe(settle, ok)

        if not self.row_done(campaign, row, outcome, on_commit=done, **kw):
            return False
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            return False

    async def row_settled(self, campaign: str, row: str | int, outcome: str, **kw: Any) -> bool:
        """:meth:`row_done_committed` for a runner that must know when it may stop sending it:
        True once committed, or when it never can be (no endpoint wants it, or it is over the
        body limit: logged); False to try again later (the queue full, no commit in time)."""
        if not self.targets(kw.get("agent")):
            return True
        try:
            return await self.row_done_committed(campaign, row, outcome, **kw)
        except ValueError as e:
            log.warning("campaign %s: row %s's %s not sent: %s", campaign, str(row)[:64], EVENT, str(e)[:200])
            return True

    def close(self, timeout: float = 5.0) -> bool:
        return self.writer.close(timeout)
