"""The SBC layout on loopback: rtpengine and Kamailio from ``deploy/sbc``, brisvoxd behind them, baresip callers.

Used by ``tests/system/test_sbc.py``. Addresses: the caller is 127.0.0.1, the
SBC's public side (Kamailio's TLS socket, rtpengine's ``pub`` interface)
:data:`PUB`, its private side (Kamailio's UDP socket, rtpengine's ``priv``)
:data:`PRIV`, brisvoxd :data:`BRISVOX`; ports are free ones.

* :class:`Rtpengine` runs the SHIPPED ``deploy/sbc/rtpengine.conf`` with the
  test's interfaces, control port and port range given on the command line
  (rtpengine lets the command line override the file); ready when its ng
  control socket answers a ``ping``.
* :class:`Sbc` runs the SHIPPED ``deploy/sbc/kamailio.cfg`` with ``-A``
  defines (sockets, paths, realm, probing interval) and ``WITH_SIPDUMP``; its
  ``tls.cfg`` is the shipped file with the test certificate's paths
  substituted, its db_text directory the shipped tables' headers with the
  test's rows. :meth:`Sbc.dumped` reads back every SIP message it received or
  sent (sipdump's text files), :meth:`Sbc.rpc` is kamcmd on its ctl socket.
* :class:`Baresip` is one baresip process (aufile source, sndfile dumps of
  what it sent and received, no jitter buffer, SRTP module, ctrl_tcp) driven
  over its JSON control socket; :class:`DumpClock` polls the two dump files'
  sizes every millisecond, so each sample sent or received gets the
  ``time.monotonic()`` at which baresip wrote it (encoded it for sending,
  decoded it on arrival). :func:`run_call` places the scripted call
  (:func:`caller_wav`: question, barge-in; then the keys 1 2 3 #) and
  returns its :class:`CallTimes`, whose ``figures`` are the turn latencies
  the caller lived.
* :func:`brisvox_config`: one brisvoxd on :data:`BRISVOX` with the scripted
  agent (:data:`SCRIPT`); :func:`routed_callee`: a SIPp callee that follows
  a Record-Route set; :func:`relay_probe`: one rtpengine hop timed per packet
  (its own ng session, :func:`bencode`).

Invariants: every process is started in its own session and stopped by its
process group in ``close`` (SIGTERM, then SIGKILL), whatever happened; every
wait is bounded; nothing binds outside 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[2]
SBC_DIR = ROOT / "deploy" / "sbc"
KAMAILIO_CFG = SBC_DIR / "kamailio.cfg"
RTPENGINE_CONF = SBC_DIR / "rtpengine.conf"
PUB = "127.0.0.20"
PRIV = "127.0.0.21"
BRISVOX = "127.0.0.22"
CALLER = "127.0.0.1"
REALM = "sbc.test"
RATE = 8000


def exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def missing() -> list[str]:
    """The programs and modules the SBC test needs that are not installed (empty: all there)."""
    need = {"kamailio": "kamailio", "kamcmd": "kamailio", "rtpengine": "rtpengine-daemon", "baresip": "baresip-core",
            "openssl": "openssl", "sipp": "sip-tester"}
    out = [f"{x} (apt package {pkg})" for x, pkg in need.items() if shutil.which(x) is None and
           not Path("/usr/sbin", x).exists()]
    if not list(Path("/usr/lib").glob("*/kamailio/modules/tls.so")):
        out.append("Kamailio's tls module (apt package kamailio-tls-modules)")
    if not Path("/usr/lib/baresip/modules/srtp.so").exists():
        out.append("baresip's srtp module (apt package baresip-core)")
    return out


def stop_group(proc: subprocess.Popen[bytes] | None, timeout: float = 3.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL whatever of it is left."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived its leader
                return


def wait_until(pred: Any, timeout: float, what: str, step: float = 0.05) -> float:
    """Poll ``pred`` until truthy (seconds it took); an AssertionError it raises ends the wait."""
    t0 = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - t0
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - a probe that cannot answer yet is "not yet"
            pass
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(step)


def make_cert(tmp: Path, ip: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``ip`` (its subjectAltName) and its key."""
    cert, key = tmp / f"cert-{ip}.pem", tmp / f"key-{ip}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ip}",
                    "-addext", f"subjectAltName=IP:{ip}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class _Proc:
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path

    def log(self, tail: int = 4000) -> str:
        """The end of the process's output (``tail`` characters)."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def close(self) -> None:
        stop_group(self.proc)
        self.proc = None


# -- rtpengine -----------------------------------------------------------------------------------

class Rtpengine(_Proc):
    """``deploy/sbc/rtpengine.conf`` with the test's interfaces, ng port and port range."""

    def __init__(self, tmp: Path, ng_port: int, ports: tuple[int, int]) -> None:
        self.tmp, self.ng_port, self.ports = tmp, ng_port, ports
        self.log_path = tmp / "rtpengine.log"

    def args(self) -> list[str]:
        return [exe("rtpengine"), f"--config-file={RTPENGINE_CONF}", "--foreground", "--log-stderr",
                f"--interface=pub/{PUB}", f"--interface=priv/{PRIV}", f"--listen-ng=127.0.0.1:{self.ng_port}",
                f"--port-min={self.ports[0]}", f"--port-max={self.ports[1]}", "--num-threads=2",
                "--media-num-threads=0", f"--pidfile={self.tmp / 'rtpengine.pid'}"]

    def start(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                         start_new_session=True)
        wait_until(lambda: self.ng({"command": "ping"}).get("result") == "pong", 10,
                   f"rtpengine's ng socket to answer ping\n{self.log()}")

    def ng(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One ng command (bencode over UDP, :func:`bencode`) and its reply, decoded."""
        assert self.proc is not None and self.proc.poll() is None, self.log()
        cookie = f"t{time.monotonic_ns()}".encode()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1.0)
            s.sendto(cookie + b" " + bencode(msg), ("127.0.0.1", self.ng_port))
            data = s.recv(65535)
        reply, _ = bdecode(data.partition(b" ")[2])
        assert isinstance(reply, dict), reply
        return reply


def bencode(v: Any) -> bytes:
    """rtpengine's ng encoding: str/bytes, int, list, dict (keys sorted)."""
    if isinstance(v, str):
        v = v.encode()
    if isinstance(v, bytes):
        return str(len(v)).encode() + b":" + v
    if isinstance(v, int):
        return f"i{v}e".encode()
    if isinstance(v, list):
        return b"l" + b"".join(bencode(x) for x in v) + b"e"
    if isinstance(v, dict):
        return b"d" + b"".join(bencode(k) + bencode(v[k]) for k in sorted(v)) + b"e"
    raise TypeError(type(v))


def bdecode(b: bytes, i: int = 0) -> tuple[Any, int]:
    """One bencoded value from ``b[i:]`` (strings as str) and the index after it."""
    c = b[i:i + 1]
    if c == b"i":
        end = b.index(b"e", i)
        return int(b[i + 1:end]), end + 1
    if c in (b"l", b"d"):
        i += 1
        items = []
        while b[i:i + 1] != b"e":
            x, i = bdecode(b, i)
            items.append(x)
        return (dict(zip(items[::2], items[1::2], strict=True)) if c == b"d" else items), i + 1
    colon = b.index(b":", i)
    n = int(b[i:colon])
    return b[colon + 1:colon + 1 + n].decode(errors="replace"), colon + 1 + n


def _sdp(port: int, proto: str, crypto: str = "") -> str:
    return (f"v=0\r\no=- 1 1 IN IP4 {CALLER}\r\ns=-\r\nc=IN IP4 {CALLER}\r\nt=0 0\r\n"
            f"m=audio {port} {proto} 0\r\na=rtpmap:0 PCMU/8000\r\n{crypto}a=sendrecv\r\n")


def _media_port(sdp: str) -> int:
    m = re.search(r"^m=audio (\d+) ", sdp, re.M)
    assert m, sdp
    return int(m.group(1))


def relay_probe(rtpe: Rtpengine, n: int = 400, step_s: float = 0.001) -> dict[str, dict[str, float]]:
    """What one rtpengine hop costs a packet: ``n`` RTP packets (PCMU, 20 ms) each way through a
    session set up with the SBC's flags, every one timestamped at its send and its arrival in
    this process, against the same sockets talking straight to each other. Keys: ``no relay``,
    ``pub->priv``, ``priv->pub``, ``priv->pub SRTP`` (the public leg RTP/SAVP: rtpengine encrypts
    and authenticates each packet); values: ``p50_us``, ``p99_us``, ``got`` (fraction arrived),
    ``grew`` (bytes added per packet: the SRTP auth tag)."""
    import base64
    import secrets as sec
    import statistics

    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the caller's side
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # brisvox's side
    out: dict[str, dict[str, float]] = {}
    try:
        for s in (a, b):
            s.bind((CALLER, 0))
            s.settimeout(0.5)
        pa, pb = a.getsockname()[1], b.getsockname()[1]

        def session(call: str, srtp: bool) -> tuple[int, int]:
            crypto = (f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:"
                      f"{base64.b64encode(sec.token_bytes(30)).decode()}\r\n") if srtp else ""
            flags = {"ICE": "remove", "replace": ["origin", "session-connection"], "flags": ["trust-address"]}
            off = rtpe.ng({"command": "offer", "call-id": call, "from-tag": "a", "direction": ["pub", "priv"],
                           "transport-protocol": "RTP/AVP", "sdp": _sdp(pa, "RTP/SAVP" if srtp else "RTP/AVP", crypto),
                           **flags})
            ans = rtpe.ng({"command": "answer", "call-id": call, "from-tag": "a", "to-tag": "b",
                           "sdp": _sdp(pb, "RTP/AVP"), **flags})
            assert off.get("result") == "ok" and ans.get("result") == "ok", (off, ans)
            # the offer as brisvox gets it names rtpengine's priv port, the answer as the caller gets it its pub port
            return _media_port(off["sdp"]), _media_port(ans["sdp"])

        def run(src: socket.socket, dst: socket.socket, to: tuple[str, int]) -> dict[str, float]:
            sent: dict[int, float] = {}
            got: dict[int, float] = {}
            sizes: list[int] = []
            done = threading.Event()

            def receive() -> None:
                dst.settimeout(0.05)
                while not done.is_set():
                    try:
                        data = dst.recv(2048)
                    except TimeoutError:
                        continue
                    got[int.from_bytes(data[2:4], "big")] = time.monotonic()
                    sizes.append(len(data))

            th = threading.Thread(target=receive, name="relay-probe", daemon=True)
            th.start()
            ssrc = sec.randbits(32)
            for seq in range(n):
                pkt = bytes([0x80, 0]) + seq.to_bytes(2, "big") + (seq * 160).to_bytes(4, "big") + \
                    ssrc.to_bytes(4, "big") + b"\xff" * 160
                sent[seq] = time.monotonic()
                src.sendto(pkt, to)
                time.sleep(step_s)
            time.sleep(0.2)
            done.set()
            th.join(2)
            d = sorted((got[k] - sent[k]) * 1e6 for k in got if k in sent)
            return {"p50_us": statistics.median(d) if d else float("nan"),
                    "p99_us": d[max(0, int(len(d) * 0.99) - 1)] if d else float("nan"), "got": len(d) / n,
                    "grew": (statistics.median(sizes) - 172) if sizes else float("nan")}

        out["no relay"] = run(b, a, (CALLER, pa))
        priv, pub = session("probe-plain", srtp=False)
        out["pub->priv"] = run(a, b, (PUB, pub))
        out["priv->pub"] = run(b, a, (PRIV, priv))
        rtpe.ng({"command": "delete", "call-id": "probe-plain", "from-tag": "a"})
        priv, pub = session("probe-srtp", srtp=True)
        out["priv->pub SRTP"] = run(b, a, (PRIV, priv))
        rtpe.ng({"command": "delete", "call-id": "probe-srtp", "from-tag": "a"})
    finally:
        a.close()
        b.close()
    return out


# -- Kamailio --------------------------------------------------------------------------------------

DB_TABLES = ("version", "subscriber", "uacreg", "address")


@dataclass
class SbcAccounts:
    """The rows the test's db_text directory holds: caller ``user``/``password`` (its HA1 in
    ``subscriber``), the trunk's registration (``uacreg``) and its source address (``address``)."""

    user: str = "alice"
    password: str = "sbc-caller-secret"
    trunk_user: str = "1001"
    trunk_realm: str = "kamailio.test"
    trunk_password: str = ""
    trunk_proxy: str = ""  # sip:host:port;transport=tls; "" = no uacreg row
    trunk_host: str = ""  # its signalling address, admitted without digest


def ha1(user: str, realm: str, password: str) -> str:
    import hashlib

    return hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()  # noqa: S324 - RFC 2617 HA1


def _esc(value: str) -> str:
    """A db_text field: ``:`` and ``\\`` escaped."""
    return value.replace("\\", "\\\\").replace(":", "\\:")


class Sbc(_Proc):
    """``deploy/sbc/kamailio.cfg`` with the test's sockets and files (module docstring)."""

    def __init__(self, tmp: Path, tls_port: int, udp_port: int, ng_port: int, dests: dict[str, str],
                 cert: tuple[Path, Path], ca: Path, accounts: SbcAccounts) -> None:
        self.tmp, self.tls_port, self.udp_port, self.ng_port = tmp, tls_port, udp_port, ng_port
        self.dests, self.cert, self.ca, self.accounts = dests, cert, ca, accounts
        self.ctl = tmp / "ctl"
        self.dump_dir = tmp / "sipdump"
        self.log_path = tmp / "kamailio.log"

    def _files(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.dump_dir.mkdir(exist_ok=True)
        tls = (SBC_DIR / "tls.cfg").read_text()
        tls = tls.replace("/etc/kamailio/sbc/tls/sbc-key.pem", str(self.cert[1]))
        tls = tls.replace("/etc/kamailio/sbc/tls/sbc-cert.pem", str(self.cert[0]))
        tls = tls.replace("/etc/ssl/certs/ca-certificates.crt", str(self.ca))
        (self.tmp / "tls.cfg").write_text(tls)
        db = self.tmp / "db"
        db.mkdir(exist_ok=True)
        a = self.accounts
        rows = {"version": [ln for ln in (SBC_DIR / "db" / "version").read_text().splitlines()[1:] if ln.strip()],
                "subscriber": [f"1:{a.user}:{REALM}::{ha1(a.user, REALM, a.password)}:"],
                "uacreg": [], "address": []}
        if a.trunk_proxy:
            rows["uacreg"].append(":".join(["1", "trunk", "trunk", REALM, a.trunk_user, a.trunk_realm, a.trunk_realm,
                                            a.trunk_user, "", ha1(a.trunk_user, a.trunk_realm, a.trunk_password),
                                            _esc(a.trunk_proxy), "60", "0", "0", "",
                                            _esc(f"tls:{PUB}:{self.tls_port}")]))
        if a.trunk_host:
            rows["address"].append(f"1:1:{a.trunk_host}:32:0:trunk")
        for t in DB_TABLES:
            head = (SBC_DIR / "db" / t).read_text().splitlines()[0]  # the shipped schema
            (db / t).write_text("\n".join([head, *rows[t]]) + "\n")
        (self.tmp / "dispatcher.list").write_text(
            "".join(f"1 {uri} 0 0 duid={name}\n" for name, uri in self.dests.items()))

    def args(self) -> list[str]:
        return [exe("kamailio"), "-DD", "-E", "-f", str(KAMAILIO_CFG),
                "-A", f"PUBLIC_LISTEN=tls:{PUB}:{self.tls_port}", "-A", f"PRIVATE_LISTEN=udp:{PRIV}:{self.udp_port}",
                "-A", f'TLS_CFG="{self.tmp / "tls.cfg"}"', "-A", f'DB_URL="text://{self.tmp / "db"}"',
                "-A", f'DS_LIST="{self.tmp / "dispatcher.list"}"', "-A", f'CTL_SOCKET="unix:{self.ctl}"',
                "-A", f'RTPENGINE_SOCK="udp:127.0.0.1:{self.ng_port}"', "-A", f'REALM="{REALM}"',
                "-A", f'UAC_CONTACT="{PUB}:{self.tls_port};transport=tls"', "-A", "UAC_TIMER=2",
                "-A", f'PING_FROM="sip:sbc@{PRIV}"', "-A", "PING_INTERVAL=1",
                "-A", "CHILDREN=2", "-A", "TCP_CHILDREN=2",
                "-A", "WITH_SIPDUMP", "-A", f'SIPDUMP_DIR="{self.dump_dir}"',
                "-P", str(self.tmp / "kamailio.pid"), "-Y", str(self.tmp), "-w", str(self.tmp), "-m", "48", "-M", "8"]

    def start(self) -> None:
        self._files()
        check = subprocess.run([*self.args(), "-c"], capture_output=True, text=True, timeout=20)
        if check.returncode != 0:
            raise RuntimeError(f"kamailio -c refused {KAMAILIO_CFG}:\n{check.stdout[-3000:]}{check.stderr[-3000:]}")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                         start_new_session=True)
        wait_until(lambda: self.dispatcher(), 15, f"Kamailio's ctl socket\n{self.log()}")

    def rpc(self, *cmd: str) -> str:
        r = subprocess.run([exe("kamcmd"), "-s", f"unix:{self.ctl}", *cmd], capture_output=True, text=True, timeout=5)
        if r.returncode != 0:
            raise RuntimeError(f"kamcmd {' '.join(cmd)}: {r.stderr.strip()[:300]}")
        return r.stdout

    def dispatcher(self) -> dict[str, str]:
        """Destination URI -> dispatcher flags (``AP`` active and probed, ``IP`` inactive)."""
        out = self.rpc("dispatcher.list")
        return dict(zip(re.findall(r"URI:\s*(\S+)", out), re.findall(r"FLAGS:\s*(\S+)", out), strict=True))

    def active(self, uri: str) -> bool:
        return self.dispatcher().get(uri, "").startswith("A")

    def dumped(self) -> list[Dumped]:
        """Every SIP message sipdump wrote so far, in order."""
        out: list[Dumped] = []
        for path in sorted(self.dump_dir.glob("*.data")):
            text = path.read_text(errors="replace")
            for entry in text.split("====================")[1:]:
                meta, _, msg = entry.partition("~~~~~~~~~~~~~~~~~~~~")
                kv = dict(re.findall(r"^(\w+): (.*)$", meta, re.M))
                out.append(Dumped(kv.get("tag", ""), kv.get("dstip", ""), int(kv.get("dstport", "0") or 0),
                                  kv.get("srcip", ""), msg.split("||||||||||||||||||||")[0].strip("\r\n")))
        return out


@dataclass(frozen=True)
class Dumped:
    tag: str  # rcv | snd
    dst_ip: str
    dst_port: int
    src_ip: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0].strip()

    @property
    def body(self) -> str:
        return self.text.replace("\r\n", "\n").split("\n\n", 1)[1] if "\n\n" in self.text.replace("\r\n", "\n") else ""

    def header(self, name: str) -> str:
        m = re.search(rf"^{name}:\s*(.*)$", self.text, re.M | re.I)
        return m.group(1).strip() if m else ""


