"""Prometheus text exposition (format 0.0.4) of the supervisor's status snapshot.

Owns metric names and labels; renders from the same snapshot ``brisvoxd
status --json`` shows, so the two never disagree. Pure: snapshot in, text out.

Invariants: every family has ``# HELP`` and ``# TYPE`` lines and appears once;
counters end in ``_total``; label values are escaped (``\\``, ``"``, newline);
every role x state pair of ``brisvox_children`` is present (0 when empty), so
an alert on ``state="failed"`` has a series to watch. The agents' ``telemetry``
stats (latency histograms, calls by end reason, provider errors) are not
``brisvox_child_stat`` gauges: :mod:`brisvox.daemon.telemetry` sums them across
the processes and renders them with prometheus-client, after these families; so
does :mod:`brisvox.daemon.loop_metrics` with every process's ``loop`` entry (the
loop-stall probe's lateness, per role and index). The outbound child's webhook courier
and campaign runner have their own families (:func:`webhooks`, :func:`campaigns`); the
runner's per-campaign list is not a ``brisvox_child_stat`` (a list is not flattened).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from brisvox.daemon import loop_metrics, telemetry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROLES = ("gateway", "worker", "agent", "outbound")
STATES = ("starting", "ready", "stopping", "exited", "failed")
DAEMON_STATES = ("starting", "running", "draining", "stopping")
_STAT_RE = re.compile(r"[^A-Za-z0-9_.:-]")


def _esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(d: dict[str, Any]) -> str:
    if not d:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in d.items()) + "}"


def _num(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples: Iterable[tuple[dict[str, Any], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_num(value)}")


def _flatten(prefix: str, obj: Any, out: list[tuple[str, float]], depth: int = 0) -> None:
    if depth > 3 or len(out) > 200:
        return
    if isinstance(obj, bool):
        out.append((prefix, 1.0 if obj else 0.0))
    elif isinstance(obj, (int, float)):
        out.append((prefix, float(obj)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            key = _STAT_RE.sub("_", str(k))[:64]
            _flatten(f"{prefix}.{key}" if prefix else key, v, out, depth + 1)


def render(snap: dict[str, Any]) -> str:
    d = snap["daemon"]
    children: list[dict[str, Any]] = snap["children"]
    o = _Out()
    o.family("brisvox_up", "gauge", "1 while the supervisor answers.", [({}, 1)])
    o.family("brisvox_supervisor_uptime_seconds", "gauge", "Seconds since the supervisor started.",
             [({}, d["uptime_s"])])
    o.family("brisvox_daemon_state", "gauge", "1 for the supervisor's current state.",
             [({"state": s}, 1 if d["state"] == s else 0) for s in DAEMON_STATES])
    o.family("brisvox_daemon_ready", "gauge", "1 once every child completed its handshake (READY=1 sent).",
             [({}, 1 if d["ready"] else 0)])
    if d.get("pss_bytes") is not None:
        o.family("brisvox_supervisor_memory_pss_bytes", "gauge", "PSS of the supervisor process.",
                 [({}, d["pss_bytes"])])
    counts = {(r, s): 0 for r in ROLES for s in STATES}
    for c in children:
        counts[(c["role"], c["state"])] = counts.get((c["role"], c["state"]), 0) + 1
    o.family("brisvox_children", "gauge", "Children by role and state.",
             [({"role": r, "state": s}, n) for (r, s), n in counts.items()])
    o.family("brisvox_calls", "gauge", "Live calls reported by the children.", [({}, d["calls"])])

    def per_child(key: str, fn: Any = None) -> list[tuple[dict[str, Any], float]]:
        rows = []
        for c in children:
            v = fn(c) if fn else c.get(key)
            if v is not None:
                rows.append(({"role": c["role"], "index": c["index"]}, v))
        return rows

    o.family("brisvox_child_up", "gauge", "1 if the child is ready.",
             per_child("", lambda c: 1 if c["state"] == "ready" else 0))
    o.family("brisvox_child_pid", "gauge", "Pid of the child's current (or last) process.", per_child("pid"))
    o.family("brisvox_child_restarts_total", "counter", "Times the child was restarted.", per_child("restarts"))
    o.family("brisvox_child_boot_failures", "gauge", "Boot failures in a row.", per_child("boot_failures"))
    o.family("brisvox_child_hung_total", "counter", "Times the child was killed as hung.", per_child("hung"))
    o.family("brisvox_child_memory_restarts_total", "counter", "Restarts for exceeding the memory limit.",
             per_child("memory_restarts"))
    o.family("brisvox_child_memory_pss_bytes", "gauge", "PSS memory of the child.", per_child("pss_bytes"))
    o.family("brisvox_child_uptime_seconds", "gauge", "Seconds since the child process started.",
             per_child("uptime_s"))
    o.family("brisvox_child_calls", "gauge", "Live calls the child reported.", per_child("calls"))
    nofile_rows: list[tuple[dict[str, Any], float]] = []
    for who, lim in [({"role": "supervisor", "index": 0}, d.get("nofile")),
                     *(({"role": c["role"], "index": c["index"]}, c.get("nofile")) for c in children)]:
        if lim:
            nofile_rows += [({**who, "limit": k}, lim[k]) for k in ("soft", "hard")]
    o.family("brisvox_nofile_limit", "gauge", "RLIMIT_NOFILE of the supervisor and of each child "
             "(read at its handshake; -1: unlimited).", nofile_rows)
    o.family("brisvox_child_heartbeat_age_seconds", "gauge", "Age of the child's main-loop heartbeat at its last pong.",
             per_child("", lambda c: c["beat_ms"] / 1000 if c.get("beat_ms", -1) >= 0 else None))
    ev_rows = []
    stat_rows = []
    dec_rows = [({"process": where, "kind": kind}, n)
                for where, kinds in sorted(d.get("decode_errors", {}).items()) for kind, n in sorted(kinds.items())]
    for c in children:
        base = {"role": c["role"], "index": c["index"]}
        for kind, n in sorted((c.get("events") or {}).items()):
            ev_rows.append(({**base, "kind": kind}, n))
        stats = dict(c.get("stats") or {})
        stats.pop("telemetry", None)  # histograms and typed counters: brisvox/daemon/telemetry.py
        stats.pop("loop", None)  # the loop probe's: brisvox/daemon/loop_metrics.py
        for kind, n in sorted((stats.pop("decode_errors", None) or {}).items()):
            if isinstance(n, (int, float)):
                dec_rows.append(({"process": c["name"], "kind": kind}, n))
        flat: list[tuple[str, float]] = []
        _flatten("", stats, flat)
        stat_rows += [({**base, "stat": k}, v) for k, v in flat]
    o.family("brisvox_child_events_total", "counter", "ChildEvent frames by kind.", ev_rows)
    o.family("brisvox_child_stat", "gauge", "Numeric counters a child reports with its pongs.", stat_rows)
    o.family("brisvox_decode_errors_total", "counter", "Malformed or unknown frames dropped, by process and kind.",
             dec_rows)
    o.family("brisvox_log_lines_total", "counter", "Child output lines forwarded by the supervisor.",
             [({"role": r}, n) for r, n in sorted(d.get("log_lines", {}).items())])
    o.family("brisvox_metrics_requests_total", "counter", "HTTP requests served by this endpoint.",
             [({}, d.get("http_requests", 0))])
    o.family("brisvox_metrics_refused_total", "counter", "Connections and requests this endpoint did not serve, "
             "by reason (busy, bad_request, accept_error, handler_error).",
             [({"reason": r}, n) for r, n in sorted((d.get("http_refused") or {}).items())])
    o.family("brisvox_supervisor_log_suppressed_total", "counter", "Repeated supervisor log lines not written "
             "(rate-limited), by site.", [({"site": s}, n) for s, n in sorted((d.get("log_suppressed") or {}).items())])
    webhooks(o, children)
    campaigns(o, children)
    return "\n".join(o.lines) + "\n" + telemetry.render(children) + loop_metrics.render(snap)


def webhooks(o: _Out, children: list[dict[str, Any]]) -> None:
    """The webhook families: the outbound child's courier (``stats.webhooks``) and the agent
    processes' outbox writers (``stats.webhooks``, summed). Present only when some child reports them."""
    couriers = [((c.get("stats") or {}).get("webhooks") or {}) for c in children if c["role"] == "outbound"]
    couriers = [w for w in couriers if isinstance(w, dict) and "delivered" in w]
    writers = [((c.get("stats") or {}).get("webhooks") or {}) for c in children if c["role"] == "agent"]
    writers = [w for w in writers if isinstance(w, dict) and "committed" in w]
    if writers:
        o.family("brisvox_webhook_events_total", "counter", "Webhook events the agent processes produced, by what "
                 "became of them: committed to the outbox, dropped (its queue full), failed (the commit failed).",
                 [({"result": r}, sum(int(w.get(r, 0)) for w in writers)) for r in ("committed", "dropped", "failed")])
        o.family("brisvox_webhook_outbox_queue", "gauge", "Webhook events queued for the outbox writer, not yet committed.",
                 [({}, sum(int(w.get("queued", 0)) for w in writers))])
    if not couriers:
        return
    w = couriers[0]
    o.family("brisvox_webhook_deliveries_total", "counter", "Webhook delivery attempts by result (failed: to be "
             "retried or given up; gave_up: past the horizon or no longer configured).",
             [({"result": r}, int(w.get(r, 0))) for r in ("delivered", "failed", "gave_up")])
    o.family("brisvox_webhook_attempt_failures_total", "counter", "Failed webhook attempts by kind (status, timeout, "
             "connect, address, http).", [({"kind": k}, n) for k, n in sorted((w.get("failures") or {}).items())])
    ob = w.get("outbox") or {}
    o.family("brisvox_webhook_outbox_rows", "gauge", "Rows of the webhook outbox by state (delivered and given-up "
             "rows are kept a week).", [({"state": k}, int(ob.get(k, 0))) for k in ("pending", "delivered", "gave_up")])
    o.family("brisvox_webhook_oldest_pending_seconds", "gauge", "Age of the oldest undelivered webhook event.",
             [({}, float(ob.get("oldest_pending_age_s", 0.0)))])
    o.family("brisvox_webhook_in_flight", "gauge", "Webhook attempts in flight.", [({}, int(w.get("in_flight", 0)))])
    lat = w.get("latency") or {}
    if isinstance(lat.get("le"), list) and isinstance(lat.get("counts"), list):
        name = "brisvox_webhook_delivery_seconds"
        o.lines.append(f"# HELP {name} Seconds from a webhook event's creation to its delivery.")
        o.lines.append(f"# TYPE {name} histogram")
        for le, n in zip([*lat["le"], "+Inf"], lat["counts"], strict=False):
            o.lines.append(f'{name}_bucket{{le="{le}"}} {_num(n)}')
        o.lines.append(f"{name}_sum {_num(float(lat.get('sum', 0.0)))}")
        o.lines.append(f"{name}_count {_num(int(lat.get('count', 0)))}")


