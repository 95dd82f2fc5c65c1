"""The e2e tests' daemon: brisvoxd with the local models and agent files, plus the tools to call it.

:class:`E2EDaemon` starts ``brisvoxd start --foreground`` (via
:class:`bench.harness.daemon.Daemon`: its own session, SIGKILLed by
process group and its ``/dev/shm`` segments swept on close, even when a test
fails) with a temp config: one worker, one agent process, WebSocket and SIP
on ports chosen by the gateway (port 0; the status tells which), a per-test
RTP port range, agent definitions from a temp folder:

* ``local``: ``configs/agents/local.toml`` as shipped (Whisper tiny.en,
  the default local LLM with greedy decoding, Piper; no keys);
* ``booking_e2e``: the scripted LLM with the example booking tools, loaded
  through :mod:`tests.e2e.booking_probe` (the store's counters are written
  to ``booking.json`` in the temp folder).

:func:`brisvox_call` runs the real CLI (``python -m brisvox.cli.brisvox call
... --json``) and returns its JSON result; :meth:`E2EDaemon.record` waits for
the call record the agent process writes at hang-up and finds it by the
call's ids.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.harness.daemon import Daemon, write_config
from brisvox.agent.host.call_record import read_records
from tests.system.gateway_harness import rtp_range

ROOT = Path(__file__).resolve().parents[2]

BOOKING_AGENT = """\
# e2e: the scripted LLM (exact, no model) with the example booking tools, observable
name = "booking_e2e"
system_prompt = "You book tables at Brisvox Bistro."
tool_modules = ["tests.e2e.booking_probe:tools"]
tools = ["check_availability", "book_table", "end_call"]

[stt]
provider = "local_whisper"

[llm]
provider = "scripted"
[llm.options]
fallback = "{fallback}"

# either word: the caller's "Please book the table" reaches the rule through the local Whisper,
# which once heard the line without "book" (fc42); the test judges the booking, not Whisper
[[llm.options.rules]]
match = "\\\\b(book|table)"
steps = [
  {{ reply = "{first}", tools = [{{ name = "book_table", arguments = {{ name = "Anna", date = "2031-05-17", time = "19:00", people = 2 }} }}] }},
  {{ reply = "{second}" }},
]

[tts]
provider = "local_piper"
[tts.secondary]
provider = "espeak"
"""
BOOK_FIRST = ("Let me book that for you. One moment please, I am writing your name into our reservation book "
              "and checking that the table by the window is still free for the evening.")
BOOK_SECOND = "You are booked, Anna. We look forward to seeing you."
BOOK_FALLBACK = "Sorry, I can only book tables."


def missing_prerequisite() -> str:
    """Why the local stack cannot run here ("" when it can)."""
    for mod in ("faster_whisper", "piper", "llama_cpp"):
        if importlib.util.find_spec(mod) is None:
            return f"the local extra is not installed ({mod}): pip install -e '.[local]'"
    try:
        from workers.local_llm import DEFAULT_LLM
        from workers.models import ModelError, locate

        for name in ("silero_vad", "smart_turn", "whisper_tiny_en", "piper_joe", DEFAULT_LLM):
            locate(name)
    except ModelError as e:
        return str(e)
    return ""


class E2EDaemon:
    def __init__(self, book_delay_s: float = 3.0) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bve", dir="/tmp"))
        self.records_dir = self.tmp / "state" / "calls"  # [calls] path "": <state_dir>/calls
        self.booking_state = self.tmp / "booking.json"
        agents = self.tmp / "agents"
        agents.mkdir()
        shutil.copy(ROOT / "configs" / "agents" / "local.toml", agents / "local.toml")
        (agents / "booking_e2e.toml").write_text(
            BOOKING_AGENT.format(first=BOOK_FIRST, second=BOOK_SECOND, fallback=BOOK_FALLBACK))
        lo, hi = rtp_range(100)
        extra = f"""
[gateway]
echo_use_workers = false

[sip]
port = 0
rtp_port_min = {lo}
rtp_port_max = {hi}
users = {{ local = "local", booking = "booking_e2e" }}
# baresip announces its interface address in its SDP but sends from loopback: latch onto the
# first source, as behind NAT (the default "sdp" latch would send to an address nobody hears)
rtp_latch = "first"
# ... and its SDP address is outside [sip] allow: send to the signalling source instead
nat = "signalling_source"

[websocket]
port = 0
trust_loopback = true
routes = [{{ path = "/twilio", protocol = "twilio", agent = "default", agents = ["local", "booking_e2e"] }},
          {{ path = "/ws", protocol = "native", agent = "default", agents = ["local", "booking_e2e"] }}]