# -- baresip ---------------------------------------------------------------------------------------

def netstring(data: bytes) -> bytes:
    return str(len(data)).encode() + b":" + data + b","


class DumpClock:
    """Polls the sizes of baresip's sndfile dumps every ``step`` s on a thread: each size change
    with its ``time.monotonic()``, so :meth:`when` gives the time sample ``i`` was written."""

    def __init__(self, folder: Path, step: float = 0.001) -> None:
        self.folder, self.step = folder, step
        self.samples: dict[str, list[tuple[float, int]]] = {"enc": [], "dec": []}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dump-clock", daemon=True)
        self.thread.start()

    def path(self, kind: str) -> Path | None:
        found = sorted(self.folder.glob(f"dump-*-{kind}.wav"))
        return found[-1] if found else None

    def _run(self) -> None:
        paths: dict[str, Path | None] = {"enc": None, "dec": None}
        last = {"enc": -1, "dec": -1}
        while not self._stop.is_set():
            for kind in ("enc", "dec"):
                if paths[kind] is None:
                    paths[kind] = self.path(kind)
                p = paths[kind]
                if p is None:
                    continue
                try:
                    size = p.stat().st_size
                except OSError:
                    continue
                if size != last[kind]:
                    last[kind] = size
                    self.samples[kind].append((time.monotonic(), size))
            time.sleep(self.step)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2)

    def audio(self, kind: str) -> np.ndarray:
        import soundfile as sf

        p = self.path(kind)
        if p is None:
            return np.zeros(0, np.int16)
        x, _ = sf.read(str(p), dtype="int16")
        return np.asarray(x, dtype=np.int16)

    def frame_times(self, kind: str, frame: int = 160) -> tuple[np.ndarray, np.ndarray]:
        """The ``kind`` dump as whole frames and, per frame, the time its last sample was
        written (NaN: not seen by the poller)."""
        x = self.audio(kind)
        p = self.path(kind)
        n = len(x) // frame
        if p is None or n == 0:
            return np.zeros((0, frame), np.int16), np.zeros(0)
        header = p.stat().st_size - 2 * len(x)
        ts = np.array([t for t, _ in self.samples[kind]])
        sizes = np.array([s for _, s in self.samples[kind]])
        need = header + 2 * frame * (np.arange(n) + 1)
        idx = np.searchsorted(sizes, need)  # the first size that holds the frame
        times = np.where(idx < len(ts), ts[np.minimum(idx, len(ts) - 1)], np.nan)
        return x[: n * frame].reshape(n, frame), times

    def bursts(self, kind: str, gap_s: float = 0.3) -> list[tuple[float, float]]:
        """The loud stretches of the ``kind`` dump as (first loud frame written, last loud frame
        written): loud frames less than ``gap_s`` apart in time are one stretch. Time, not sample
        count, separates them: brisvox sends no RTP between utterances."""
        from brisvox.client.speech import is_loud

        frames, times = self.frame_times(kind)
        out: list[list[float]] = []
        for f, t in zip(frames, times, strict=True):
            if np.isnan(t) or not is_loud(f):
                continue
            if out and t - out[-1][1] <= gap_s:
                out[-1][1] = float(t)
            else:
                out.append([float(t), float(t)])
        return [(a, b) for a, b in out]


