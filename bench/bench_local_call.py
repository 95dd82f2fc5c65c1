"""A local agent's answer time: caller's last word -> first bot audio, on `make run`'s default stack.

``python -m bench local_call`` starts brisvoxd with ``configs/brisvoxd.toml``
as ``make run`` ships it (two workers, one agent process, Smart Turn on, the
``local`` agent: Whisper tiny.en, the default local LLM, Piper), changed only
where a benchmark must be (runtime/state dirs and call records in a temp
folder, the WebSocket and metrics ports picked free, SIP off, the agent files
read from ``configs/agents``). It places calls with ``brisvox call --events``
over the native protocol at 8 kHz, one after the other, each asking
:data:`CALL_SIZE` of the 20 fixed questions of :mod:`bench.llm_rubric`
(spoken by the Piper joe voice with its noise off, deterministic, cached in
``bench/out/local_call``, via :class:`bench.amd_set.Voices`), and joins each
answered client turn to its call record turn. Two agents take turns call by
call, so one run compares them under the same load: ``local`` as shipped
(``[stt.options] early = false``: the final transcribed from the VAD stop), and
:data:`VARIANT`, the same file with ``early = true`` (transcribed once the
caller's audio went quiet).

Per turn (the marks of :mod:`bench.breakdown`, critical path, each step clamped
to the marks before it so a turn's steps sum to its latency):

* **latency**: the client's caller-stopped (last loud sample sent) -> first bot
  audio received (``brisvox call``'s ``latency_ms``);
* **end of turn**: speech end -> turn end (VAD stop, Smart Turn verdict, STT
  final; the finals gate waits for the final);
* **VAD stop**, **Smart Turn verdict**, **STT final**: speech end -> the VAD stop / the
  verdict / the STT final reached the turn driver (they run in parallel; the latest ends the turn);
* **LLM first token**: LLM request -> first token;
* **first clause -> TTS first audio**: first token -> first audio written into the
  tts ring (the segmenter's first chunk, then Piper);

printed as p50/p95 with the table of every turn; the target is p50 <= 1.0 s and
p95 <= 1.3 s. Then, in this process, after the daemon stopped: the LLM's first
token when two calls take turns on one runner, with and without the per-call
state cache (:func:`llm_interleaved`; sequential calls never share a context). Bounded: every call has a timeout, the daemon is killed by process
group at the end. ``--quick``: one call of :data:`QUICK` questions. The host is
shared: give figures of one run side by side, with the load average printed.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import orjson

from bench.harness.daemon import Daemon
from bench.llm_rubric import QUESTIONS

Row = tuple[str, Any, str, str]

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "local_call"
CALL_SIZE = 5
QUICK = 3
RATE = 8000
CALL_TIMEOUT_S = 240.0
BOOT_TIMEOUT_S = 180.0
P50_TARGET_MS = 1000.0
P95_TARGET_MS = 1300.0
VARIANT = "local_early"
VARIANTS = (("local (as shipped)", ""), ("early = true", VARIANT))  # (label, /ws/<agent> path)
MATCH_S = 0.6  # a record turn's speech end within this of the client's caller-stopped stamp

# (config line as shipped, what the benchmark puts instead); each must match exactly once
EDITS: tuple[tuple[str, str], ...] = (
    (r'^runtime_dir = ""', 'runtime_dir = "{run}"'),
    (r'^state_dir = ""', 'state_dir = "{state}"'),
    (r'^listen = "127\.0\.0\.1:9464"', 'listen = "127.0.0.1:0"'),
    (r"^\[sip\]\nenabled = true", "[sip]\nenabled = false"),
    (r"^port = 8765", "port = 0"),
    (r'^agents_dir = ""', 'agents_dir = "{agents}"'),
    (r'^(path = "/ws"\nprotocol = "native"\nagent = "default"\n)agents = \["echo"\]',
     r'\1agents = ["echo", "{variant}"]'),
    (r'^(\[calls\]\nrecords = true[^\n]*\n)path = ""', r'\1path = "{records}"'),
)


def make_run_config(tmp: Path, text: str | None = None) -> Path:
    """``configs/brisvoxd.toml`` with the benchmark's edits (:data:`EDITS`); a shipped line that
    no longer matches raises (the benchmark must not silently measure another stack). The agent
    files: ``configs/agents/local.toml`` as shipped, and :data:`VARIANT`, the same with
    ``early = true`` (transcribe while the caller speaks)."""
    agents = tmp / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    local = (ROOT / "configs" / "agents" / "local.toml").read_text()
    (agents / "local.toml").write_text(local)
    var, n = re.subn(r'^name = "local"', f'name = "{VARIANT}"', local, flags=re.MULTILINE)
    var, m = re.subn(r"^early = false\b", "early = true", var, flags=re.MULTILINE)
    if n != 1 or m != 1:
        raise RuntimeError("configs/agents/local.toml: no single name = \"local\" or [stt.options] early = false")
    (agents / f"{VARIANT}.toml").write_text(var)
    text = text if text is not None else (ROOT / "configs" / "brisvoxd.toml").read_text()
    vals = {"run": tmp / "run", "state": tmp / "state", "agents": tmp / "agents", "records": tmp / "records",
            "variant": VARIANT}
    for pat, repl in EDITS:
        text, n = re.subn(pat, repl.format(**vals), text, flags=re.MULTILINE)
        if n != 1:
            raise RuntimeError(f"configs/brisvoxd.toml: {pat!r} matched {n} times (expected once)")
    path = tmp / "brisvoxd.toml"
    path.write_text(text)
    return path


def question_wavs(n: int) -> list[Path]:
    """The first ``n`` questions as 8 kHz WAVs (Piper joe, noise off; cached)."""
    from bench.amd_set import Voices, _piper_files

    files = _piper_files()
    if files is None:
        raise RuntimeError("the Piper joe voice is not installed: brisvox models install")
    OUT.mkdir(parents=True, exist_ok=True)
    v = Voices(OUT / "tts", files)
    out = []
    try:
        for i, (q, _) in enumerate(QUESTIONS[:n]):
            x = v.say("piper:joe@1.0", q)
            p = OUT / f"q{i:02d}.wav"
            with wave.open(str(p), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(RATE)
                w.writeframes(x.astype("<i2").tobytes())
            out.append(p)
    finally:
        v.close()
    return out


def place_call(port: int, agent: str, wavs: list[Path], tmp: Path) -> dict[str, Any]:
    out = tmp / f"call-{time.monotonic_ns()}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    path = f"/ws/{agent}" if agent else "/ws"
    args = [sys.executable, "-m", "brisvox.cli.brisvox", "call", f"ws://127.0.0.1:{port}{path}", "--rate", str(RATE),
            "--events", "--no-transcribe", "--json", str(out), "--pause", "1.0", "--wait", "15"]
    for w in wavs:
        args += ["--play", str(w)]
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    if not out.is_file():
        raise RuntimeError(f"brisvox call failed ({p.returncode}): {p.stderr[-2000:]}")
    return dict(orjson.loads(out.read_bytes()))


def wait_record(records: Path, call_id: str, timeout: float = 30.0) -> dict[str, Any]:
    from bench.breakdown import read_records

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = [r for r in read_records(records) if r.get("call_id") == call_id]
        if hits:
            return hits[-1]
        time.sleep(0.2)
    raise RuntimeError(f"no call record for {call_id}")


# the breakdown's marks (record keys), in pipeline order; the first mark is the client's stop
MARKS = ("t_speech_end", "t_vad_stop", "t_verdict", "t_stt_final", "t_turn_end", "t_request", "t_first_token", "t_first_audio")
COLUMNS = ("latency", "end of turn", "VAD stop", "Smart Turn verdict", "STT final", "LLM first token", "first token -> TTS first audio",
           "first audio -> client")


def turn_rows(res: dict[str, Any], rec: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per answered client turn joined to its record turn: the figures of :data:`COLUMNS` (ms;
    None: a mark is missing) plus the question's index and whether the join found the turn."""
    t0 = float(res["t0_monotonic"])
    off = float(rec.get("clock_offset_s") or 0.0)
    rturns = [t for t in rec.get("turns", []) if t.get("t_speech_end") is not None and t.get("t_turn_end")]
    out = []
    for ct in res["turns"]:
        if ct["kind"] != "line" or ct["latency_ms"] is None or ct["caller_end_s"] is None:
            continue
        stop = t0 + float(ct["caller_end_s"])
        first = t0 + float(ct["bot_start_s"])
        best, gap = None, MATCH_S
        for rt in rturns:
            d = abs(float(rt["t_speech_end"]) + off - stop)
            if d <= gap:
                best, gap = rt, d
        row: dict[str, Any] = {"index": ct["index"], "latency": float(ct["latency_ms"]), "joined": best is not None}
        if best is not None:
            m = {k: (None if best.get(k) is None else float(best[k]) + off) for k in MARKS}

            def ms(a: float | None, b: float | None) -> float | None:
                return None if a is None or b is None else round(max(0.0, b - a) * 1000.0, 1)

            se = m["t_speech_end"]
            row["end of turn"] = ms(se, m["t_turn_end"])
            row["VAD stop"] = ms(se, m["t_vad_stop"])
            row["Smart Turn verdict"] = ms(se, m["t_verdict"])
            row["STT final"] = ms(se, m["t_stt_final"])
            row["LLM first token"] = ms(m["t_request"], m["t_first_token"])
            row["first token -> TTS first audio"] = ms(m["t_first_token"], m["t_first_audio"])
            row["first audio -> client"] = ms(m["t_first_audio"], first)
        out.append(row)
    return out


