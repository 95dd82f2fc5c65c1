"""The WebSocket floods of ``python -m bench fuzz``: a bystander call's frame gaps under each, judged.

:func:`run_ws_floods` starts a ``brisvoxd`` of its own (the gateway role,
the echo agent, soft ``RLIMIT_NOFILE`` 1,024 as from a shell, the default
``[websocket]`` limits; :class:`bench.harness.ws_flood.LimitedDaemon`), places
one native call to the echo agent (the bystander) and runs, one after the
other, each for ``phase_s`` seconds: nothing (the baseline), 1,500 half-open
connections from 60 addresses, then two connections at a time flooding
one-byte fragments, pings without reading the pongs, two-byte binary frames
(:mod:`bench.harness.ws_flood`). Printed per phase: the bystander's p99 and
worst frame gap (target: p99 within 40 ms under a
two-connection flood), how the floods were closed; then the gateway's log
lines per 100 bad inputs (flood connections) and, after the floods, its
half-open slots, open connections, calls and descriptors against before.

Invariants: the daemon's process group is killed in ``finally``
(:meth:`bench.harness.daemon.Daemon.close`); every flood stops by its deadline.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.harness.chaos.judge import Report
from bench.harness.daemon import write_config, ws_port
from bench.harness.ws_flood import (
    GATEWAY_ONLY,
    KINDS,
    Gaps,
    LimitedDaemon,
    bystander,
    close_all,
    echo_config,
    flood_phases_apart,
    gap_figures,
    half_open,
    log_lines,
    open_fds,
    sources,
)

SECRET = "fuzz-floods"
PATH = f"/ws/echo?token={SECRET}"
HALF_OPEN = 1500
FLOODERS = ("127.0.0.3", "127.0.0.4")
P99_TARGET_MS = 40.0


def _stats(d: LimitedDaemon) -> dict[str, Any]:
    return dict(d.child(d.status(), "gateway-0").get("stats") or {})


def run_ws_floods(tmp: Path, phase_s: float = 5.0, log: Any = print) -> Report:
    tmp.mkdir(parents=True, exist_ok=True)
    rep = Report()
    d = LimitedDaemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=echo_config(SECRET)), env=GATEWAY_ONLY,
                      nofile=1024)
    try:
        d.start()
        gw = d.child(d.wait_ready(30), "gateway-0")
        port, pid = ws_port(gw), int(gw["pid"])
        fds_before = open_fds(pid)
        log_start = d.log_path.stat().st_size
        log(f"   WebSocket floods: a bystander call, then {phase_s:.0f} s each of nothing, {HALF_OPEN} half-open "
            f"connections, and two connections flooding {', '.join(KINDS)}")
        phases: dict[str, tuple[float, float]] = {}
        floods: dict[str, list[Any]] = {}
        half: dict[str, int] = {}

        async def main() -> Gaps:
            stop, gaps = asyncio.Event(), Gaps()
            call = asyncio.create_task(bystander(port, stop, gaps, PATH))
            await asyncio.sleep(1.0)
            t = time.monotonic()
            await asyncio.sleep(phase_s)
            phases["none"] = (t, time.monotonic())
            t = time.monotonic()
            socks, half["connected"] = await asyncio.to_thread(half_open, port, HALF_OPEN, sources(60))
            try:
                await asyncio.sleep(max(0.0, phase_s - (time.monotonic() - t)))
            finally:
                close_all(socks)
            phases["half-open"] = (t, time.monotonic())
            for kind, t, t_end, results in await flood_phases_apart(port, KINDS, list(FLOODERS), phase_s, PATH):
                floods[kind] = results
                phases[kind] = (t, t_end)
            stop.set()
            await call
            return gaps

        gaps = asyncio.run(main())
        mid = _stats(d)
        time.sleep(6.0)  # the last half-open ones time out (5 s), the flood calls end
        after = _stats(d)
        lines = log_lines(d.log_path, log_start)
        fds_after = open_fds(pid)
    finally:
        d.close()
    rep.add("wsflood_bystander", "WS floods: bystander call", "lost" if gaps.error else "up", "", "up",
            not gaps.error, gaps.error)
    for name, (t0, t1) in phases.items():
        g = gap_figures(gaps.between(t0, t1))
        two = name in KINDS
        rep.add(f"wsflood_p99_{name}", f"WS floods: bystander p99 frame gap, {name}", round(g["p99_ms"], 1), "ms",
                f"<= {P99_TARGET_MS:.0f}" if two else "", (g["p99_ms"] <= P99_TARGET_MS) if two else None,
                f"{g['frames']} frames")
        rep.add(f"wsflood_worst_{name}", f"WS floods: bystander worst frame gap, {name}", round(g["worst_ms"], 1),
                "ms", "", None)
    conns = 0
    for kind, results in floods.items():
        codes = [c for r in results for c, _ in r.closes]
        conns += len(codes)
        slow = max((s for r in results for s in r.to_close_s), default=float("nan"))
        rep.add(f"wsflood_closed_{kind}", f"WS floods: {kind} connections closed 1008 / flooded",
                f"{codes.count(1008)}/{len(codes)}", "", "all", bool(codes) and codes.count(1008) == len(codes),
                f"slowest {slow:.2f} s to close; {sum(r.refused for r in results)} handshakes refused")
    bad = conns + half.get("connected", 0)
    per100 = 100.0 * lines / max(1, bad)
    rep.add("wsflood_log_lines", "WS floods: log lines per 100 bad inputs (flooding connections)",
            round(per100, 2), "lines", "<= 1", per100 <= 1.0, f"{lines} lines, {bad} connections")
    rep.add("wsflood_half_open_peak", "WS floods: half-open evicted / cap",
            f"{mid.get('ws_evicted_half_open', 0)}/{mid.get('ws_half_open_cap')}", "", "", None,
            f"{mid.get('ws_dropped_half_open_source', 0)} reset per source, "
            f"{mid.get('ws_accept_errors', 0)} accept errors")
    left = (after.get("ws_half_open", -1), after.get("ws_connections_open", -1), after.get("calls_active", -1))
    rep.add("wsflood_slots_after", "WS floods: half-open / open connections / calls after", "/".join(map(str, left)),
            "", "0/0/0", left == (0, 0, 0))
    rep.add("wsflood_fds_after", "WS floods: gateway descriptors after - before", fds_after - fds_before, "fds",
            "<= 8", fds_after - fds_before <= 8, f"{fds_before} before")
    return rep
