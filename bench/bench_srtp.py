"""SRTP's cost: per packet in libsrtp (through brisvox.wire.srtp), and per call in the gateway.

``python -m bench srtp`` (``--quick``: fewer packets, 10 calls, a short window).

* Per packet: :meth:`~brisvox.wire.srtp.SrtpSession.protect` and ``unprotect`` of a
  172-byte RTP packet (160 bytes of G.711, one 20 ms frame) for both suites, in ns per
  packet, median of 7 batches; beside them the copy the gateway's send path adds (the
  reused buffer's ``bytes()``), and a plain ``rtp.parse`` as the scale of what a packet
  already costs.
* Per call: the gateway process's CPU at N calls (50; ``BRISVOX_BENCH_SRTP_CALLS``) with
  SRTP and without, everything else equal: the same gateway config (``srtp = "optional"``
  with ``srtp_allow_insecure_signalling``: the load's signalling is UDP), the same Python
  caller process (a separate, niced asyncio process: one SIP socket, a media socket per
  call, 50 packets/s per call of 160-byte PCMU, offering ``RTP/SAVP`` with a=crypto or plain
  ``RTP/AVP``), the agent and worker stand-in of ``bench_gateway`` (the bot's audio out at
  50 packets/s per call, a Clear every 2 s). The caller checks every packet it gets back
  (decrypts them for SRTP): a failure counts, and the gateway's ``sip_srtp_*`` refusals
  must stay 0. SIPp cannot do SRTP, hence this caller instead of ``bench gateway``'s SIPp.

The machine is shared (2 cores): the caller competes with the gateway; the figures are the
gateway's own CPU, measured with psutil over the window.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_gateway import BenchAgent, _nice, start_gateway, stop_proc  # noqa: E402
from brisvox.wire import rtp, sdp, srtp  # noqa: E402
from brisvox.wire.sip_message import parse  # noqa: E402
from ipc.bus import request_sync  # noqa: E402
from ipc.frames import Command  # noqa: E402

Row = tuple[str, Any, str, str]
S80, S32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"


# -- per packet ---------------------------------------------------------------------------------


def _ns_per(fn: Any, n: int, batches: int = 7) -> float:
    times = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        fn(n)
        times.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(times)


def _suite_costs(suite: str, n: int, payload: bytes) -> tuple[float, float]:
    """(ns per protect, ns per unprotect) of ``suite`` for RTP packets carrying ``payload``."""
    a, b = srtp.new_crypto(1, suite), srtp.new_crypto(1, suite)
    tx, rx = srtp.SrtpSession(a, b), srtp.SrtpSession(b, a)
    seq = [0]

    def protect(k: int) -> None:
        s0 = seq[0]
        for i in range(s0, s0 + k):
            tx.protect(struct.pack("!BBHII", 0x80, 0, i & 0xFFFF, i * 160, 1) + payload)
        seq[0] = s0 + k

    sender = srtp.SrtpSession(a, b)  # a fresh stream under the key rx expects
    wires = [sender.protect(struct.pack("!BBHII", 0x80, 0, i & 0xFFFF, i * 160, 1) + payload)
             for i in range(n * 8)]
    pos = [0]

    def unprotect(k: int) -> None:
        p0 = pos[0]
        for w in wires[p0:p0 + k]:
            rx.unprotect(w)
        pos[0] = p0 + k

    return _ns_per(protect, n), _ns_per(unprotect, n)


def per_packet(n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    payload = secrets.token_bytes(160)
    for suite in (S80, S32):
        out[f"protect {suite}"], out[f"unprotect {suite}"] = _suite_costs(suite, n, payload)
    plain = struct.pack("!BBHII", 0x80, 0, 1, 160, 1) + payload
    buf = bytearray(12 + 4096)
    buf[:172] = plain
    view = memoryview(buf)

    def copy(k: int) -> None:
        for _ in range(k):
            bytes(view[:172])

    def header_pack(k: int) -> None:
        for i in range(k):
            struct.pack("!BBHII", 0x80, 0, i & 0xFFFF, i * 160, 1)

    def parse_rtp(k: int) -> None:
        for _ in range(k):
            rtp.parse(plain)

    out["send-path copy (bytes of the reused buffer)"] = _ns_per(copy, n)
    out["header pack (the protect loop's own overhead)"] = _ns_per(header_pack, n)
    out["rtp.parse (plain, for scale)"] = _ns_per(parse_rtp, n)
    return out


# -- the caller process -----------------------------------------------------------------------


class _Sig(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[Any]] = {}
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            msg = parse(data)
        except Exception:  # noqa: BLE001 - a bench caller ignores what it cannot read
            return
        if msg.is_request:  # the gateway's BYE (none expected: rtp_timeout_s = 0): 200 it
            return
        fut = self.waiting.get(msg.call_id)
        if fut is not None and msg.status >= 200 and not fut.done():
            fut.set_result(msg)


class _Media(asyncio.DatagramProtocol):
    def __init__(self, session: list[srtp.SrtpSession | None], counts: dict[str, int]) -> None:
        self.session = session
        self.counts = counts
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        s = self.session[0]
        try:
            rtp.parse(s.unprotect(data) if s is not None else data)
            self.counts["rx_ok"] += 1
        except (srtp.SrtpDrop, rtp.RtpError):
            self.counts["rx_bad"] += 1


def _request(method: str, port: int, lp: int, call_id: str, cseq: int, to: str = "", body: bytes = b"") -> bytes:
    head = (f"{method} sip:bench@127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{lp};branch=z9hG4bK"
            f"{method}{call_id}{cseq};rport\r\nFrom: <sip:caller@127.0.0.1>;tag=b{call_id}\r\n"
            f"To: {to or '<sip:bench@127.0.0.1>'}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n"
            f"Contact: <sip:caller@127.0.0.1:{lp}>\r\nMax-Forwards: 70\r\n"
            + ("Content-Type: application/sdp\r\n" if body else "") + f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _sip_calls(port: int, n: int, seconds: float, use_srtp: bool) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    sig = _Sig()
    st, _ = await loop.create_datagram_endpoint(lambda: sig, local_addr=("127.0.0.1", 0))
    lp = st.get_extra_info("sockname")[1]
    counts = {"answered": 0, "failed": 0, "tx": 0, "rx_ok": 0, "rx_bad": 0}
    payload = bytes([0xFF, 0x7F]) * 80
    calls: list[dict[str, Any]] = []

    async def place(i: int) -> None:
        await asyncio.sleep(i * 0.02)
        session: list[srtp.SrtpSession | None] = [None]
        mt, _ = await loop.create_datagram_endpoint(lambda: _Media(session, counts), local_addr=("127.0.0.1", 0))
        mport = mt.get_extra_info("sockname")[1]
        mine = srtp.new_crypto(1, S80)
        crypto = f"a=crypto:{mine.value()}\r\n" if use_srtp else ""
        body = (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                f"m=audio {mport} {'RTP/SAVP' if use_srtp else 'RTP/AVP'} 0\r\na=rtpmap:0 PCMU/8000\r\n"
                f"{crypto}").encode()
        call_id = f"srtpbench{i}-{os.getpid()}"
        fut: asyncio.Future[Any] = loop.create_future()
        sig.waiting[call_id] = fut
        st.sendto(_request("INVITE", port, lp, call_id, 1, body=body), ("127.0.0.1", port))
        try:
            ok = await asyncio.wait_for(fut, 10)
        except TimeoutError:
            counts["failed"] += 1
            mt.close()
            return
        if ok.status != 200:
            counts["failed"] += 1
            mt.close()
            return
        to = ok.get("to")
        st.sendto(_request("ACK", port, lp, call_id, 1, to=to), ("127.0.0.1", port))
        neg = sdp.negotiate(sdp.parse(ok.body), policy=sdp.SrtpPolicy("optional"), secure_signalling=True,
                            offered=(mine,) if use_srtp else ())
        if use_srtp:
            assert neg.crypto is not None
            session[0] = srtp.SrtpSession(mine, neg.crypto)
        counts["answered"] += 1
        calls.append({"mt": mt, "dest": (neg.remote_host, neg.remote_port), "sender": rtp.RtpSender(),
                      "session": session[0], "call_id": call_id, "to": to})

    await asyncio.gather(*(place(i) for i in range(n)))
    t0 = time.monotonic()
    k = 0
    while time.monotonic() - t0 < seconds:  # one 20 ms ticker for every call
        now = time.monotonic()
        for c in calls:
            pkt = c["sender"].next_header(0, 160, now) + payload
            s = c["session"]
            c["mt"].sendto(s.protect(pkt) if s is not None else pkt, c["dest"])
            counts["tx"] += 1
        k += 1
        await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
    for c in calls:
        st.sendto(_request("BYE", port, lp, c["call_id"], 2, to=c["to"]), ("127.0.0.1", port))
    await asyncio.sleep(0.5)
    for c in calls:
        c["mt"].close()
    st.close()
    return counts


def sip_client_main(argv: list[str]) -> None:
    port, n, seconds, use_srtp = int(argv[0]), int(argv[1]), float(argv[2]), argv[3] == "1"
    counts = asyncio.run(_sip_calls(port, n, seconds, use_srtp))
    print(orjson.dumps(counts).decode(), flush=True)


# -- one load measurement --------------------------------------------------------------------


def measure(n: int, window: float, use_srtp: bool) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bvsrtp", dir="/tmp"))
    instance = f"bsrtp{os.getpid()}-{int(use_srtp)}{n}"
    agent = BenchAgent(f"ipc://{tmp}/agent.sock", instance)
    agent.start()
    gw, info = start_gateway(tmp, instance, agent.endpoint, n, False,
                             extra_sip='srtp = "optional"\nsrtp_allow_insecure_signalling = true\n')
    load: subprocess.Popen[bytes] | None = None
    ramp = n * 0.02 + 2.0
    try:
        port = int(info["endpoints"]["sip"].rsplit(":", 1)[1])
        load = subprocess.Popen([sys.executable, "-m", "bench.bench_srtp", "--sip-client", str(port), str(n),
                                 str(window + 3.0), "1" if use_srtp else "0"], cwd=ROOT, stdout=subprocess.PIPE,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=_nice)
        time.sleep(ramp)
        p = psutil.Process(gw.pid)
        lp = psutil.Process(load.pid)
        c0, l0, t0 = p.cpu_times(), sum(lp.cpu_times()[:2]), time.monotonic()
        time.sleep(window)
        c1, l1, t1 = p.cpu_times(), sum(lp.cpu_times()[:2]), time.monotonic()
        stats = request_sync(info["inbox"], Command(name="stats"), 5).data
        out, _ = load.communicate(timeout=ramp + window + 30)
        counts = orjson.loads(out.strip().splitlines()[-1])
        cpu = ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)
        user = (c1.user - c0.user) / (t1 - t0)
        active = stats["calls_active"]
        refused = sum(stats.get(f"sip_srtp_{r}", 0) for r in srtp.DROP_REASONS)
        return {"calls": active, "cpu_per_call_pct": 100.0 * cpu / max(1, active), "cpu_total_pct": 100.0 * cpu,
                "user_pct": 100.0 * user,
                "loadgen_cpu_pct": 100.0 * (l1 - l0) / (t1 - t0), "load_avg": os.getloadavg()[0],
                "srtp_sessions": stats.get("sip_srtp_sessions", 0), "srtp_refused": refused,
                "answered": counts["answered"], "rx_bad": counts["rx_bad"], "rx_ok": counts["rx_ok"],
                "packets_in": stats["call_packets_in_total"]}
    finally:
        if load is not None and load.poll() is None:
            os.kill(load.pid, signal.SIGKILL)
            load.wait(5)
        stop_proc(gw)
        agent.close()
        for seg in Path("/dev/shm").glob(f"brisvox.{instance}.*"):
            seg.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    for name, ns in per_packet(2000 if quick else 20000).items():
        rows.append((f"per packet (172 B RTP): {name}", round(ns), "ns", ""))
    n = 10 if quick else int(os.environ.get("BRISVOX_BENCH_SRTP_CALLS", "50"))
    window = 3.0 if quick else 10.0
    results = {}
    for use_srtp in (False, True):
        m = measure(n, window, use_srtp)
        results[use_srtp] = m
        label = f"{n} calls, {'SRTP' if use_srtp else 'RTP'}"
        rows += [
            (f"{label}: calls live in the window", m["calls"], "calls", str(n)),
            (f"{label}: gateway CPU per call", round(m["cpu_per_call_pct"], 3), "% core", ""),
            (f"{label}: gateway CPU total", round(m["cpu_total_pct"], 1), "% core", ""),
            (f"{label}: ... of it in user space", round(m["user_pct"], 1), "% core", ""),
            (f"{label}: caller process CPU (niced)", round(m["loadgen_cpu_pct"], 1), "% core", ""),
            (f"{label}: machine load average (1 min)", round(m["load_avg"], 2), "", ""),
            (f"{label}: SRTP sessions / packets refused", f"{m['srtp_sessions']} / {m['srtp_refused']}", "",
             f"{n if use_srtp else 0} / 0"),
            (f"{label}: packets back the caller read (whole run)", m["rx_ok"], "", ""),
            (f"{label}: packets back the caller could not read", m["rx_bad"], "", "0"),
        ]
    off, on = results[False], results[True]
    if off["calls"] and on["calls"]:
        rows.append((f"{n} calls: SRTP's added gateway CPU per call",
                     round(on["cpu_per_call_pct"] - off["cpu_per_call_pct"], 3), "% core", ""))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--sip-client":
        sip_client_main(sys.argv[2:])
    else:
        for row in run(quick="--quick" in sys.argv):
            print(row)
