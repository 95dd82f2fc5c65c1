"""The whole chaos scenario on a real ``brisvoxd``: vendors, daemon, baseline, chaos, settle, judge.

:func:`run_chaos` (used by ``python -m bench chaos`` and
``tests/system/test_chaos.py``):

1. starts the vendor process (:mod:`.vendors`), writes one agent file per
   variant (``chaos_<variant>``: Deepgram, OpenAI-compatible and Cartesia at
   the vendors, ``book_table`` for the booking variants) and a daemon config
   (2 workers, 2 agent processes, SIP and WebSocket on ports the gateway
   picks, Smart Turn off, short LLM and mark timeouts);
2. baseline: one quiet call per transport and script (``talk``, ``book``),
   all at once (six calls on an idle daemon), their records and latencies;
3. idle snapshot of the process tree (after the baseline: warm);
4. chaos: :func:`plan` calls started over a few seconds, the fault schedule
   of :func:`schedule` on its thread;
5. waits for every record the run owes, for every table to empty and every
   child to be ready again, takes the after snapshot, stops the daemon and
   checks nothing of the instance is left;
6. :func:`.judge.judge` -> a :class:`.judge.Report`.

Invariants: the daemon's process group and the vendor process are killed in
``finally`` whatever happened, and the instance's /dev/shm segments removed
(:meth:`bench.harness.daemon.Daemon.close`); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.chaos import callers, judge, script
from bench.harness.chaos.callers import CallResult, CallSpec
from bench.harness.chaos.faults import Fault, FaultScheduler, Snapshot, snapshot, tree
from bench.harness.chaos.vendors import VendorProcess
from bench.harness.daemon import Daemon, write_config
from brisvox.agent.host.call_record import read_records
from ipc.bus import endpoint, request_sync
from ipc.frames import Command
from ipc.ring import SHM_DIR

STAGGER_S = 0.08  # between call starts


def agent_file(variant: str, ports: dict[str, int]) -> str:
    book = script.SCRIPT_OF[variant] == "book"
    fn = "slow_tools" if variant == "slowbook" else "tools"
    tools = (f'tools = ["book_table"]\ntool_modules = ["bench.harness.chaos.booking_tool:{fn}"]\n'
             if book else "")
    secondary = f"""
[tts.secondary]
provider = "elevenlabs"
model = "eleven_flash_v2_5"
voice = "{script.SECONDARY_VOICE}"
base_url = "ws://127.0.0.1:{ports['tts2']}/{variant}"
api_key_env = "CHAOS_FAKE_KEY"
options = {{ sample_rate = 16000 }}
""" if variant == "ttsdie" else ""
    return f"""name = "chaos_{variant}"
system_prompt = "{script.system_prompt(variant)}"
{tools}
[stt]
provider = "deepgram"
base_url = "ws://127.0.0.1:{ports['stt']}/{variant}"
api_key_env = "CHAOS_FAKE_KEY"

[llm]
provider = "openai_compatible"
model = "chaos"
base_url = "http://127.0.0.1:{ports['http']}/{variant}/v1"
api_key_env = "CHAOS_FAKE_KEY"

[tts]
provider = "cartesia"
voice = "00000000-0000-4000-8000-00000000c4a0"  # a Cartesia voice id is a UUID (brisvoxd check)
base_url = "ws://127.0.0.1:{ports['tts']}/{variant}"
api_key_env = "CHAOS_FAKE_KEY"
{secondary}
[filler]
enabled = false

[turn]
smart_turn = false
"""


def daemon_config(tmp: Path, agents_dir: Path) -> Path:
    rtp = 30000 + (os.getpid() % 300) * 100  # a range of its own per run (other runs share the machine)
    agents = "[" + ", ".join(f'"chaos_{v}"' for v in script.VARIANTS) + "]"  # /twilio/<name>, /ws/<name>
    extra = f"""
[gateway]
echo_use_workers = false
tts_rate = 16000
max_calls = 200
max_calls_per_source = 200  # every call comes from one loopback caller

[sip]
enabled = true
host = "127.0.0.1"
port = 0
rtp_port_min = {rtp}
rtp_port_max = {rtp + 98}
users = {{ talk = "chaos_talk", book = "chaos_book" }}
invite_rate = ["100/second"]  # every SIP call comes from this one loopback caller, {STAGGER_S} s apart

[websocket]
port = 0
handshakes_per_s = 100  # every call comes from this one loopback caller, {STAGGER_S} s apart
trust_loopback = true
routes = [{{ path = "/twilio", protocol = "twilio", agent = "default", agents = {agents} }},
          {{ path = "/ws", protocol = "native", agent = "default", agents = {agents} }}]

