"""Gateway benchmark: N concurrent calls over SIP (SIPp) and WebSocket (Twilio protocol).

``python -m bench gateway`` (``--quick``: 20 calls, short windows). For each
transport (WebSocket, SIP over UDP, SIP over TCP, SIP over TLS:
``BRISVOX_BENCH_GATEWAY_TRANSPORTS`` picks, e.g. ``sip,sip-tcp,sip-tls``) and N in 50, 100, 200 (``BRISVOX_BENCH_GATEWAY_SIZES``), it starts a standalone gateway process whose
calls are routed to this process acting as the agent AND the worker: it accepts
every CallStart, keeps each call's ``out`` ring 200 ms ahead of playback at the
real-time rate, and every 2 s per call (staggered) sends a Clear, then starts
a new utterance one tick later (OutUtterance), as a barge-in would. The load
generator sends caller audio at 50 packets/s per call and receives the bot
audio: SIPp ``rtp_stream`` for SIP, a separate Python process of asyncio
WebSocket clients for Twilio.

Figures (measured inside the gateway unless said otherwise):

* CPU per call: the gateway process's user+system CPU over the window / N,
  in % of one core.
* Frame release jitter p50/p99: |interval between two consecutive releases
  of one talkspurt - 20 ms| (target p99 <= 5 ms at 200 calls).
* Clear latency p99: from the Clear frame's arrival (read from the socket) to
  the cut (target <= 1 ms); also from the agent's send stamp (includes the
  ZeroMQ hop and the gateway loop's queue).
* Underruns and late frames while the out ring has audio (target 0).
* First frame of a new utterance: from the OutUtterance's arrival to the
  release of the utterance's first frame (target: at once, not at the next
  tick), p50/p99 over the utterances started in the window's run.

The machine is shared (2 cores): the load generator and this process compete
with the gateway, so the figures are an upper bound of what the gateway needs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.daemon import ws_port  # noqa: E402
from brisvox.wire import twilio  # noqa: E402
from brisvox.wire.g711 import ULAW_SILENCE  # noqa: E402
from ipc.bus import request_sync  # noqa: E402
from ipc.codec import decode_env, encode  # noqa: E402
from ipc.frames import CallAccepted, CallEnd, CallEnded, CallStart, Clear, Command, OutUtterance  # noqa: E402
from ipc.ring import Ring, ring_name  # noqa: E402

Row = tuple[str, Any, str, str]
FRAME = 160
CLEAR_EVERY_S = 2.0


class BenchAgent:
    """Agent + worker stand-in on a thread (see module docstring)."""

    def __init__(self, endpoint: str, instance: str) -> None:
        self.endpoint = endpoint
        self.instance = instance
        self.calls: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.clears = 0
        self.ctx = zmq.Context()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.tone = (3000 * np.sin(2 * np.pi * 300 * np.arange(8000) / 8000)).astype(np.int16)

    def start(self) -> None:
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(3)
        for c in self.calls.values():
            c["ring"].close()
        self.sock.close(0)
        self.ctx.term()

    def run(self) -> None:
        tick = 0.02
        next_t = time.monotonic()
        n_call = 0
        while not self.stop.is_set():
            while True:
                try:
                    ident, data = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                frame, cid = decode_env(data)
                if isinstance(frame, CallStart):
                    ring = Ring.attach(ring_name(self.instance, frame.call_id, "out", frame.ring_key))
                    ring.write(np.zeros(1600, dtype=np.int16))  # 200 ms ahead
                    n_call += 1
                    self.calls[frame.call_id] = {"ring": ring, "ident": ident, "epoch": 1, "phase": 0,
                                                 "t0": time.monotonic(), "base": 1600,
                                                 "next_clear": time.monotonic() + CLEAR_EVERY_S * (
                                                     0.25 + (n_call * 0.37) % 1.0), "resume": False}
                    self.sock.send_multipart([ident, encode(OutUtterance(call_id=frame.call_id, utterance=0,
                                                                         epoch=1, out_pos=0))])
                    self.sock.send_multipart([ident, encode(CallAccepted(call_id=frame.call_id), cid=cid)])
                elif isinstance(frame, CallEnd):
                    c = self.calls.pop(frame.call_id, None)
                    if c is not None:
                        c["ring"].close()
                    self.sock.send_multipart([ident, encode(CallEnded(call_id=frame.call_id, reason="bye"))])
            now = time.monotonic()
            for call_id, c in self.calls.items():
                ring = c["ring"]
                if c["resume"]:
                    c["resume"] = False
                    c["epoch"] += 1
                    w = ring.write_pos
                    ring.write(np.zeros(1600, dtype=np.int16))
                    # the new response keeps 200 ms ahead of real time from here on
                    c["t0"], c["base"] = now, w + 1600
                    self.sock.send_multipart([c["ident"], encode(OutUtterance(
                        call_id=call_id, utterance=c["epoch"], epoch=c["epoch"], out_pos=w))])
                    continue
                # write up to where real time says the response is (catches up after a stall)
                target = c["base"] + int((now - c["t0"]) * 8000) + FRAME
                while ring.write_pos < target:
                    p = c["phase"]
                    ring.write(self.tone[p:p + FRAME])
                    c["phase"] = (p + FRAME) % (8000 - FRAME)
                if now >= c["next_clear"]:
                    c["next_clear"] = now + CLEAR_EVERY_S
                    self.sock.send_multipart([c["ident"], encode(Clear(call_id=call_id, epoch=c["epoch"],
                                                                       sent_ns=time.monotonic_ns()))])
                    self.clears += 1
                    c["resume"] = True
            next_t += tick
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()


def start_gateway(tmp: Path, instance: str, agent_ep: str, n: int, uvloop: bool,
                  tcp_port: int = 0, tls: tuple[Path, Path] | None = None,
                  extra_sip: str = "") -> tuple[subprocess.Popen, dict]:
    """The gateway under test. ``tcp_port``: a ``[[sip.listeners]]`` entry on it, TCP, or TLS with
    ``tls`` (cert, key); ``extra_sip``: more ``[sip]`` keys, TOML lines."""
    cfg = tmp / "gw.toml"
    listeners = ""
    if tcp_port:
        listeners = (f'[[sip.listeners]]\ntransport = "{"tls" if tls else "tcp"}"\nhost = "127.0.0.1"\n'
                     f'port = {tcp_port}\n')
        if tls:
            listeners += f'cert_file = "{tls[0]}"\nkey_file = "{tls[1]}"\n'
    cfg.write_text(f"""[gateway]
