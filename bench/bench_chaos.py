"""The chaos run: ``python -m bench chaos [--quick]``.

100 concurrent calls (45 Twilio Media Streams, 45 native WebSocket, 10 SIP;
``--quick``: 40 calls, 6 SIP) against a real ``brisvoxd`` (2 workers, 2 agent
processes) whose agents talk to loopback Deepgram / OpenAI-compatible /
Cartesia servers with scripted conversations and book tables through a
SideEffect tool at a loopback booking API, while the fault schedule SIGKILLs
agent-1 and worker-1, cuts an STT and a TTS socket mid-utterance, hangs one
LLM request, answers another 429 + Retry-After, and callers read slowly,
never echo marks, send malformed messages and hang up mid-answer and
mid-tool (``bench/harness/chaos/``). Every judgment is printed with its
target and verdict ("ok" / "FAILED"); the per-call results and the report are
written to ``bench/out/chaos.json``. ``BRISVOX_CHAOS_CALLS`` /
``BRISVOX_CHAOS_SIP`` override the call counts.

Invariants: the run's processes are stopped and its /dev/shm segments
removed even when it fails (``bench.harness.chaos.run``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.chaos.run import run_chaos

OUT = Path(__file__).resolve().parent / "out"


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    n = int(os.environ.get("BRISVOX_CHAOS_CALLS", "40" if quick else "100"))
    sip = int(os.environ.get("BRISVOX_CHAOS_SIP", "6" if quick else "10"))
    tmp = Path(tempfile.mkdtemp(prefix="bvchaos", dir="/tmp"))
    try:
        rep = run_chaos(tmp, n, sip)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "chaos.json").write_text(json.dumps(
        {"checks": [c.__dict__ for c in rep.checks], "calls": rep.calls}, indent=1, default=str))
    failed = [c.key for c in rep.failed()]
    return [*rep.rows(), ("judges failed", len(failed), ", ".join(failed) or "-", "0")]
