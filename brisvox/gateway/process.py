"""The gateway role main: :class:`GatewayCore` inside the daemon's ChildRuntime.

Owns the glue between the supervisor's child API and the gateway core: one
asyncio loop (uvloop when ``[gateway] uvloop`` is set and it is installed),
the core bound on the configured addresses with its ROUTER inbox at
``rt.inbox_endpoint("gateway", index)``, the heartbeat and the load report
every 500 ms (with the loop-stall probe's ``loop`` entry: ``brisvox/runtime/loop_probe.py``), topology pushes (connect to ready agents and workers; end the
calls of a dead agent), reloads (the listeners' sections read again: SIP trunks
register again), drain (refuse new calls, OPTIONS 503, wait for live
calls up to the grace period) and stop.

Invariants: ``rt.ready`` is called only once every listening socket is bound
(a port in use is a boot failure, a bad section a config error); callbacks
from the control thread reach the loop only through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import (
    AudioSocketConfig,
    GatewayConfig,
    GatewaySettings,
    SipConfig,
    WebSocketConfig,
)
from brisvox.gateway.transports import assemble
from brisvox.runtime import exitcodes
from brisvox.runtime.child_runtime import ChildRuntime
from brisvox.runtime.loop_probe import LoopProbe
from brisvox.runtime.memory import freeze_startup_heap

log = logging.getLogger("brisvox.gateway")

REPORT_S = 0.5


def settings_from(rt: Any) -> GatewaySettings:
    return settings_from_config(rt.config)


def settings_from_config(cfg: Any) -> GatewaySettings:
    gw = cfg.section("gateway")
    sip = cfg.section("sip")
    ws = cfg.section("websocket")
    audiosocket = cfg.section("audiosocket")
    assert isinstance(gw, GatewayConfig) and isinstance(sip, SipConfig) and isinstance(ws, WebSocketConfig)
    assert isinstance(audiosocket, AudioSocketConfig)
    return GatewaySettings(gw, sip, ws, audiosocket)


async def run(rt: Any, settings: GatewaySettings) -> int:
    loop = asyncio.get_running_loop()
    ctx = rt.zmq_context()
    core = assemble(settings, instance=rt.instance, identity=f"gateway-{rt.index}",
                       inbox_endpoint=rt.inbox_endpoint("gateway", rt.index), runtime_dir=rt.runtime_dir, ctx=ctx)
    try:
        endpoints = await core.start()
    except OSError as e:
        await core.stop(grace_s=0)
        rt.fail(f"gateway could not bind: {e}", exitcodes.BOOT)
    stop = asyncio.Event()
    drain_requested = False

    def on_stop() -> None:
        nonlocal drain_requested
        drain_requested = bool(rt.drain)
        loop.call_soon_threadsafe(stop.set)

    def on_reload(path: str) -> None:
        """The supervisor applied ``path``: read it again and give the listeners their sections
        (a configuration error keeps what runs: the supervisor already refused a bad file, so
        this is a file edited between its read and ours)."""
        from brisvox.config.daemon import load_config

        try:
            done = core.reload(settings_from_config(load_config(path)))
        except ConfigError as e:
            log.warning("reload of %s not applied by the gateway: %s", path, e)
            rt.event("reload_failed", str(e)[:300])
            return
        log.info("reload of %s applied: %s", path, done)

    rt.add_shutdown_callback(on_stop)
    rt.add_reload_callback(on_reload, loop=loop)
    rt.add_topology_callback(core.update_topology, loop=loop)  # replays the Topology already received
    probe = LoopProbe(f"gateway-{rt.index}").start()
    probe_task = loop.create_task(probe.run(), name="loop-probe")

    def stats() -> dict[str, Any]:
        return {**core.stats(), "loop": probe.snapshot()}

    rt.ready(endpoints)
    log.info("gateway ready: %s", endpoints)
    freeze_startup_heap()
    while not stop.is_set():
        rt.heartbeat()
        rt.report(len(core.table), stats())
        try:
            async with asyncio.timeout(REPORT_S):
                await stop.wait()
        except TimeoutError:
            pass
    grace = float(rt.grace_s or 0.0)
    if drain_requested:
        core.drain()
        deadline = time.monotonic() + grace
        while len(core.table) and time.monotonic() < deadline:
            rt.heartbeat()
            rt.report(len(core.table), stats())
            await asyncio.sleep(0.25)
    await core.stop(grace_s=min(2.0, max(0.2, grace)))
    probe_task.cancel()
    probe.close()
    rt.report(0, stats())
    return exitcodes.OK


def main(rt: ChildRuntime) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        settings = settings_from(rt)
    except ConfigError as e:
        rt.fail(str(e), exitcodes.CONFIG)
    if settings.gateway.uvloop:
        try:
            import uvloop

            return int(uvloop.run(run(rt, settings)))
        except ImportError:
            log.warning("[gateway] uvloop = true but uvloop is not installed; using asyncio")
    return int(asyncio.run(run(rt, settings)))
