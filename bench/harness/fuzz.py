"""The fuzz campaign on a running ``brisvoxd``: mutated SIP datagrams and WebSocket messages, then judged.

:func:`run_fuzz` (``python -m bench fuzz``, ``tests/system/test_fuzz.py``):

1. starts ``brisvoxd`` (1 worker, 1 agent process with the scripted
   providers; the gateway's echo agent at ``sip:echo@``, ``/twilio/echo``,
   ``/ws/echo``; SIP and WebSocket on ports the gateway picks; ``[sip]
   allow`` 127.0.0.0/24; the native secret, the Twilio auth token and an
   Origin allow-list set) with the DEFAULT per-source limits: the campaign
   sends from 249 addresses (127.0.0.2-127.0.0.250, :mod:`.fuzz_sip`,
   :mod:`.fuzz_ws`), so what it sends is parsed, not rate-limited away, and
   the limits' per-source keying is exercised;
2. WebSocket phase: ``n_ws`` messages over ``n_conns`` connections
   (:mod:`.fuzz_ws`); SIP phase: ``n_sip`` datagrams (:mod:`.fuzz_sip`),
   half of the in-dialog ones aimed at a live call (the victim);
3. limits phase: one address bursts OPTIONS, INVITEs and WebSocket
   handshakes past the default limits: 503 with Retry-After / 429, counted;
4. waits for the call table to empty, checks the processes, /dev/shm and the
   deleted mappings, places a valid SIP call and a valid Twilio call, reads
   the log lines the campaign caused, judges (:func:`judge`).

Invariants judged (docs/BENCHMARKS.md "Fuzz campaign"):

* (i) no process crashed or restarted: the children's pids and restart
  counts are those of before the campaign, and the daemon still runs;
* (ii) the gateway's call count is back to 0 within ``DRAIN_S`` (35 s: the
  calls a valid-looking INVITE opened are never ACKed and end at 64*T1, 16 s with the
  run's ``t1_ms = 250``; the WebSocket calls end at their 10 s ``media_timeout_s``);
* (iii) no /dev/shm segment of the instance is left, no process maps a
  deleted one;
* (iv) a valid SIP call and a valid Twilio call are answered right after
  (established, and the echo agent's audio arrives);
* (v) the log lines about bad input are bounded: at most one per kind
  (counter) plus one per 100 bad inputs;
* (vi) every refusal is counted: every datagram the gateway's socket
  received is in exactly one intake counter, every refusal answer received
  is within its ``sip_refused_*`` counter, every HTTP refusal within its
  ``ws_refused_*`` class exactly, the ``ws_malformed_*`` sum between the
  native ``error`` answers and the messages delivered; no internal error.

Invariants of the run: everything binds 127.0.0.0/8; the daemon's process
group is killed and the instance's segments removed in ``finally``
(:meth:`bench.harness.daemon.Daemon.close`); every wait is bounded, and the
campaign by a wall-clock deadline.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.harness import fuzz_sip, fuzz_ws
from bench.harness.chaos.faults import deleted_shm, tree
from bench.harness.chaos.judge import Report
from bench.harness.daemon import Daemon, write_config
from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents
from brisvox.wire import twilio
from brisvox.wire.g711 import PCMU
from ipc.ring import SHM_DIR

DRAIN_S = 35.0
LIMIT_SRC = "127.0.0.251"  # the limits phase's one address
SEED = 20240
SIP_RATE = 1200.0  # datagrams a second (about 5 per source a second: under invite_rate 10/second)
WS_PLAN_FACTOR = 1.75
REPORT_WAIT_S = 1.2  # the gateway reports its counters every 0.5 s (brisvox/gateway/process.py)
LOUD = 300  # mean |sample| of a frame that is the echo of our tone


def daemon_config(tmp: Path) -> Path:
    rtp = 31000 + (os.getpid() % 300) * 100
    extra = f"""
[gateway]
echo_use_workers = false
max_calls = 60

