"""The fleet's callers and probes: SIPp runs through Kamailio, Twilio and SIP clients, OPTIONS and /healthz.

* :class:`SippRun` -- one SIPp process (``bench.harness.sipp.routed_call``: the
  in-dialog requests follow the Record-Route set through the proxy) in the
  background; its result is read from SIPp's statistics file (successful and
  failed calls, failures by kind) and its exit code.
* :func:`call` -- one held call with the project's own clients
  (:class:`brisvox.client.twilio.TwilioTransport`,
  :class:`brisvox.client.sip.SipTransport`): speak the recorded question once,
  keep the line open with silence until ``hold_s``, then hang up (Twilio
  ``stop`` / SIP BYE). It keeps who ended the call (the caller, or the server
  first: a server hang-up or a close), the setup time, the turn latency
  (caller stopped -> first loud bot audio) and the protocol ids (to find the
  call record and so the instance that served it).
* :func:`options` / :func:`healthz` -- one SIP OPTIONS (UDP) or one
  ``GET /healthz`` (HTTP/1.1) to an instance, its status code.

Invariants: every await and every socket read is bounded; a call never
raises (an error is its result); every SIPp process is stopped by its pid.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import sipp as S
from bench.harness.call_daemon import SPEECH
from brisvox.client.sip import SipTransport
from brisvox.client.speech import is_loud, read_wav
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport
from brisvox.wire.g711 import ulaw_encode

RATE = 8000
FRAME = RATE // 50
LEAD_S = 0.3


def speech() -> np.ndarray:
    """The recorded question every caller speaks (8 kHz int16)."""
    return read_wav(SPEECH, RATE)


def ulaw_file(tmp: Path) -> Path:
    """The question as raw mu-law in whole 20 ms packets (SIPp's rtp_stream)."""
    path = tmp / "question.ulaw"
    if not path.exists():
        x = speech()
        path.write_bytes(ulaw_encode(x[: len(x) // FRAME * FRAME]))
    return path


# -- SIPp --------------------------------------------------------------------------------------

@dataclass
class SippResult:
    returncode: int | None
    successful: int
    failed: int
    failures: dict[str, int]  # SIPp's Failed* counters that are not zero
    tail: str  # the end of SIPp's output and error log, for a message

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.returncode == 0


class SippRun:
    """``calls`` SIPp calls at ``rate``/s to ``target`` (Kamailio), each held ``hold_ms``."""

    def __init__(self, tmp: Path, label: str, target: str, ulaw: Path, *, calls: int, hold_ms: int,
                 rate: float = 10.0, local_port: int, media_port: int, service: str = "fleet",
                 timeout_s: int = 90) -> None:
        self.tmp = tmp / f"sipp-{label}"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.label, self.calls, self.timeout_s = label, calls, timeout_s
        scen = self.tmp / "scenario.xml"
        scen.write_text(S.routed_call(ulaw, hold_ms))
        self.stat = self.tmp / "stat.csv"
        self.err = self.tmp / "errors.log"
        self.args = ["sipp", "-sf", str(scen), "-m", str(calls), "-l", str(calls), "-r", f"{rate:g}", "-rp", "1000",
                     "-s", service, target, "-i", "127.0.0.1", "-p", str(local_port), "-mi", "127.0.0.1",
                     "-mp", str(media_port), "-timeout", f"{timeout_s}s", "-timeout_error", "-nostdin",
                     "-trace_stat", "-stf", str(self.stat), "-fd", "1", "-trace_err", "-error_file", str(self.err)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.t_start = 0.0

    def start(self) -> SippRun:
        self._out = open(self.tmp / "stdout.log", "wb")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.args, cwd=self.tmp, stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def wait(self, timeout: float | None = None) -> SippResult:
        assert self.proc is not None
        try:
            rc: int | None = self.proc.wait(timeout if timeout is not None else self.timeout_s + 15)
        except subprocess.TimeoutExpired:
            self.stop()
            rc = None
        self._out.close()
        return self.result(rc)

    def result(self, rc: int | None) -> SippResult:
        successful = failed = 0
        failures: dict[str, int] = {}
        try:
            rows = [r for r in self.stat.read_text(errors="replace").splitlines() if r.strip()]
        except OSError:
            rows = []
        if len(rows) >= 2:
            head, last = rows[0].split(";"), rows[-1].split(";")
            vals = dict(zip(head, last, strict=False))

            def num(k: str) -> int:
                try:
                    return int(vals.get(k, "0") or 0)
                except ValueError:
                    return 0
            successful, failed = num("SuccessfulCall(C)"), num("FailedCall(C)")
            failures = {k[6:-3]: num(k) for k in head if k.startswith("Failed") and k.endswith("(C)")
                        and k != "FailedCall(C)" and num(k)}
        tail = ""
        for p in (self.tmp / "stdout.log", self.err):
            try:
                tail += f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}\n"
            except OSError:
                pass
        return SippResult(rc, successful, failed, failures, tail)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(3)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue


# -- one held call with the project's clients ----------------------------------------------------

@dataclass
class CallResult:
    idx: int
    transport: str  # twilio | sip
    url: str
    t_start: float = 0.0
    t_open: float | None = None  # Twilio: connected and start sent; SIP: 200 OK received
    t_end: float | None = None
    ended_by: str = ""  # client | server | error
    end_reason: str = ""
    latency_ms: float | None = None  # caller stopped -> first loud bot audio
    ids: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def setup_ms(self) -> float | None:
        return None if self.t_open is None else (self.t_open - self.t_start) * 1000.0

    @property
    def normal(self) -> bool:
        """Placed and ended by the caller (no server hang-up, no error)."""
        return self.ended_by == "client" and not self.error

    @property
    def answered(self) -> bool:
        """Normal, and the bot's answer was heard."""
        return self.normal and self.latency_ms is not None


def make_transport(transport: str, url: str, idx: int) -> Any:
    if transport == "twilio":
        return TwilioTransport(url, tag=f"fleet{idx}")
    return SipTransport(url, codecs=("PCMU",), answer_timeout=15.0, response_timeout=5.0)


async def call(transport: str, url: str, idx: int, hold_s: float, line: np.ndarray, delay: float = 0.0) -> CallResult:
    """One held call (module docstring); never raises."""
    await asyncio.sleep(delay)
    res = CallResult(idx, transport, url, t_start=time.monotonic())
    state: dict[str, float | None] = {"speech_end": None}

    def on_audio(pcm: np.ndarray, now: float) -> None:
        end = state["speech_end"]
        if end is not None and res.latency_ms is None and is_loud(pcm):
            res.latency_ms = (now - end) * 1000.0

    def on_end(reason: str, now: float) -> None:
        if not res.ended_by:
            res.ended_by, res.end_reason, res.t_end = "server", reason, now

    tr = make_transport(transport, url, idx)
    try:
        await asyncio.wait_for(tr.open(BotEvents(on_audio=on_audio, on_end=on_end)), 20.0)
    except Exception as e:  # noqa: BLE001 - a refused call is a result
        res.ended_by, res.error, res.t_end = "error", f"open: {type(e).__name__}: {e}", time.monotonic()
        try:
            await tr.close()
        except Exception:  # noqa: BLE001
            pass
        return res
    res.t_open = time.monotonic()
    res.ids = dict(tr.ids)
    silence = np.zeros(FRAME, dtype=np.int16)
    lead = int(LEAD_S * 50)
    frames = [line[i:i + FRAME] for i in range(0, len(line) - FRAME + 1, FRAME)]
    loud = [i for i, f in enumerate(frames) if is_loud(f)]
    last_loud = lead + (loud[-1] if loud else len(frames) - 1)
    try:
        i = 0
        next_t = time.monotonic()
        while not res.ended_by and time.monotonic() - res.t_open < hold_s:
            k = i - lead
            await tr.send_audio(frames[k] if 0 <= k < len(frames) else silence)
            if i == last_loud:
                state["speech_end"] = time.monotonic()
            i += 1
            next_t += 0.02
            if next_t < time.monotonic() - 0.2:
                next_t = time.monotonic()
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
        if not res.ended_by:
            res.ended_by, res.end_reason, res.t_end = "client", "hung up", time.monotonic()
    except Exception as e:  # noqa: BLE001
        res.error = f"{type(e).__name__}: {e}"
    finally:
        try:
            await asyncio.wait_for(tr.close(), 10.0)
        except Exception as e:  # noqa: BLE001
            res.error = res.error or f"close: {type(e).__name__}"
    return res


async def calls(specs: list[tuple[str, str, float, float]], line: np.ndarray, first_idx: int = 0) -> list[CallResult]:
    """``(transport, url, hold_s, delay)`` each, all at once."""
    return list(await asyncio.gather(*(call(t, u, first_idx + i, h, line, d)
                                       for i, (t, u, h, d) in enumerate(specs))))


# -- probes ------------------------------------------------------------------------------------

def options(host: str, port: int, timeout: float = 0.5) -> int | None:
    """One SIP OPTIONS to ``host:port``; the response's status, None without an answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        lport = s.getsockname()[1]
        n = time.monotonic_ns()
        msg = (f"OPTIONS sip:{host}:{port} SIP/2.0\r\n"
               f"Via: SIP/2.0/UDP 127.0.0.1:{lport};branch=z9hG4bKfleet{n};rport\r\n"
               f"From: <sip:probe@127.0.0.1>;tag=p{n}\r\nTo: <sip:{host}:{port}>\r\n"
               f"Call-ID: probe{n}@fleet\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
        s.settimeout(timeout)
        s.sendto(msg.encode(), (host, port))
        try:
            data = s.recv(65535)
        except (TimeoutError, OSError):
            return None
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def healthz(host: str, port: int, timeout: float = 1.0) -> tuple[int | None, str]:
    """``GET /healthz`` on an instance's WebSocket port: (status, body); (None, why) when it fails."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/healthz", headers={"Host": f"{host}:{port}"})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None
