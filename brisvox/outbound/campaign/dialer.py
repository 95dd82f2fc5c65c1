"""The real :class:`~.runner.Dialer`: the running daemon's gateway, exactly as ``brisvoxd dial`` asks it.

Owns a thread pool for the blocking request of :func:`brisvox.cli.dial_request.dial`
(each dial waits for its verdict in its own thread, so dials run
concurrently; the runner bounds how many by each campaign's cap) and the
``calls`` question. A row's variables go with its dial as the call's parameters (the
agent's ``CallStart.params``: its tools' ``ctx.call_info.params``, the prompt's
``{{name}}`` placeholders, the call record). A gateway that does not answer the dial request is a
:class:`TimeoutError` (the attempt's outcome is then ``unknown``); its refusals
and the callee's answers are results (:func:`brisvox.cli.dial_request.live_calls`). SIP only:
a row's number is dialled through ``[sip] trunk`` (or ``trunk``: a
``[[sip.trunks]]`` name), a ``sip:`` URI as it is.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from brisvox.cli.dial_request import GATEWAY_SILENT, dial, live_calls
from brisvox.outbound.campaign.runner import DialResult
from brisvox.outbound.campaign.scheduler import MAX_CONCURRENT


class GatewayDialer:
    """Dials through the gateway inbox of the daemon whose runtime dir is ``runtime_dir``."""

    def __init__(self, runtime_dir: str | Path, trunk: str = "", max_threads: int = MAX_CONCURRENT + 4) -> None:
        from ipc.bus import endpoint

        self.inbox = endpoint(Path(runtime_dir), "gateway-0")
        self.trunk = trunk
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="campaign-dial")

    async def dial(self, target: str, agent: str, ring_timeout_s: float,
                   params: Mapping[str, str] | None = None) -> DialResult:
        ok, data, error = await asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(dial, self.inbox, target, agent, ring_timeout_s, "sip", self.trunk, params))
        if not ok and error.startswith(GATEWAY_SILENT):
            raise TimeoutError(error)  # no verdict: the INVITE may have gone out (the runner records unknown)
        return DialResult(ok, str(data.get("call_id") or ""), error)

    async def live(self, call_ids: Collection[str]) -> set[str] | None:
        got = await asyncio.get_running_loop().run_in_executor(self._pool, live_calls, self.inbox)
        return None if got is None else set(call_ids) & got

    async def ready(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self._pool, live_calls, self.inbox, 2.0) is not None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