[sip]
port = 0
allow = ["127.0.0.0/24"]
default_agent = "default"  # the campaign's INVITEs to sip:agent@ reach the default agent
max_transactions = 16384  # a refused INVITE's transaction lives 64*T1 = 16 s: the campaign's would fill 4096
t1_ms = 250  # the unACKed calls end at 64*T1 = 16 s (500 ms: 32 s of the run spent waiting for them)
rtp_port_min = {rtp}
rtp_port_max = {rtp + 98}

[websocket]
port = 0
media_timeout_s = 10.0  # the fuzzed calls that send no audio end after 10 s, not 20
native_secret = "{fuzz_ws.SECRET}"
twilio_auth_token = "{fuzz_ws.TOKEN}"
public_url = "{fuzz_ws.PUBLIC_URL}"
allowed_origins = ["{fuzz_ws.ORIGIN}"]
max_message_bytes = {fuzz_ws.MAX_MESSAGE}
routes = [{{ path = "/twilio", protocol = "twilio", agent = "default", agents = ["echo"] }},
          {{ path = "/ws", protocol = "native", agent = "default", agents = ["echo"] }}]

[smart_turn]
enabled = false

[agents]
providers = "scripted"
smart_turn = false
max_calls = 64

[calls]
records = false
"""
    return write_config(tmp, workers=1, agents=1, extra=extra)


@dataclass
class Fuzz:
    n_sip: int
    n_ws: int
    n_conns: int
    status_before: dict[str, Any] = field(default_factory=dict)
    status_after: dict[str, Any] = field(default_factory=dict)
    stats_before: dict[str, Any] = field(default_factory=dict)
    stats_after: dict[str, Any] = field(default_factory=dict)
    stats_main: dict[str, Any] = field(default_factory=dict)  # after the campaign, before the limits phase
    stats_sip0: dict[str, Any] = field(default_factory=dict)  # the SIP phase alone (the victim call's outside)
    stats_sip1: dict[str, Any] = field(default_factory=dict)
    sip: fuzz_sip.Sent = field(default_factory=fuzz_sip.Sent)
    sip_drops: int = 0
    ws: fuzz_ws.WsResult = field(default_factory=fuzz_ws.WsResult)
    limits: dict[str, Any] = field(default_factory=dict)
    victim: dict[str, Any] = field(default_factory=dict)
    drain_s: float | None = None
    segments: list[str] = field(default_factory=list)
    deleted: dict[int, list[str]] = field(default_factory=dict)
    valid: dict[str, Any] = field(default_factory=dict)
    log_lines: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _tone(n: int, rate: int = 8000, start: int = 0) -> np.ndarray:
    t = np.arange(start, start + n) / rate
    return (6000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def _loud(pcm: np.ndarray) -> bool:
    return bool(len(pcm)) and float(np.abs(pcm.astype(np.int32)).mean()) > LOUD


async def sip_call(port: int, seconds: float = 1.6, during: Any = None) -> dict[str, Any]:
    """A valid SIP call to the echo agent: answered, and how many loud frames came back.
    ``during(transport)``, if given, is awaited while the call streams (the victim call)."""
    got = {"frames": 0, "loud": 0, "ended": ""}

    def on_audio(pcm: np.ndarray, now: float) -> None:
        got["frames"] += 1
        got["loud"] += _loud(pcm)

    def on_end(reason: str, now: float) -> None:
        got["ended"] = reason

    tr = SipTransport(f"sip:echo@127.0.0.1:{port}", codecs=("PCMU",), answer_timeout=10.0)
    out: dict[str, Any] = {"answered": False}
    try:
        await asyncio.wait_for(tr.open(BotEvents(on_audio=on_audio, on_end=on_end)), 12.0)
        out["answered"] = True

        async def stream() -> None:
            k = 0
            while during is not None or k < seconds * 50:
                if got["ended"]:
                    return
                await tr.send_audio(_tone(160, start=k * 160))
                k += 1
                await asyncio.sleep(0.02)

        if during is None:
            await stream()
            await asyncio.sleep(0.5)
        else:
            streamer = asyncio.create_task(stream())
            try:
                await during(tr)
            finally:
                streamer.cancel()
    except Exception as e:  # noqa: BLE001 - a refused call is a result
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    finally:
        try:
            await asyncio.wait_for(tr.close(), 5.0)
        except Exception:  # noqa: BLE001
            pass
    return {**out, **got}


async def twilio_call(port: int, seconds: float = 1.6) -> dict[str, Any]:
    """A valid (signed) Twilio Media Streams call to the echo agent."""
    from websockets.asyncio.client import connect

    path = "/twilio/echo"
    st = twilio.TwilioStream(1, tag="fuzzok")
    out: dict[str, Any] = {"answered": False, "frames": 0, "loud": 0}
    try:
        async with connect(f"ws://127.0.0.1:{port}{path}", open_timeout=5, close_timeout=2,
                           additional_headers={"X-Twilio-Signature": twilio.signature(
                               fuzz_ws.TOKEN, fuzz_ws.PUBLIC_URL + path)}) as ws:
            await ws.send(st.connected())
            await ws.send(st.start())
            out["answered"] = True

            async def rx() -> None:
                async for m in ws:
                    ev, val = twilio.bot_event(orjson.loads(m))
                    if ev == "media":
                        out["frames"] += 1
                        out["loud"] += _loud(PCMU.decode(val))

            task = asyncio.create_task(rx())
            import base64
            for k in range(int(seconds * 50)):
                await ws.send(st.media(base64.b64encode(PCMU.encode(_tone(160, start=k * 160)).tobytes()).decode()))
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)
            await ws.send(st.stop())
            try:
                await asyncio.wait_for(task, 3.0)
            except TimeoutError:
                task.cancel()
    except Exception as e:  # noqa: BLE001 - a refused call is a result
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    return out


async def limits_phase(sip_port: int, ws_port: int) -> dict[str, Any]:
    """One address past the default limits: 30 OPTIONS (options_rate 20/second), 15 INVITEs with an
    unusable offer (invite_rate 10/second: 488 then 503), 30 handshakes (handshakes_per_s 20: 404
    then 429)."""
    dgrams = [fuzz_sip.Datagram(i, "limit_options", LIMIT_SRC,
                                b"".join(fuzz_sip.request("OPTIONS", sip_port, LIMIT_SRC, 900_000 + i)))
              for i in range(30)]
    bad_offer = fuzz_sip.sdp().replace(b"RTP/AVP 0 8 101", b"RTP/AVP 96")
    dgrams += [fuzz_sip.Datagram(i, "limit_invite", LIMIT_SRC,
                                 b"".join(fuzz_sip.request("INVITE", sip_port, LIMIT_SRC, 910_000 + i, body=bad_offer)))
               for i in range(15)]
    sent = await fuzz_sip.send(dgrams, sip_port, 2000.0, time.monotonic() + 10, linger=0.5)
    codes = fuzz_sip.replies(sent.replies)
    plans = [fuzz_ws.Plan(i, "native", "bad_path", LIMIT_SRC,
                          b"GET /nope HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
             for i in range(30)]
    ws = await fuzz_ws.run(plans, ws_port, 30, time.monotonic() + 10)
    return {"sip_sent": sent.sent, "sip_codes": codes, "ws_statuses": ws.statuses()}


def _gw_stats(d: Daemon) -> dict[str, Any]:
    return dict(d.child(d.status(), "gateway-0").get("stats") or {})


def _fresh_stats(d: Daemon) -> dict[str, Any]:
    """The gateway's counters as of now: its report reaches the status every 0.5 s."""
    time.sleep(REPORT_WAIT_S)
    return _gw_stats(d)


