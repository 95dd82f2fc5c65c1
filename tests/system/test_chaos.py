"""The chaos run on the real daemon (``bench/harness/chaos``), with every judgment asserted.

``BRISVOX_TEST_CHAOS_CALLS`` calls, ``BRISVOX_TEST_CHAOS_SIP`` of them SIP (default 40: 17 Twilio, 17 native, 6 SIP, the
``python -m bench chaos --quick`` sizes, whose recorded run held every judgment; ``python -m bench
chaos`` runs 100) against ``brisvoxd`` with 2 workers and 2 agent processes;
the fault schedule SIGKILLs agent-1 and worker-1 mid-run, the loopback
vendors cut an STT and a TTS socket, never answer an STT Finalize, kill a
primary TTS mid-call (the secondary, another vendor with a voice of its own,
speaks on), hang an LLM request and answer one 429, and callers read slowly,
never echo marks, send malformed messages and hang up mid-answer and
mid-tool. Besides every judgment passing, the run must show 0 silent turns,
0 doubled side effects, 0 leaks and the secondary's voice after the death
(asserted by key, so a judgment that went missing fails too). What each judgment means is in
``bench/harness/chaos/judge.py`` and docs/BENCHMARKS.md ("Chaos run").

The run cleans up after itself whatever happens (the daemon's process group,
the vendor process, the instance's /dev/shm segments; ``run_chaos``'s
``finally``), and ``short_tmp`` removes its directory.
"""

from __future__ import annotations

import os

import pytest

from bench.harness.chaos.run import run_chaos

pytestmark = [pytest.mark.system, pytest.mark.timeout(420),
              pytest.mark.serial_light]  # judges the turn latency p95 against a quiet baseline

N_CALLS = int(os.environ.get("BRISVOX_TEST_CHAOS_CALLS", "40"))
N_SIP = int(os.environ.get("BRISVOX_TEST_CHAOS_SIP", "6"))

# judgments known to fail because of a product defect (key -> the defect); see the report
KNOWN_DEFECTS: dict[str, str] = {}


def test_chaos_run_every_judgment(short_tmp):
    rep = run_chaos(short_tmp, N_CALLS, N_SIP, log=lambda *_: None)
    failed = rep.failed()
    known = [c for c in failed if c.key in KNOWN_DEFECTS]
    other = [c for c in failed if c.key not in KNOWN_DEFECTS]
    summary = "\n".join(f"{c.key}: {c.figure}: {c.value} {c.unit} (target {c.target}) {c.detail}" for c in failed)
    assert not other, summary
    for key in ("silent_turns", "doubled", "leaks"):
        c = rep.get(key)
        assert c.ok and c.value == 0, f"{key}: {c.value} {c.detail}"
    tts = rep.get("tts_failover")
    assert tts.ok and not tts.value.startswith("0 of"), f"tts_failover: {tts.value} {tts.detail}"
    if known:
        pytest.xfail("; ".join(f"{c.key}: {KNOWN_DEFECTS[c.key]}" for c in known))