def campaigns(o: _Out, children: list[dict[str, Any]]) -> None:
    """The campaign families: the outbound child's runner (``stats.campaigns.by_campaign``, read
    from its store by :mod:`brisvox.outbound.campaign.meter`: at most 20 campaigns, the running
    and paused ones and those ended in the last 15 minutes). Present only when a runner reports;
    labelled ``campaign`` (the id) and ``campaign_name``."""
    runners = [((c.get("stats") or {}).get("campaigns") or {}) for c in children if c["role"] == "outbound"]
    shown = [r["by_campaign"] for r in runners if isinstance(r, dict) and isinstance(r.get("by_campaign"), list)]
    if not shown:
        return
    cs = [c for c in shown[0] if isinstance(c, dict) and isinstance(c.get("id"), int)][:20]

    def rows(fn: Any) -> list[tuple[dict[str, Any], float]]:
        out = []
        for c in cs:
            base = {"campaign": c["id"], "campaign_name": str(c.get("name", ""))[:64]}
            for extra, v in fn(c):
                if isinstance(v, (int, float)):
                    out.append(({**base, **extra}, v))
        return out

    def by(key: str, label: str) -> Any:
        return lambda c: [({label: str(k)[:32]}, v) for k, v in (c.get(key) or {}).items()]

    o.family("brisvox_campaign_state", "gauge", "1 for the campaign's state (running, paused, cancelled, done).",
             rows(lambda c: [({"state": s}, 1 if c.get("state") == s else 0)
                             for s in ("running", "paused", "cancelled", "done")]))
    o.family("brisvox_campaign_rows", "gauge", "The campaign's rows by state (pending, dialing, waiting for a "
             "retry, done).", rows(by("rows", "state")))
    o.family("brisvox_campaign_rows_done", "gauge", "The campaign's done rows by outcome as status shows it "
             "(answered_human, answered_machine once AMD said; cancelled: ended by a cancel).",
             rows(by("outcomes", "outcome")))
    o.family("brisvox_campaign_attempts_total", "counter", "Dials the campaign began (each committed before "
             "its INVITE).", rows(lambda c: [({}, c.get("attempts"))]))
    o.family("brisvox_campaign_retries_total", "counter", "Dials that were a row's second or later attempt.",
             rows(lambda c: [({}, c.get("retries"))]))
    o.family("brisvox_campaign_attempt_outcomes_total", "counter", "The campaign's finished dials by outcome "
             "(refused: the gateway placed nothing).", rows(by("attempt_outcomes", "outcome")))
    o.family("brisvox_campaign_dial_rate", "gauge", "Dials begun per second over the last 10 s.",
             rows(lambda c: [({}, c.get("rate"))]))
    o.family("brisvox_campaign_dial_rate_limit", "gauge", "The campaign's --rate (dials per second).",
             rows(lambda c: [({}, c.get("rate_cap"))]))
    o.family("brisvox_campaign_calls_in_flight", "gauge", "Dials waiting for their verdict plus answered calls "
             "still up.", rows(lambda c: [({}, c.get("in_flight"))]))
    o.family("brisvox_campaign_calls_in_flight_limit", "gauge", "The campaign's --max-concurrent.",
             rows(lambda c: [({}, c.get("max_concurrent"))]))