@dataclass
class Baresip(_Proc):
    """One baresip caller (module docstring). ``account`` is its accounts line; its audio source
    is ``wav`` (8 kHz mono), played once from the moment the call is established."""

    tmp: Path
    account: str
    wav: Path
    ca: Path | None = None
    sip_port: int = 0
    ctrl_port: int = 0
    rtp_ports: tuple[int, int] = (0, 0)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_path = self.tmp / "baresip.log"
        self.snd = self.tmp / "snd"
        self.sock: socket.socket | None = None
        self.clock: DumpClock | None = None
        self._reader: threading.Thread | None = None
        self._buf = b""

    def config(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.snd.mkdir(exist_ok=True)
        (self.tmp / "config").write_text(f"""poll_method epoll
sip_listen {CALLER}:{self.sip_port}
{f"sip_cafile {self.ca}" if self.ca else ""}
audio_player aubridge,nowhere
audio_source aufile,{self.wav}
audio_alert aubridge,nowhere
audio_srate 8000
audio_channels 1
audio_buffer 20-160
rtp_ports {self.rtp_ports[0]}-{self.rtp_ports[1]}
jitter_buffer_delay 0-0
net_interface {CALLER}
snd_path {self.snd}
ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}
module_path /usr/lib/baresip/modules
module g711.so
module aufile.so
module aubridge.so
module sndfile.so
module srtp.so
module_app account.so
module_app menu.so
module_app ctrl_tcp.so
""")
        (self.tmp / "accounts").write_text(self.account + "\n")

    def start(self) -> None:
        self.config()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([exe("baresip"), "-f", str(self.tmp)], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.tmp, start_new_session=True)

        def connect() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"baresip exited ({self.proc.returncode}):\n{self.log()}")
            self.sock = socket.create_connection(("127.0.0.1", self.ctrl_port), timeout=0.5)
            return True

        wait_until(connect, 10, f"baresip's ctrl_tcp socket\n{self.log()}")
        assert self.sock is not None
        self.sock.settimeout(0.2)
        self._reader = threading.Thread(target=self._read, name="baresip-ctrl", daemon=True)
        self._reader.start()
        self.clock = DumpClock(self.snd)

    def _read(self) -> None:
        while self.sock is not None:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self._buf += data
            while True:
                head, sep, rest = self._buf.partition(b":")
                if not sep or not head.isdigit() or len(rest) < int(head) + 1:
                    break
                n = int(head)
                with contextlib.suppress(ValueError):
                    self.events.append((time.monotonic(), orjson.loads(rest[:n])))
                self._buf = rest[n + 1:]

    def command(self, command: str, params: str = "") -> None:
        assert self.sock is not None
        self.sock.sendall(netstring(orjson.dumps({"command": command, "params": params, "token": command})))

    def event_time(self, kind: str) -> float | None:
        return next((t for t, e in self.events if e.get("type") == kind), None)

    def wait_event(self, kind: str, timeout: float) -> float:
        wait_until(lambda: self.event_time(kind) is not None, timeout,
                   f"baresip event {kind} (events {[e.get('type') for _, e in self.events]})\n{self.log()}")
        t = self.event_time(kind)
        assert t is not None
        return t

    def close(self) -> None:
        if self.clock is not None:
            self.clock.stop()
        if self.sock is not None:
            sock, self.sock = self.sock, None
            with contextlib.suppress(OSError):
                sock.close()
        super().close()


