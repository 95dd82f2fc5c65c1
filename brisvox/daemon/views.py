"""What the supervisor shows of its children: the status line, the rows, ``/healthz``.

Pure functions of the slots (and the daemon's state): the arbiter builds
the ``brisvoxd status`` snapshot and ``/metrics`` (:mod:`brisvox.daemon.metrics`)
from them, sends the status line with sd_notify and logs it.

Invariants:

* Nothing here changes a slot; the same slots give the same answer (but the
  uptimes, which read ``now``).
* ``/healthz`` is 200 only while running with every child ready; any other
  state (starting, draining, stopping) or any child not ready is 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brisvox.daemon.slots import Slot, State


def status_line(slots: Sequence[Slot]) -> str:
    """``gateway 1/1, workers 2/2, agents 1/1 ready; 3 calls[; failed: ...]``."""
    parts = []
    for role, label in (("gateway", "gateway"), ("worker", "workers"), ("agent", "agents")):
        members = [s for s in slots if s.role == role]
        parts.append(f"{label} {sum(s.state is State.READY for s in members)}/{len(members)}")
    outbound = [s for s in slots if s.role == "outbound"]
    if outbound:  # only when webhooks (or campaigns) are configured
        parts.append(f"outbound {sum(s.state is State.READY for s in outbound)}/{len(outbound)}")
    calls = sum(s.calls for s in slots if s.live)
    line = f"{', '.join(parts)} ready; {calls} calls"
    failed = [s.name for s in slots if s.state is State.FAILED]
    if failed:
        line += f"; failed: {', '.join(failed)}"
    return line


def child_rows(slots: Sequence[Slot], now: float) -> list[dict[str, Any]]:
    """The ``children`` of the ``brisvoxd status`` snapshot, one row per slot."""
    return [{
        "role": s.role, "index": s.index, "name": s.name, "pid": s.pid, "state": str(s.state),
        "uptime_s": round(now - s.started_at, 3) if s.live else 0.0,
        "ready": s.state is State.READY, "restarts": s.restarts, "boot_failures": s.boot_failures,
        "pss_bytes": s.pss, "calls": s.calls, "beat_ms": s.beat_ms, "last_exit": s.last_exit,
        "error": s.error, "hung": s.hung, "memory_restarts": s.mem_restarts,
        "events": dict(s.events), "stats": s.stats, "endpoints": s.endpoints, "measured": s.measured,
        "stop_reason": s.stop_reason,
        "nofile": {"soft": s.nofile[0], "hard": s.nofile[1]} if s.nofile else None,
    } for s in slots]


def healthz(state: str, slots: Sequence[Slot]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of ``/healthz`` for the daemon in ``state``."""
    live = [s for s in slots if s.state is not State.FAILED]
    healthy = state == "running" and all(s.state is State.READY for s in slots)
    body = {"status": "ok" if healthy else "degraded" if state == "running" else state,
            "state": state, "ready": sum(s.state is State.READY for s in slots),
            "children": len(slots), "failed": [s.name for s in slots if s.state is State.FAILED],
            "not_ready": [s.name for s in live if s.state is not State.READY]}
    trunks = {}  # the gateway's [[sip.trunks]] registrations: detail, not health (a carrier's outage is not ours)
    for s in slots:
        rows = (s.stats or {}).get("sip_trunks") if s.state is State.READY else None
        if isinstance(rows, dict):
            trunks.update({str(k)[:32]: {"state": str(v.get("state", ""))[:16], "error": str(v.get("error", ""))[:200]}
                           for k, v in list(rows.items())[:64] if isinstance(v, dict)})
    if trunks:
        body["sip_trunks"] = trunks
    return (200 if healthy else 503), body