def _calls(s: dict[str, Any]) -> int:
    gw = next(c for c in s["children"] if c["name"] == "gateway-0")
    return int(s["daemon"]["calls"]) + sum(int(c["calls"]) for c in s["children"]) + \
        int((gw.get("stats") or {}).get("calls_active", 0))


def _read_log(d: Daemon, start: int) -> list[dict[str, Any]]:
    try:
        with open(d.log_path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    out = []
    for ln in data.splitlines():
        try:
            rec = orjson.loads(ln)
        except orjson.JSONDecodeError:
            rec = {"msg": ln.decode(errors="replace")[:200], "role": "?", "logger": "?"}
        if isinstance(rec, dict):
            out.append(rec)
    return out


def run_fuzz(tmp: Path, n_sip: int = 10_000, n_ws: int = 10_000, n_conns: int = 500, deadline_s: float = 240.0,
             log: Any = print) -> Report:
    from bench.harness.fuzz_judge import judge

    tmp.mkdir(parents=True, exist_ok=True)
    fz = Fuzz(n_sip, n_ws, n_conns)
    t_start = time.monotonic()
    deadline = t_start + deadline_s
    d = Daemon(tmp, config=daemon_config(tmp), env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
               real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(60)
        gw = d.child(snap, "gateway-0")["endpoints"]
        ws_port, sip_port = int(gw["websocket"].rsplit(":", 1)[1]), int(gw["sip"].rsplit(":", 1)[1])
        fz.timings["daemon_ready_s"] = time.monotonic() - t_start
        fz.status_before = snap
        fz.stats_before = _gw_stats(d)
        log_start = d.log_path.stat().st_size
        # a quarter of the handshakes are refused and a connection ends at its server's close: planned
        # messages are WS_PLAN_FACTOR times the target so that about n_ws are sent
        per_conn = max(1, math.ceil(WS_PLAN_FACTOR * n_ws / max(1, n_conns)))
        log(f"   daemon ready ({fz.timings['daemon_ready_s']:.1f} s); WebSocket: {n_conns} connections x "
            f"{per_conn} messages; SIP: {n_sip} datagrams")
        t0 = time.monotonic()
        plans = fuzz_ws.plans(SEED, n_conns, per_conn, f"127.0.0.1:{ws_port}")
        fz.ws = asyncio.run(fuzz_ws.run(plans, ws_port, 25, deadline))
        fz.timings["ws_phase_s"] = time.monotonic() - t0

        async def sip_phase(victim: SipTransport) -> None:
            dlg = victim.dialog
            target = fuzz_sip.Dialog(dlg.call_id, dlg.local_tag, dlg.remote_tag) if dlg else None
            dgrams = fuzz_sip.datagrams(SEED, n_sip, sip_port, target)
            drops0 = fuzz_sip.udp_drops(sip_port)
            fz.stats_sip0 = await asyncio.to_thread(_fresh_stats, d)
            fz.sip = await fuzz_sip.send(dgrams, sip_port, SIP_RATE, deadline)
            fz.stats_sip1 = await asyncio.to_thread(_fresh_stats, d)
            fz.sip_drops = fuzz_sip.udp_drops(sip_port) - drops0

        t0 = time.monotonic()
        fz.victim = asyncio.run(sip_call(sip_port, during=sip_phase))
        fz.timings["sip_phase_s"] = time.monotonic() - t0
        fz.stats_main = _fresh_stats(d)
        fz.limits = asyncio.run(limits_phase(sip_port, ws_port))
        fz.timings["campaign_s"] = time.monotonic() - t_start - fz.timings["daemon_ready_s"]
        log(f"   campaign done ({fz.timings['campaign_s']:.1f} s): {fz.sip.sent} datagrams, "
            f"{fz.ws.messages} messages over {len(fz.ws.conns)} connections; waiting for the calls to end")
        t0 = time.monotonic()
        while time.monotonic() - t0 < DRAIN_S + 5:
            if _calls(d.status()) == 0:
                fz.drain_s = time.monotonic() - t0
                break
            time.sleep(0.2)
        fz.log_lines = _read_log(d, log_start)
        time.sleep(0.5)  # the rings of the last call are unlinked just after its end is reported
        fz.segments = sorted(p.name for p in SHM_DIR.glob(f"brisvox.{d.instance}.*"))
        assert d.proc is not None
        fz.deleted = deleted_shm([p.pid for p in tree(d.proc.pid)], d.instance)
        fz.valid["sip"] = asyncio.run(sip_call(sip_port))
        fz.valid["twilio"] = asyncio.run(twilio_call(ws_port))
        fz.status_after = d.status()
        fz.stats_after = _fresh_stats(d)
        fz.timings["total_s"] = time.monotonic() - t_start
        return judge(fz, d.proc.poll() is None)
    finally:
        d.close()