# -- brisvoxd ----------------------------------------------------------------------------------------

# the agent's lines: the question's answer is long (the caller talks over it), the barge-in's short,
# the keypad entry's last
SCRIPT = {"user": ["what time do you close", "wait a moment"],
          "bot": ["Thank you for calling. Our kitchen is open until ten tonight and the bar stays open until "
                  "midnight, so there is plenty of time for dinner or a drink after work with your friends.",
                  "Sorry, go ahead please.", "Thank you, your code is noted."]}

INSTANCE = """
[gateway]
max_call_s = {max_call_s}  # brisvoxd hangs the scripted call up: its BYE goes back through the SBC
max_calls = 8
max_calls_per_source = 8
echo_use_workers = false
tts_rate = {tts_rate}

[sip]
host = "{host}"
port = {sip_port}
default_agent = "default"
rtp_port_min = {rtp_min}
rtp_port_max = {rtp_max}
# the SBC's private address; the test's own direct caller (the latency baseline) too
allow = ["{priv}/32", "{caller}/32"]
trusted_proxies = ["{priv}"]
options_rate = ["100/second"]

[websocket]
enabled = false

[smart_turn]
enabled = false

[agents]
providers = "scripted"
script = "{script}"
smart_turn = false
lead_margin_ms = 0
max_calls = 8

[calls]
path = "{records}"
"""


