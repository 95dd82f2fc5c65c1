"""The real :class:`~.runner.Dialer`: the running daemon's gateway, exactly as ``brisvoxd dial`` asks it.

Owns a thread pool for the blocking request of :func:`brisvox.cli.dial_request.dial`
(each dial waits for its verdict in its own thread, so dials run
concurrently; the runner bounds how many by each campaign's cap) and the
``calls`` question. A row's variables go with its dial as the call's parameters (the
agent's ``CallStart.params``: its tools' ``ctx.call_info.params``, the prompt's
``{{name}}`` placeholders, the call record). A gateway that does not answer the dial request is a
:class:`TimeoutError` (the attempt's outcome is then ``unknown``); its refusals
and the callee's answers are results (:func:`brisvox.cli.dial_request.live_calls`). Over SIP
(a campaign's ``via``, default) a row's number is dialled through ``[sip] trunk`` (or
``trunk``: a ``[[sip.trunks]]`` name), a ``sip:`` URI as it is; via ``twilio`` through
Twilio's REST API with ``await_answer`` (the reply at the callee's answer or the dial's
failure, from Twilio's status callbacks), an answered call named ``twilio:<CallSid>`` until
the gateway's ``calls`` shows it (by its ``callSid``; up to :data:`STREAM_GRACE_S` after the
answer it counts as up unseen: Twilio's fetch of the webhook and the stream come after the answer). An awaited Twilio dial that heard no
decisive status is a :class:`TimeoutError` too (``unknown``: the callee may be talking).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from brisvox.cli.dial_request import GATEWAY_SILENT, NO_STATUS, TWILIO_PREFIX, dial, live_calls
from brisvox.outbound.campaign.runner import DialResult
from brisvox.outbound.campaign.scheduler import MAX_CONCURRENT

STREAM_GRACE_S = 15.0  # an answered Twilio call counts as up this long before its stream shows in calls


class GatewayDialer:
    """Dials through the gateway inbox of the daemon whose runtime dir is ``runtime_dir``."""

    def __init__(self, runtime_dir: str | Path, trunk: str = "", max_threads: int = MAX_CONCURRENT + 4) -> None:
        from ipc.bus import endpoint

        self.inbox = endpoint(Path(runtime_dir), "gateway-0")
        self.trunk = trunk
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="campaign-dial")
        self._fresh: dict[str, float] = {}  # twilio:<CallSid> answered, not yet seen in calls -> when

    async def dial(self, target: str, agent: str, ring_timeout_s: float,
                   params: Mapping[str, str] | None = None, via: str = "sip") -> DialResult:
        trunk, answer = (self.trunk, False) if via == "sip" else ("", True)
        ok, data, error = await asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(dial, self.inbox, target, agent, ring_timeout_s, via, trunk, params,
                                          answer))
        if not ok and error.startswith((GATEWAY_SILENT, NO_STATUS)):
            raise TimeoutError(error)  # no verdict: the call may have gone out (the runner records unknown)
        sid = data.get("call_sid")
        call_id = data.get("call_id") or (f"{TWILIO_PREFIX}{sid}" if ok and isinstance(sid, str) and sid else "")
        if ok and str(call_id).startswith(TWILIO_PREFIX):
            self._fresh[str(call_id)] = time.monotonic()
        return DialResult(ok, str(call_id), error)

    async def live(self, call_ids: Collection[str]) -> set[str] | None:
        got = await asyncio.get_running_loop().run_in_executor(self._pool, live_calls, self.inbox)
        if got is None:
            return None
        now = time.monotonic()
        self._fresh = {k: t for k, t in self._fresh.items() if now - t < STREAM_GRACE_S and k not in got}
        return set(call_ids) & (got | set(self._fresh))  # a Twilio call answered, its stream on its way

    async def ready(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self._pool, live_calls, self.inbox, 2.0) is not None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