[smart_turn]
enabled = false

[agents]
providers = "definitions"
agents_dir = "{agents_dir}"
default_agent = "chaos_talk"
smart_turn = false
lead_margin_ms = 0
max_calls = 150
first_token_timeout_s = 2.0
idle_timeout_s = 5.0
mark_timeout_s = 3.0

[calls]
path = "{tmp / 'records'}"
"""
    return write_config(tmp, workers=2, agents=2, extra=extra)


CLIENT_FAULTS_WS = [("sttcut", ""), ("sttfin", ""), ("ttscut", ""), ("ttsdie", ""), ("llmhang", ""), ("llm429", ""),
                    ("slowbook", "hangup_tool"),
                    ("talk", "slowread"), ("talk", "malformed"), ("talk", "hangup_answer")]


def plan(n_calls: int, n_sip: int, seed: int = 7) -> list[CallSpec]:
    """``n_calls`` calls: ``n_sip`` over SIP (half talk, half book), the rest split over Twilio and
    native; on each WebSocket transport ``k`` calls of every fault (Twilio also ``nomarks``), the
    rest undisturbed ``talk`` and ``book``. Start order shuffled (seeded), ``STAGGER_S`` apart."""
    n_ws = n_calls - n_sip
    per = {"twilio": n_ws - n_ws // 2, "native": n_ws // 2}
    k = max(1, min(per.values()) // 22)
    rows: list[tuple[str, str, str]] = []
    for tr, m in per.items():
        faults = CLIENT_FAULTS_WS + ([("talk", "nomarks")] if tr == "twilio" else [])
        mine = [(tr, v, f) for v, f in faults for _ in range(k)][:m]
        rest = m - len(mine)
        mine += [(tr, "book" if i % 2 else "talk", "") for i in range(rest)]
        rows += mine
    rows += [("sip", "book" if i % 2 else "talk", "") for i in range(n_sip)]
    random.Random(seed).shuffle(rows)
    return [CallSpec(i, tr, v, f, delay=i * STAGGER_S) for i, (tr, v, f) in enumerate(rows)]


def schedule(specs: list[CallSpec]) -> list[Fault]:
    """Offsets: vendor faults armed early (they fire when their calls reach the faulted step),
    agent-1 killed while the first half of the calls is in its first turns, worker-1 killed
    mid-run."""
    span = max(s.delay for s in specs) if specs else 0.0
    count = {v: sum(1 for s in specs if s.variant == v) for v in script.VARIANTS}
    out = [Fault(1.0, "arm", f"stt_cut:{count['sttcut']}"), Fault(2.0, "arm", f"tts_cut:{count['ttscut']}"),
           Fault(3.0, "arm", f"llm_hang:{count['llmhang']}"), Fault(4.0, "arm", f"llm_429:{count['llm429']}"),
           Fault(4.5, "arm", f"stt_finalize_hang:{count['sttfin']}"),
           Fault(0.0, "arm", f"tts_die:{count['ttsdie']}")]
    out += [Fault(round(span * 0.5, 2), "kill", "agent-1"), Fault(round(span + 2.0, 2), "kill", "worker-1")]
    return out


@dataclass
class Run:
    tmp: Path
    n_calls: int
    n_sip: int
    baseline: list[CallResult] = field(default_factory=list)
    results: list[CallResult] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    idle: Snapshot | None = None
    after: Snapshot | None = None
    status_after: dict[str, Any] = field(default_factory=dict)
    vendor_stats: dict[str, Any] = field(default_factory=dict)
    events: list[Any] = field(default_factory=list)
    t0: float = 0.0
    left_after_stop: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


# both snapshots wait this long once every table is empty: past each role's idle memory
# release (brisvox/runtime/memory.py: 2 s after its last call; the worker checks every 0.5 s),
# so idle and after are measured alike
SETTLE_S = 3.0


def gateway_calls(d: Daemon) -> Any:
    """The gateway's own table (its ``calls`` command on its inbox), to say why a call is left."""
    try:
        reply = request_sync(endpoint(d.run_dir, "gateway-0"), Command(name="calls"), 3.0)
        return {k: {f: v.get(f) for f in ("transport", "state", "agent_proc", "worker", "transport_done",
                                          "agent_done", "end_reason", "age_s", "ids")}
                for k, v in (reply.data or {}).items()}  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        return f"{type(e).__name__}: {e}"