def pct(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return round(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))], 1)


def table(rows: list[dict[str, Any]]) -> str:
    head = "| q | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows:
        cells = ["-" if r.get(c) is None else f"{r[c]:.0f}" for c in COLUMNS]
        lines.append(f"| {r['index']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], asked: int) -> list[Row]:
    out: list[Row] = []
    for c in COLUMNS:
        vals = [float(r[c]) for r in rows if r.get(c) is not None]
        if not vals:
            out.append((f"{c} p50 / p95", "n/a", "ms", ""))
            continue
        target = f"p50 <= {P50_TARGET_MS:.0f}, p95 <= {P95_TARGET_MS:.0f}" if c == "latency" else ""
        out.append((f"{c} p50 / p95", f"{pct(vals, 0.5):.0f} / {pct(vals, 0.95):.0f}", "ms", target))
    lat = [float(r["latency"]) for r in rows]
    if lat:
        out.append(("latency mean", round(statistics.fmean(lat), 1), "ms", ""))
    out.append(("turns answered / asked", f"{len(rows)} / {asked}", "", f"{sum(not r['joined'] for r in rows)} "
                "not joined to a record turn"))
    return out


INTERLEAVED = ("What is the capital of France?", "How many days are in a week?", "What color is the sky on a clear day?",
               "What is two plus two?", "What do bees make?")


def llm_interleaved(turns: int) -> list[Row]:
    """Two calls taking turns on one :class:`workers.local_llm.LlamaRunner` (as two calls on one
    worker do): first token of every turn after the first, without the per-call state cache (no call
    ids: each turn finds the other call's tokens in the context) and with it, alternating rounds."""
    from bench.llm_rubric import SYSTEM
    from workers.local_llm import DEFAULT_LLM, LlamaRunner
    from workers.models import locate

    r = LlamaRunner(locate(DEFAULT_LLM))
    r.load()
    got: dict[bool, list[float]] = {False: [], True: []}
    for cached in (False, True, False, True):
        msgs = {c: [{"role": "system", "content": SYSTEM + extra}] for c, extra in (("A", ""), ("B", " You work for a bank."))}
        for i, q in enumerate(INTERLEAVED[:turns]):
            for c in "AB":
                msgs[c].append({"role": "user", "content": q})
                out: list[str] = []
                o = r.generate(msgs[c], 48, 0.0, lambda: False, out.append, call_id=c if cached else "")
                msgs[c].append({"role": "assistant", "content": "".join(out).strip()})
                if i:
                    got[cached].append(o.first_token_s * 1000.0)
        r.forget("A")
        r.forget("B")
    return [(f"LLM first token, 2 calls alternating on one worker, {'with' if c else 'without'} the per-call "
             "state cache p50 / p95", f"{pct(v, 0.5):.0f} / {pct(v, 0.95):.0f}", "ms", f"{len(v)} turns")
            for c, v in got.items()]


def run(quick: bool = False) -> list[Row]:
    n = QUICK if quick else len(QUESTIONS)
    wavs = question_wavs(n)
    tmp = Path(tempfile.mkdtemp(prefix="bvlc", dir="/tmp"))
    load0 = os.getloadavg()
    d = Daemon(tmp, make_run_config(tmp), real_roles=True)
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in VARIANTS}
    try:
        d.start()
        snap = d.wait_ready(BOOT_TIMEOUT_S)
        port = int(d.child(snap, "gateway-0")["endpoints"]["websocket"].rsplit(":", 1)[1])
        for i in range(0, n, CALL_SIZE):  # the variants take turns call by call: the same load on both
            for label, agent in VARIANTS:
                res = place_call(port, agent, wavs[i : i + CALL_SIZE], tmp)
                rec = wait_record(tmp / "records", res["call_id"])
                for r in turn_rows(res, rec):
                    r["index"] += i
                    rows[label].append(r)
    finally:
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()
    out: list[Row] = []
    for label, _ in VARIANTS:
        print(f"{label}:\n{table(rows[label])}", flush=True)
        out += [(f"{label}: {fig}", *rest) for fig, *rest in summary(rows[label], n)]
    out += llm_interleaved(2 if quick else len(INTERLEAVED))
    load2 = os.getloadavg()
    out.append(("load average (1 min) at start / after the calls / end", f"{load0[0]:.2f} / {load1[0]:.2f} / "
                f"{load2[0]:.2f}", "", "shared host"))
    return out
