"""``brisvox calls list|show ID``: read the call records the agent processes wrote.

Owns argument parsing and output. Records come from ``--path`` (a directory
or a .jsonl file), else the ``[calls] path`` of the daemon config, else
``<state_dir>/calls``. ``list`` prints one line per call (newest last);
``show`` prints one record as JSON (``--conversation`` only the transcript), found by its
call id, a unique prefix of it, or one of its transport ids (a Twilio CallSid).
Exit codes: 0, 1 when ``show`` finds no such call.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from brisvox.agent.host.call_record import read_records


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calls", help="list and show the per-call records")
    p.add_argument("--path", default=None, help="records directory or .jsonl file "
                   "(default: [calls] path of the daemon config, else <state_dir>/calls)")
    p.add_argument("--config", default=None, help="daemon config to read [calls] and [daemon] state_dir from")
    csub = p.add_subparsers(dest="calls_command", required=True)
    pl = csub.add_parser("list", help="one line per call")
    pl.add_argument("--last", type=int, default=50, help="show the last N calls (0 = all)")
    ps = csub.add_parser("show", help="one call record as JSON")
    ps.add_argument("call_id", help="the call id (a unique prefix is enough), or a transport id (a Twilio CallSid)")
    ps.add_argument("--conversation", action="store_true", help="print only the conversation")
    p.set_defaults(run=run)


def _target(args: argparse.Namespace) -> Path:
    if args.path:
        return Path(args.path).expanduser()
    from brisvox.config.daemon import find_config, load_config
    from brisvox.runtime.paths import state_dir

    path = find_config(args.config)
    if path is not None:
        cfg = load_config(path)
        calls = cfg.section("calls")
        if calls.path:
            return Path(calls.path).expanduser()
        return state_dir(cfg) / "calls"
    from brisvox.config.daemon import DaemonConfig

    return state_dir(DaemonConfig()) / "calls"


def _line(r: dict[str, Any]) -> str:
    conv = r.get("conversation") or []
    turns = sum(1 for m in conv if m.get("role") == "user")
    tools = len(r.get("tools") or [])
    interrupts = ((r.get("stats") or {}).get("turn") or {}).get("interrupts", 0)
    return (f"{r.get('started', '?'):<30} {r.get('call_id', '?'):<24} {r.get('transport', ''):<8} "
            f"{r.get('duration_s', 0):>8.1f}s  turns={turns} interrupts={interrupts} tools={tools} "
            f"end={r.get('end_reason', '')}")


def run(args: argparse.Namespace) -> int:
    target = _target(args)
    records = read_records(target)
    if args.calls_command == "list":
        rows = records[-args.last:] if args.last > 0 else records
        if not rows:
            print(f"no call records in {target}", file=sys.stderr)
        for r in rows:
            print(_line(r))
        return 0
    matches = [r for r in records if str(r.get("call_id", "")) == args.call_id]
    if not matches:
        matches = [r for r in records if str(r.get("call_id", "")).startswith(args.call_id)]
    if not matches:  # a transport's id: a Twilio CallSid (brisvoxd dial --via twilio), a SIP Call-ID
        matches = [r for r in records if args.call_id in (r.get("transport_ids") or {}).values()]
    if len(matches) != 1:
        print(f"{'no' if not matches else 'more than one'} call {args.call_id!r} in {target}", file=sys.stderr)
        return 1
    rec = matches[0]
    out = rec.get("conversation") if args.conversation else rec
    sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