def brisvox_config(tmp: Path, sip_port: int, rtp: tuple[int, int]) -> Path:
    """A brisvoxd config: gateway, one worker (the real Silero VAD), one agent process with the
    scripted providers (:data:`SCRIPT`); SIP on :data:`BRISVOX` only, no WebSocket."""
    from bench.harness.daemon import FAST
    from brisvox.sim.ws_caller import TTS_RATE

    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / "script.json"
    script.write_bytes(orjson.dumps(SCRIPT))
    base = FAST.format(run=tmp / "run", state=tmp / "state", workers=1, agents=1).replace(
        'level = "info"', 'level = "warning"')
    path = tmp / "brisvoxd.toml"
    path.write_text(base + INSTANCE.format(max_call_s=MAX_CALL_S, tts_rate=TTS_RATE, host=BRISVOX, sip_port=sip_port, rtp_min=rtp[0],
                                           rtp_max=rtp[1], priv=PRIV, caller=CALLER, script=script,
                                           records=tmp / "records"))
    return path


# -- one scripted call, judged from the caller's dumps ------------------------------------------------

LEAD_S = 0.5  # silence before the question
BARGE_AFTER_S = 2.4  # silence between the question's clip and the barge-in clip (the answer starts ~1 s in)
TAIL_S = 9.0  # after the barge-in: the second answer, the keys, the keypad answer, brisvoxd's BYE
MAX_CALL_S = 16.5  # brisvoxd's [gateway] max_call_s: it hangs up after the keypad answer started, before the file ends
KEYS_AT_S = 12.5  # after the call is established (the second answer is over): 1, 2, 3, # (KEY_STEP_S apart)
KEY_STEP_S = 0.3


