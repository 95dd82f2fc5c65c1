"""``python -m bench.loadgen``: run N Twilio Media Streams calls against a server, print JSON.

Example: ``python -m bench.loadgen --url ws://127.0.0.1:8765/twilio --calls 10``.
Several ``--url`` spread the calls round-robin (one server process per URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from bench import workload
from bench.loadgen.runner import run_load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.loadgen")
    ap.add_argument("--url", action="append", required=True, help="ws:// URL (repeatable)")
    ap.add_argument("--calls", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer turns at N=1")
    ap.add_argument("--workload", type=Path, default=None, help="default bench/workload.toml")
    ap.add_argument("--cache", type=Path, default=None, help="speech cache dir")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here too")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    wl = workload.load(args.workload)
    summary = asyncio.run(run_load(args.url, args.calls, wl, quick=args.quick, cache_dir=args.cache))
    text = json.dumps(summary, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0 if summary["calls_ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