[agents]
providers = "definitions"
agents_dir = "{agents}"
filler_delay_ms = 0
"""
        self.config = write_config(self.tmp, workers=1, agents=1, extra=extra)
        env = {"BRISVOX_E2E_BOOKING_STATE": str(self.booking_state), "BRISVOX_E2E_BOOK_DELAY_S": str(book_delay_s)}
        self.daemon = Daemon(self.tmp, config=self.config, env=env, real_roles=True)
        self.ws_port = 0
        self.sip_port = 0

    def start(self) -> E2EDaemon:
        self.daemon.start()
        snap = self.daemon.wait_ready(120)
        eps = self.daemon.child(snap, "gateway-0")["endpoints"]
        self.ws_port = int(eps["websocket"].rsplit(":", 1)[1])
        self.sip_port = int(eps["sip"].rsplit(":", 1)[1])
        return self

    def close(self) -> None:
        try:
            self.daemon.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def logs(self) -> str:
        return self.daemon.logs()[-6000:]

    def record(self, res: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """The call record of the call ``res`` (a ``brisvox call --json`` result)."""
        ids = res["ids"]

        def match(r: dict[str, Any]) -> bool:
            if res.get("call_id"):
                return r.get("call_id") == res["call_id"]
            tids = r.get("transport_ids") or {}
            return any(tids.get(k) == v for k, v in ids.items())

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [r for r in read_records(self.records_dir) if match(r)]
            if hits:
                return hits[-1]
            time.sleep(0.2)
        raise AssertionError(f"no call record for {ids} in {self.records_dir}\n{self.logs()}")

    def calls_show(self, call_id: str) -> dict[str, Any]:
        """``brisvox calls --config <the daemon's config> show ID``, as an operator reads a record."""
        p = subprocess.run([sys.executable, "-m", "brisvox.cli.brisvox", "calls", "--config", str(self.config),
                            "show", call_id], cwd=ROOT, capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert p.returncode == 0, p.stderr
        return orjson.loads(p.stdout)

    def booking(self) -> dict[str, Any]:
        if not self.booking_state.is_file():
            return {"writes": 0, "bookings": [], "runs": []}
        return orjson.loads(self.booking_state.read_bytes())


def brisvox_call(*args: str, tmp: Path, daemon: E2EDaemon | None = None, steps: int | None = None,
                 timeout: float = 120.0) -> tuple[dict[str, Any], str]:
    """Run ``brisvox call ARGS --json`` as a user would; returns (result, printed text).

    Fails (with the client's output and the daemon's log) unless the client hung up
    itself after every one of its ``steps`` turns."""
    out = tmp / f"call-{time.monotonic_ns()}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "brisvox.cli.brisvox", "call", *args, "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    why = f"brisvox call ({p.returncode}):\n{p.stdout}\n{p.stderr}\n" + (daemon.logs() if daemon else "")
    assert p.returncode in (0, 3) and out.is_file(), why
    res = orjson.loads(out.read_bytes())
    assert res["end_reason"] == "hung up", why
    if steps is not None:
        assert len([t for t in res["turns"] if t["kind"] != "greeting"]) == steps, why
    return res, p.stdout


WORD = re.compile(r"[a-z']+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def is_speech(pcm: Any, rate: int) -> bool:
    """At least half a second of 20 ms frames above -40 dBFS whose loudness varies as speech does
    (a steady tone or a constant noise floor has nearly the same level in every frame)."""
    import numpy as np

    n = rate // 50
    x = np.asarray(pcm, dtype=np.float64)[: len(pcm) // n * n].reshape(-1, n)
    rms = np.sqrt((x * x).mean(axis=1)) if len(x) else np.zeros(0)
    loud = rms > 330.0
    if loud.sum() * 0.02 < 0.5:
        return False
    db = 20 * np.log10(rms[loud])
    return float(db.std()) > 1.5


def heard_what_was_said(said: str, heard: str) -> bool:
    """The words the call record says the bot spoke reached the caller: at least half of the
    record's words of three letters or more are in the client's transcript of what it heard
    (Whisper tiny mishears a few words over G.711)."""
    want = {w for w in words(said) if len(w) >= 3}
    got = set(words(heard))
    return bool(want) and len(want & got) >= max(1, len(want) // 2)


def is_english(text: str) -> bool:
    """At least two words, mostly Latin letters, at least one very common English word."""
    w = words(text)
    common = {"the", "a", "an", "is", "are", "i", "you", "it", "of", "to", "and", "in", "that", "this", "what",
              "can", "be", "was", "for", "on", "with", "my", "your", "hello", "hi", "there", "capital", "yes", "no"}
    letters = sum(c.isascii() and c.isalpha() for c in text)
    return len(w) >= 2 and letters >= 0.6 * len(text.replace(" ", "")) and bool(common & set(w))
