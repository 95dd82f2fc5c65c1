"""The ``outbound`` role's main: it hosts the daemon's outbound services, each in one event loop.

A service is an object with ``name`` (str), ``async def run(self, stop: asyncio.Event)`` and
``stats() -> dict``, made by a factory ``factory(rt) -> service | None`` (None: nothing of
it is configured) listed in :data:`SERVICES` as ``"module:function"``. The supervisor
starts this role when anything it hosts is configured
(:data:`brisvox.config.daemon.OUTBOUND_WANTED`).

Invariants:

* One service's failure is logged and does not end the others; the role exits (and is
  restarted by the supervisor) only when every service ended while no stop was asked for.
* The main loop beats and reports every :data:`REPORT_S`: the stats of every service under
  its name (``/metrics``: :mod:`brisvox.daemon.metrics`).
* On a stop the services' ``stop`` event is set, and each gets :data:`STOP_TIMEOUT_S` to
  return before it is cancelled.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from brisvox.runtime.child_runtime import ChildRuntime

log = logging.getLogger("brisvox.outbound")

SERVICES: tuple[str, ...] = ("brisvox.outbound.webhooks.courier:service", "brisvox.outbound.campaign.service:service")
REPORT_S = 0.5
STOP_TIMEOUT_S = 5.0


def make_services(rt: Any) -> list[Any]:
    out = []
    for ref in SERVICES:
        module, _, fn = ref.partition(":")
        svc = getattr(importlib.import_module(module), fn)(rt)
        if svc is not None:
            out.append(svc)
    return out


async def run_services(rt: Any, services: list[Any]) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    rt.add_shutdown_callback(lambda: loop.call_soon_threadsafe(stop.set))

    async def guarded(svc: Any) -> None:
        try:
            await svc.run(stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("outbound service %s failed", svc.name)

    tasks = {asyncio.create_task(guarded(s), name=f"outbound-{s.name}"): s for s in services}
    rt.ready({})
    log.info("outbound ready: %s", ", ".join(s.name for s in services) or "no service")

    def report() -> None:
        rt.heartbeat()
        rt.report(0, {s.name: s.stats() for s in services})

    while not stop.is_set() and (not tasks or not all(t.done() for t in tasks)):
        report()
        try:
            async with asyncio.timeout(REPORT_S):
                await stop.wait()
        except TimeoutError:
            pass
    stop.set()
    pending = [t for t in tasks if not t.done()]
    if pending:
        done, still = await asyncio.wait(pending, timeout=STOP_TIMEOUT_S)
        for t in still:
            log.warning("outbound service %s did not stop within %.0fs: cancelled", tasks[t].name, STOP_TIMEOUT_S)
            t.cancel()
        if still:
            await asyncio.wait(still, timeout=1.0)
    report()
    return 0 if rt.stopping.is_set() or not services else 1


def main(rt: ChildRuntime) -> int:
    from brisvox.config.errors import ConfigError
    from brisvox.runtime import exitcodes

    try:
        services = make_services(rt)
    except ConfigError as e:
        rt.fail(str(e), exitcodes.CONFIG)
    return int(asyncio.run(run_services(rt, services)))