def _quiet(d: Daemon, timeout: float) -> dict[str, Any]:
    def ok(s: dict[str, Any]) -> bool:
        return (s["daemon"]["ready"] and all(c["state"] == "ready" for c in s["children"])
                and s["daemon"]["calls"] == 0 and all(c["calls"] == 0 for c in s["children"]))

    return d.wait_for(ok, timeout, "every child ready and every call table empty")


def _wait_records(tmp: Path, results: list[CallResult], want: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        recs = read_records(tmp / "records")
        if len(judge.match_records(results, recs)) >= want or time.monotonic() > deadline:
            return recs
        time.sleep(0.2)


def run_chaos(tmp: Path, n_calls: int = 100, n_sip: int = 10, log: Any = print) -> judge.Report:
    tmp.mkdir(parents=True, exist_ok=True)
    run = Run(tmp, n_calls, n_sip)
    vendors = VendorProcess(tmp)
    d: Daemon | None = None
    sched: FaultScheduler | None = None
    t_start = time.monotonic()
    try:
        vendors.start()
        agents = tmp / "agents"
        agents.mkdir(exist_ok=True)
        for v in script.VARIANTS:
            (agents / f"chaos_{v}.toml").write_text(agent_file(v, vendors.ports))
        env = {"BRISVOX_CHAOS_BOOKING_URL": vendors.http, "CHAOS_FAKE_KEY": "fake",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        d = Daemon(tmp, config=daemon_config(tmp, agents), env=env, real_roles=True)
        d.start()
        snap = d.wait_ready(90)
        gw = d.child(snap, "gateway-0")["endpoints"]
        ws_port, sip_port = int(gw["websocket"].rsplit(":", 1)[1]), int(gw["sip"].rsplit(":", 1)[1])
        run.timings["daemon_ready_s"] = time.monotonic() - t_start
        log(f"   daemon ready ({run.timings['daemon_ready_s']:.1f} s); baseline: 6 quiet calls")
        base = [CallSpec(i, tr, v, "", delay=i * 0.3) for i, (tr, v) in
                enumerate((tr, v) for tr in ("twilio", "native", "sip") for v in ("talk", "book"))]
        run.baseline = asyncio.run(callers.run_calls(base, ws_port, sip_port))
        _wait_records(tmp, run.baseline, len(base), 20)
        _quiet(d, 20)
        time.sleep(SETTLE_S)
        run.idle = snapshot(d)
        specs = plan(n_calls, n_sip)
        faults = schedule(specs)
        log(f"   chaos: {len(specs)} calls ({sum(s.transport == 'twilio' for s in specs)} Twilio, "
            f"{sum(s.transport == 'native' for s in specs)} native, {n_sip} SIP), {len(faults)} faults")
        sched = FaultScheduler(d, vendors, faults)
        run.t0 = time.monotonic()
        sched.start(run.t0)
        run.results = asyncio.run(callers.run_calls(specs, ws_port, sip_port))
        run.timings["chaos_calls_s"] = time.monotonic() - run.t0
        sched.join(30)
        run.events = list(sched.events)
        killed = sum(len(e.calls) for e in run.events if e.fault.arg.startswith("agent"))
        opened = sum(1 for r in run.results if r.t_open is not None)
        all_recs = _wait_records(tmp, run.baseline + run.results, len(base) + opened - killed, 30)
        try:
            run.status_after = _quiet(d, 30)
        except AssertionError as e:
            run.status_after = d.status()
            run.notes.append(f"not quiet after the run: {str(e)[:300]}")
            run.notes.append(f"gateway calls left: {gateway_calls(d)}")
        time.sleep(SETTLE_S)
        run.status_after = d.status()
        run.after = snapshot(d)
        # read again once every table is empty: the count above can be reached while a record is
        # still being written (seen: a call on agent-1 that ended at the kill had one, a survivor not yet)
        run.records = read_records(tmp / "records") or all_recs
        run.vendor_stats = vendors.stats()
        inst, pids = d.instance, [p.pid for p in tree(d.proc.pid)] if d.proc else []
        d.command("stop")
        try:
            d.wait_exit(30)
        except Exception as e:  # noqa: BLE001 - judged below
            run.notes.append(f"the daemon did not stop in 30 s: {type(e).__name__}")
        time.sleep(0.3)
        run.left_after_stop = {
            "segments": sorted(p.name for p in SHM_DIR.glob(f"brisvox.{inst}.*")),
            "processes": [p for p in pids if _alive(p)],
        }
        run.timings["total_s"] = time.monotonic() - t_start
        return judge.judge(run, sched)
    finally:
        if sched is not None:
            sched.stop()
        if d is not None:
            d.close()
        vendors.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
