"""``brisvoxd campaign start|status|pause|resume|cancel|export``: outbound campaigns (docs/OUTBOUND.md).

Owns the subcommands' registration and their work on the campaign store (the
SQLite file, default ``<state dir>/campaigns.sqlite3``, ``--db`` to name
another): ``start`` validates the CSV (:mod:`brisvox.outbound.campaign.csvload`:
refused with each problem's line, exit 2, nothing stored) and the agent,
then stores the campaign ``running``; the runner (the ``outbound`` role, or
``python -m brisvox.outbound.campaign run``) polls the file and dials.
``pause``/``resume``/``cancel`` change the campaign's state in the file; the
runner follows at its next poll (a dial in flight finishes). ``status`` and
``export`` read it.

Exit codes: 0 ok; 1 refused (an unknown campaign, a state change not allowed,
a name taken); 2 a bad CSV, option, agent or config.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from brisvox.runtime import exitcodes

MAX_FILE_BYTES = 64 << 20  # 100 000 rows of ordinary width fit many times
NAME = re.compile(r"^(?![0-9]+$)[A-Za-z0-9._-]{1,64}$")  # not all digits: a number is an id


def _err(msg: str) -> None:
    print(f"brisvoxd campaign: {msg}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> Any:
    from brisvox.config.daemon import find_config, load_config
    from brisvox.config.secrets import deferred

    path = find_config(getattr(args, "config", None))
    with deferred():  # the service's secrets are not needed to find the state dir or an agent file
        return load_config(path.resolve() if path else None)


def db_path(args: argparse.Namespace) -> Path:
    """``--db``, else the daemon's ``[campaigns] db`` (default: its state dir's ``campaigns.sqlite3``)."""
    from brisvox.outbound.campaign.config import store_path

    if getattr(args, "db", None):
        return Path(args.db)
    return store_path(_config(args))


def _store(args: argparse.Namespace) -> Any:
    from brisvox.outbound.campaign.store import CampaignStore

    return CampaignStore(db_path(args))


def _agent_problem(args: argparse.Namespace) -> str:
    """Why ``--agent`` cannot run the calls ("" when it can, or cannot be told offline)."""
    from brisvox.agent.definition import check_agent_file
    from brisvox.agent.host.config import ECHO

    if args.no_agent_check:
        return ""
    cfg = _config(args)
    agents = cfg.section("agents")
    name = agents.agent_name(args.agent)
    if agents.providers != "definitions" or name == ECHO:
        return ""
    path = agents.agents_path(getattr(cfg, "path", None)) / f"{name}.toml"
    if not path.is_file():
        return f"--agent {args.agent!r}: no agent file {path} (agents.agents_dir)"
    _, problems = check_agent_file(path)
    errors = [p.render(str(path)) for p in problems if p.severity == "error"]
    return f"--agent {args.agent!r}: {errors[0]}" if errors else ""


def _settings(args: argparse.Namespace) -> Any:
    from brisvox.outbound.campaign.scheduler import Settings, parse_days, parse_hours

    retry_on = frozenset(x.strip() for x in args.retry_on.split(",") if x.strip()) if args.retry_on else None
    kw: dict[str, Any] = {"rate": args.rate, "max_concurrent": args.max_concurrent,
                          "windows": parse_hours(args.hours), "days": parse_days(args.days),
                          "max_attempts": args.max_attempts, "retry_delay_s": args.retry_delay,
                          "retry_multiplier": args.retry_backoff, "ring_timeout_s": args.ring_timeout,
                          "via": args.via}
    if retry_on is not None:
        kw["retry_on"] = retry_on
    return Settings(**kw)


def cmd_start(args: argparse.Namespace) -> int:
    from brisvox.config.errors import ConfigError
    from brisvox.outbound.campaign.csvload import CsvRefused, load
    from brisvox.outbound.campaign.store import StoreError

    src = Path(args.file)
    try:
        settings = _settings(args)
        name = args.name or src.stem
        if not NAME.match(name):
            raise ValueError(f"--name {name[:80]!r}: 1-64 letters, digits, '.', '_' or '-', not only digits")
        if src.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES >> 20} MiB: split the file")
        text = src.read_bytes().decode("utf-8")
        rows = load(text, declared=args.var or (), default_timezone=args.timezone or "")
    except CsvRefused as e:
        for line, msg in e.problems:
            _err(f"{src}:{line}: {msg}" if line else f"{msg}")
        if e.more:
            _err(f"... and {e.more} more")
        _err("refused: nothing stored, nothing dialled")
        return exitcodes.CONFIG
    except (ValueError, OSError) as e:
        _err(f"{src}: {e}")
        return exitcodes.CONFIG
    try:
        problem = _agent_problem(args)
        if problem:
            _err(problem)
            return exitcodes.CONFIG
        store = _store(args)
    except ConfigError as e:
        _err(f"configuration error: {e}")
        return exitcodes.CONFIG
    try:
        c = store.create(name, args.agent, str(src.resolve()), settings, rows, time.time())
    except StoreError as e:
        _err(str(e))
        return exitcodes.FAILURE
    finally:
        store.close()
    print(f"campaign {c.name} (id {c.id}): {len(rows)} rows, agent {c.agent}, {settings.rate:g} calls/s, "
          f"at most {settings.max_concurrent} at once; running (store {store.path})")
    if not getattr(args, "db", None) and not _config(args).section("campaigns").enabled:
        _err("warning: [campaigns] enabled is false in the daemon config: nothing dials this campaign until "
             "it is true (then brisvoxd reload)")
    return exitcodes.OK


def _report(store: Any, c: Any, now: float) -> dict[str, Any]:
    from brisvox.outbound.campaign.scheduler import rate_over

    p = store.progress(c.id)
    return {"id": c.id, "name": c.name, "agent": c.agent, "state": c.state, "source": c.source,
            "settings": c.settings.to_json(), **p,
            "rate_now": round(rate_over(store.started_since(c.id, now - 10.0), now), 3)}


def render(rep: dict[str, Any]) -> str:
    from brisvox.outbound.campaign.outcomes import SHOWN

    s = rep["settings"]
    done = rep["states"].get("done", 0)
    lines = [f"campaign {rep['name']} (id {rep['id']}): {rep['state']}, agent {rep['agent']}",
             f"  rows {rep['rows']}: done {done}, dialling {rep['states'].get('dialing', 0)}, "
             f"waiting for a retry {rep['states'].get('waiting', 0)}, pending {rep['states'].get('pending', 0)}; "
             f"attempts {rep['attempts']}",
             f"  rate now {rep['rate_now']:g}/s (cap {s['rate']:g}/s, at most {s['max_concurrent']} at once)"]
    outs = rep["outcomes"]
    if outs:
        lines.append("  outcomes: " + ", ".join(f"{k} {outs[k]}" for k in (*SHOWN, *sorted(set(outs) - set(SHOWN)))
                                                if k in outs))
    return "\n".join(lines)


def _find(store: Any, key: str) -> Any:
    c = store.campaign(key)
    if c is None:
        _err(f"no campaign {key!r} in {store.path}")
    return c


def cmd_status(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        now = time.time()
        if args.campaign:
            c = _find(store, args.campaign)
            if c is None:
                return exitcodes.FAILURE
            chosen = [c]
        else:
            chosen = store.campaigns()
        reps = [_report(store, c, now) for c in chosen]
    finally:
        store.close()
    if args.json:
        print(json.dumps(reps if not args.campaign else reps[0], indent=2, sort_keys=True))
    elif not reps:
        print("no campaigns")
    else:
        print("\n".join(render(r) for r in reps))
    return exitcodes.OK


def _change(args: argparse.Namespace, to: str, verb: str) -> int:
    from brisvox.outbound.campaign.store import StoreError

    store = _store(args)
    try:
        c = store.set_state(args.campaign, to, time.time())
    except StoreError as e:
        _err(str(e))
        return exitcodes.FAILURE
    finally:
        store.close()
    print(f"campaign {c.name}: {verb} (the runner follows at its next poll; dials in flight finish)")
    return exitcodes.OK


EXPORT_COLUMNS = ("line", "number", "timezone", "outcome", "attempts", "first_attempt_at", "last_attempt_at",
                  "last_detail", "call_id", "amd")


def export_records(store: Any, campaign_id: int) -> list[dict[str, Any]]:
    return list(store.rows(campaign_id))


def to_csv(records: list[dict[str, Any]]) -> str:
    """One line per row: its columns, its variables, its outcome and a summary of its attempts."""
    names = sorted({k for r in records for k in r["variables"]})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*EXPORT_COLUMNS, *names])
    for r in records:
        a = r["attempts"]
        last = a[-1] if a else {}
        w.writerow([r["line"], r["number"], r["timezone"], r["outcome"] or r["state"], len(a),
                    _iso(a[0]["started_at"]) if a else "", _iso(last.get("started_at")),
                    last.get("detail") or "", last.get("call_id") or "", last.get("amd") or "",
                    *[r["variables"].get(n, "") for n in names]])
    return buf.getvalue()


def _iso(t: float | None) -> str:
    if t is None:
        return ""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def cmd_export(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        c = _find(store, args.campaign)
        if c is None:
            return exitcodes.FAILURE
        records = export_records(store, c.id)
        rep = _report(store, c, time.time())
    finally:
        store.close()
    if args.format == "json":
        text = json.dumps({"campaign": rep, "rows": records}, indent=1, sort_keys=True) + "\n"
    else:
        text = to_csv(records)
    if args.output:
        from brisvox.outbound.campaign.store import open_private

        out = Path(args.output)
        open_private(out)  # numbers are personal data: owner-only
        out.write_text(text)
    else:
        sys.stdout.write(text)
    return exitcodes.OK


def add_parser(sub: Any) -> None:
    """``campaign`` and its subcommands (``brisvoxd``'s build_parser calls it)."""
    p = sub.add_parser("campaign", help="outbound campaigns: a CSV of numbers dialled at a rate, within calling "
                       "hours, with retries (docs/OUTBOUND.md)")
    csub = p.add_subparsers(dest="campaign_command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="daemon config (default: $BRISVOX_CONFIG, /etc/brisvox/brisvoxd.toml)")
        sp.add_argument("--db", help="the campaign store (default: <state dir>/campaigns.sqlite3)")

    sp = csub.add_parser("start", help="validate a CSV and start dialling it")
    sp.add_argument("file", help="CSV: a header line, a 'number' column, optionally 'timezone', variables")
    sp.add_argument("--agent", required=True, help="the agent that runs the answered calls")
    sp.add_argument("--name", help="the campaign's name (default: the file's name without .csv)")
    sp.add_argument("--var", action="append", metavar="NAME", help="declare a variable column (repeatable); "
                    "any other column but number and timezone is refused")
    sp.add_argument("--timezone", help="IANA zone of rows without a timezone cell (e.g. Europe/Berlin)")
    sp.add_argument("--rate", type=float, default=1.0, help="calls started per second (default 1)")
    sp.add_argument("--max-concurrent", type=int, default=10, help="calls ringing or up at once (default 10)")
    sp.add_argument("--hours", default="09:00-20:00", help="calling hours in each row's zone, "
                    "HH:MM-HH:MM[,HH:MM-HH:MM] (default 09:00-20:00)")
    sp.add_argument("--days", default="mon-sat", help="calling days in each row's zone: mon-fri, "
                    "mon,wed or all (default mon-sat)")
    sp.add_argument("--max-attempts", type=int, default=3, help="attempts per row, the first included (default 3)")
    sp.add_argument("--retry-delay", type=float, default=600.0, help="seconds before the first retry (default 600)")
    sp.add_argument("--retry-backoff", type=float, default=1.0, help="each further retry waits this many times "
                    "longer (default 1: the same delay)")
    sp.add_argument("--retry-on", help="outcomes retried: any of no_answer,busy,failed,refused "
                    "(default no_answer,busy,failed)")
    sp.add_argument("--ring-timeout", type=float, default=0.0, help="seconds to ring (default: the gateway's "
                    "[sip] dial_ring_timeout_s)")
    sp.add_argument("--via", choices=("sip", "twilio"), default="sip", help="how rows are dialled: sip "
                    "([campaigns] trunk) or twilio (the REST API: [websocket] twilio_account_sid, twilio_from, "
                    "public_url, twiml_path; default sip)")
    sp.add_argument("--no-agent-check", action="store_true", help="do not look for the agent's file offline")
    common(sp)
    sp.set_defaults(func=cmd_start)

    sp = csub.add_parser("status", help="progress, outcomes and the current rate")
    sp.add_argument("campaign", nargs="?", help="name or id (default: every campaign)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    common(sp)
    sp.set_defaults(func=cmd_status)

    for verb, to, done, what in (("pause", "paused", "paused", "stop starting dials (resume continues)"),
                                 ("resume", "running", "resumed", "continue a paused campaign"),
                                 ("cancel", "cancelled", "cancelled", "stop for good: rows not dialled end cancelled")):
        sp = csub.add_parser(verb, help=what)
        sp.add_argument("campaign", help="name or id")
        common(sp)
        sp.set_defaults(func=functools.partial(_change, to=to, verb=done))

    sp = csub.add_parser("export", help="every row with its outcome and attempts, as CSV or JSON")
    sp.add_argument("campaign", help="name or id")
    sp.add_argument("--format", choices=("csv", "json"), default="csv")
    sp.add_argument("--output", "-o", help="write to this file (mode 0600) instead of stdout")
    common(sp)
    sp.set_defaults(func=cmd_export)
