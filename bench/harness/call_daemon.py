"""The daemon of the simultaneous-call test: one worker, one agent process, scripted providers.

Shared by ``tests/system/test_call_daemon.py`` and ``python -m bench actor``
(``bench/bench_actor.py``): :func:`config` writes a ``brisvoxd.toml`` whose
agent process gives every call the scripted providers (``[agents] providers
= "scripted"``, the lines of ``script``), the gateway's WebSocket on a port
the gateway picks (read it from the status), SIP off, the call records in
``<tmp>/records``; :data:`SPEECH` is the recorded question every client speaks.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness.daemon import write_config
from brisvox.sim.ws_caller import TTS_RATE

ROOT = Path(__file__).resolve().parents[2]
SPEECH = ROOT / "tests" / "fixtures" / "generated" / "turn_complete.8k.wav"


def config(tmp: Path, script: Path, smart_turn: bool = False) -> Path:
    st = "true" if smart_turn else "false"
    extra = f"""
[gateway]
echo_use_workers = false
tts_rate = {TTS_RATE}
max_calls_per_source = 100000  # every call comes from this one loopback caller

[sip]
enabled = false

[websocket]
port = 0
handshakes_per_s = 0  # every call comes from this one loopback caller, BRISVOX_TEST_CALLS of them
trust_loopback = true

[smart_turn]
enabled = {st}

[agents]
providers = "scripted"
script = "{script}"
smart_turn = {st}
lead_margin_ms = 0
max_calls = 64

[calls]
path = "{tmp / 'records'}"
"""
    return write_config(tmp, workers=1, agents=1, extra=extra)