def caller_wav(tmp: Path, speech: np.ndarray) -> Path:
    """What every caller plays: silence, the question, silence, the question again (the barge-in)."""
    import soundfile as sf

    def sil(s: float) -> np.ndarray:
        return np.zeros(int(s * RATE), np.int16)

    path = tmp / "caller.wav"
    sf.write(str(path), np.concatenate([sil(LEAD_S), speech, sil(BARGE_AFTER_S), speech, sil(TAIL_S)]), RATE,
             subtype="PCM_16")
    return path


@dataclass
class CallTimes:
    """One call as the caller lived it (monotonic seconds): the loud stretches it sent (the
    question, the barge-in) and heard (the agent's answers), when the call was established and
    when it pressed ``#``."""

    established: float
    hash_at: float
    sent: list[tuple[float, float]]
    heard: list[tuple[float, float]]

    def figures(self) -> dict[str, float | None]:
        """turn_ms: question's end -> first answer heard; stop_ms: barge-in's start -> the first
        answer's audio stopped; turn2_ms: barge-in's end -> second answer heard; keypad_ms: ``#``
        -> the keypad answer heard. None when the stretch it needs is missing."""
        out: dict[str, float | None] = {"turn_ms": None, "stop_ms": None, "turn2_ms": None, "keypad_ms": None}
        if len(self.sent) < 2:
            return out
        q1 = self.sent[0][1]
        b0, b1 = self.sent[1]
        a1 = next((h for h in self.heard if h[0] > q1), None)
        if a1 is None:
            return out
        out["turn_ms"] = (a1[0] - q1) * 1000
        if a1[0] < b0 < a1[1] + 0.02:
            out["stop_ms"] = (a1[1] - b0) * 1000
        a2 = next((h for h in self.heard if h[0] > a1[1]), None)
        if a2 is not None:
            out["turn2_ms"] = (a2[0] - b1) * 1000
        a3 = next((h for h in self.heard if h[0] > self.hash_at), None)
        if a3 is not None:
            out["keypad_ms"] = (a3[0] - self.hash_at) * 1000
        return out


