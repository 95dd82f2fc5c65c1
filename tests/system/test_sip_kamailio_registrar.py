"""brisvox registers with a real Kamailio (Debian's package) that authenticates it with digest, and
answers a call Kamailio routes to the registered contact over UDP.

Kamailio (tests/system/peers/kamailio_registrar.cfg: tm, registrar, usrloc in memory, auth with
the password passed as a define) challenges every REGISTER; brisvox answers with the trunk's
secret and is registered (its stats and the `sip_trunks` row say so). Kamailio grants at most
4 s, so brisvox refreshes every 2-3.2 s. SIPp calls sip:1001@kamailio; Kamailio looks up the
binding and relays the INVITE (record-routed) to brisvox, whose call runs the trunk's agent and
names the trunk; the caller's BYE comes back through Kamailio. Kamailio is then restarted on the
same address, losing every binding: brisvox's next refresh registers again and a second call is
routed. Over TLS: brisvox registers on Kamailio's TLS port with a Contact naming its own TLS
listener, and Kamailio relays a SIPp call to it over a TLS connection of its own. And the other
way: `dial` through the TLS trunk reaches Kamailio, answers its 407 once, is relayed to a SIPp
callee on UDP, and brisvox's BYE follows the route set back through Kamailio. Every process
is stopped by its process group, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench.harness import sipp as S
from ipc import frames as F
from ipc.bus import request_sync
from tests.system.gateway_harness import (
    GatewayProc,
    free_port,
    free_port_pair_base,
    have,
    make_fixture,
    wait_for,
)

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(not (have("kamailio") and have("sipp") and have("espeak-ng") and have("sox")),
                                 reason="needs kamailio, sipp, espeak-ng and sox (make test installs them)")]

CFG = Path(__file__).parent / "peers" / "kamailio_registrar.cfg"
HOST = "127.0.0.8"
SECRET = "kamailio trunk secret"


class Kamailio:
    """The registrar config on ``HOST:port``, run in its own process group."""

    def __init__(self, tmp: Path, port: int, tls_port: int = 0, callee: str = "") -> None:
        self.tmp = tmp
        self.port = port
        self.tls_port = tls_port
        self.callee = callee  # CALLEE: where an INVITE for another user than the trunk's goes
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "kamailio.log"

    def tls_args(self) -> list[str]:
        """The tls module on ``tls_port`` with a certificate made here (peers not verified)."""
        if not self.tls_port:
            return []
        key, cert, cfg = self.tmp / "k.pem", self.tmp / "c.pem", self.tmp / "tls.cfg"
        if not cert.exists():
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            f"/CN={HOST}", "-addext", f"subjectAltName=IP:{HOST}", "-keyout", str(key),
                            "-out", str(cert)], check=True, capture_output=True, timeout=60)
            cfg.write_text(f"[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\n"
                           f"private_key = {key}\ncertificate = {cert}\n\n[client:default]\nmethod = TLSv1.2+\n"
                           "verify_certificate = no\nrequire_certificate = no\n")
        return ["-A", "WITH_TLS", "-A", f"TLS_LISTEN=tls:{HOST}:{self.tls_port}", "-A", f'TLS_CFG="{cfg}"']

    def args(self) -> list[str]:
        return ["kamailio", "-DD", "-E", "-f", str(CFG), *self.tls_args(), "-A", f"LISTEN=udp:{HOST}:{self.port}",
                "-A", 'TRUNK_USER="1001"', "-A", f'TRUNK_PASSWORD="{SECRET}"', "-A", "MAX_EXPIRES=4",
                "-A", 'REALM="kamailio.test"', "-P", str(self.tmp / "kamailio.pid"), "-Y", str(self.tmp),
                "-w", str(self.tmp), "-m", "32", "-M", "4",
                *(["-A", f'CALLEE="{self.callee}"'] if self.callee else [])]

    def start(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                     start_new_session=True)
        log.close()
        time.sleep(0.5)
        assert self.proc.poll() is None, self.log()

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""



def call_through(tmp: Path, ulaw: Path, port: int) -> subprocess.CompletedProcess[str]:
    return S.run_sipp(tmp, S.routed_call(ulaw, 800), f"{HOST}:{port}", service="1001", timeout=15,
                      media_port=free_port_pair_base(4), local_port=free_port())


def test_registers_with_kamailio_takes_its_calls_and_registers_again_after_a_restart(short_tmp, monkeypatch):
    monkeypatch.setenv("BRISVOX_TEST_KAMAILIO", SECRET)
    fx = make_fixture(short_tmp, "A call routed by Kamailio.")
    kam = Kamailio(short_tmp / "kamailio", free_port())
    trunk = {"name": "kamailio", "registrar": f"{HOST}:{kam.port}", "username": "1001",
             "secret_env": "BRISVOX_TEST_KAMAILIO", "expires": 60, "agent": "echo", "keepalive_s": 0}
    try:
        kam.start()
        with GatewayProc(short_tmp, inbox=True, sip={"trunks": [trunk]}) as gw:
            def row() -> dict[str, Any]:
                return gw.stats().get("sip_trunks", {}).get("kamailio", {})

            assert wait_for(lambda: row().get("state") == "registered", 8), (row(), kam.log())
            st = gw.stats()
            assert st["sip_trunk_kamailio_registered"] == 1 and st.get("sip_auth_answered", 0) >= 1
            assert 0 < row()["expires_in_s"] <= 4  # Kamailio's max_expires, not the 60 asked
            n = st["sip_trunk_kamailio_registrations"]
            assert wait_for(lambda: gw.stats()["sip_trunk_kamailio_registrations"] > n, 5)  # refreshed
            r = call_through(short_tmp, fx["ulaw"], kam.port)
            assert r.returncode == 0, (r.stdout[-800:], r.stderr[-800:], kam.log())
            assert gw.stats()["calls_admitted"] == 1
            assert "challenged" in kam.log()  # Kamailio did challenge, brisvox did answer

            kam.stop()  # its bindings are lost
            kam.start()
            n = gw.stats()["sip_trunk_kamailio_registrations"]
            assert wait_for(lambda: gw.stats()["sip_trunk_kamailio_registrations"] > n, 8), kam.log()
            r = call_through(short_tmp, fx["ulaw"], kam.port)
            assert r.returncode == 0, (r.stdout[-800:], r.stderr[-800:], kam.log())
            st = gw.stats()
            assert st["calls_admitted"] == 2 and st.get("sip_register_failed", 0) <= 2
    finally:
        kam.stop()


@pytest.mark.skipif(not list(Path("/usr/lib").glob("*/kamailio/modules/tls.so")),
                    reason="needs kamailio-tls-modules (make test installs it)")
def test_registers_over_tls_and_kamailio_routes_a_call_to_it_over_tls(short_tmp, monkeypatch):
    """brisvox registers over TLS (its Contact: our TLS listener, ;transport=tls); Kamailio, a TLS
    peer, challenges it, answers brisvox's RFC 5626 keepalive pings, then relays a SIPp call over a
    TLS connection of its own to brisvox."""
    from tests.system.test_sip_streams import make_cert

    monkeypatch.setenv("BRISVOX_TEST_KAMAILIO", SECRET)
    fx = make_fixture(short_tmp, "A call routed by Kamailio over TLS.")
    kam = Kamailio(short_tmp / "kamailio", free_port(), free_port(socket.SOCK_STREAM))
    cert = make_cert(short_tmp)
    tls = free_port(socket.SOCK_STREAM)
    trunk = {"name": "kamailio", "registrar": f"{HOST}:{kam.tls_port}", "transport": "tls", "username": "1001",
             "secret_env": "BRISVOX_TEST_KAMAILIO", "expires": 60, "agent": "echo", "keepalive_s": 0.5,
             "addresses": [HOST, "127.0.0.1"]}  # keepalive: RFC 5626 pings on the TLS connection  # Kamailio's TLS connections to us come from either
    sip = {"trunks": [trunk], "tls_verify_server": False,  # Kamailio's certificate is its own, self-signed
           "listeners": [{"transport": "tls", "host": "127.0.0.1", "port": tls, "cert_file": cert[0],
                          "key_file": cert[1]}]}
    try:
        kam.start()
        with GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
            def row() -> dict[str, Any]:
                return gw.stats().get("sip_trunks", {}).get("kamailio", {})

            assert wait_for(lambda: row().get("state") == "registered", 8), (row(), kam.log())
            assert "challenged" in kam.log() and gw.stats()["sip_stream_connected_tls"] >= 1
            r = call_through(short_tmp, fx["ulaw"], kam.port)
            assert r.returncode == 0, (r.stdout[-800:], r.stderr[-800:], kam.log())
            st = gw.stats()
            assert st["calls_admitted"] == 1 and st.get("sip_stream_accepted_tls", 0) >= 1
            # Kamailio answers our CRLFCRLF pings with CRLF: each pong arms the next ping, none is lost
            assert wait_for(lambda: gw.stats()["sip_trunk_keepalives"] >= 3, 5), gw.stats()
            assert gw.stats().get("sip_trunk_keepalive_lost", 0) == 0
    finally:
        kam.stop()


_RESP = """      SIP/2.0 {status}
      [last_Via:]
      [last_Record-Route:]
      [last_From:]
      [last_To:];tag=[pid]SIPpTag01[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:callee@[local_ip]:[local_port]>"""


def callee_hung_up_by_brisvox(media_port: int) -> str:
    """A UDP callee behind Kamailio: 180, 200 with SDP (Record-Route copied, RFC 3261 12.1.1),
    the ACK, then brisvox's BYE, answered 200."""
    sdp = "\n".join(f"      {line}" for line in (
        "v=0", "o=callee 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
        f"m=audio {media_port} RTP/AVP 0", "a=rtpmap:0 PCMU/8000", "a=sendrecv"))
    body = ('  <recv request="INVITE"/>\n'
            + S.send(_RESP.format(status="180 Ringing") + "\n      Content-Length: 0", False)
            + S.send(_RESP.format(status="200 OK") + "\n      Content-Type: application/sdp\n"
                     "      Content-Length: [len]\n\n" + sdp)
            + '  <recv request="ACK"/>\n  <recv request="BYE"/>\n'
            + S.send(_RESP.format(status="200 OK") + "\n      Content-Length: 0", False))
    return S.scenario(body, name="callee")


@pytest.mark.skipif(not list(Path("/usr/lib").glob("*/kamailio/modules/tls.so")),
                    reason="needs kamailio-tls-modules (make test installs it)")
def test_a_dial_through_kamailio_over_tls_answers_its_proxy_challenge_and_ends_with_bye(short_tmp, monkeypatch):
    """``dial`` through the TLS trunk: brisvox's INVITE reaches Kamailio over TLS, Kamailio
    challenges it (407), brisvox answers once with Proxy-Authorization, Kamailio relays it
    (record-routed, TLS -> UDP) to a SIPp callee that answers; the call runs, and brisvox's BYE
    (``max_call_s``) follows the route set back through Kamailio to the callee."""
    from tests.system.test_sip_outbound import Media
    from tests.system.test_sip_streams import make_cert

    monkeypatch.setenv("BRISVOX_TEST_KAMAILIO", SECRET)
    callee_port = free_port()
    kam = Kamailio(short_tmp / "kamailio", free_port(), free_port(socket.SOCK_STREAM),
                   callee=f"sip:127.0.0.1:{callee_port}")
    cert = make_cert(short_tmp)
    trunk = {"name": "kamailio", "registrar": f"{HOST}:{kam.tls_port}", "transport": "tls", "username": "1001",
             "secret_env": "BRISVOX_TEST_KAMAILIO", "register": False, "agent": "echo", "keepalive_s": 0}
    sip = {"trunks": [trunk], "tls_verify_server": False,
           "listeners": [{"transport": "tls", "host": "127.0.0.1", "port": free_port(socket.SOCK_STREAM),
                          "cert_file": cert[0], "key_file": cert[1]}]}
    media = Media()
    scen = short_tmp / "callee.xml"
    scen.write_text(callee_hung_up_by_brisvox(media.port))
    callee = subprocess.Popen(["sipp", "-sf", str(scen), "-m", "1", "-i", "127.0.0.1", "-p", str(callee_port),
                               "-mi", "127.0.0.1", "-mp", str(free_port_pair_base(4)), "-timeout", "25s",
                               "-timeout_error", "-nostdin"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=short_tmp, start_new_session=True)
    try:
        kam.start()
        with GatewayProc(short_tmp, inbox=True, gateway={"max_call_s": 2.0}, sip=sip) as gw:
            reply = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": "5550100", "trunk": "kamailio", "agent": "echo", "ring_timeout_s": 10}), 20)
            assert isinstance(reply, F.CommandReply) and reply.ok, (reply, kam.log())
            out, err = callee.communicate(timeout=25)
            assert callee.returncode == 0, (out[-800:], err[-800:], kam.log())  # the BYE reached it
            st = gw.stats()
            log = kam.log()
            assert st.get("sip_auth_answered", 0) == 1 and "for sip:5550100@" in log and "to the callee" in log
            assert st.get("sip_stream_connected_tls", 0) >= 1 and st.get("sip_dial_answered", 0) == 1
            assert media.received > 20  # the echo agent's audio reached the callee, past Kamailio
    finally:
        if callee.poll() is None:
            os.killpg(callee.pid, signal.SIGKILL)
            callee.wait(5)
        media.close()
        kam.stop()
