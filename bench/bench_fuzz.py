"""The fuzz campaign: ``python -m bench fuzz [--quick]``.

Against a real ``brisvoxd`` (1 worker, 1 agent process, the gateway's echo
agent and the scripted providers), from 249 loopback addresses with the
default per-source limits: 10,000 mutated SIP datagrams and 10,000 mutated
WebSocket messages over 500 connections (``--quick``: 2,000 + 2,000 over
100), then a short burst past the default limits from one address
(``bench/harness/fuzz.py``, the inputs in ``fuzz_sip.py`` / ``fuzz_ws.py``).
Every judgment is printed with its target and verdict ("ok" / "FAILED"):
no crash or restart, the call table empty within 35 s, no /dev/shm segment
left or deleted one mapped, a valid SIP and a valid Twilio call answered
right after, the log lines bounded, every refusal counted
(``bench/harness/fuzz_judge.py``); the report is written to
``bench/out/fuzz.json``. ``BRISVOX_FUZZ_SIP`` / ``BRISVOX_FUZZ_WS`` /
``BRISVOX_FUZZ_CONNS`` override the sizes. Then the SIP table flood
(``bench/harness/fuzz_table.py``, on a daemon of its own with the default
``[sip]`` limits): one address sends 250 out-of-dialog requests a second for
``BRISVOX_FUZZ_TABLE_S`` (20) seconds while another places calls; printed:
the bystander INVITEs' worst answer time, log lines per 100 flood requests,
the transaction table 40 s after the flood started. Then the WebSocket floods
(``bench/harness/fuzz_ws_floods.py``, on a daemon of its own at a soft file
limit of 1,024): a bystander call through ``BRISVOX_FUZZ_WS_FLOOD_S`` (5)
seconds each of nothing, 1,500 half-open connections, and two connections
flooding one-byte fragments, pings without reading the pongs, tiny binary
frames; printed: its p99 and worst frame gap per flood (target p99 <= 40 ms),
how the floods were closed, log lines per 100 flooding connections, and the
slots and descriptors after.

Invariants: the daemon's process group is killed and the instance's /dev/shm
segments removed even when the run fails (``run_fuzz``'s ``finally``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.fuzz import run_fuzz
from bench.harness.fuzz_table import run_table_flood
from bench.harness.fuzz_ws_floods import run_ws_floods

OUT = Path(__file__).resolve().parent / "out"


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    n_sip = int(os.environ.get("BRISVOX_FUZZ_SIP", "2000" if quick else "10000"))
    n_ws = int(os.environ.get("BRISVOX_FUZZ_WS", "2000" if quick else "10000"))
    conns = int(os.environ.get("BRISVOX_FUZZ_CONNS", "100" if quick else "500"))
    tmp = Path(tempfile.mkdtemp(prefix="bvfuzz", dir="/tmp"))
    try:
        rep = run_fuzz(tmp, n_sip, n_ws, conns)
        # the SIP table flood, on a daemon of its own with the default [sip] limits
        rep.checks += run_table_flood(tmp / "table", float(os.environ.get("BRISVOX_FUZZ_TABLE_S", "20"))).checks
        # the WebSocket floods, on a daemon of its own at a soft file limit of 1,024
        rep.checks += run_ws_floods(tmp / "wsflood", float(os.environ.get("BRISVOX_FUZZ_WS_FLOOD_S", "5"))).checks
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "fuzz.json").write_text(json.dumps({"checks": [c.__dict__ for c in rep.checks]}, indent=1, default=str))
    failed = [c.key for c in rep.failed()]
    return [*rep.rows(), ("judges failed", len(failed), ", ".join(failed) or "-", "0")]