max_calls = {n + 16}
max_calls_per_source = {n + 16}  # every call comes from 127.0.0.1
echo_use_workers = false
[sip]
port = 0
rtp_port_min = 36000
rtp_port_max = 37998
rtp_timeout_s = 0
default_agent = "default"  # SIPp calls sip:bench@
invite_rate = ["1000/second"]  # SIPp places every call from 127.0.0.1, 50 a second
other_rate = ["5000/second"]
{extra_sip}[websocket]
port = 0
trust_loopback = true
""" + listeners)
    inbox = f"ipc://{tmp}/gw.sock"
    args = [sys.executable, "-m", "brisvox.gateway", "--config", str(cfg), "--instance", instance,
            "--inbox", inbox, "--peer", f"agent-0={agent_ep}"] + (["--uvloop"] if uvloop else [])
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(tmp / "gw.err", "wb"), env=env, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError((tmp / "gw.err").read_text()[-2000:])
    info = orjson.loads(line)
    info["inbox"] = inbox
    return proc, info


def _nice() -> None:
    """Load generators run at a lower priority: the gateway is what is measured."""
    os.nice(10)


def stop_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


# -- WebSocket load generator (a separate process) -------------------------------------


async def _ws_calls(port: int, n: int, seconds: float) -> None:
    from websockets.asyncio.client import connect

    silence = bytes([ULAW_SILENCE]) * FRAME

    async def one(i: int) -> None:
        sid = f"MZ{i:032d}"
        # the same 20 ms of silence every frame, in the minimal media shape (the one a bot
        # sends: no sequenceNumber, track, chunk, timestamp), encoded once per call
        media = twilio.BotStream(sid).media(silence).decode()
        start = twilio.TwilioStream(stream_sid=sid, call_sid=f"CA{i}", account_sid="AC").start()
        await asyncio.sleep(i * 0.01)
        async with connect(f"ws://127.0.0.1:{port}/twilio", max_queue=256) as ws:
            await ws.send(start)

            async def drain() -> None:
                async for _ in ws:
                    pass

            rx = asyncio.create_task(drain())
            t0 = time.monotonic()
            k = 0
            while time.monotonic() - t0 < seconds:
                await ws.send(media)
                k += 1
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
            rx.cancel()

    await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)


def ws_client_main(argv: list[str]) -> None:
    port, n, seconds = int(argv[0]), int(argv[1]), float(argv[2])
    asyncio.run(_ws_calls(port, n, seconds))


# -- SIP over TLS for SIPp, which has no TLS (a separate process) ---------------------------


async def _tls_relay(listen_port: int, tls_port: int, ready: Path) -> None:
    """Accept SIPp's TCP connections on ``listen_port``; carry each over its own TLS connection to
    the gateway's TLS listener (certificate not verified: the bench's own), both ways."""
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def on_client(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", tls_port, ssl=ctx), 10)
        await asyncio.gather(pump(r, tw), pump(tr, w))

    server = await asyncio.start_server(on_client, "127.0.0.1", listen_port)
    await asyncio.to_thread(ready.write_text, "ok")
    async with server:
        await server.serve_forever()


def tls_relay_main(argv: list[str]) -> None:
    asyncio.run(_tls_relay(int(argv[0]), int(argv[1]), Path(argv[2])))


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- one measurement ----------------------------------------------------------------------


def measure(transport: str, n: int, window: float, uvloop: bool = False) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bvgw", dir="/tmp"))
    instance = f"bench{os.getpid()}-{transport[0]}{n}"
    agent = BenchAgent(f"ipc://{tmp}/agent.sock", instance)
    agent.start()
    tcp_port = _free_tcp_port() if transport in ("sip-tcp", "sip-tls") else 0
    tls = _self_signed(tmp) if transport == "sip-tls" else None
    gw, info = start_gateway(tmp, instance, agent.endpoint, n, uvloop, tcp_port, tls)
    loads: list[subprocess.Popen] = []
    ramp = max(2.0, n * 0.02 + 1.0)
    try:
        sipp_port = tcp_port
        if tls:  # SIPp over TCP to the relay, the relay over TLS to the gateway
            sipp_port = _free_tcp_port()
            ready = tmp / "relay.ready"
            loads.append(subprocess.Popen([sys.executable, "-m", "bench.bench_gateway", "--tls-relay", str(sipp_port),
                                           str(tcp_port), str(ready)], cwd=ROOT,
                                          env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=_nice))
            deadline = time.monotonic() + 10
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if transport == "ws":
            port = ws_port(info)
            procs = 2 if n > 60 else 1
            loads = [subprocess.Popen([sys.executable, "-m", "bench.bench_gateway", "--ws-client", str(port),
                                       str(n // procs + (1 if i < n % procs else 0)), str(ramp + window + 1)],
                                      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=_nice)
                     for i in range(procs)]
        else:
            port = sipp_port or int(info["endpoints"]["sip"].rsplit(":", 1)[1])
            ulaw = tmp / "tone.ulaw"
            ulaw.write_bytes(bytes([0xFF, 0x7F]) * 4000 * 2)
            scen = tmp / "scen.xml"
            from bench.harness import sipp as S

            scen.write_text(S.scenario(S.invite_answered("[rtpstream_audio_port]")
                                       + f'  <nop><action><exec rtp_stream="{ulaw},-1,0"/></action></nop>\n'
                                       + f'  <pause milliseconds="{int((ramp + window + 1) * 1000)}"/>\n'
                                       + S.bye(2)))
            loads += [subprocess.Popen(["sipp", "-sf", str(scen), "-m", str(n), "-l", str(n), "-r", "50",
                                       "-s", "bench", f"127.0.0.1:{port}", "-i", "127.0.0.1", "-p", "15999",
                                       "-mi", "127.0.0.1", "-mp", "38000", "-nostdin", "-timeout",
                                       f"{int(ramp + window + 30)}s", *(["-t", "t1"] if tcp_port else [])],
                                      cwd=tmp, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, preexec_fn=_nice)]
        time.sleep(ramp)
        stats0 = request_sync(info["inbox"], Command(name="stats"), 5).data
        p = psutil.Process(gw.pid)
        lps = [psutil.Process(lp.pid) for lp in loads]
        c0 = p.cpu_times()
        l0 = sum(sum(x.cpu_times()[:2]) for x in lps)
        t0 = time.monotonic()
        time.sleep(window)
        c1 = p.cpu_times()
        l1 = sum(sum(x.cpu_times()[:2]) for x in lps)
        t1 = time.monotonic()
        load_avg = os.getloadavg()[0]
        stats1 = request_sync(info["inbox"], Command(name="stats"), 5).data
        for lp in loads[1:] if tls else loads:  # the relay serves until killed
            try:
                lp.wait(ramp + window + 40)
            except subprocess.TimeoutExpired:
                os.kill(lp.pid, signal.SIGKILL)
        cpu = ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)
        active = stats1["calls_active"]
        return {
            "calls": active,
            "cpu_per_call_pct": 100.0 * cpu / max(1, active),
            "cpu_total_pct": 100.0 * cpu,
            "loadgen_cpu_pct": 100.0 * (l1 - l0) / (t1 - t0),
            "load_avg": load_avg,
            "jitter_p50": stats1["release_jitter_p50_ms"],
            "jitter_p99": stats1["release_jitter_p99_ms"],
            "tick_late_p99": stats1["tick_late_p99_ms"],
            "clear_local_p99": stats1.get("clear_local_p99_ms", 0.0),
            "clear_sent_p99": stats1["clear_latency_p99_ms"],
            "clears": stats1["call_clears_total"] - stats0["call_clears_total"],
            "underruns": stats1["call_underruns_total"] - stats0["call_underruns_total"],
            "late_frames": stats1["call_late_frames_total"] - stats0["call_late_frames_total"],
            "frames_out": stats1["call_frames_out_total"] - stats0["call_frames_out_total"],
            "first_frame_p50": stats1.get("first_frame_p50_ms", float("nan")),
            "first_frame_p99": stats1.get("first_frame_p99_ms", float("nan")),
            "first_frames": stats1.get("first_frame_n", 0),
            "packets_in": stats1["call_packets_in_total"] - stats0["call_packets_in_total"],
        }
    finally:
        for lp in loads:
            if lp.poll() is None:
                os.kill(lp.pid, signal.SIGKILL)
                lp.wait(5)
        stop_proc(gw)
        agent.close()
        for p2 in Path("/dev/shm").glob(f"brisvox.{instance}.*"):
            p2.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def run(quick: bool = False) -> list[Row]:
    sizes = [20] if quick else [50, 100, 200]
    if os.environ.get("BRISVOX_BENCH_GATEWAY_SIZES"):  # e.g. "50": one level
        sizes = [int(x) for x in os.environ["BRISVOX_BENCH_GATEWAY_SIZES"].split(",")]
    window = 3.0 if quick else 8.0
    rows: list[Row] = []
    # sip-tcp: the same SIPp calls with their signalling on one TCP connection ([[sip.listeners]]);
    # sip-tls: SIPp has no TLS, so its TCP connection goes through a relay process (the load
    # generator's side) that carries it over TLS to the gateway's TLS listener
    only = os.environ.get("BRISVOX_BENCH_GATEWAY_TRANSPORTS", "")
    transports = ["ws"] + (["sip", "sip-tcp", "sip-tls"] if shutil.which("sipp") else [])
    if only:
        transports = [t for t in transports if t in only.split(",")]
    for transport in transports:
        for n in sizes:
            m = measure(transport, n, window)
            name = f"{transport.upper()} {n} calls"
            rows += [
                (f"{name}: calls live in the window", m["calls"], "calls", str(n)),
                (f"{name}: gateway CPU per call", round(m["cpu_per_call_pct"], 3), "% core", ""),
                (f"{name}: gateway CPU total", round(m["cpu_total_pct"], 1), "% core", ""),
                (f"{name}: load generator CPU (niced)", round(m["loadgen_cpu_pct"], 1), "% core", ""),
                (f"{name}: machine load average (1 min)", round(m["load_avg"], 2), "", ""),
                (f"{name}: release jitter p50", round(m["jitter_p50"], 2), "ms", ""),
                (f"{name}: release jitter p99", round(m["jitter_p99"], 2), "ms", "<= 5 (200 calls)"),
                (f"{name}: pacer tick lateness p99", round(m["tick_late_p99"], 2), "ms", ""),
                (f"{name}: Clear arrival->cut p99", round(m["clear_local_p99"], 3), "ms", "<= 1"),
                (f"{name}: Clear agent send->cut p99", round(m["clear_sent_p99"], 2), "ms", ""),
                (f"{name}: clears in the window", m["clears"], "", ""),
                (f"{name}: new utterance, OutUtterance -> first frame p50", round(m["first_frame_p50"], 2), "ms",
                 ""),
                (f"{name}: new utterance, OutUtterance -> first frame p99 ({m['first_frames']})",
                 round(m["first_frame_p99"], 2), "ms", "at once (histogram step 0.05)"),
                (f"{name}: underruns (out ring had audio)", m["underruns"], "", "0"),
                (f"{name}: late frames", m["late_frames"], "", "0"),
                (f"{name}: frames out per call-second", round(m["frames_out"] / max(1, m["calls"]) / window, 1),
                 "/s", "50"),
            ]
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--ws-client":
        ws_client_main(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--tls-relay":
        tls_relay_main(sys.argv[2:])
    else:
        for row in run(quick="--quick" in sys.argv):
            print(row)
