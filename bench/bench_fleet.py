"""Scale-out: ``python -m bench fleet [--quick]``.

Two real ``brisvoxd`` (127.0.0.3 and 127.0.0.4) behind Kamailio (SIP) and
HAProxy (WebSocket) on 127.0.0.2, each proxy running its shipped file from
``deploy/`` (:mod:`bench.harness.fleet`). First the cost of the proxies:
calls over each path at once, through the proxy and straight to instance
``a``, Twilio Media Streams and SIP (RTP never crosses Kamailio: only the
setup does; every WebSocket frame crosses HAProxy), p95 of the turn latency
(caller stopped -> first loud bot audio) and of the setup time per path, and
what the proxy adds. Then the scenario of ``tests/system/test_fleet.py``
with more and longer calls (:mod:`bench.harness.fleet_scenario`): the
spread, a drain with live calls, a SIGKILL, the rejoins, every figure and
check. ``--quick`` runs the test's sizes. Written to ``bench/out/fleet.json``
as well.

Needs kamailio (with kamcmd), haproxy and sipp (``make test`` installs them);
without them it fails with one line naming what is missing.

Invariants: every process is stopped and every instance's /dev/shm segments
removed even when the run fails (``Fleet.close``); nothing binds outside
127.0.0.0/8.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import fleet_calls as C
from bench.harness.fleet import Fleet, tools_missing
from bench.harness.fleet_scenario import Plan
from bench.harness.fleet_scenario import run as run_scenario

OUT = Path(__file__).resolve().parent / "out"

LONG = Plan(sip_long=30, sip_short=15, ws_long=30, ws_short=15, hold_long_s=30.0, drain_sip=12, drain_ws=12,
            kill_sip=16, kill_ws=16, kill_hold_s=15.0, failover_sip=20, failover_ws=8, rejoin_sip=10, rejoin_ws=10)


def paths(fleet: Fleet) -> dict[str, tuple[str, str]]:
    a = fleet.instances["a"]
    return {"twilio via HAProxy": ("twilio", fleet.ws_url("/twilio")),
            "twilio direct": ("twilio", f"ws://{a.ws_addr}/twilio"),
            "sip via Kamailio": ("sip", f"sip:fleet@{fleet.sip_target}"),
            "sip direct": ("sip", f"sip:fleet@{a.host}:{a.sip_port}")}


def latency(fleet: Fleet, per_path: int, batch: int = 5) -> dict[str, dict[str, Any]]:
    """``per_path`` calls over each path, ``batch`` per path at a time (all paths together, so
    they share the same load); per path the p50/p95 of turn latency and setup time."""
    line = C.speech()
    ps = paths(fleet)
    got: dict[str, list[C.CallResult]] = {k: [] for k in ps}
    done = 0
    while done < per_path:
        k = min(batch, per_path - done)
        specs = [(t, u, 7.0, 0.15 * i) for _, (t, u) in ps.items() for i in range(k)]
        res = asyncio.run(C.calls(specs, line, first_idx=done * 10))
        for j, name in enumerate(ps):
            got[name] += res[j * k:(j + 1) * k]
        done += k
    out: dict[str, dict[str, Any]] = {}
    for name, rs in got.items():
        lat = [r.latency_ms for r in rs if r.latency_ms is not None]
        setup = [r.setup_ms for r in rs if r.setup_ms is not None]
        out[name] = {"calls": len(rs), "answered": sum(r.answered for r in rs),
                     "turn_p50_ms": C.percentile(lat, 50), "turn_p95_ms": C.percentile(lat, 95),
                     "setup_p50_ms": C.percentile(setup, 50), "setup_p95_ms": C.percentile(setup, 95)}
    return out


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    missing = tools_missing()
    if missing:
        raise RuntimeError(f"needs {', '.join(missing)}")
    tmp = Path(tempfile.mkdtemp(prefix="bvfleet", dir="/tmp"))
    rows: list[tuple[str, Any, str, str]] = []
    try:
        with Fleet(tmp, n=2) as fleet:
            try:
                took = fleet.start()
                rows.append(("fleet start (2 instances + Kamailio + HAProxy)", round(took, 1), "s", ""))
                lat = latency(fleet, per_path=10 if quick else 30)
                rep = run_scenario(fleet, Plan() if quick else LONG)
            except BaseException:
                print(fleet.logs())
                raise
        for name, f in lat.items():
            rows.append((f"{name}: answered", f"{f['answered']}/{f['calls']}", "calls", "all"))
            for k in ("turn_p50_ms", "turn_p95_ms", "setup_p50_ms", "setup_p95_ms"):
                v = f[k]
                rows.append((f"{name}: {k[:-3].replace('_', ' ')}", round(v, 1) if v is not None else "-", "ms", ""))
        for proto, proxy in (("twilio", "HAProxy"), ("sip", "Kamailio")):
            via, direct = lat[f"{proto} via {proxy}"], lat[f"{proto} direct"]
            for k in ("turn_p95_ms", "setup_p95_ms"):
                if via[k] is not None and direct[k] is not None:
                    rows.append((f"{proto}: added by {proxy}, {k[:-3].replace('_', ' ')}",
                                 round(via[k] - direct[k], 1), "ms", "small"))
        for k, v in rep.figures.items():
            rows.append((k, v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v), "", ""))
        for c in rep.checks:
            rows.append((f"check {c.key}", "ok" if c.ok else "FAILED", "", c.detail[:160]))
        OUT.mkdir(exist_ok=True)
        (OUT / "fleet.json").write_text(json.dumps({"latency": lat, "figures": rep.figures, "notes": rep.notes,
                                                    "checks": [c.__dict__ for c in rep.checks]}, indent=1,
                                                   default=str))
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
