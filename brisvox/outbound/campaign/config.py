"""``[campaigns]`` of ``brisvoxd.toml``: whether the daemon runs its campaigns, and how.

With ``enabled = true`` the supervisor starts its ``outbound`` child, which runs the
campaign runner (:mod:`brisvox.outbound.campaign.service`) over the store that
``brisvoxd campaign start`` writes (``db``, default ``<state dir>/campaigns.sqlite3``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from brisvox.config.schema import from_table, section


@section
class CampaignsConfig:
    """``[campaigns]``: ``enabled`` (false: nothing dials a campaign); ``db``, the store ("":
    ``<state dir>/campaigns.sqlite3``); ``trunk``, the ``[[sip.trunks]]`` entry numbers are
    dialled through ("": ``[sip] trunk``); ``poll_s``, how often the store is looked at;
    ``drain_s``, how long the dials in flight get at a stop."""

    enabled: bool = False
    db: str = Field(default="", max_length=1024)
    trunk: str = Field(default="", max_length=64)
    poll_s: float = Field(default=0.25, ge=0.05, le=10.0)
    drain_s: float = Field(default=30.0, ge=0.0, le=600.0)

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> CampaignsConfig:
        return from_table(cls, table, where)


def store_path(cfg: Any) -> Path:
    """The campaign store of a daemon config: ``[campaigns] db``, else the state dir's."""
    from brisvox.outbound.campaign.store import DB_NAME
    from brisvox.runtime.paths import state_dir

    db = cfg.section("campaigns").db
    return Path(db).expanduser() if db else state_dir(cfg) / DB_NAME


def campaigns_wanted(cfg: Any) -> bool:
    """The daemon runs its campaigns (then the supervisor starts ``outbound``)."""
    return bool(cfg.section("campaigns").enabled)
