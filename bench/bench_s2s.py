"""Speech-to-speech calls under load: ``python -m bench s2s [--quick]`` (docs/S2S.md, docs/BENCHMARKS.md).

N concurrent calls (``BRISVOX_BENCH_CALLS``, default 1 and 100; ``--quick``: 1 and 10) of
the load benchmark's workload (``bench/workload.toml``: the same callers, lines, pauses and
one barge-in per call, the same load generator, :mod:`bench.bench_load`'s measurement)
against the bench daemon config routed to a speech-to-speech agent whose OpenAI Realtime
provider is the loopback server (``bench/harness/s2s_server.py``) in a process of its OWN:
the provider's work is remote in production, so the daemon's CPU and memory figures must not
contain it. The server's VAD hears each caller line in the appended audio (energy, 300 ms of
silence), answers with 2 s of audio streamed faster than real time, and is cut by a barge-in
like the service.

What it prints, per level: the load bench's rows (CPU and memory per call, turn latency,
barge-in stop time, late frames, CPU per call-second by process role, "held"), the
daemon's own counters (barge-in decision -> Clear applied), and the latency breakdown from
the call records, whose "first token -> first audio written" and "first audio written ->
first frame at the client" rows are the path of the model's first audio to the caller (the
issue's target for the two together: <= 5 ms p95). The turn latency includes the fake's
300 ms VAD silence and its immediate answer: it measures the engine's hops, not a model.

``BRISVOX_BENCH_S2S_G711=1`` offers μ-law 8 kHz input (``g711_passthrough``) instead of
24 kHz PCM. ``BRISVOX_BENCH_S2S_TURN=brisvox`` ends turns with brisvox's VAD and Smart Turn
(the server's VAD off: the stage commits and asks for the answer) instead of the provider's
VAD (``provider``, the default). Each level also prints the stage's counters summed over the
call records: responses per caller turn (above 1: turn ends the caller did not make, or
answers restarted), barge-ins, truncations sent, model audio dropped as stale.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import bench_load, workload
from bench.loadgen import harness

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"cpu": "", "mem": "<= 2", "p95": "", "stopped": "<= 250"}
AGENT = """name = "bench"
system_prompt = "You are the test kitchen's phone line."
[s2s]
provider = "openai_realtime"
model = "gpt-realtime"
voice = "marin"
base_url = "ws://127.0.0.1:{port}/v1/realtime"
api_key_env = "BRISVOX_BENCH_S2S_KEY"
turn_detection = "{turn}"
g711_passthrough = {g711}
[s2s.options]
vad = {{silence_duration_ms = 300}}
[tts]
provider = "espeak"
"""


class FakeServer:
    """The loopback vendor as a child process of the bench (not of the daemon)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> FakeServer:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.harness.s2s_server", "--max-seconds", "3600"],
                                     cwd=REPO, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            self.__exit__()
            raise harness.ServerError(f"the loopback S2S server did not start: {line}")
        self.port = int(line[1])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def run(quick: bool) -> list[tuple[str, Any, str, str]]:
    wl = workload.load()
    ns = bench_load.env_levels() or ([1, 10] if quick else [1, 100])
    g711 = os.environ.get("BRISVOX_BENCH_S2S_G711", "") == "1"
    turn = os.environ.get("BRISVOX_BENCH_S2S_TURN", "provider")
    if turn not in ("provider", "brisvox"):
        raise harness.ServerError(f"BRISVOX_BENCH_S2S_TURN {turn!r}: provider or brisvox")
    with tempfile.TemporaryDirectory(prefix="brisvox-bench-s2s-") as tmp, FakeServer() as fake:
        agents = Path(tmp) / "agents"
        agents.mkdir()
        (agents / "bench.toml").write_text(AGENT.format(port=fake.port, g711="true" if g711 else "false",
                                                         turn=turn))
        src = Path(os.environ.get("BRISVOX_BENCH_CONFIG", bench_load.DEFAULT_CONFIG))
        config = Path(tmp) / "brisvoxd.s2s.toml"
        config.write_text(bench_load.set_keys(src.read_text(), "agents", {"agents_dir": str(agents)}))
        saved = {k: os.environ.get(k) for k in ("BRISVOX_BENCH_CONFIG", "BRISVOX_BENCH_S2S_KEY")}
        os.environ["BRISVOX_BENCH_CONFIG"] = str(config)
        os.environ["BRISVOX_BENCH_S2S_KEY"] = "sk-loopback"  # the fake takes any key
        try:
            levels, largest, describe = bench_load.measure(quick, ns=ns, wl=wl)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    rows = harness.rows("brisvox s2s", levels, largest, wl, TARGETS)
    rows.insert(0, ("brisvox s2s: how it was run",
                    f"{describe}; agent openai_realtime over loopback ({'μ-law 8 kHz' if g711 else 'PCM 24 kHz'} "
                    f"in), turn detection {turn}", "", ""))
    return rows + bench_load.server_rows(levels) + bench_load.breakdown_rows(levels) + stage_rows(levels)


def stage_rows(levels: list[harness.Level]) -> list[tuple[str, Any, str, str]]:
    """The S2S stage's counters of each level, summed over its call records."""
    out: list[tuple[str, Any, str, str]] = []
    for lv in levels:
        recs = bench_load.LAST_RECORDS.get(lv.n, [])
        st = [r.get("stats", {}).get("s2s", {}) for r in recs]
        turns = lv.summary.get("turns") or 0

        def total(key: str, st: list[dict[str, Any]] = st) -> int:
            return int(sum(s.get(key, 0) for s in st))

        p = f"brisvox s2s N={lv.n}:"
        out += [
            (f"{p} responses per caller turn", round(total("responses") / turns, 3) if turns else None,
             f"({total('responses')} of {turns} turns, {len(recs)} records)", "1"),
            (f"{p} barge-ins / truncations sent", f"{total('barge_ins')} / {total('truncations')}", "", ""),
            (f"{p} model audio chunks dropped as stale", total("stale_audio"), "chunks", ""),
            (f"{p} session errors / reconnects", f"{total('session_errors')} / {total('reconnects')}", "", "0 / 0"),
        ]
    return out