def run_call(b: Baresip, target: str, timeout: float = 40.0) -> CallTimes:
    """Dial ``target``, press 1 2 3 # at :data:`KEYS_AT_S`, wait for the call to end (brisvoxd's
    BYE at :data:`MAX_CALL_S`), then read the dumps."""
    b.command("dial", target)
    est = b.wait_event("CALL_ESTABLISHED", 10)
    time.sleep(max(0.0, est + KEYS_AT_S - time.monotonic()))
    hash_at = 0.0
    for key in "123#":
        b.command("sndcode", key)
        hash_at = time.monotonic()
        time.sleep(KEY_STEP_S)
    b.wait_event("CALL_CLOSED", timeout)
    time.sleep(0.1)
    assert b.clock is not None
    return CallTimes(est, hash_at, b.clock.bursts("enc"), b.clock.bursts("dec"))


def routed_callee(media_port: int, hold_ms: int) -> str:
    """A SIPp callee behind record-routing proxies: answers the INVITE 200 with SDP (echoing its
    Record-Route), takes the ACK, holds ``hold_ms``, then its BYE along the route set."""
    from bench.harness import sipp as S

    resp = ("      SIP/2.0 {status}\n      [last_Via:]\n      [last_Record-Route:]\n      [last_From:]\n"
            "      [last_To:];tag=[pid]SIPpTag01[call_number]\n      [last_Call-ID:]\n      [last_CSeq:]\n"
            "      Contact: <sip:callee@[local_ip]:[local_port]>")
    sdp = "\n".join(f"      {line}" for line in (
        "v=0", "o=callee 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
        f"m=audio {media_port} RTP/AVP 0 101", "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000",
        "a=sendrecv"))
    bye = ("      BYE [next_url] SIP/2.0\n      [routes]\n"
           "      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]\n"
           "      From: <sip:callee@[local_ip]:[local_port]>;tag=[pid]SIPpTag01[call_number]\n"
           "      To:[$from_hdr]\n      [last_Call-ID:]\n      CSeq: 2 BYE\n      Max-Forwards: 70\n"
           "      Content-Length: 0")
    body = ('  <recv request="INVITE" rrs="true">\n    <action>\n'
            '      <ereg regexp=".*" search_in="hdr" header="From:" check_it="true" assign_to="from_hdr"/>\n'
            '    </action>\n  </recv>\n'
            + S.send(resp.format(status="180 Ringing") + "\n      Content-Length: 0", False)
            + S.send(resp.format(status="200 OK") + "\n      Content-Type: application/sdp\n"
                     "      Content-Length: [len]\n\n" + sdp)
            + '  <recv request="ACK"/>\n' + f'  <pause milliseconds="{hold_ms}"/>\n'
            + S.send(bye) + '  <recv response="200"/>\n')
    return S.scenario(body, name="routed-callee")
